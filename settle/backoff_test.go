package settle

import (
	"testing"
	"time"
)

// The backoff doubles from MinBackoff up to MaxBackoff, less up to a
// quarter at random, so intents failed together spread their retries.
func TestBackoffDoublesWithJitter(t *testing.T) {
	w := &Worker{cfg: Config{MinBackoff: 100 * time.Millisecond, MaxBackoff: time.Second}}
	for _, c := range []struct {
		delivery uint64
		want     time.Duration
	}{{0, 100 * time.Millisecond}, {1, 100 * time.Millisecond}, {2, 200 * time.Millisecond}, {4, 800 * time.Millisecond}, {5, time.Second}, {1 << 63, time.Second}} {
		seen := map[time.Duration]bool{}
		for range 200 {
			d := w.backoff(c.delivery)
			if d > c.want || d < c.want*3/4 {
				t.Fatalf("backoff(%d) = %s, want in [%s, %s]", c.delivery, d, c.want*3/4, c.want)
			}
			seen[d] = true
		}
		if len(seen) < 10 {
			t.Fatalf("backoff(%d) took %d values in 200 draws, want them spread", c.delivery, len(seen))
		}
	}
	if d := (&Worker{}).backoff(3); d != 0 {
		t.Fatalf("backoff with no MinBackoff = %s, want 0", d)
	}
}
