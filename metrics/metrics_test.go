package metrics_test

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
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

// A scraper that never reads its answer holds no slot: the slot covers the
// gathering and the encoding, and the writing runs outside it, so
// MaxScrapes such scrapers (a hostile caller needs no token) do not keep
// Prometheus out. Before, each held its slot until the server's write
// timeout (none here: for ever).
func TestScrapersThatNeverReadHoldNoSlot(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	if err := metrics.Register(reg, metrics.Metric{Name: "big", Help: "many series", Labels: []string{"series"}, Read: func() []metrics.Sample {
		s := make([]metrics.Sample, 200_000) // ~12 MB of text: past any socket buffer
		for i := range s {
			s[i] = metrics.Sample{Labels: map[string]string{"series": strconv.Itoa(i) + strings.Repeat("x", 24)}, Value: float64(i)}
		}
		return s
	}}); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(metrics.HandlerEvery(reg, time.Hour))
	defer srv.Close()
	small := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		var err error
		_ = c.Control(func(fd uintptr) { err = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 1024) })
		return err
	}}
	for range metrics.MaxScrapes {
		conn, err := small.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if _, err := io.WriteString(conn, "GET / HTTP/1.1\r\nHost: metrics\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		res, err := http.Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		n, _ := io.Copy(io.Discard, res.Body)
		res.Body.Close()
		if res.StatusCode == http.StatusOK && n > 1<<20 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("a scrape beside %d that never read: %d (%d bytes); want 200 with the whole answer", metrics.MaxScrapes, res.StatusCode, n)
		}
		time.Sleep(100 * time.Millisecond) // the slow ones may still be encoding
	}
}
