package httpapi_test

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/acme/orders/command"
	"github.com/acme/orders/internal/testenv"
)

// Past its key quota a tenant gets 429 idempotency-quota-exceeded with
// Retry-After and nothing is written; a retry of a stored key replays; and
// another tenant is served.
func TestKeyQuotaAnswers429(t *testing.T) {
	t.Parallel()
	a := newAPIWith(t, testenv.DB(t), command.IdempotencyConfig{TTL: time.Hour, KeyQuota: 2, KeyQuotaRefresh: time.Hour})
	for i := range 2 {
		if res := a.post(t, "k"+strconv.Itoa(i), validBody); res.status != http.StatusCreated {
			t.Fatalf("key %d: %d %s", i, res.status, res.body)
		}
	}
	res := a.post(t, "k2", validBody)
	if res.status != http.StatusTooManyRequests {
		t.Fatalf("past the quota: %d %s; want 429", res.status, res.body)
	}
	if p := decodeProblem(t, res); !strings.HasSuffix(p.Type, "/idempotency-quota-exceeded") {
		t.Fatalf("type %q", p.Type)
	}
	if ra, err := strconv.Atoi(res.header.Get("Retry-After")); err != nil || ra < 1 {
		t.Fatalf("Retry-After = %q", res.header.Get("Retry-After"))
	}
	if keys, orders, _, outbox := a.counts(t); keys != 2 || orders != 2 || outbox != 2 {
		t.Fatalf("rows after the refusal: keys=%d orders=%d outbox=%d, want 2 each", keys, orders, outbox)
	}
	if res := a.post(t, "k1", validBody); res.status != http.StatusCreated || res.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry of a stored key at the quota: %d %v", res.status, res.header)
	}
	other := a
	other.token = a.newToken(t, "t2")
	if res := other.post(t, "k2", validBody); res.status != http.StatusCreated {
		t.Fatalf("another tenant: %d %s", res.status, res.body)
	}
}

// A command on an order that does not exist is a 404 that stores no key.
func TestCommandOnUnknownOrderStoresNoKey(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	for range 2 {
		res := a.do(t, http.MethodPost, "/v1/orders/0193b1a8-7c2e-7000-8000-000000000001/pay", map[string]string{"Idempotency-Key": "pay-1"}, "")
		if res.status != http.StatusNotFound || res.header.Get("Idempotent-Replayed") != "" || res.header.Get("Idempotency-Key-Expires") != "" {
			t.Fatalf("pay unknown order: %d %v %s", res.status, res.header, res.body)
		}
	}
	if keys, _, _, _ := a.counts(t); keys != 0 {
		t.Fatalf("%d keys stored for a 404", keys)
	}
}
