package bench

import (
	"bufio"
	"context"
	"fmt"
	"maps"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// stageHistograms are the histograms that split pay → paid into its stages,
// each on the process that observes it: the relay's commit → published (in
// the api), the worker's intent → recorded, provider call and recording
// transaction, and each projection's commit → applied.
var stageHistograms = []struct{ process, name string }{
	{"api", "orders_relay_commit_to_published_seconds"},
	{"api", "orders_relay_publish_seconds"},
	{"worker", "orders_payment_intent_to_recorded_seconds"},
	{"worker", "orders_payment_provider_seconds"},
	{"worker", "orders_payment_record_seconds"},
	{"projector", "orders_projection_commit_to_applied_seconds"},
	{"projector", "orders_projection_batch_duration_seconds"},
}

// histogram is one labelled series of a classic Prometheus histogram:
// cumulative counts by upper bound, their sum and count.
type histogram struct {
	les    []float64
	counts []float64
	sum    float64
	count  float64
}

// scrapeStages reads the stage histograms from the stack's processes, by
// series ("name{labels}" without le). A process whose scrape fails is left
// out (its stages then have no row).
func (r *runner) scrapeStages(ctx context.Context) map[string]*histogram {
	ports := map[string]int{"api": r.s.apiPort, "worker": r.s.workerPort, "projector": r.s.projPort}
	out := map[string]*histogram{}
	for process, port := range ports {
		if got, err := scrapeProcess(ctx, process, port); err == nil {
			maps.Copy(out, got)
		}
	}
	return out
}

func scrapeProcess(ctx context.Context, process string, port int) (map[string]*histogram, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/metrics", port), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "text/plain") // the classic buckets, not the protobuf native ones
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape %s: %s", process, resp.Status)
	}
	out := map[string]*histogram{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		parseStageLine(process, sc.Text(), out)
	}
	return out, sc.Err()
}

// parseStageLine adds one exposition line to out if it belongs to a stage
// histogram of process.
func parseStageLine(process, line string, out map[string]*histogram) {
	for _, h := range stageHistograms {
		if h.process != process || !strings.HasPrefix(line, h.name+"_") {
			continue
		}
		rest := line[len(h.name)+1:]
		kind, rest, _ := strings.Cut(rest, "{")
		if i := strings.IndexByte(kind, ' '); i >= 0 { // no labels
			kind, rest = kind[:i], "}"+kind[i:]
		}
		labels, value, ok := strings.Cut(rest, "} ")
		if !ok {
			return
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			return
		}
		var le float64
		var others []string
		for l := range strings.SplitSeq(labels, ",") {
			if s, ok := strings.CutPrefix(l, `le="`); ok {
				le, _ = strconv.ParseFloat(strings.TrimSuffix(s, `"`), 64) // "+Inf" parses
				continue
			}
			if l != "" {
				others = append(others, l)
			}
		}
		series := h.name
		if len(others) > 0 {
			series += "{" + strings.Join(others, ",") + "}"
		}
		hist := out[series]
		if hist == nil {
			hist = &histogram{}
			out[series] = hist
		}
		switch kind {
		case "bucket":
			hist.les = append(hist.les, le)
			hist.counts = append(hist.counts, v)
		case "sum":
			hist.sum = v
		case "count":
			hist.count = v
		}
		return
	}
}

// minus is h's observations since before (a scrape of the same series),
// or false if the two do not make a difference: no scrape before, other
// buckets, fewer observations now (the process restarted).
func (h *histogram) minus(before *histogram) (*histogram, bool) {
	if before == nil || !slices.Equal(h.les, before.les) || before.count > h.count {
		return nil, false
	}
	d := &histogram{les: h.les, counts: slices.Clone(h.counts), sum: h.sum - before.sum, count: h.count - before.count}
	for i := range d.counts {
		d.counts[i] -= before.counts[i]
		if d.counts[i] < 0 {
			return nil, false
		}
	}
	return d, true
}

// quantile estimates the q-quantile in seconds by linear interpolation
// within its bucket, as Prometheus's histogram_quantile does.
func (h *histogram) quantile(q float64) float64 {
	if h.count <= 0 || len(h.counts) == 0 {
		return math.NaN()
	}
	rank := q * h.count
	lower, below := 0.0, 0.0
	for i, c := range h.counts {
		if c >= rank {
			if math.IsInf(h.les[i], 1) {
				return lower
			}
			if c == below {
				return h.les[i]
			}
			return lower + (h.les[i]-lower)*(rank-below)/(c-below)
		}
		lower, below = h.les[i], c
	}
	return lower
}

// stagesSince renders the stage histograms' observations since before as a
// table: count, mean, p50 and p99 (interpolated in the classic buckets, so
// coarse: read them as "in this bucket").
func stagesSince(before, after map[string]*histogram) string {
	names := make([]string, 0, len(after))
	for name := range after {
		names = append(names, name)
	}
	slices.SortFunc(names, func(a, b string) int {
		return strings.Compare(stageOrder(a), stageOrder(b))
	})
	var b strings.Builder
	b.WriteString("| stage (histogram) | observations | mean ms | p50 ms | p99 ms |\n| --- | ---: | ---: | ---: | ---: |\n")
	for _, name := range names {
		d, ok := after[name].minus(before[name])
		if !ok || d.count <= 0 {
			continue
		}
		fmt.Fprintf(&b, "| `%s` | %.0f | %.1f | %.1f | %.1f |\n", strings.TrimPrefix(name, "orders_"), d.count,
			1000*d.sum/d.count, 1000*d.quantile(0.5), 1000*d.quantile(0.99))
	}
	return b.String()
}

// stageOrder sorts series in the order of stageHistograms (the pipeline's).
func stageOrder(series string) string {
	for i, h := range stageHistograms {
		if strings.HasPrefix(series, h.name) {
			return fmt.Sprintf("%02d%s", i, series)
		}
	}
	return "99" + series
}
