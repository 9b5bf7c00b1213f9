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

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/acme/orders/command"
	"github.com/acme/orders/httpapi"
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
