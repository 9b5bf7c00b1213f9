package bench

import (
	"math"
	"strings"
	"testing"
)

func TestStagesSinceTakesTheDifferenceOfTwoScrapes(t *testing.T) {
	scrape := func(text string) map[string]*histogram {
		out := map[string]*histogram{}
		for line := range strings.SplitSeq(text, "\n") {
			parseStageLine("projector", line, out)
			parseStageLine("api", line, out)
		}
		return out
	}
	before := scrape(`# HELP orders_projection_commit_to_applied_seconds x
orders_projection_commit_to_applied_seconds_bucket{projection="order_views",le="0.01"} 10
orders_projection_commit_to_applied_seconds_bucket{projection="order_views",le="0.1"} 10
orders_projection_commit_to_applied_seconds_bucket{projection="order_views",le="+Inf"} 10
orders_projection_commit_to_applied_seconds_sum{projection="order_views"} 0.05
orders_projection_commit_to_applied_seconds_count{projection="order_views"} 10
orders_relay_publish_seconds_bucket{le="0.01"} 1
orders_relay_publish_seconds_bucket{le="+Inf"} 1
orders_relay_publish_seconds_sum 0.002
orders_relay_publish_seconds_count 1`)
	after := scrape(`orders_projection_commit_to_applied_seconds_bucket{projection="order_views",le="0.01"} 10
orders_projection_commit_to_applied_seconds_bucket{projection="order_views",le="0.1"} 110
orders_projection_commit_to_applied_seconds_bucket{projection="order_views",le="+Inf"} 110
orders_projection_commit_to_applied_seconds_sum{projection="order_views"} 5.05
orders_projection_commit_to_applied_seconds_count{projection="order_views"} 110
orders_relay_publish_seconds_bucket{le="0.01"} 1
orders_relay_publish_seconds_bucket{le="+Inf"} 1
orders_relay_publish_seconds_sum 0.002
orders_relay_publish_seconds_count 1`)
	series := `orders_projection_commit_to_applied_seconds{projection="order_views"}`
	d, ok := after[series].minus(before[series])
	if !ok || d.count != 100 || math.Abs(d.sum-5) > 1e-9 {
		t.Fatalf("difference: count %v sum %v, want 100 and 5", d.count, d.sum)
	}
	// All 100 new observations lie in (0.01, 0.1]: the median interpolates
	// to the middle of that bucket.
	if got := d.quantile(0.5); math.Abs(got-0.055) > 1e-9 {
		t.Errorf("p50 = %v, want 0.055", got)
	}
	table := stagesSince(before, after)
	if !strings.Contains(table, "| `projection_commit_to_applied_seconds{projection=\"order_views\"}` | 100 | 50.0 | 55.0 | 99.1 |") {
		t.Errorf("table:\n%s", table)
	}
	if strings.Contains(table, "relay_publish") {
		t.Errorf("a histogram with no new observations is in the table:\n%s", table)
	}
	// A series that was not there before (its process's scrape failed), or
	// that went back (its process restarted), is no difference.
	if _, ok := after[series].minus(nil); ok {
		t.Error("a difference from no scrape")
	}
	if _, ok := before[series].minus(after[series]); ok {
		t.Error("a difference from a later scrape")
	}
}
