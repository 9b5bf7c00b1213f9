package dashshot

import (
	"bytes"
	"context"
	"fmt"
	"image/png"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/prometheus/model/labels"
)

const synthetic = `{"title":"Synthetic","panels":[
 {"id":1,"type":"timeseries","title":"Requests by route","gridPos":{"h":8,"w":12,"x":0,"y":0},
  "fieldConfig":{"defaults":{"unit":"reqps"}},
  "targets":[{"refId":"A","expr":"sum by (route) (rate(demo_requests_total[$__rate_interval]))","legendFormat":"{{route}} requests"}]},
 {"id":2,"type":"stat","title":"Total","gridPos":{"h":4,"w":12,"x":12,"y":0},
  "targets":[{"refId":"A","expr":"sum(rate(demo_requests_total[$__rate_interval]))"}]},
 {"id":3,"type":"row","title":"a row","gridPos":{"h":1,"w":24,"x":0,"y":8}}
]}`

// A synthetic dashboard over two synthetic counters (10/s and 5/s, one
// sample a second) evaluates, through the PromQL engine and the
// substituted $__rate_interval, to those rates at every step, legends from
// legendFormat; rows are skipped; and it renders to a PNG of the layout's
// size with the first series' colour in the timeseries panel and the stat
// drawn in the other.
func TestEvaluateAndRenderSyntheticDashboard(t *testing.T) {
	t.Parallel()
	base := time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)
	store := NewStore()
	for s := 0; s <= 120; s++ {
		ts := base.Add(time.Duration(s) * time.Second).UnixMilli()
		store.Append(labels.FromStrings("__name__", "demo_requests_total", "route", "/a", "job", "api"), ts, float64(10*s))
		store.Append(labels.FromStrings("__name__", "demo_requests_total", "route", "/b", "job", "api"), ts, float64(5*s))
	}
	if series, samples := store.Len(); series != 2 || samples != 242 {
		t.Fatalf("store holds %d series, %d samples; want 2, 242", series, samples)
	}
	d, err := ParseDashboard([]byte(synthetic))
	if err != nil {
		t.Fatal(err)
	}
	data, err := Evaluate(context.Background(), store, d, EvalConfig{
		Start: base.Add(30 * time.Second), End: base.Add(120 * time.Second), Step: 10 * time.Second, RateInterval: 30 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(data) != 2 {
		t.Fatalf("%d panels evaluated, want 2 (the row skipped)", len(data))
	}
	want := []struct {
		legend string
		v      float64
	}{{"/a requests", 10}, {"/b requests", 5}}
	if got := data[0].Series; len(got) != len(want) {
		t.Fatalf("panel 1: %d series, want %d", len(got), len(want))
	}
	for i, w := range want {
		s := data[0].Series[i]
		if s.Legend != w.legend || len(s.Points) != 10 {
			t.Fatalf("panel 1 series %d: legend %q with %d points; want %q with 10", i, s.Legend, len(s.Points), w.legend)
		}
		for _, p := range s.Points {
			if math.Abs(p.V-w.v) > 1e-9 {
				t.Fatalf("panel 1 %s at %d: %v, want %v", s.Legend, p.T, p.V, w.v)
			}
		}
	}
	if s := data[1].Series; len(s) != 1 || s[0].Legend != "value" || math.Abs(s[0].Points[len(s[0].Points)-1].V-15) > 1e-9 {
		t.Fatalf("stat panel: %+v, want one series ending at 15", s)
	}

	img, err := Render(data, RenderConfig{Width: 960, RowHeight: 30, Title: "Synthetic", Subtitle: "test"})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := WritePNG(&buf, img); err != nil {
		t.Fatal(err)
	}
	decoded, err := png.Decode(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if b := decoded.Bounds(); b.Dx() != 960 || b.Dy() != headerHeight+8*30+gap {
		t.Fatalf("PNG is %dx%d, want 960x%d", b.Dx(), b.Dy(), headerHeight+8*30+gap)
	}
	count := func(x0, x1 int, c [3]uint8) int {
		n := 0
		for y := 0; y < img.Bounds().Dy(); y++ {
			for x := x0; x < x1; x++ {
				p := img.RGBAAt(x, y)
				if [3]uint8{p.R, p.G, p.B} == c {
					n++
				}
			}
		}
		return n
	}
	first := [3]uint8{palette[0].R, palette[0].G, palette[0].B}
	second := [3]uint8{palette[1].R, palette[1].G, palette[1].B}
	// Both lines cross the plot (~400 px wide), two pixels thick.
	if n := count(0, 480, first); n < 600 {
		t.Errorf("left panel: %d pixels of the first series' colour, want a line (≥ 600)", n)
	}
	if n := count(0, 480, second); n < 600 {
		t.Errorf("left panel: %d pixels of the second series' colour, want a line (≥ 600)", n)
	}
	// "15 " four times the font's size.
	if n := count(480, 960, first); n < 200 {
		t.Errorf("stat panel: %d pixels of the first colour, want a big number (≥ 200)", n)
	}
}

// A query that does not parse, or a panel off the grid, is an error that
// names the panel.
func TestEvaluateNamesBrokenPanels(t *testing.T) {
	t.Parallel()
	broken := strings.Replace(synthetic, `sum(rate(demo_requests_total[$__rate_interval]))`, `sum(rate(demo_requests_total[$__rate_interval])`, 1)
	d, err := ParseDashboard([]byte(broken))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	_, err = Evaluate(context.Background(), NewStore(), d, EvalConfig{Start: now.Add(-time.Minute), End: now, Step: time.Second})
	if err == nil || !strings.Contains(err.Error(), `panel "Total"`) {
		t.Fatalf("Evaluate of an unparsable query: %v, want an error naming panel \"Total\"", err)
	}
	if _, err := ParseDashboard([]byte(strings.Replace(synthetic, `"w":12,"x":12`, `"w":14,"x":12`, 1))); err == nil || !strings.Contains(err.Error(), "Total") {
		t.Fatalf("ParseDashboard of a panel off the grid: %v, want an error naming it", err)
	}
}

// ScrapeOnce reads the text exposition of a real HTTP endpoint: every
// series (histogram buckets included) lands in the store with job and
// instance labels, up is 1, and histogram_quantile over two scrapes gives
// the bucket the observations fell in; a failing endpoint stores up=0.
func TestScrapeOnceFeedsTheEngine(t *testing.T) {
	t.Parallel()
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.Error(w, "no", http.StatusInternalServerError)
			return
		}
		k := n.Add(1) * 100 // 100 observations between 0.1 and 0.25 per scrape
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		fmt.Fprintf(w, "# HELP demo_seconds d\n# TYPE demo_seconds histogram\n"+
			"demo_seconds_bucket{le=\"0.1\"} 0\ndemo_seconds_bucket{le=\"0.25\"} %d\ndemo_seconds_bucket{le=\"+Inf\"} %d\n"+
			"demo_seconds_sum %d\ndemo_seconds_count %d\n# TYPE demo_up gauge\ndemo_up 1\n", k, k, k/5, k)
	}))
	defer srv.Close()
	store := NewStore()
	base := time.Now().Truncate(time.Second)
	for i := 0; i < 3; i++ {
		if _, err := ScrapeOnce(context.Background(), store, srv.Client(), time.Second, Target{Job: "api", URL: srv.URL + "/metrics"}, base.Add(time.Duration(i)*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := ScrapeOnce(context.Background(), store, srv.Client(), time.Second, Target{Job: "broken", URL: srv.URL + "/nope"}, base); err == nil {
		t.Fatal("scrape of a 500: no error")
	}
	// 3 buckets + sum + count + demo_up + up for api, up for broken.
	if series, samples := store.Len(); series != 8 || samples != 3*7+1 {
		t.Fatalf("store: %d series, %d samples; want 8, 22", series, samples)
	}
	d, err := ParseDashboard([]byte(`{"panels":[{"type":"timeseries","title":"p","gridPos":{"h":1,"w":1,"x":0,"y":0},"targets":[
		{"refId":"A","expr":"histogram_quantile(0.5, sum by (le, job) (rate(demo_seconds_bucket[$__rate_interval])))","legendFormat":"{{job}}"},
		{"refId":"B","expr":"up","legendFormat":"{{job}} {{instance}}"}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Evaluate(context.Background(), store, d, EvalConfig{Start: base.Add(2 * time.Second), End: base.Add(2 * time.Second), Step: time.Second, RateInterval: 5 * time.Second}); err == nil {
		t.Fatal("Evaluate with End == Start: no error")
	}
	data, err := Evaluate(context.Background(), store, d, EvalConfig{Start: base.Add(time.Second), End: base.Add(2 * time.Second), Step: time.Second, RateInterval: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	s := data[0].Series
	if len(s) != 3 || s[0].Legend != "api" {
		t.Fatalf("series %+v, want the quantile of api, then up of api and broken", s)
	}
	// Half of the observations: in the middle of the (0.1, 0.25] bucket.
	if got := s[0].Points[len(s[0].Points)-1].V; math.Abs(got-0.175) > 1e-9 {
		t.Errorf("p50: %v, want 0.175", got)
	}
	host := strings.TrimPrefix(srv.URL, "http://")
	if s[1].Legend != "api "+host || s[1].Points[0].V != 1 || s[2].Legend != "broken "+host || s[2].Points[0].V != 0 {
		t.Errorf("up: %+v, %+v; want api 1, broken 0", s[1], s[2])
	}
}

func TestFormatValue(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		v    float64
		unit string
		want string
	}{
		{12.345, "reqps", "12.3 req/s"},
		{1500, "short", "1.5K"},
		{0.25, "s", "250 ms"},
		{0.00002, "s", "20 us"},
		{2.5, "s", "2.5 s"},
		{3 << 20, "bytes", "3 MiB"},
		{0, "", "0"},
		{0.5, "ops", "0.5 ops/s"},
	} {
		if got := formatValue(tc.v, tc.unit); got != tc.want {
			t.Errorf("formatValue(%v, %q) = %q, want %q", tc.v, tc.unit, got, tc.want)
		}
	}
	if got := niceTicks(0, 87); len(got) < 3 || got[0] != 0 || got[len(got)-1] < 87 || got[len(got)-1] > 120 {
		t.Errorf("niceTicks(0, 87) = %v, want 3-6 round ticks from 0 covering 87", got)
	}
}
