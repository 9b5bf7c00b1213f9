package httpapi_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/acme/orders/command"
	"github.com/acme/orders/httpapi"
	"github.com/acme/orders/internal/testenv"
	"github.com/acme/orders/postgres"
	"github.com/acme/orders/query"
)

// tenantAuth takes every token as tenant t1, without a database.
type tenantAuth struct{}

func (tenantAuth) Authenticate(context.Context, string) (string, error) { return "t1", nil }

// A database that cannot be reached is a dependency down, not a bug: every
// request that needs it gets 503 database-unavailable with Retry-After, as
// problem+json, so a client retries (with its key) instead of giving up on
// a 500.
func TestDatabaseDownIs503(t *testing.T) {
	t.Parallel()
	// A port nothing listens on: taken, then released.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	db, err := pgxpool.New(context.Background(), "postgres://postgres@"+addr+"/orders?sslmode=disable&connect_timeout=5")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	idem, err := command.NewIdempotency(db, command.IdempotencyConfig{TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(validated(t, httpapi.New(httpapi.Deps{
		Logger:      slog.New(slog.NewTextHandler(io.Discard, nil)),
		Auth:        tenantAuth{},
		Idempotency: idem,
		Keys:        idem,
		CreateOrder: command.NewCreateOrderHandler(),
		PayOrder:    command.NewPayOrderHandler(),
		GetOrder:    query.NewGetOrderHandler(db, nil),
		ListOrders:  query.NewListOrdersHandler(db),
	})))
	t.Cleanup(srv.Close)

	for _, c := range []struct{ method, path, body string }{
		{http.MethodPost, "/v1/orders", `{"customer_id":"c1","currency":"EUR","items":[{"sku":"s","quantity":1,"unit_price":100}]}`},
		{http.MethodPost, "/v1/orders/0190a0b0-0000-7000-8000-000000000001/pay", ``},
		{http.MethodGet, "/v1/orders/0190a0b0-0000-7000-8000-000000000001", ``},
		{http.MethodGet, "/v1/orders", ``},
		{http.MethodGet, "/v1/idempotency-keys/k1", ``},
	} {
		req, err := http.NewRequest(c.method, srv.URL+c.path, strings.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer ord_any")
		if c.body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		if c.method == http.MethodPost {
			req.Header.Set("Idempotency-Key", "k1")
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		var p struct{ Type string }
		_ = json.Unmarshal(b, &p)
		if res.StatusCode != http.StatusServiceUnavailable || !strings.HasSuffix(p.Type, "/database-unavailable") ||
			res.Header.Get("Retry-After") == "" || res.Header.Get("Content-Type") != "application/problem+json" {
			t.Errorf("%s %s with the database down: %d %s Retry-After=%q %s; want 503 database-unavailable problem+json with Retry-After",
				c.method, c.path, res.StatusCode, res.Header.Get("Content-Type"), res.Header.Get("Retry-After"), b)
		}
	}
}

// A database that cannot serve a request in time (a table locked by DDL,
// a server that stalls) is answered 503 database-unavailable with
// Retry-After once the request's deadline passes, while the client still
// listens: it used to wait for the 60 s statement_timeout and then get a
// 500 after the server's write timeout, which no client ever received. A
// read-only database (a standby after a failover) is 503 too, not 500.
func TestADatabaseThatCannotServeInTimeIs503(t *testing.T) {
	t.Parallel()
	dbURL := testenv.DatabaseURL(t)
	db, err := postgres.Open(context.Background(), dbURL, 0, 10*time.Second, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	a := newAPIWithDeps(t, db, command.IdempotencyConfig{}, func(d *httpapi.Deps) { d.RequestTimeout = time.Second })
	created := decodeOrder(t, a.post(t, "create", validBody))

	locker, err := pgx.Connect(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Close(context.Background())
	if _, err := locker.Exec(context.Background(), "BEGIN; LOCK TABLE orders"); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, method, path, body string }{
		{"pay", http.MethodPost, "/v1/orders/" + created.ID + "/pay", ""},
		{"create", http.MethodPost, "/v1/orders", validBody},
	} {
		start := time.Now()
		r := a.do(t, c.method, c.path, map[string]string{"Idempotency-Key": "locked-" + c.name}, c.body)
		took := time.Since(start)
		if r.status != http.StatusServiceUnavailable || r.header.Get("Retry-After") == "" ||
			r.header.Get("Content-Type") != "application/problem+json" || !strings.Contains(string(r.body), "database-unavailable") {
			t.Errorf("%s under LOCK TABLE orders: %d %v %s after %s; want 503 database-unavailable with Retry-After", c.name, r.status, r.header, r.body, took)
		}
	}
	if _, err := locker.Exec(context.Background(), "ROLLBACK"); err != nil {
		t.Fatal(err)
	}
	// The pay's retry with its key runs now: the timed-out one did not happen.
	if r := a.do(t, http.MethodPost, "/v1/orders/"+created.ID+"/pay", map[string]string{"Idempotency-Key": "locked-pay"}, ""); r.status != http.StatusAccepted {
		t.Fatalf("the pay's retry after the lock: %d %s", r.status, r.body)
	}

	// Read-only: every write is refused by the server, 25006.
	if _, err := locker.Exec(context.Background(), `ALTER DATABASE `+pgx.Identifier{locker.Config().Database}.Sanitize()+` SET default_transaction_read_only = on`); err != nil {
		t.Fatal(err)
	}
	db.Reset() // new connections take the setting
	if r := a.post(t, "read-only", validBody); r.status != http.StatusServiceUnavailable || r.header.Get("Retry-After") == "" {
		t.Fatalf("create on a read-only database: %d %s; want 503 with Retry-After", r.status, r.body)
	}
}

// slowReader hands out its body a byte every step.
type slowReader struct {
	body []byte
	step time.Duration
}

func (s *slowReader) Read(p []byte) (int, error) {
	if len(s.body) == 0 {
		return 0, io.EOF
	}
	time.Sleep(s.step)
	p[0], s.body = s.body[0], s.body[1:]
	return 1, nil
}

// The request's deadline starts once its body is in: a body that takes
// longer than the deadline but arrives within the body timeout is served,
// not answered 503 for a database that was fine.
func TestTheDeadlineStartsAfterTheBody(t *testing.T) {
	t.Parallel()
	a := newAPIWithDeps(t, testenv.DB(t), command.IdempotencyConfig{}, func(d *httpapi.Deps) {
		d.RequestTimeout, d.BodyTimeout = 500*time.Millisecond, 5*time.Second
	})
	body := []byte(validBody)
	req, err := http.NewRequest(http.MethodPost, a.url+"/v1/orders", &slowReader{body: body, step: time.Second / time.Duration(len(body))})
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = int64(len(body))
	req.Header.Set("Authorization", "Bearer "+a.token)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "slow-body")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusCreated {
		t.Fatalf("a body of 1 s under a 0.5 s deadline: %d %s; want 201", res.StatusCode, b)
	}
}
