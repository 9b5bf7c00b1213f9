package app_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/acme/orders/internal/app"
	"github.com/acme/orders/internal/testenv"
)

// start runs a program of the service until the test ends and returns the
// base URL it serves on.
func start(t *testing.T, name string, run testenv.Program, env map[string]string) string {
	t.Helper()
	return testenv.StartProgram(t, name, run, env)
}

// newEnv gives a test its own database and NATS server.
func newEnv(t *testing.T) map[string]string {
	t.Helper()
	return map[string]string{
		"DATABASE_URL": testenv.DatabaseURL(t),
		"NATS_URL":     testenv.NATS(t).ClientURL(),
		"LOG_FORMAT":   "json",
		// These tests drive one tenant as fast as they can: its rate is not
		// what they test (httpapi's tenant-limit tests and
		// TestNoisyNeighbour do that).
		"TENANT_RATE":          "100000",
		"TENANT_BURST":         "100000",
		"TENANT_MAX_IN_FLIGHT": "511", // one below the global limit (512)
		"TENANT_MAX_WAITING":   "511",
	}
}

// startStack runs an api and a projector on a fresh database and NATS
// server until the test ends, and returns their environment, the api's URL
// and a token of tenant acme.
func startStack(t *testing.T) (env map[string]string, api, token string) {
	t.Helper()
	env = newEnv(t)
	api = start(t, "api", app.RunAPI, env)
	start(t, "projector", app.RunProjector, env)
	return env, api, newToken(t, env, "acme")
}

// newToken runs `api token create -tenant tenant` and returns what it printed.
func newToken(t *testing.T, env map[string]string, tenant string) string {
	t.Helper()
	var out bytes.Buffer
	err := app.RunAPI(context.Background(), []string{"api", "token", "create", "-tenant", tenant}, func(k string) string { return env[k] }, &out)
	if err != nil {
		t.Fatalf("api token create: %v", err)
	}
	token := strings.TrimSpace(out.String())
	if !strings.HasPrefix(token, "ord_") || strings.Contains(token, "\n") {
		t.Fatalf("api token create printed %q, want one token", out.String())
	}
	return token
}

type reply struct {
	status int
	header http.Header
	body   string
}

func call(t *testing.T, method, url, token, key, body string) reply {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	return do(t, req)
}

func do(t *testing.T, req *http.Request) reply {
	t.Helper()
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return reply{status: res.StatusCode, header: res.Header, body: string(b)}
}

func orderBody(customer string) string {
	return fmt.Sprintf(`{"customer_id":%q,"currency":"EUR","items":[{"sku":"book","quantity":2,"unit_price":1999}]}`, customer)
}

func countRows(t *testing.T, env map[string]string, sql string, args ...any) int {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), env["DATABASE_URL"])
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestEndToEnd(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	api := start(t, "api", app.RunAPI, env)
	projector := start(t, "projector", app.RunProjector, env)
	token := newToken(t, env, "acme")

	// Readiness comes from each process's first round of checks, just
	// after it starts listening.
	for _, base := range []string{api, projector} {
		testenv.Eventually(t, 5*time.Second, base+"/readyz is 200", func() bool {
			res, err := http.Get(base + "/readyz")
			if err != nil {
				t.Fatalf("GET %s/readyz: %v", base, err)
			}
			res.Body.Close()
			return res.StatusCode == http.StatusOK
		})
	}

	created := call(t, http.MethodPost, api+"/v1/orders", token, "e2e-1", orderBody("c-42"))
	createdAt := time.Now()
	if created.status != http.StatusCreated {
		t.Fatalf("POST: status %d, body %s", created.status, created.body)
	}
	location := created.header.Get("Location")

	// The projector makes the order visible through the query side.
	var got reply
	testenv.Eventually(t, 10*time.Second, "the order is visible on the query side", func() bool {
		got = call(t, http.MethodGet, api+location, token, "", "")
		if got.status != http.StatusOK && got.status != http.StatusNotFound {
			t.Fatalf("GET %s: status %d", location, got.status)
		}
		return got.status == http.StatusOK
	})
	t.Logf("create → visible in %s", time.Since(createdAt).Round(time.Millisecond))
	if got.body != created.body {
		t.Fatalf("view differs from the created order:\n created %s\n view    %s", created.body, got.body)
	}
	if got.header.Get("ETag") != `"1"` {
		t.Fatalf("view ETag = %q", got.header.Get("ETag"))
	}
}

// Several API processes on one database: however requests with the same
// key are spread and raced across them, each key executes once and every
// response to it is the same.
func TestManyServersOneDatabase(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	servers := []string{
		start(t, "api-1", app.RunAPI, env),
		start(t, "api-2", app.RunAPI, env),
		start(t, "api-3", app.RunAPI, env),
	}
	token := newToken(t, env, "acme")

	const keys, perKey = 20, 10
	replies := make([][]reply, keys)
	for k := range replies {
		replies[k] = make([]reply, perKey)
	}
	startLine := make(chan struct{})
	var wg sync.WaitGroup
	for k := range keys {
		for i := range perKey {
			wg.Go(func() {
				<-startLine
				server := servers[(k+i)%len(servers)]
				replies[k][i] = call(t, http.MethodPost, server+"/v1/orders", token, fmt.Sprintf("multi-%d", k), orderBody(fmt.Sprintf("c-%d", k)))
			})
		}
	}
	close(startLine)
	wg.Wait()

	for k, rs := range replies {
		for i, r := range rs {
			if r.status != http.StatusCreated || r.body != rs[0].body || r.header.Get("Location") != rs[0].header.Get("Location") {
				t.Fatalf("key %d reply %d: %d %s; want 201 and %s", k, i, r.status, r.body, rs[0].body)
			}
		}
	}
	if n := countRows(t, env, `SELECT count(*) FROM orders`); n != keys {
		t.Fatalf("%d orders, want %d", n, keys)
	}
	if n := countRows(t, env, `SELECT count(*) FROM outbox`); n != keys {
		t.Fatalf("%d outbox events, want %d", n, keys)
	}
}

// A key expires and the janitor removes it; a late retry of its request
// still cannot create a second order: the order keeps its creating key.
func TestExpiredKeyRetryPointsAtTheExistingOrder(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	env["IDEMPOTENCY_TTL"] = "1s"
	env["IDEMPOTENCY_JANITOR_INTERVAL"] = "100ms"
	api := start(t, "api", app.RunAPI, env)
	token := newToken(t, env, "acme")

	first := call(t, http.MethodPost, api+"/v1/orders", token, "late-1", orderBody("c-1"))
	if first.status != http.StatusCreated {
		t.Fatalf("POST: %d %s", first.status, first.body)
	}
	testenv.Eventually(t, 10*time.Second, "the janitor deleted the expired key", func() bool {
		return countRows(t, env, `SELECT count(*) FROM idempotency_keys WHERE key = 'late-1'`) == 0
	})

	late := call(t, http.MethodPost, api+"/v1/orders", token, "late-1", orderBody("c-1"))
	if late.status != http.StatusConflict || late.header.Get("Location") != first.header.Get("Location") {
		t.Fatalf("late retry: %d, Location %q, body %s; want 409 and Location %q", late.status, late.header.Get("Location"), late.body, first.header.Get("Location"))
	}
	if ct := late.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("late retry Content-Type = %q", ct)
	}
	// That refusal is answered anew each time, never stored: another
	// body under the key cannot take the key over, and the original
	// request's retry is still pointed at its order (not told 422).
	for _, body := range []string{orderBody("c-other"), orderBody("c-1")} {
		again := call(t, http.MethodPost, api+"/v1/orders", token, "late-1", body)
		if again.status != http.StatusConflict || again.header.Get("Location") != first.header.Get("Location") || again.header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("late retry again: %d %q %s", again.status, again.header.Get("Idempotent-Replayed"), again.body)
		}
	}
	if n := countRows(t, env, `SELECT count(*) FROM idempotency_keys WHERE key = 'late-1'`); n != 0 {
		t.Fatalf("the late retries' refusal was stored under the key: %d rows", n)
	}
	if n := countRows(t, env, `SELECT count(*) FROM orders`); n != 1 {
		t.Fatalf("%d orders, want 1", n)
	}
}

// A client reads its own writes: each command answers with the order's
// version, and a read that names it waits (woken by the projector's
// NOTIFY) until the read model has it.
func TestReadYourWrites(t *testing.T) {
	t.Parallel()
	env, api, token := startStack(t)

	created := call(t, http.MethodPost, api+"/v1/orders", token, "ryw-1", orderBody("c-ryw"))
	var o struct {
		ID      string `json:"id"`
		Version int64  `json:"version"`
		Status  string `json:"status"`
	}
	if err := json.Unmarshal([]byte(created.body), &o); err != nil || created.status != 201 {
		t.Fatalf("create: %d %s", created.status, created.body)
	}
	paying := call(t, http.MethodPost, api+"/v1/orders/"+o.ID+"/pay", token, "ryw-pay", "")
	if err := json.Unmarshal([]byte(paying.body), &o); err != nil || paying.status != 202 || o.Version != 2 {
		t.Fatalf("pay: %d %s", paying.status, paying.body)
	}
	view := call(t, http.MethodGet, fmt.Sprintf("%s/v1/orders/%s?min_version=%d", api, o.ID, o.Version), token, "", "")
	if view.status != 200 || view.body != paying.body || view.header.Get("ETag") != `"2"` {
		t.Fatalf("GET ?min_version=2: %d %s; want the payment_pending order", view.status, view.body)
	}
	// The payment worker's part (not in this stack): the charge succeeded.
	pool := testenv.Pool(t, env["DATABASE_URL"])
	paid := testenv.SettlePayment(t, pool, uuid.MustParse(o.ID), true)
	o.Version = paid.Version
	view = call(t, http.MethodGet, fmt.Sprintf("%s/v1/orders/%s?min_version=%d", api, o.ID, o.Version), token, "", "")
	if view.status != 200 || !strings.Contains(view.body, `"status":"paid"`) || view.header.Get("ETag") != `"3"` {
		t.Fatalf("GET ?min_version=3: %d %s; want the paid order", view.status, view.body)
	}
	summary := call(t, http.MethodGet, fmt.Sprintf("%s/v1/customers/c-ryw/summary?min_position=%s:%d", api, o.ID, o.Version), token, "", "")
	var s struct {
		Orders map[string]int64 `json:"orders"`
		Totals []struct {
			Currency string `json:"currency"`
			Paid     int64  `json:"paid"`
		} `json:"totals"`
	}
	if err := json.Unmarshal([]byte(summary.body), &s); err != nil || summary.status != 200 ||
		s.Orders["paid"] != 1 || s.Orders["total"] != 1 || len(s.Totals) != 1 || s.Totals[0].Paid != 3998 {
		t.Fatalf("summary ?min_position: %d %s", summary.status, summary.body)
	}
	// The report has no read-your-writes parameter: it catches up shortly.
	testenv.Eventually(t, 10*time.Second, "daily sales show the payment", func() bool {
		sales := call(t, http.MethodGet, api+"/v1/reports/daily-sales?currency=EUR", token, "", "")
		if sales.status != 200 {
			t.Fatalf("daily sales: %d %s", sales.status, sales.body)
		}
		return strings.Contains(sales.body, `"orders":1,"paid_amount":3998`)
	})

	// A version the view will not reach: 412 view-behind after the wait,
	// when it is the next one (the service could write it itself: a
	// payment or refund settling), else 412 version-not-written, without
	// Retry-After: only commands not yet sent could write it.
	for _, tt := range []struct {
		ahead int64
		typ   string
		retry bool
	}{{1, "view-behind", true}, {7, "version-not-written", false}} {
		req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("%s/v1/orders/%s?min_version=%d", api, o.ID, o.Version+tt.ahead), nil)
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Prefer", "wait=1")
		began := time.Now()
		behind := do(t, req)
		if behind.status != http.StatusPreconditionFailed || !strings.Contains(behind.body, `/`+tt.typ+`"`) || (behind.header.Get("Retry-After") != "") != tt.retry {
			t.Fatalf("GET ?min_version=version+%d: %d Retry-After=%q %s; want 412 %s", tt.ahead, behind.status, behind.header.Get("Retry-After"), behind.body, tt.typ)
		}
		if waited := time.Since(began); waited < 900*time.Millisecond {
			t.Fatalf("answered behind after %s, before the 1s the client allowed", waited)
		}
	}

	// A version of an order that does not exist never comes: after the
	// wait, 404, not a view-behind that tells the client to retry for ever.
	// So too for a summary waiting on such an order, or on another tenant's.
	other := newToken(t, env, "t-other")
	for _, tt := range []struct{ path, token string }{
		{fmt.Sprintf("/v1/orders/%s?min_version=1", uuid.New()), token},
		{fmt.Sprintf("/v1/orders/%s?min_version=1", o.ID), other},
		{fmt.Sprintf("/v1/customers/c-ryw/summary?min_position=%s:1", uuid.New()), token},
	} {
		req, _ := http.NewRequest(http.MethodGet, api+tt.path, nil)
		req.Header.Set("Authorization", "Bearer "+tt.token)
		req.Header.Set("Prefer", "wait=1")
		if res := do(t, req); res.status != http.StatusNotFound || !strings.Contains(res.body, "not-found") {
			t.Fatalf("GET %s: %d %s, want 404 not-found", tt.path, res.status, res.body)
		}
	}
}
