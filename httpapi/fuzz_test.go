package httpapi_test

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// FuzzCreateOrder throws arbitrary keys and bodies at POST /v1/orders
// (straight into the handler, so even header values a client library would
// refuse get through). Whatever comes in: never a 5xx, a 201 replays
// identically, and no key ever has more than one order.
func FuzzCreateOrder(f *testing.F) {
	// More seeds live in testdata/fuzz/FuzzCreateOrder.
	f.Add("k-1", validBody)
	f.Add(`"quoted"`, `{"customer_id":"c","currency":"JPY","items":[{"sku":"s","quantity":10000,"unit_price":922337203685477}]}`)
	a := newAPI(f)
	created := map[string]bool{}

	f.Fuzz(func(t *testing.T, key, body string) {
		send := func() *httptest.ResponseRecorder {
			req := httptest.NewRequest(http.MethodPost, "/v1/orders", strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+a.token)
			req.Header.Set("Content-Type", "application/json")
			req.Header["Idempotency-Key"] = []string{key}
			rec := httptest.NewRecorder()
			validated(t, a.handler).ServeHTTP(rec, req)
			return rec
		}
		first := send()
		if first.Code >= 500 {
			t.Fatalf("key %q body %q: status %d, body %s", key, body, first.Code, first.Body)
		}
		if first.Code == http.StatusCreated {
			again := send()
			if again.Code != http.StatusCreated || !bytes.Equal(again.Body.Bytes(), first.Body.Bytes()) || again.Header().Get("Idempotent-Replayed") != "true" {
				t.Fatalf("key %q: retry got %d %s, want the replay of %s", key, again.Code, again.Body, first.Body)
			}
			created[first.Header().Get("Location")] = true
		}
		var orders, maxPerKey int
		if err := a.db.QueryRow(context.Background(), `SELECT count(*), coalesce(max(n), 0)
			FROM (SELECT count(*) AS n FROM orders GROUP BY tenant_id, creating_key) per_key`).Scan(&orders, &maxPerKey); err != nil {
			t.Fatal(err)
		}
		if maxPerKey > 1 || orders != len(created) {
			t.Fatalf("after key %q: %d orders (at most %d per key) for %d created responses", key, orders, maxPerKey, len(created))
		}
	})
}
