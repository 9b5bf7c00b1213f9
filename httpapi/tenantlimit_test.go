package httpapi_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/acme/orders/auth"
	"github.com/acme/orders/command"
	"github.com/acme/orders/httpapi"
	"github.com/acme/orders/internal/testenv"
	"github.com/acme/orders/query"
)

// limitedAPI serves the API with per-tenant limits cfg (and a global
// in-flight limit of global, if positive) and returns its URL, the limits
// and a token maker.
type limitedAPI struct {
	url     string
	tenants *httpapi.TenantLimits
	global  *httpapi.InFlightLimit
	clients *auth.Clients
	db      *pgxpool.Pool
}

func newLimitedAPI(t *testing.T, cfg httpapi.TenantLimitConfig, global int, bodyTimeout time.Duration) limitedAPI {
	t.Helper()
	return newLimitedAPILogging(t, cfg, global, bodyTimeout, slog.New(slog.NewTextHandler(io.Discard, nil)))
}

// newLimitedAPILogging is newLimitedAPI logging to logger.
func newLimitedAPILogging(t *testing.T, cfg httpapi.TenantLimitConfig, global int, bodyTimeout time.Duration, logger *slog.Logger) limitedAPI {
	t.Helper()
	db := testenv.DB(t)
	idem, err := command.NewIdempotency(db, command.IdempotencyConfig{TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	clients := auth.NewClients(db, time.Minute)
	tenants, err := httpapi.NewTenantLimits(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var inFlight *httpapi.InFlightLimit
	if global > 0 {
		inFlight = httpapi.NewInFlightLimit(global)
	}
	srv := httptest.NewServer(validated(t, httpapi.New(httpapi.Deps{
		Logger: logger, Auth: clients,
		Idempotency: idem, Keys: idem, CreateOrder: command.NewCreateOrderHandler(),
		GetOrder:   query.NewGetOrderHandler(db, query.NewChanges()),
		ListOrders: query.NewListOrdersHandler(db),
		InFlight:   inFlight, Tenants: tenants, BodyTimeout: bodyTimeout,
	})))
	t.Cleanup(srv.Close)
	return limitedAPI{url: srv.URL, tenants: tenants, global: inFlight, clients: clients, db: db}
}

func (a limitedAPI) token(t *testing.T, tenant string) string {
	t.Helper()
	tok, err := a.clients.CreateToken(context.Background(), tenant, "test")
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// get sends GET path with token and extra headers and returns the status,
// the problem type (if any) and the Retry-After header.
func (a limitedAPI) get(t *testing.T, path string, header http.Header) (int, string, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, a.url+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var p struct{ Type string }
	b, _ := io.ReadAll(res.Body)
	_ = json.Unmarshal(b, &p)
	return res.StatusCode, strings.TrimPrefix(p.Type, "https://orders.acme.example/problems/"), res.Header.Get("Retry-After")
}

// fire sends GET path from any goroutine and returns the status (0 if the
// request failed).
func (a limitedAPI) fire(path string, header http.Header) int {
	req, err := http.NewRequest(http.MethodGet, a.url+path, nil)
	if err != nil {
		return 0
	}
	req.Header = header
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return res.StatusCode
}

func bearer(token string) http.Header { return http.Header{"Authorization": {"Bearer " + token}} }

// A tenant past its rate gets 429 tenant-rate-limited with Retry-After;
// another tenant is served.
func TestTenantRateLimit(t *testing.T) {
	t.Parallel()
	a := newLimitedAPI(t, httpapi.TenantLimitConfig{Rate: 0.5, Burst: 2}, 0, 0)
	noisy, quiet := a.token(t, "noisy"), a.token(t, "quiet")
	for i := range 2 {
		if st, typ, _ := a.get(t, "/v1/orders", bearer(noisy)); st != 200 {
			t.Fatalf("request %d within the burst: %d %s", i, st, typ)
		}
	}
	st, typ, retry := a.get(t, "/v1/orders", bearer(noisy))
	if st != 429 || typ != "tenant-rate-limited" {
		t.Fatalf("past the burst: %d %s, want 429 tenant-rate-limited", st, typ)
	}
	if n, err := strconv.Atoi(retry); err != nil || n < 1 || n > 2 {
		t.Fatalf("Retry-After %q, want 1 or 2 (seconds to the next token at 0.5/s)", retry)
	}
	if st, typ, _ := a.get(t, "/v1/orders", bearer(quiet)); st != 200 {
		t.Fatalf("the other tenant: %d %s, want 200", st, typ)
	}
	if s := a.tenants.Stats(); s.RateLimited != 1 {
		t.Fatalf("stats %+v, want 1 rate-limited", s)
	}
}

// A request refused for its query string counts towards its tenant's
// rate like any other: a flood of them is shed with 429, not answered 400
// for free (each costing the parse and the answer), while another tenant
// is served. The answer names at most ten parameters, however many.
func TestBadQueryStringsCountTowardsTheTenantsRate(t *testing.T) {
	t.Parallel()
	a := newLimitedAPI(t, httpapi.TenantLimitConfig{Rate: 0.5, Burst: 2}, 0, 0)
	noisy, quiet := a.token(t, "noisy"), a.token(t, "quiet")
	var q strings.Builder
	for i := range 1000 {
		fmt.Fprintf(&q, "p%d=&", i)
	}
	bad := "/v1/orders?" + strings.TrimSuffix(q.String(), "&")
	for i := range 2 {
		if st, typ, _ := a.get(t, bad, bearer(noisy)); st != 400 || typ != "invalid-parameter" {
			t.Fatalf("bad request %d within the burst: %d %s, want 400 invalid-parameter", i, st, typ)
		}
	}
	if st, typ, _ := a.get(t, bad, bearer(noisy)); st != 429 || typ != "tenant-rate-limited" {
		t.Fatalf("bad request past the burst: %d %s, want 429 tenant-rate-limited", st, typ)
	}
	if st, typ, _ := a.get(t, "/v1/orders", bearer(quiet)); st != 200 {
		t.Fatalf("the other tenant: %d %s, want 200", st, typ)
	}

	// The answer stays small: a query string of more parameters than any
	// route takes is refused before they are parsed, and one within that
	// bound names at most ten of its bad ones.
	var few strings.Builder
	for i := range 20 {
		fmt.Fprintf(&few, "p%02d=&", i)
	}
	st, typ, _ := a.get(t, bad, bearer(quiet))
	if st != 400 || typ != "invalid-parameter" {
		t.Fatalf("1000 parameters: %d %s, want 400 invalid-parameter", st, typ)
	}
	req, err := http.NewRequest(http.MethodGet, a.url+"/v1/orders?"+strings.TrimSuffix(few.String(), "&"), nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header = bearer(a.token(t, "third")) // quiet's burst is spent
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var p struct {
		Detail string
		Errors []struct{ Field string }
	}
	if err := json.NewDecoder(res.Body).Decode(&p); err != nil {
		t.Fatal(err)
	}
	if res.StatusCode != 400 || len(p.Errors) != 10 || p.Errors[0].Field != "p00" || !strings.HasSuffix(p.Detail, "and 10 more are each given more than once or empty.") {
		t.Fatalf("20 empty parameters: %d, %d errors, detail %q; want 400 naming ten and counting the rest", res.StatusCode, len(p.Errors), p.Detail)
	}
}

// A response costs its tenant a token per BytesPerToken bytes besides the
// request's one, taken after it is sent: a tenant asking for large pages
// within its request rate waits for what they cost, while another tenant
// is served; small responses cost one token each.
func TestLargeResponsesCostTheirTenantMoreTokens(t *testing.T) {
	t.Parallel()
	a := newLimitedAPI(t, httpapi.TenantLimitConfig{Rate: 1, Burst: 30, BytesPerToken: 1024}, 0, 0)
	heavy, quiet := a.token(t, "heavy"), a.token(t, "quiet")
	// 100 orders of 20 items in heavy's read model: a page of them is
	// about 100 KiB, 100 tokens' worth, so it costs the whole burst.
	if _, err := a.db.Exec(context.Background(), `
INSERT INTO order_views (tenant_id, order_id, customer_id, status, currency, items, total, version, created_at, updated_at)
SELECT 'heavy', gen_random_uuid(), 'c-1', 'pending', 'EUR',
       (SELECT jsonb_agg(jsonb_build_object('sku', 'sku-' || j, 'quantity', 1, 'unit_price', 100, 'line_total', 100)) FROM generate_series(1, 20) j),
       2000, 1, now() - make_interval(secs => i), now()
FROM generate_series(1, 100) i`); err != nil {
		t.Fatal(err)
	}
	// Small answers cost a token each: 20 of them fit the burst of 30.
	for i := range 20 {
		if st, typ, _ := a.get(t, "/v1/orders?limit=1&status=shipped", bearer(quiet)); st != 200 {
			t.Fatalf("small read %d of the quiet tenant: %d %s", i, st, typ)
		}
	}
	if st, typ, _ := a.get(t, "/v1/orders?limit=100", bearer(heavy)); st != 200 {
		t.Fatalf("heavy's first page: %d %s", st, typ)
	}
	st, typ, retry := a.get(t, "/v1/orders?limit=1", bearer(heavy))
	if n, _ := strconv.Atoi(retry); st != 429 || typ != "tenant-rate-limited" || n < 2 {
		t.Fatalf("heavy's read after a page that cost its burst: %d %s Retry-After %q; want 429 tenant-rate-limited, seconds to pay it back", st, typ, retry)
	}
	if st, typ, _ := a.get(t, "/v1/orders?limit=1&status=shipped", bearer(quiet)); st != 200 {
		t.Fatalf("the quiet tenant meanwhile: %d %s, want 200", st, typ)
	}
}

// A request body costs its tenant a token per BytesPerToken bytes too,
// whatever the answer: a tenant sending megabyte bodies that are refused
// (here, 1,000 items where 100 are allowed) waits for what reading and
// checking them cost, while another tenant is served.
func TestLargeBodiesCostTheirTenantMoreTokens(t *testing.T) {
	t.Parallel()
	a := newLimitedAPI(t, httpapi.TenantLimitConfig{Rate: 1, Burst: 30, BytesPerToken: 1024}, 0, 0)
	heavy, quiet := a.token(t, "heavy"), a.token(t, "quiet")
	items := strings.TrimSuffix(strings.Repeat(`{"sku":"a-rather-long-sku-to-make-the-body-large","quantity":1,"unit_price":100},`, 1000), ",")
	body := `{"customer_id":"c-1","currency":"EUR","items":[` + items + `]}` // about 80 KiB: 80 tokens
	post := func(token, key string) (int, string) {
		req, err := http.NewRequest(http.MethodPost, a.url+"/v1/orders", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header = bearer(token)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var p struct{ Type string }
		_ = json.NewDecoder(res.Body).Decode(&p)
		return res.StatusCode, strings.TrimPrefix(p.Type, "https://orders.acme.example/problems/")
	}
	if st, typ := post(heavy, "k-1"); st != 422 || typ != "validation-failed" {
		t.Fatalf("a body of 1,000 items: %d %s, want 422 validation-failed", st, typ)
	}
	if st, typ := post(heavy, "k-2"); st != 429 || typ != "tenant-rate-limited" {
		t.Fatalf("heavy's next request after a body that cost its burst: %d %s, want 429 tenant-rate-limited", st, typ)
	}
	if st, typ, _ := a.get(t, "/v1/orders?limit=1", bearer(quiet)); st != 200 {
		t.Fatalf("the quiet tenant meanwhile: %d %s, want 200", st, typ)
	}
}

// A tenant at its in-flight limit, or at its limit of waiting
// read-your-writes readers, gets 429 tenant-overloaded with Retry-After;
// another tenant is served meanwhile.
func TestTenantInFlightAndWaitingReaders(t *testing.T) {
	t.Parallel()
	a := newLimitedAPI(t, httpapi.TenantLimitConfig{MaxInFlight: 2, MaxWaiting: 1}, 0, 0)
	noisy, quiet := a.token(t, "noisy"), a.token(t, "quiet")
	waitFor := func(tok string) http.Header {
		h := bearer(tok)
		h.Set("Prefer", "wait=3")
		return h
	}
	// A reader of an order that never appears waits its 3 s.
	held := "/v1/orders/" + uuid.NewString() + "?min_version=1"
	done := make(chan int, 1)
	go func() { done <- a.fire(held, waitFor(noisy)) }()
	testenv.Eventually(t, 2*time.Second, "the reader waits", func() bool { return a.tenants.Stats().Waiting == 1 })

	st, typ, retry := a.get(t, held, waitFor(noisy))
	if st != 429 || typ != "tenant-overloaded" || retry == "" {
		t.Fatalf("a second waiting reader: %d %s Retry-After %q, want 429 tenant-overloaded with Retry-After", st, typ, retry)
	}
	if st, typ, _ := a.get(t, held, waitFor(quiet)); st != 404 {
		// The quiet tenant's reader is admitted: it waits, then is told
		// there is no such order (not even in the write model).
		t.Fatalf("the other tenant's reader: %d %s, want 404 after its wait", st, typ)
	}
	// A plain read of the noisy tenant is still admitted (1 of 2 in flight).
	if st, typ, _ := a.get(t, "/v1/orders", bearer(noisy)); st != 200 {
		t.Fatalf("a plain read beside the waiter: %d %s", st, typ)
	}
	if st := <-done; st != 404 {
		t.Fatalf("the held reader: %d, want 404", st)
	}

	// Fill the noisy tenant's two in-flight slots with waiting readers.
	b := newLimitedAPI(t, httpapi.TenantLimitConfig{MaxInFlight: 2, MaxWaiting: 2}, 0, 0)
	noisy, quiet = b.token(t, "noisy"), b.token(t, "quiet")
	for range 2 {
		go b.fire(held, waitFor(noisy))
	}
	testenv.Eventually(t, 2*time.Second, "two in flight", func() bool { return b.tenants.Stats().InFlight == 2 })
	if st, typ, retry := b.get(t, "/v1/orders", bearer(noisy)); st != 429 || typ != "tenant-overloaded" || retry == "" {
		t.Fatalf("a third request: %d %s Retry-After %q, want 429 tenant-overloaded", st, typ, retry)
	}
	if st, typ, _ := b.get(t, "/v1/orders", bearer(quiet)); st != 200 {
		t.Fatalf("the other tenant: %d %s, want 200", st, typ)
	}
}

// Authentication comes before any shared slot: with the global limit full,
// a forged token still gets 401 (not 429), and costs no database look-up.
// Two Authorization headers are refused like two Idempotency-Keys.
func TestAuthenticationBeforeSlots(t *testing.T) {
	t.Parallel()
	a := newLimitedAPI(t, httpapi.TenantLimitConfig{MaxInFlight: 5, MaxWaiting: 5}, 1, 0)
	tok := a.token(t, "acme")
	h := bearer(tok)
	h.Set("Prefer", "wait=2")
	go a.fire("/v1/orders/"+uuid.NewString()+"?min_version=1", h)
	testenv.Eventually(t, 2*time.Second, "the global slot is taken", func() bool { return a.global.InFlight() == 1 })

	forged := "ord_" + strings.Repeat("A", 49)
	st, typ, _ := a.get(t, "/v1/orders", bearer(forged))
	if st != 401 || typ != "unauthorized" {
		t.Fatalf("forged token: %d %s, want 401 unauthorized", st, typ)
	}
	if n := a.clients.Stats().Lookups; n != 1 { // the real token's
		t.Fatalf("%d token look-ups, want 1", n)
	}
	if a.global.Shed() != 0 {
		t.Fatalf("the forged request took part in the global limit (shed %d)", a.global.Shed())
	}
	two := http.Header{"Authorization": {"Bearer " + tok, "Bearer " + tok}}
	if st, typ, _ := a.get(t, "/v1/orders", two); st != 400 || typ != "invalid-authorization" {
		t.Fatalf("two Authorization headers: %d %s, want 400 invalid-authorization", st, typ)
	}
}

// The 401 names the command that makes a token.
func TestUnauthorizedNamesTheCommand(t *testing.T) {
	t.Parallel()
	a := newLimitedAPI(t, httpapi.TenantLimitConfig{}, 0, 0)
	req, _ := http.NewRequest(http.MethodGet, a.url+"/v1/orders", nil)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 401 || !strings.Contains(string(b), "go run ./cmd/api token create -tenant NAME") {
		t.Fatalf("401 body %s, want it to name `go run ./cmd/api token create -tenant NAME`", b)
	}
}

// A body that trickles in is cut off after the body timeout with 408, and
// its tenant slot is free again at once.
func TestTricklingBodyIsCutOff(t *testing.T) {
	t.Parallel()
	a := newLimitedAPI(t, httpapi.TenantLimitConfig{MaxInFlight: 1}, 0, 500*time.Millisecond)
	tok := a.token(t, "slow")
	conn, err := net.Dial("tcp", strings.TrimPrefix(a.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	start := time.Now()
	fmt.Fprintf(conn, "POST /v1/orders HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nIdempotency-Key: k1\r\n"+
		"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n", tok)
	stop := make(chan struct{})
	defer close(stop)
	go func() { // one byte every 200 ms, for 20 s if let
		for range 100 {
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
			if _, err := conn.Write([]byte(" ")); err != nil {
				return
			}
		}
	}()
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no response to the trickling body after %s: %v", time.Since(start), err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusRequestTimeout || res.Header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("trickling body: %d %s, want 408 problem+json", res.StatusCode, res.Header.Get("Content-Type"))
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("cut off after %s, want about 0.5 s", d)
	}
	testenv.Eventually(t, time.Second, "the tenant slot is free", func() bool { return a.tenants.Stats().InFlight == 0 })
	if st, typ, _ := a.get(t, "/v1/orders", bearer(tok)); st != 200 {
		t.Fatalf("next request of the tenant: %d %s", st, typ)
	}
}

// A body sent where nothing reads one (outside /v1) does not hold its
// connection while it trickles in: the answer closes the connection at
// once, instead of net/http discarding the body up to the body timeout
// first (a connection the connection limit cannot close for a new one).
func TestABodyNobodyReadsDoesNotHoldItsConnection(t *testing.T) {
	t.Parallel()
	a := newLimitedAPI(t, httpapi.TenantLimitConfig{}, 0, 5*time.Second)
	for _, path := range []string{"/healthz", "/no-such-path"} {
		conn, err := net.Dial("tcp", strings.TrimPrefix(a.url, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{", path) // 1 of 100 bytes, then silence
		_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		br := bufio.NewReader(conn)
		res, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("%s: no response: %v", path, err)
		}
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		if !res.Close {
			t.Fatalf("%s: %d without Connection: close", path, res.StatusCode)
		}
		if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
			t.Fatalf("%s: after the answer the connection gave %v, want it closed", path, err)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Fatalf("%s: the connection was closed after %s, want at once (the body timeout is 5 s)", path, d)
		}
		conn.Close()
	}
}

// The per-tenant state is bounded: past MaxTenants, idle tenants are
// forgotten.
func TestTenantStateIsBounded(t *testing.T) {
	t.Parallel()
	a := newLimitedAPI(t, httpapi.TenantLimitConfig{MaxTenants: 2}, 0, 0)
	for i := range 5 {
		tok := a.token(t, fmt.Sprintf("t%d", i))
		if st, typ, _ := a.get(t, "/v1/orders", bearer(tok)); st != 200 {
			t.Fatalf("tenant %d: %d %s", i, st, typ)
		}
		if n := a.tenants.Stats().Tenants; n > 2 {
			t.Fatalf("%d tenants tracked, want at most 2", n)
		}
	}
}

func TestTenantLimitConfigIsValidated(t *testing.T) {
	t.Parallel()
	for _, cfg := range []httpapi.TenantLimitConfig{
		{MaxInFlight: -1}, {MaxWaiting: -1}, {Rate: -1}, {Burst: -1}, {MaxTenants: -1}, {IdleAfter: -time.Second},
		{MaxInFlight: 2, MaxWaiting: 3},
	} {
		if _, err := httpapi.NewTenantLimits(cfg); err == nil {
			t.Errorf("NewTenantLimits(%+v): no error", cfg)
		}
	}
}
