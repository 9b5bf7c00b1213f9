package metrics_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/acme/orders/metrics"
)

// /metrics takes no token, so a flood of scrapes must cost what one does:
// scrapes that arrive while a reading runs wait for it and share it, a
// scrape within the interval of a reading is answered from it, and past
// MaxScrapes at once the others are refused at once with 429 problem+json.
func TestScrapesShareReadingsAndAreBounded(t *testing.T) {
	t.Parallel()
	var reads atomic.Int64
	release := make(chan struct{})
	reg := prometheus.NewRegistry()
	if err := metrics.Register(reg, metrics.Metric{Name: "reads", Help: "readings so far", Read: func() []metrics.Sample {
		n := reads.Add(1)
		<-release
		return []metrics.Sample{{Value: float64(n)}}
	}}); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(metrics.HandlerEvery(reg, time.Hour))
	defer srv.Close()
	scrape := func() (int, http.Header, string) {
		res, err := http.Get(srv.URL)
		if err != nil {
			t.Error(err)
			return 0, nil, ""
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, res.Header, string(b)
	}

	var wg sync.WaitGroup
	bodies := make(chan string, metrics.MaxScrapes)
	for range metrics.MaxScrapes {
		wg.Go(func() {
			code, _, body := scrape()
			if code != http.StatusOK {
				t.Errorf("a scrape within the bound: %d %s", code, body)
			}
			bodies <- body
		})
	}
	// The first reading is held up; once the other scrapes wait for it, the
	// next one is past the bound.
	deadline := time.Now().Add(5 * time.Second)
	for reads.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	var code int
	var h http.Header
	var body string
	for time.Now().Before(deadline) {
		if code, h, body = scrape(); code == http.StatusTooManyRequests {
			break
		}
		time.Sleep(5 * time.Millisecond) // a scrape ahead of it not yet counted
	}
	if code != http.StatusTooManyRequests || h.Get("Retry-After") != "1" || h.Get("Content-Type") != "application/problem+json" ||
		!strings.Contains(body, `"type":"https://orders.acme.example/problems/scrapes-busy"`) {
		t.Fatalf("a scrape past %d at once: %d %v %s; want 429 scrapes-busy with Retry-After: 1", metrics.MaxScrapes, code, h, body)
	}
	close(release)
	wg.Wait()
	close(bodies)
	for body := range bodies {
		if !strings.Contains(body, "orders_reads 1\n") {
			t.Errorf("a scrape that waited for the reading in progress:\n%s", body)
		}
	}
	if code, _, body := scrape(); code != http.StatusOK || !strings.Contains(body, "orders_reads 1\n") {
		t.Errorf("a scrape within the interval of the reading: %d\n%s", code, body)
	}
	if n := reads.Load(); n != 1 {
		t.Errorf("%d readings for %d scrapes within the interval, want 1", n, metrics.MaxScrapes+1)
	}

	// Past the interval, a scrape reads again.
	fresh := httptest.NewServer(metrics.HandlerEvery(reg, time.Nanosecond))
	defer fresh.Close()
	for i := range 2 {
		want := int64(i) + 2
		res, err := http.Get(fresh.URL)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if n := reads.Load(); n != want || !strings.Contains(string(b), "orders_reads ") {
			t.Errorf("scrape %d past the interval: %d readings, want %d\n%s", i+1, n, want, b)
		}
	}
}
