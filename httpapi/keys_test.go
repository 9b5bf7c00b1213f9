package httpapi_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/acme/orders/auth"
)

func TestRequestsNeedAKnownBearerToken(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	revoked := a.newToken(t, "t9")
	if _, err := a.clients.Revoke(context.Background(), auth.Revocation{Token: revoked}); err != nil {
		t.Fatal(err)
	}
	// The detail says why: no token, one of no token's form (a typo, a
	// truncated copy), or one that is not (or no longer) registered.
	const none, malformed, unknown = "Send Authorization", "not in the form", "not known, or was revoked"
	for name, tt := range map[string]struct{ auth, detail string }{
		"no header":     {"-", none},
		"empty bearer":  {"Bearer ", none},
		"basic scheme":  {"Basic dXNlcjpwYXNz", none},
		"unknown token": {"Bearer ord_notarealtoken", malformed},
		"not our kind":  {"Bearer abc", malformed},
		"truncated":     {"Bearer " + revoked[:len(revoked)-1], malformed},
		"revoked":       {"Bearer " + revoked, unknown},
	} {
		t.Run(name, func(t *testing.T) {
			res := a.do(t, http.MethodPost, "/v1/orders", map[string]string{"Authorization": tt.auth, "Idempotency-Key": "k-" + name}, validBody)
			if res.status != http.StatusUnauthorized {
				t.Fatalf("status %d, want 401", res.status)
			}
			if p := decodeProblem(t, res); !strings.HasSuffix(p.Type, "/unauthorized") || !strings.Contains(p.Detail, tt.detail) {
				t.Fatalf("type %q, detail %q; want one saying %q", p.Type, p.Detail, tt.detail)
			}
			if res.header.Get("WWW-Authenticate") == "" {
				t.Fatal("no WWW-Authenticate header")
			}
		})
	}
	if keys, orders, _, _ := a.counts(t); keys+orders != 0 {
		t.Fatalf("unauthenticated requests stored %d keys and %d orders", keys, orders)
	}
	// Health endpoints stay open.
	if res := a.do(t, http.MethodGet, "/healthz", map[string]string{"Authorization": "-"}, ""); res.status != http.StatusOK {
		t.Fatalf("/healthz without a token: %d", res.status)
	}
}

func TestTenantsAreIsolated(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	b := a
	b.token = a.newToken(t, "t2")

	ra := a.post(t, "shared-key", validBody)
	rb := b.post(t, "shared-key", validBody)
	if ra.status != http.StatusCreated || rb.status != http.StatusCreated {
		t.Fatalf("statuses %d and %d, want 201 and 201", ra.status, rb.status)
	}
	if ra.header.Get("Location") == rb.header.Get("Location") || rb.header.Get("Idempotent-Replayed") != "" {
		t.Fatal("tenant t2 got tenant t1's order for the same key")
	}
	if _, orders, _, _ := a.counts(t); orders != 2 {
		t.Fatalf("%d orders, want one per tenant", orders)
	}
	// Neither reads nor looks up the other's order or key. No projector
	// runs here, so the views are filled from the orders table directly.
	var ownerOfB string
	if err := a.db.QueryRow(context.Background(), `SELECT tenant_id FROM orders WHERE id = $1`,
		strings.TrimPrefix(rb.header.Get("Location"), "/v1/orders/")).Scan(&ownerOfB); err != nil || ownerOfB != "t2" {
		t.Fatalf("order of t2 belongs to %q (%v)", ownerOfB, err)
	}
	if _, err := a.db.Exec(context.Background(), `INSERT INTO order_views
		SELECT tenant_id, id, customer_id, status, currency, '[]', total, version, created_at, updated_at FROM orders`); err != nil {
		t.Fatal(err)
	}
	if res := a.do(t, http.MethodGet, rb.header.Get("Location"), nil, ""); res.status != http.StatusNotFound {
		t.Fatalf("t1 reading t2's order: %d, want 404", res.status)
	}
	if res := b.do(t, http.MethodGet, rb.header.Get("Location"), nil, ""); res.status != http.StatusOK {
		t.Fatalf("t2 reading its own order: %d, want 200", res.status)
	}
	// Each tenant's key lookup sees only its own record.
	la := a.do(t, http.MethodGet, "/v1/idempotency-keys/shared-key", nil, "")
	lb := b.do(t, http.MethodGet, "/v1/idempotency-keys/shared-key", nil, "")
	if la.status != 200 || lb.status != 200 || !strings.Contains(string(la.body), ra.header.Get("Location")) ||
		!strings.Contains(string(lb.body), rb.header.Get("Location")) || strings.Contains(string(la.body), rb.header.Get("Location")) {
		t.Fatalf("key lookups:\n t1 %d %s\n t2 %d %s", la.status, la.body, lb.status, lb.body)
	}
	c := a
	c.token = a.newToken(t, "t3")
	if res := c.do(t, http.MethodGet, "/v1/idempotency-keys/shared-key", nil, ""); res.status != http.StatusNotFound {
		t.Fatalf("t3 looking up a key it never used: %d, want 404", res.status)
	}
}

func TestKeyLookup(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	key := "look/up key"
	created := a.post(t, key, validBody)
	if created.status != http.StatusCreated {
		t.Fatalf("create: %d %s", created.status, created.body)
	}
	res := a.do(t, http.MethodGet, "/v1/idempotency-keys/"+url.PathEscape(key), nil, "")
	if res.status != http.StatusOK {
		t.Fatalf("lookup: %d %s", res.status, res.body)
	}
	var got struct {
		Key     string `json:"key"`
		Records []struct {
			Scope    string `json:"scope"`
			State    string `json:"state"`
			Response struct {
				Status      int    `json:"status"`
				ContentType string `json:"content_type"`
				Location    string `json:"location"`
				ETag        string `json:"etag"`
			} `json:"response"`
			CreatedAt time.Time `json:"created_at"`
			ExpiresAt time.Time `json:"expires_at"`
		} `json:"records"`
	}
	if err := json.Unmarshal(res.body, &got); err != nil {
		t.Fatal(err)
	}
	if got.Key != key || len(got.Records) != 1 {
		t.Fatalf("lookup = %s", res.body)
	}
	r := got.Records[0]
	if r.Scope != "POST /v1/orders" || r.State != "completed" || r.Response.Status != 201 ||
		r.Response.Location != created.header.Get("Location") || r.Response.ETag != `"1"` ||
		r.Response.ContentType != "application/json" || r.ExpiresAt.Sub(r.CreatedAt) != 24*time.Hour {
		t.Fatalf("record = %+v", r)
	}
	for _, odd := range []string{"50%off", "a%41", "x?y#z"} {
		if res := a.post(t, odd, validBody); res.status != http.StatusCreated {
			t.Fatalf("create with key %q: %d", odd, res.status)
		}
		res := a.do(t, http.MethodGet, "/v1/idempotency-keys/"+url.PathEscape(odd), nil, "")
		if res.status != http.StatusOK || !strings.Contains(string(res.body), `"key":`+strconv.Quote(odd)) {
			t.Fatalf("lookup of %q: %d %s", odd, res.status, res.body)
		}
	}
	// The quoted form of a key finds it, as the header's does ("abc" is
	// abc); a key that itself begins with a quote is found as it is.
	for path, key := range map[string]string{`"look/up key"`: key, `"look/up key";p=1`: key} {
		res := a.do(t, http.MethodGet, "/v1/idempotency-keys/"+url.PathEscape(path), nil, "")
		if res.status != http.StatusOK || !strings.Contains(string(res.body), `"key":`+strconv.Quote(key)) {
			t.Fatalf("lookup of %s: %d %s, want the record of %q", path, res.status, res.body, key)
		}
	}
	if res := a.post(t, `"\"q"`, validBody); res.status != http.StatusCreated { // the key "q
		t.Fatalf("create with key \"q: %d %s", res.status, res.body)
	}
	if res := a.do(t, http.MethodGet, "/v1/idempotency-keys/"+url.PathEscape(`"q`), nil, ""); res.status != http.StatusOK {
		t.Fatalf("lookup of the key \"q: %d %s", res.status, res.body)
	}
	if res := a.do(t, http.MethodGet, "/v1/idempotency-keys/never-used", nil, ""); res.status != http.StatusNotFound {
		t.Fatalf("unknown key: %d", res.status)
	}
	if res := a.do(t, http.MethodGet, "/v1/idempotency-keys/"+strings.Repeat("k", 256), nil, ""); res.status != http.StatusBadRequest {
		t.Fatalf("overlong key: %d", res.status)
	}
}

// A request whose key is held by a transaction still in flight waits for
// it, bounded by the server's limit or the client's Prefer: wait, and then
// gets 409 with Retry-After; once the holder rolls back, the key is free.
func TestInFlightKeyWaitsThen409(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	tx := holdKey(t, a, "busy")

	start := time.Now()
	res := a.do(t, http.MethodPost, "/v1/orders", map[string]string{"Idempotency-Key": "busy", "Prefer": "wait=1"}, validBody)
	waited := time.Since(start)
	if res.status != http.StatusConflict {
		t.Fatalf("status %d, body %s; want 409", res.status, res.body)
	}
	if p := decodeProblem(t, res); !strings.HasSuffix(p.Type, "/idempotency-key-in-flight") {
		t.Fatalf("type %q", p.Type)
	}
	if s, err := strconv.Atoi(res.header.Get("Retry-After")); err != nil || s < 1 {
		t.Fatalf("Retry-After = %q", res.header.Get("Retry-After"))
	}
	if waited < 900*time.Millisecond {
		t.Fatalf("answered after %s: it did not wait for the in-flight request", waited)
	}
	if waited >= 2*time.Second { // a claim retried as if stalled on another lock (command.waitedForKey)
		t.Fatalf("answered after %s: the wait for a key in flight was not recognised as one", waited)
	}
	if s := a.idem.Stats(); s.WaitTimeouts != 1 || s.Waits != 1 {
		t.Fatalf("stats = %+v, want one wait that timed out", s)
	}

	if err := tx.Rollback(context.Background()); err != nil {
		t.Fatal(err)
	}
	if res := a.post(t, "busy", validBody); res.status != http.StatusCreated {
		t.Fatalf("after the holder rolled back: %d %s", res.status, res.body)
	}
}

func TestPreferWaitIsBoundedByTheServer(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	holdKey(t, a, "busy")
	start := time.Now()
	res := a.do(t, http.MethodPost, "/v1/orders", map[string]string{"Idempotency-Key": "busy", "Prefer": "respond-async, wait=0"}, validBody)
	if res.status != http.StatusConflict || time.Since(start) > 2*time.Second {
		t.Fatalf("Prefer: wait=0 → %d after %s; want an immediate 409", res.status, time.Since(start))
	}
}

// holdKey claims key for tenant t1 on POST /v1/orders in a transaction that
// stays open (a request in flight) until the test rolls it back or ends.
func holdKey(t *testing.T, a api, key string) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	tx, err := a.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	if _, err := tx.Exec(ctx, `INSERT INTO idempotency_keys (tenant_id, scope, key, fingerprint, fingerprint_version, request, expires_at)
		VALUES ('t1', 'POST /v1/orders', $1, '\x00', 1, '{}', now() + interval '1 day')`, key); err != nil {
		t.Fatal(err)
	}
	return tx
}
