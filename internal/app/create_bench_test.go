package app_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/acme/orders/internal/app"
	"github.com/acme/orders/internal/testenv"
)

// BenchmarkCreateOrderOverHTTP times one POST /v1/orders after another
// through the whole api (router, middleware, auth, the create transaction,
// the relay woken after it) with tracing off, as it runs by default: the
// figure `make bench` would show per create on one client, without its
// noise. Compare builds with benchstat (BENCHMARKS.md, "Tracing off").
func BenchmarkCreateOrderOverHTTP(b *testing.B) {
	env := map[string]string{
		"DATABASE_URL": testenv.DatabaseURL(b), "NATS_URL": testenv.NATS(b).ClientURL(), "LOG_FORMAT": "json",
		"TENANT_RATE": "1000000", "TENANT_BURST": "1000000",
	}
	api := testenv.StartProgram(b, "api", app.RunAPI, env)
	var out bytes.Buffer
	if err := app.RunAPI(context.Background(), []string{"api", "token", "create", "-tenant", "bench"}, func(k string) string { return env[k] }, &out); err != nil {
		b.Fatal(err)
	}
	token := strings.TrimSpace(out.String())
	body := []byte(`{"customer_id":"c-1","currency":"EUR","items":[{"sku":"book","quantity":2,"unit_price":1999}]}`)
	client := &http.Client{}
	b.ResetTimer()
	for i := range b.N {
		req, err := http.NewRequest(http.MethodPost, api+"/v1/orders", bytes.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", fmt.Sprintf("bench-%d-%d", b.N, i))
		resp, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			b.Fatalf("create %d: status %d", i, resp.StatusCode)
		}
	}
}
