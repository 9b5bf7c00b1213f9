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

	"github.com/acme/orders/internal/testenv"
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

	// More scrapes at once than the bound, while the first reading is held
	// up: whatever their order, MaxScrapes of them hold a slot (one
	// reading, the others waiting for it) and the rest are refused at once.
	const extra = 3
	type answer struct {
		code   int
		header http.Header
		body   string
	}
	var wg sync.WaitGroup
	answers := make(chan answer, metrics.MaxScrapes+extra)
	var refused atomic.Int64
	for range metrics.MaxScrapes + extra {
		wg.Go(func() {
			code, h, body := scrape()
			if code == http.StatusTooManyRequests {
				refused.Add(1)
			}
			answers <- answer{code, h, body}
		})
	}
	testenv.Eventually(t, 5*time.Second, "the scrapes past the bound are refused", func() bool { return refused.Load() == extra })
	close(release)
	wg.Wait()
	close(answers)
	ok := 0
	for a := range answers {
		switch a.code {
		case http.StatusOK:
			ok++
			if !strings.Contains(a.body, "orders_reads 1\n") {
				t.Errorf("a scrape that waited for the reading in progress:\n%s", a.body)
			}
		case http.StatusTooManyRequests:
			if a.header.Get("Retry-After") != "1" || a.header.Get("Content-Type") != "application/problem+json" ||
				!strings.Contains(a.body, `"type":"https://orders.acme.example/problems/scrapes-busy"`) {
				t.Errorf("a scrape past %d at once: %v %s; want 429 scrapes-busy with Retry-After: 1", metrics.MaxScrapes, a.header, a.body)
			}
		default:
			t.Errorf("a scrape: %d %s", a.code, a.body)
		}
	}
	if ok != metrics.MaxScrapes {
		t.Errorf("%d scrapes answered 200, want the %d within the bound", ok, metrics.MaxScrapes)
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
	// The slow ones may still be encoding: their slots come back after.
	testenv.Eventually(t, 20*time.Second, "a scrape beside those that never read gets its whole answer", func() bool {
		res, err := http.Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		n, _ := io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return res.StatusCode == http.StatusOK && n > 1<<20
	})
}
