package app

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/acme/orders/httpapi"
	"github.com/acme/orders/internal/mono"
	"github.com/acme/orders/internal/testenv"
)

// serveLimited serves h with at most max connections open and returns its
// URL and the limiter.
func serveLimited(t *testing.T, max int, h http.Handler) (string, *connLimit) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := limitConns(ln, max)
	srv := &http.Server{Handler: h, ConnState: l.connState}
	go srv.Serve(l) //nolint:errcheck
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String(), l
}

// tracked returns how many connections l knows as idle and as fresh.
func tracked(l *connLimit) (idle, fresh int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.idle), len(l.fresh)
}

// get sends a GET through its own transport (so its own connections) and
// reports whether it reused a connection.
func get(t *testing.T, tr *http.Transport, url string) (reused bool) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
		GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused }}))
	c := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET: %v", err)
	}
	io.Copy(io.Discard, resp.Body) //nolint:errcheck
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET: %s", resp.Status)
	}
	return reused
}

// At the limit, a new connection is served by closing the connection idle
// the longest, never by going past the limit, and the other idle one is
// kept.
func TestConnLimitClosesTheLongestIdleConnectionForANewOne(t *testing.T) {
	url, l := serveLimited(t, 2, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	a, b, c := &http.Transport{}, &http.Transport{}, &http.Transport{}
	defer a.CloseIdleConnections()
	defer b.CloseIdleConnections()
	defer c.CloseIdleConnections()
	get(t, a, url)
	testenv.Eventually(t, 5*time.Second, "a's connection is idle, before b's", func() bool { idle, _ := tracked(l); return idle == 1 })
	get(t, b, url)
	get(t, c, url) // a third connection: a's is closed for it
	if !get(t, b, url) {
		t.Error("b's idle connection was closed; the one idle the longest (a's) should have been")
	}
	if get(t, a, url) {
		t.Error("a's connection, idle the longest, was kept past the limit")
	}
	if idle, slow := l.closedIdle.Load(), l.closedSlow.Load(); idle < 1 || slow != 0 {
		t.Errorf("closed for a new connection: %d idle, %d slow; want at least 1 idle (a's), no slow", idle, slow)
	}
}

// With every connection busy, a new one waits (in the kernel's accept
// queue) until one is free, and is then served: it is neither refused nor
// let past the limit.
func TestConnLimitQueuesANewConnectionWhileAllAreBusy(t *testing.T) {
	release := make(chan struct{})
	var served atomic.Int64
	url, _ := serveLimited(t, 1, http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		served.Add(1)
		if r.URL.Path == "/slow" {
			<-release
		}
	}))
	a, b := &http.Transport{}, &http.Transport{}
	defer a.CloseIdleConnections()
	defer b.CloseIdleConnections()
	slow := make(chan bool)
	go func() { slow <- get(t, a, url+"/slow") }()
	testenv.Eventually(t, 5*time.Second, "the slow request is served", func() bool { return served.Load() > 0 })
	done := make(chan struct{})
	go func() { get(t, b, url+"/fast"); close(done) }()
	select {
	case <-done:
		t.Fatal("a second connection was served while the only slot was busy")
	case <-time.After(200 * time.Millisecond):
	}
	if n := served.Load(); n != 1 {
		t.Fatalf("%d requests served while the slot was busy, want 1", n)
	}
	close(release)
	<-slow
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the waiting connection was not served after the slot freed")
	}
}

// Closing the listener ends an Accept that waits for a slot.
func TestConnLimitCloseEndsAWaitingAccept(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := limitConns(ln, 1)
	for range 2 {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	if _, err := l.Accept(); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	// The second has no slot. Whether Close comes while it waits for one
	// or before it takes the connection, it must end with an error.
	go func() { _, err := l.Accept(); errc <- err }()
	l.Close()
	select {
	case err := <-errc:
		if err == nil {
			t.Fatal("Accept after Close returned a connection")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Accept still waits for a slot after Close")
	}
}

// The api refuses a connection limit below its in-flight limit (every
// request in flight needs a connection) or above MaxAPIConns (whose memory
// budget would overflow), and takes the default otherwise.
func TestAPIConnLimitIsAtLeastTheInFlightLimit(t *testing.T) {
	env := func(vars map[string]string) *Env { return NewEnv(func(k string) string { return vars[k] }) }
	for _, v := range []string{"100", fmt.Sprint(MaxAPIConns + 1), "281474976710656"} {
		if _, err := parseAPIConfig("", nil, env(map[string]string{"MAX_CONNS": v})); err == nil ||
			!strings.Contains(err.Error(), "-max-conns") {
			t.Errorf("MAX_CONNS=%s: err %v, want one naming -max-conns", v, err)
		}
	}
	if _, err := parseAPIConfig("", nil, env(map[string]string{"MAX_CONNS": fmt.Sprint(MaxAPIConns)})); err != nil {
		t.Errorf("MAX_CONNS=%d (the most): %v", MaxAPIConns, err)
	}
	cfg, err := parseAPIConfig("", nil, env(map[string]string{}))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.maxConns != DefaultAPIMaxConns {
		t.Errorf("maxConns = %d, want the default %d", cfg.maxConns, DefaultAPIMaxConns)
	}
}

// A connection that sends nothing holds its slot only until a new one needs
// it and it has been silent for silentAfter: silent sockets cannot lock
// the clients that send requests out.
func TestConnLimitClosesASilentConnectionForANewOne(t *testing.T) {
	url, l := serveLimited(t, 1, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	silent, err := net.Dial("tcp", url[len("http://"):])
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	testenv.Eventually(t, 5*time.Second, "the silent connection is accepted first", func() bool { _, fresh := tracked(l); return fresh == 1 })
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	start := time.Now()
	get(t, tr, url)
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("a request waited %s behind a silent connection", took)
	}
	silent.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := silent.Read(make([]byte, 1)); err == nil {
		t.Error("the silent connection was not closed")
	}
}

// A keep-alive connection whose next request has begun to arrive is not
// idle any more: a new connection waits for the slot rather than have that
// connection closed under the request (net/http reports it active only
// once the whole header is in).
func TestConnLimitKeepsAConnectionWhoseRequestHasBegun(t *testing.T) {
	url, l := serveLimited(t, 1, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, r.URL.Path) })) //nolint:errcheck
	a, br := idleKeepAlive(t, url, l)
	fmt.Fprint(a, "GET /two HTTP/1.1\r\n") // the next request begins
	testenv.Eventually(t, 5*time.Second, "the server reads it", func() bool { idle, _ := tracked(l); return idle == 0 })

	b := &http.Transport{}
	defer b.CloseIdleConnections()
	done := make(chan error, 1)
	go func() { done <- getErr(b, url+"/b") }() // waits for the slot
	time.Sleep(50 * time.Millisecond)           // room for Accept to close a's connection, if it would (within silentAfter)

	fmt.Fprint(a, "Host: x\r\n\r\n")
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("the request that had begun lost its connection to a new one: %v", err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if string(body) != "/two" {
		t.Fatalf("second request: %q", body)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the waiting connection, served once a's went idle: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the waiting connection was not served once a's went idle")
	}
}

// getErr sends a GET through tr and reports any failure: for a goroutine
// other than the test's.
func getErr(tr *http.Transport, url string) error {
	resp, err := (&http.Client{Transport: tr, Timeout: 5 * time.Second}).Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body) //nolint:errcheck
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return nil
}

// A keep-alive connection that begins its next request and stalls ("GET",
// three bytes: net/http waits up to IdleTimeout for a fourth) gives up its
// slot to a new connection after silentAfter, like a new connection that
// trickles its header: beginning a request buys no more than that.
func TestConnLimitClosesAKeepAliveConnectionThatBeganARequestAndStalled(t *testing.T) {
	url, l := serveLimited(t, 1, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	a, br := idleKeepAlive(t, url, l)
	fmt.Fprint(a, "GET") // and no more
	testenv.Eventually(t, 5*time.Second, "the server reads it", func() bool { idle, _ := tracked(l); return idle == 0 })

	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	get(t, tr, url) // served: a's connection is closed for it
	if _, err := br.ReadByte(); err == nil {
		t.Error("the stalled connection was answered, not closed")
	}
}

// A new connection that has begun its first header but not finished it is
// still closable for another after silentAfter: a client sends its header
// at once, so one that trickles it is slow, or an attack that would hold
// the slot until ReadHeaderTimeout.
func TestConnLimitClosesANewConnectionTricklingItsHeader(t *testing.T) {
	url, l := serveLimited(t, 1, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	slow, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	fmt.Fprint(slow, "GET / HTTP/1.1\r\n") // and no more
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	get(t, tr, url) // served: the slow one is closed for it
	_ = slow.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := slow.Read(make([]byte, 1)); err == nil {
		t.Error("the connection trickling its header was answered, not closed")
	}
	if idle, slow := l.closedIdle.Load(), l.closedSlow.Load(); idle != 0 || slow != 1 {
		t.Errorf("closed for a new connection: %d idle, %d slow; want 0 and 1", idle, slow)
	}
}

// The limiter's state is exported on the api's registry: the connections
// open and those closed for a new one, by reason.
func TestConnLimitRegistersItsMetrics(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	l := limitConns(ln, 1)
	l.closedSlow.Add(2)
	l.closedStalled.Add(3)
	reg := prometheus.NewRegistry()
	l.register(reg)
	got, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]float64{}
	for _, mf := range got {
		for _, m := range mf.GetMetric() {
			name := mf.GetName()
			for _, lp := range m.GetLabel() {
				name += "{" + lp.GetName() + "=" + lp.GetValue() + "}"
			}
			seen[name] = m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	want := map[string]float64{"orders_http_connections_open": 0,
		"orders_http_connections_closed_for_new_total{reason=idle}":    0,
		"orders_http_connections_closed_for_new_total{reason=slow}":    2,
		"orders_http_connections_closed_for_new_total{reason=stalled}": 3}
	for name, v := range want {
		if g, ok := seen[name]; !ok || g != v {
			t.Errorf("%s = %v (exported: %v), want %v", name, g, ok, v)
		}
	}
}

// idleKeepAlive opens a raw connection to url, sends one request on it and
// reads the answer, and returns it once l holds it as idle, with its reader.
func idleKeepAlive(t *testing.T, url string, l *connLimit) (net.Conn, *bufio.Reader) {
	t.Helper()
	a, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	_ = a.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(a)
	fmt.Fprint(a, "GET /one HTTP/1.1\r\nHost: x\r\n\r\n")
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("first request: %v", err)
	}
	io.Copy(io.Discard, res.Body) //nolint:errcheck
	res.Body.Close()
	testenv.Eventually(t, 5*time.Second, "the connection is idle", func() bool { idle, _ := tracked(l); return idle == 1 })
	return a, br
}

// A client with no token that sends a request with a body it trickles (a
// byte a second) holds its connection slot no longer than the body timeout,
// on every path: outside /v1 no handler reads a body, net/http discarded
// it under the server's ReadTimeout (30 s) alone, and two such clients at
// -max-conns 2 kept every other client waiting that long; on /v1 a 401
// closes the connection, but only after that same discard. Either way the
// connection limit, which assumes a request holds its slot for its header
// and then its body timeout, could not close them.
func TestTrickledBodyDoesNotHoldAConnectionSlot(t *testing.T) {
	t.Parallel()
	const bodyTimeout = time.Second // what bounds each attacker; a legitimate request waits about that long
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	h := httpapi.New(httpapi.Deps{Logger: logger, BodyTimeout: bodyTimeout})
	for _, path := range []string{"/openapi.json", "/healthz", "/no-such-path", "/v1/orders"} {
		t.Run(path, func(t *testing.T) {
			t.Parallel()
			reg := prometheus.NewRegistry()
			addr := serveConns(t, h, logger, 2, reg)

			done := make(chan struct{})
			var trickling sync.WaitGroup
			t.Cleanup(func() {
				close(done)
				trickling.Wait()
			})
			for range 2 { // two attackers, no token; -max-conns is 2
				c := dialUntilListening(t, addr)
				fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\nx", path)
				trickling.Go(func() {
					defer c.Close()
					for range 60 {
						select {
						case <-done:
							return
						case <-time.After(time.Second):
						}
						if _, err := c.Write([]byte("x")); err != nil {
							return
						}
					}
				})
			}
			if strings.HasPrefix(path, "/v1/") {
				// Outside /v1 nothing reads a body: the answer closes the
				// attacker's connection at once (httpapi's
				// TestABodyNobodyReadsDoesNotHoldItsConnection).
				testenv.Eventually(t, 5*time.Second, "both attackers' connections are open", func() bool { return gaugeValue(t, reg, "orders_http_connections_open") == 2 })
			}

			// Served once an attacker's body timeout has passed: in about
			// bodyTimeout, not the 30 s of ReadTimeout.
			client := &http.Client{Timeout: 10 * bodyTimeout}
			resp, err := client.Get("http://" + addr + "/healthz")
			if err != nil {
				t.Fatalf("a legitimate request was not served within %s: %v", client.Timeout, err)
			}
			resp.Body.Close()
		})
	}
}

// dialUntilListening connects to addr, retrying while nothing listens there
// yet (for up to 5 s).
func dialUntilListening(t *testing.T, addr string) net.Conn {
	t.Helper()
	var c net.Conn
	testenv.Eventually(t, 5*time.Second, "something listens on "+addr, func() bool {
		var err error
		c, err = net.Dial("tcp", addr)
		return err == nil
	})
	return c
}

// gaugeValue is the value of the gauge name on reg (-1 if it has none).
func gaugeValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return -1
}

// serveConns serves h with ServeConns (at most maxConns connections, their
// state on reg) on a free local port until the test ends, and returns the
// address.
func serveConns(t *testing.T, h http.Handler, logger *slog.Logger, maxConns int, reg prometheus.Registerer) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- ServeConns(ctx, addr, h, logger, time.Second, maxConns, reg) }()
	t.Cleanup(func() {
		cancel()
		<-served
	})
	return addr
}

// A connection whose client sends requests and never reads the answers
// holds its slot only until a new connection needs it and its write has
// been blocked for stalledAfter: clients that stop reading cannot lock out
// the ones that read. (Before, 1,024 such connections, pipelining GET
// /openapi.json without a token, locked every tenant out until the
// server's WriteTimeout.)
func TestConnLimitClosesAConnectionWhoseClientReadsNothingForANewOne(t *testing.T) {
	chunk := make([]byte, 64<<10)
	url, l := serveLimited(t, 2, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/big" {
			return
		}
		for { // far more than any socket buffer holds
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	}))
	addr := url[len("http://"):]
	for range 2 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.(*net.TCPConn).SetReadBuffer(4 << 10)
		if _, err := io.WriteString(c, "GET /big HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 10*time.Second, "both connections stall writing", func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		n := 0
		for c := range l.all {
			if w := c.writingSince.Load(); w != 0 && mono.Since(w) > 100*time.Millisecond {
				n++
			}
		}
		return n == 2
	})
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	start := time.Now()
	get(t, tr, url)
	if took := time.Since(start); took > stalledAfter+2*time.Second {
		t.Errorf("a request waited %s behind connections that read nothing", took)
	}
	if n := l.closedStalled.Load(); n != 1 {
		t.Errorf("%d stalled connections closed, want 1 (one slot was needed)", n)
	}
}

// A client that reads a large answer steadily, if slowly, is not stalled:
// at the limit, a new connection waits for it rather than cut its answer
// off (a write of the whole body used to count as stalled once it had
// lasted stalledAfter, however fast the client took the bytes).
func TestConnLimitKeepsAConnectionWhoseClientReadsSlowly(t *testing.T) {
	body := make([]byte, 8<<20)
	url, l := serveLimited(t, 1, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/big" {
			w.Write(body) //nolint:errcheck
		}
	}))
	c, err := net.Dial("tcp", url[len("http://"):])
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "GET /big HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	got := make(chan int64, 1)
	go func() { // about 800 KB/s: the 8 MiB take some 10 s
		var n int64
		buf := make([]byte, 16<<10)
		for {
			m, err := c.Read(buf)
			n += int64(m)
			if err != nil || n >= int64(len(body)) {
				got <- n
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	// Sleeps, not polls: the answer must have been under way for longer
	// than stalledAfter before the new connection comes, and the assertion
	// is that nothing happens over the next window.
	time.Sleep(stalledAfter + 500*time.Millisecond)
	go getErr(&http.Transport{}, url) //nolint:errcheck // waits for the slot
	time.Sleep(2 * stalledAfter)
	if n := l.closedStalled.Load(); n != 0 {
		t.Fatalf("%d connections closed as stalled while their client read", n)
	}
	c.Close()
	if n := <-got; n < 1<<20 {
		t.Errorf("the reader got %d bytes", n)
	} else {
		t.Logf("the reader got %d bytes", n)
	}
}

// The group commit's default fits any pool the api accepts (-db-pool-size
// 4 gets 2 slots), and a setting above half the pool, however its size
// was set, is refused.
func TestCreateGroupSlotsFitThePool(t *testing.T) {
	for _, c := range []struct{ flag, pool, want int }{{-1, 20, 4}, {-1, 4, 2}, {-1, 7, 3}, {0, 4, 0}, {10, 20, 10}} {
		if got, err := createGroupSlots(c.flag, c.pool); err != nil || got != c.want {
			t.Errorf("createGroupSlots(%d, pool %d) = %d, %v; want %d", c.flag, c.pool, got, err, c.want)
		}
	}
	if _, err := createGroupSlots(4, 4); err == nil || !strings.Contains(err.Error(), "-create-group-slots") {
		t.Errorf("4 slots on a pool of 4: %v; want an error naming -create-group-slots", err)
	}
	if _, err := parseAPIConfig("", nil, NewEnv(func(k string) string { return map[string]string{"DB_POOL_SIZE": "4"}[k] })); err != nil {
		t.Errorf("DB_POOL_SIZE=4 with the default group slots: %v", err)
	}
}

// The api refuses a key wait lock_timeout cannot take or the server's
// write timeout cannot answer within (700h made every claim but a
// create's fail with 500), and a janitor interval that would switch the
// janitor off (expired keys counted against the quota for good).
func TestAPIRefusesKeyWaitsAndJanitorIntervalsItCannotKeep(t *testing.T) {
	env := func(vars map[string]string) *Env { return NewEnv(func(k string) string { return vars[k] }) }
	for _, tt := range []struct{ name, value, flag string }{
		{"IDEMPOTENCY_WAIT", "700h", "-idempotency-wait"},
		{"IDEMPOTENCY_WAIT", "16s", "-idempotency-wait"},
		{"IDEMPOTENCY_WAIT", "-1s", "-idempotency-wait"},
		{"IDEMPOTENCY_JANITOR_INTERVAL", "0s", "-idempotency-janitor-interval"},
		{"IDEMPOTENCY_JANITOR_INTERVAL", "-1m", "-idempotency-janitor-interval"},
	} {
		if _, err := parseAPIConfig("", nil, env(map[string]string{tt.name: tt.value})); err == nil || !strings.Contains(err.Error(), tt.flag) {
			t.Errorf("%s=%s: err %v, want one naming %s", tt.name, tt.value, err, tt.flag)
		}
	}
	for _, v := range []string{"0s", "15s"} {
		if _, err := parseAPIConfig("", nil, env(map[string]string{"IDEMPOTENCY_WAIT": v})); err != nil {
			t.Errorf("IDEMPOTENCY_WAIT=%s: %v", v, err)
		}
	}
}
