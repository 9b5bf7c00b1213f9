package client_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/acme/orders/client"
	"github.com/acme/orders/internal/app"
	"github.com/acme/orders/internal/testenv"
)

// The tests and examples of this package share one real stack (api with
// its relay, projector, PostgreSQL database, embedded NATS), started on
// first use; each test is a tenant of its own, which the service isolates.
var (
	stackOnce sync.Once
	stackEnv  map[string]string
	stackURL  string
	mainT     = &mainTB{}
)

func TestMain(m *testing.M) {
	code := m.Run()
	mainT.cleanup()
	os.Exit(code)
}

// stack starts the shared stack once and returns its environment and the
// api's base URL.
func stack() (map[string]string, string) {
	stackOnce.Do(func() {
		env := map[string]string{
			"DATABASE_URL":         testenv.DatabaseURL(mainT),
			"NATS_URL":             testenv.NATS(mainT).ClientURL(),
			"LOG_FORMAT":           "json",
			"TENANT_RATE":          "100000",
			"TENANT_BURST":         "100000",
			"TENANT_MAX_IN_FLIGHT": "511",
			"TENANT_MAX_WAITING":   "511",
		}
		stackURL = start(env, "api", app.RunAPI)
		start(env, "projector", app.RunProjector)
		stackEnv = env
	})
	return stackEnv, stackURL
}

// start runs a program of the service until TestMain ends and returns the
// base URL it serves on.
func start(env map[string]string, name string, run testenv.Program) string {
	return testenv.StartProgram(mainT, name, run, env)
}

// newTenant returns a token of a tenant no other test uses.
func newTenant(tenant string) string {
	env, _ := stack()
	var out bytes.Buffer
	if err := app.RunAPI(context.Background(), []string{"api", "token", "create", "-tenant", tenant}, func(k string) string { return env[k] }, &out); err != nil {
		panic(fmt.Sprintf("api token create: %v", err))
	}
	return strings.TrimSpace(out.String())
}

// tenantName makes a tenant name no other test uses.
func tenantName() string {
	return "t-" + strings.ReplaceAll(uuid.NewString(), "-", "")[:16]
}

// newClient returns a client of a fresh tenant, talking to base (the api or
// a proxy in front of it), with short backoffs.
func newClient(t *testing.T, base string, opts ...client.Option) (*client.Client, string) {
	t.Helper()
	tenant := tenantName()
	opts = append([]client.Option{client.WithBackoff(20*time.Millisecond, 200*time.Millisecond)}, opts...)
	c, err := client.New(base, newTenant(tenant), opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c, tenant
}

// count runs a count query on the stack's database.
func count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	env, _ := stack()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, env["DATABASE_URL"])
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func ordersOf(t *testing.T, tenant string) int {
	t.Helper()
	return count(t, `SELECT count(*) FROM orders WHERE tenant_id = $1`, tenant)
}

// attempt is one request the proxy saw.
type attempt struct {
	method, path, key string
	body              []byte
	status            int // what the client was answered (0: connection cut)
}

// fault says what the proxy does with attempt n (from 1): pass it on, or
// inject a fault.
type fault int

const (
	pass               fault = iota
	loseResponse             // forward, let the api commit, then cut the connection
	fail503Before            // answer 503 without forwarding
	fail503After             // forward, let the api commit, then answer 503
	fail429Before            // answer 429 with Retry-After: 1 without forwarding
	fail408Before            // answer the api's 408 body-timeout without forwarding
	fail409LaterBefore       // answer a 409 conflict with Retry-After: 1 (a refusal for now) without forwarding
)

// proxy sits between a client and the real api and injects faults.
type proxy struct {
	target string
	plan   func(n int) fault
	after  func(n int, status int) // runs after attempt n was answered

	mu       sync.Mutex
	attempts []attempt
}

func newProxy(t *testing.T, plan func(n int) fault) (*proxy, string) {
	t.Helper()
	_, api := stack()
	p := &proxy{target: api, plan: plan}
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	return p, srv.URL
}

func (p *proxy) seen() []attempt {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]attempt(nil), p.attempts...)
}

func (p *proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	p.mu.Lock()
	p.attempts = append(p.attempts, attempt{method: r.Method, path: r.URL.Path, key: r.Header.Get("Idempotency-Key"), body: body})
	n := len(p.attempts)
	p.mu.Unlock()
	answered := func(status int) {
		p.mu.Lock()
		p.attempts[n-1].status = status
		p.mu.Unlock()
		if p.after != nil {
			p.after(n, status)
		}
	}

	f := p.plan(n)
	switch f {
	case fail503Before:
		answered(http.StatusServiceUnavailable)
		http.Error(w, "injected 503", http.StatusServiceUnavailable)
		return
	case fail429Before:
		answered(http.StatusTooManyRequests)
		w.Header().Set("Retry-After", "1")
		http.Error(w, "injected 429", http.StatusTooManyRequests)
		return
	case fail408Before:
		answered(http.StatusRequestTimeout)
		w.Header().Set("Content-Type", "application/problem+json")
		w.Header().Set("Connection", "close")
		w.WriteHeader(http.StatusRequestTimeout)
		_, _ = w.Write([]byte(`{"type":"https://orders.acme.example/problems/body-timeout","title":"Request body too slow","status":408}`))
		return
	case fail409LaterBefore:
		answered(http.StatusConflict)
		w.Header().Set("Content-Type", "application/problem+json")
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusConflict)
		_, _ = w.Write([]byte(`{"type":"https://orders.acme.example/problems/conflict","title":"Conflict with the current state","status":409,"current_status":"payment_pending"}`))
		return
	}
	req, err := http.NewRequestWithContext(r.Context(), r.Method, p.target+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		panic(err)
	}
	req.Header = r.Header.Clone()
	res, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	defer res.Body.Close()
	resBody, err := io.ReadAll(res.Body) // the api has answered: it committed
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	switch f {
	case loseResponse:
		answered(0)
		panic(http.ErrAbortHandler) // the connection is cut, nothing written
	case fail503After:
		answered(http.StatusServiceUnavailable)
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(`{"type":"about:blank","title":"Service Unavailable","status":503}`))
		return
	}
	for k, v := range res.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(res.StatusCode)
	_, _ = w.Write(resBody)
	answered(res.StatusCode)
}

// mainTB lets TestMain's shared stack use testenv's helpers: it runs their
// cleanups when TestMain ends and panics on a fatal error.
type mainTB struct {
	testing.TB // nil: only the methods below are called

	mu       sync.Mutex
	cleanups []func()
}

func (m *mainTB) Helper()      {}
func (m *mainTB) Name() string { return "client-stack" }
func (m *mainTB) Cleanup(f func()) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.cleanups = append(m.cleanups, f)
}
func (m *mainTB) Fatalf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }
func (m *mainTB) Fatal(args ...any)                 { panic(fmt.Sprint(args...)) }
func (m *mainTB) Errorf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "client-stack: "+format+"\n", args...)
}
func (m *mainTB) Logf(format string, args ...any) {}
func (m *mainTB) TempDir() string {
	dir, err := os.MkdirTemp("", "client-stack-")
	if err != nil {
		panic(err)
	}
	m.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

func (m *mainTB) cleanup() {
	m.mu.Lock()
	fs := m.cleanups
	m.cleanups = nil
	m.mu.Unlock()
	for i := len(fs) - 1; i >= 0; i-- {
		fs[i]()
	}
}

// holdKey claims key for tenant on POST /v1/orders in a transaction that
// stays open (a request in flight) until the test rolls it back or ends.
func holdKey(t *testing.T, databaseURL, tenant, key string) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, databaseURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(ctx) })
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	if _, err := tx.Exec(ctx, `INSERT INTO idempotency_keys (tenant_id, scope, key, fingerprint, fingerprint_version, request, expires_at)
		VALUES ($1, 'POST /v1/orders', $2, '\x00', 1, '{}', now() + interval '1 day')`, tenant, key); err != nil {
		t.Fatal(err)
	}
	return tx
}

// exampleAPI returns the shared stack's URL and a token of a fresh tenant,
// for the examples.
func exampleAPI() (baseURL, token string) {
	_, api := stack()
	return api, newTenant(tenantName())
}
