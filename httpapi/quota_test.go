package httpapi_test

import (
	"context"
	"fmt"
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

// The key quota counts bytes too (G9): a tenant whose every key stores a
// 100-item order is refused past its bytes long before its count of keys,
// while a retry of a stored key replays and another tenant is served; and
// an api that starts afresh counts those bytes from the database.
func TestKeyQuotaCountsTheBytesKeysStore(t *testing.T) {
	t.Parallel()
	db := testenv.DB(t)
	var items []string
	for i := range 100 {
		items = append(items, fmt.Sprintf(`{"sku":"%064d","quantity":1,"unit_price":1}`, i))
	}
	big := `{"customer_id":"c-1","currency":"EUR","items":[` + strings.Join(items, ",") + `]}`
	cfg := command.IdempotencyConfig{TTL: time.Hour, KeyQuota: 1000, KeyQuotaBytes: 50_000, KeyQuotaRefresh: time.Hour}
	a := newAPIWith(t, db, cfg)
	stored := 0
	for ; stored < 10; stored++ {
		res := a.post(t, "big"+strconv.Itoa(stored), big)
		if res.status == http.StatusTooManyRequests {
			break
		}
		if res.status != http.StatusCreated {
			t.Fatalf("key %d: %d %s", stored, res.status, res.body)
		}
	}
	// Each key keeps about 19 KB (8.6 KB of request, 10 KB of response):
	// three fit under 50,000 bytes, and the fourth is refused.
	if stored != 3 {
		t.Fatalf("%d keys of 100 items stored under 50,000 bytes; want 3, then 429", stored)
	}
	var rows, sum, actual int64
	if err := db.QueryRow(context.Background(), `
SELECT count(*), sum(stored_bytes), sum(octet_length(request::text) + octet_length(response_body))
FROM idempotency_keys WHERE tenant_id = 't1'`).Scan(&rows, &sum, &actual); err != nil {
		t.Fatal(err)
	}
	if rows != 3 || sum < actual*9/10 || sum > actual*11/10 {
		t.Fatalf("%d rows keep %d stored_bytes, of %d bytes of request and response; want 3 rows within 10%%", rows, sum, actual)
	}
	if res := a.post(t, "big1", big); res.status != http.StatusCreated || res.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry of a stored key past the bytes: %d %v", res.status, res.header)
	}
	other := a
	other.token = a.newToken(t, "t2")
	if res := other.post(t, "big0", big); res.status != http.StatusCreated {
		t.Fatalf("another tenant: %d %s", res.status, res.body)
	}
	fresh := newAPIWith(t, db, cfg) // counts t1's keys from the database
	fresh.token = a.token
	if res := fresh.post(t, "small", validBody); res.status != http.StatusTooManyRequests {
		t.Fatalf("a new key of t1 at a fresh api: %d %s; want 429 from the bytes counted", res.status, res.body)
	}
}
