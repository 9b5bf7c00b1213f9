package client_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/acme/orders/client"
)

func newOrder(customer string) client.NewOrder {
	return client.NewOrder{CustomerID: customer, Currency: "EUR", Items: []client.NewItem{{SKU: "book", Quantity: 2, UnitPrice: 1999}}}
}

// sameKeyAndBody checks that every attempt of one logical call carried the
// same key (a UUIDv7 the client made) and the same body bytes.
func sameKeyAndBody(t *testing.T, seen []attempt, key string) {
	t.Helper()
	if u, err := uuid.Parse(key); err != nil || u.Version() != 7 {
		t.Fatalf("Idempotency-Key %q is not a UUIDv7", key)
	}
	for i, a := range seen {
		if a.key != key || !bytes.Equal(a.body, seen[0].body) {
			t.Fatalf("attempt %d: key %q body %s; want key %q body %s", i+1, a.key, a.body, key, seen[0].body)
		}
	}
}

// A CreateOrder whose attempts meet a fault is sent again with the same key
// and body until the api answers; the api executed it once: one order per
// logical call, and the answer is the order it created.
func TestCreateOrderRetriesFaultsIntoOneOrder(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		plan     func(n int) fault
		attempts int
		replayed bool // the final answer is the stored one of an earlier attempt
	}{
		{"lost response after commit", func(n int) fault { return map[bool]fault{true: loseResponse}[n == 1] }, 2, true},
		{"lost twice", func(n int) fault { return map[bool]fault{true: loseResponse}[n <= 2] }, 3, true},
		{"503 before the api", func(n int) fault { return map[bool]fault{true: fail503Before}[n == 1] }, 2, false},
		{"503 after commit", func(n int) fault { return map[bool]fault{true: fail503After}[n == 1] }, 2, true},
		{"429 with Retry-After", func(n int) fault { return map[bool]fault{true: fail429Before}[n == 1] }, 2, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p, base := newProxy(t, tc.plan)
			c, tenant := newClient(t, base)
			var meta client.Meta
			start := time.Now()
			o, err := c.CreateOrder(context.Background(), newOrder("c-1"), client.WithMeta(&meta))
			if err != nil {
				t.Fatalf("CreateOrder: %v", err)
			}
			seen := p.seen()
			if len(seen) != tc.attempts || meta.Attempts != tc.attempts {
				t.Fatalf("%d attempts reached the proxy, meta says %d; want %d", len(seen), meta.Attempts, tc.attempts)
			}
			sameKeyAndBody(t, seen, meta.IdempotencyKey)
			if meta.Status != http.StatusCreated || meta.Replayed != tc.replayed || o.Version != 1 || o.Status != "pending" {
				t.Fatalf("answer: status %d replayed %v order %+v; want 201, replayed %v, a pending order", meta.Status, meta.Replayed, o, tc.replayed)
			}
			if n := ordersOf(t, tenant); n != 1 {
				t.Fatalf("%d orders, want 1", n)
			}
			if n := count(t, `SELECT count(*) FROM orders WHERE tenant_id = $1 AND id = $2`, tenant, o.ID); n != 1 {
				t.Fatalf("the returned order %s is not the one stored", o.ID)
			}
			if tc.plan(1) == fail429Before && time.Since(start) < time.Second {
				t.Fatalf("retried after %s, before Retry-After: 1", time.Since(start))
			}
		})
	}
}

// A command whose key is held by a request still in flight gets 409
// idempotency-key-in-flight; the client waits and sends it again with the
// same key and body, and once the holder is gone it executes once.
func TestInFlightKeyIsRetried(t *testing.T) {
	t.Parallel()
	p, base := newProxy(t, func(int) fault { return pass })
	c, tenant := newClient(t, base)
	env, _ := stack()
	ctx := context.Background()
	key, err := uuid.NewV7()
	if err != nil {
		t.Fatal(err)
	}
	holder := holdKey(t, env["DATABASE_URL"], tenant, key.String())
	p.after = func(n, status int) {
		if n == 1 && status == http.StatusConflict {
			if err := holder.Rollback(ctx); err != nil {
				t.Errorf("release the key: %v", err)
			}
		}
	}
	var meta client.Meta
	o, err := c.CreateOrder(ctx, newOrder("c-1"), client.WithIdempotencyKey(key.String()), client.WithWait(0), client.WithMeta(&meta))
	if err != nil {
		t.Fatalf("CreateOrder: %v", err)
	}
	seen := p.seen()
	if len(seen) != 2 || seen[0].status != http.StatusConflict || seen[1].status != http.StatusCreated {
		t.Fatalf("attempts %+v; want a 409 then a 201", seen)
	}
	sameKeyAndBody(t, seen, key.String())
	if o.Version != 1 || ordersOf(t, tenant) != 1 {
		t.Fatalf("order %+v, %d orders; want one", o, ordersOf(t, tenant))
	}
}

// A 408 body-timeout (nothing ran) and a 409 that carries Retry-After (a
// refusal for now, which the server does not store) are sent again with the
// same key and body, after Retry-After: the server says to retry them, and
// the client used to return both as final. On the real api, a cancel of a
// payment_pending order is such a 409: retried until the attempts run out,
// and then not definitive.
func TestBodyTimeoutAndConflictWithRetryAfterAreRetried(t *testing.T) {
	t.Parallel()
	plan := func(n int) fault { return map[int]fault{1: fail408Before, 2: fail409LaterBefore}[n] }
	p, base := newProxy(t, plan)
	c, tenant := newClient(t, base)
	ctx := context.Background()
	var meta client.Meta
	start := time.Now()
	o, err := c.CreateOrder(ctx, newOrder("c-1"), client.WithMeta(&meta))
	if err != nil {
		t.Fatalf("CreateOrder: %v", err)
	}
	seen := p.seen()
	if len(seen) != 3 || seen[0].status != http.StatusRequestTimeout || seen[1].status != http.StatusConflict || seen[2].status != http.StatusCreated {
		t.Fatalf("attempts %+v; want a 408, a 409, then a 201", seen)
	}
	sameKeyAndBody(t, seen, meta.IdempotencyKey)
	if time.Since(start) < time.Second {
		t.Fatalf("retried after %s, before the 409's Retry-After: 1", time.Since(start))
	}
	if !meta.Definitive || meta.Attempts != 3 || o.Version != 1 || ordersOf(t, tenant) != 1 {
		t.Fatalf("meta %+v, order %+v, %d orders; want one order after 3 attempts", meta, o, ordersOf(t, tenant))
	}

	// The real api: no payment worker runs in this stack, so the order
	// stays payment_pending and every cancel is refused for now.
	_, direct := stack()
	c2, _ := newClient(t, direct, client.WithMaxAttempts(2))
	o, err = c2.CreateOrder(ctx, newOrder("c-1"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c2.PayOrder(ctx, o.ID, ""); err != nil {
		t.Fatal(err)
	}
	_, err = c2.CancelOrder(ctx, o.ID, "changed my mind", client.WithMeta(&meta))
	if pr := client.AsProblem(err); !client.IsConflict(err) || pr.RetryAfter != time.Second || meta.Attempts != 2 || meta.Definitive {
		t.Fatalf("cancel while payment_pending: %v, meta %+v; want a 409 with Retry-After: 1 after 2 attempts, not definitive", err, meta)
	}
}

// Retries stop at the context's deadline, keeping the last answer in the
// error; and at MaxAttempts.
func TestRetriesStopAtDeadlineAndMaxAttempts(t *testing.T) {
	t.Parallel()
	p, base := newProxy(t, func(int) fault { return fail503Before })
	c, tenant := newClient(t, base, client.WithMaxAttempts(1000))
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	var meta client.Meta
	_, err := c.CreateOrder(ctx, newOrder("c-1"), client.WithMeta(&meta))
	if !errors.Is(err, context.DeadlineExceeded) || client.AsProblem(err) == nil || client.AsProblem(err).Status != 503 {
		t.Fatalf("err = %v; want the deadline and the last 503", err)
	}
	if d := time.Since(start); d > 700*time.Millisecond {
		t.Fatalf("returned after %s, past the 500ms deadline", d)
	}
	if seen := p.seen(); len(seen) < 2 || meta.Attempts != len(seen) {
		t.Fatalf("%d attempts (meta %d); want several", len(seen), meta.Attempts)
	} else {
		sameKeyAndBody(t, seen, meta.IdempotencyKey)
	}

	p2, base2 := newProxy(t, func(int) fault { return fail503Before })
	c2, _ := newClient(t, base2, client.WithMaxAttempts(3))
	if _, err := c2.CreateOrder(context.Background(), newOrder("c-1")); client.AsProblem(err) == nil || len(p2.seen()) != 3 {
		t.Fatalf("err = %v after %d attempts; want the 503 after 3", err, len(p2.seen()))
	}
	if n := ordersOf(t, tenant); n != 0 {
		t.Fatalf("%d orders, want none", n)
	}
}

// A definitive 4xx is returned at once as a typed *Problem, never retried.
func TestDefinitiveAnswersAreNotRetried(t *testing.T) {
	t.Parallel()
	p, base := newProxy(t, func(int) fault { return pass })
	c, tenant := newClient(t, base)
	ctx := context.Background()

	_, err := c.CreateOrder(ctx, client.NewOrder{CustomerID: "c-1", Currency: "EUR"})
	if pr := client.AsProblem(err); !client.IsValidation(err) || len(pr.Errors) == 0 || pr.Status != 422 {
		t.Fatalf("no items: %v; want 422 validation-failed with the fields", err)
	}

	key := "k-" + uuid.NewString()
	first, err := c.CreateOrder(ctx, newOrder("c-1"), client.WithIdempotencyKey(key))
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.CreateOrder(ctx, newOrder("c-2"), client.WithIdempotencyKey(key))
	if pr := client.AsProblem(err); !client.IsMismatch(err) || len(pr.MismatchedFields) != 1 || pr.MismatchedFields[0] != "customer_id" {
		t.Fatalf("same key, other body: %v; want a mismatch naming customer_id", err)
	}

	_, err = c.ShipOrder(ctx, first.ID)
	if pr := client.AsProblem(err); !client.IsConflict(err) || pr.CurrentStatus != "pending" {
		t.Fatalf("ship a pending order: %v; want a conflict with current_status pending", err)
	}
	if _, _, ok := client.ConflictLocation(err); ok {
		t.Fatalf("a state conflict points at no other order")
	}

	// The key expired and the janitor removed it: a late retry is a
	// conflict naming the order the key created.
	count(t, `WITH d AS (DELETE FROM idempotency_keys WHERE tenant_id = $1 AND key = $2 RETURNING 1) SELECT count(*) FROM d`, tenant, key)
	_, err = c.CreateOrder(ctx, newOrder("c-1"), client.WithIdempotencyKey(key))
	if loc, id, ok := client.ConflictLocation(err); !ok || id != first.ID || loc != "/v1/orders/"+first.ID {
		t.Fatalf("late retry: %v (location %q, id %q); want a conflict pointing at %s", err, loc, id, first.ID)
	}

	_, err = c.GetOrder(ctx, uuid.NewString())
	if !client.IsNotFound(err) {
		t.Fatalf("unknown order: %v; want not-found", err)
	}
	_, err = c.GetOrder(ctx, first.ID, client.WithMinVersion(2), client.WithWait(0))
	if pr := client.AsProblem(err); !client.IsViewBehind(err) || pr.CurrentVersion == nil || *pr.CurrentVersion > 1 || pr.RetryAfter != time.Second {
		t.Fatalf("min_version 2: %v; want view-behind at 0 or 1 with Retry-After: 1", err)
	}
	_, err = c.GetOrder(ctx, first.ID, client.WithMinVersion(99), client.WithWait(0))
	if pr := client.AsProblem(err); !client.IsVersionNotWritten(err) || pr.RetryAfter != 0 {
		t.Fatalf("min_version 99: %v; want version-not-written without Retry-After", err)
	}
	for _, a := range p.seen() {
		if a.status == 0 || a.status >= 500 {
			t.Fatalf("unexpected attempt %+v", a)
		}
	}
	if n := len(p.seen()); n != 8 {
		t.Fatalf("%d requests for 8 calls: something was retried", n)
	}
	if n := ordersOf(t, tenant); n != 1 {
		t.Fatalf("%d orders, want 1", n)
	}
}

// Meta.Definitive tells a call whose outcome is known (a 2xx, or a refusal
// that sending it again would not change) from one that gave up, whose
// outcome is unknown however its last answer looked.
func TestMetaTellsDefinitiveFromGaveUp(t *testing.T) {
	t.Parallel()
	_, base := newProxy(t, func(int) fault { return pass })
	c, _ := newClient(t, base)
	ctx := context.Background()
	var meta client.Meta
	first, err := c.CreateOrder(ctx, newOrder("c-1"), client.WithMeta(&meta))
	if err != nil || !meta.Definitive || meta.Status != http.StatusCreated {
		t.Fatalf("create: %v, meta %+v; want a definitive 201", err, meta)
	}
	_, err = c.ShipOrder(ctx, first.ID, client.WithMeta(&meta))
	if !client.IsConflict(err) || !meta.Definitive || meta.Status != http.StatusConflict {
		t.Fatalf("ship a pending order: %v, meta %+v; want a definitive 409", err, meta)
	}

	_, base503 := newProxy(t, func(int) fault { return fail503Before })
	c503, _ := newClient(t, base503, client.WithMaxAttempts(2), client.WithBackoff(time.Millisecond, time.Millisecond))
	_, err = c503.CreateOrder(ctx, newOrder("c-1"), client.WithMeta(&meta))
	if err == nil || meta.Definitive || meta.Status != http.StatusServiceUnavailable || meta.Attempts != 2 {
		t.Fatalf("out of attempts: %v, meta %+v; want not definitive after two 503s", err, meta)
	}
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	c503, _ = newClient(t, base503, client.WithMaxAttempts(1000), client.WithBackoff(10*time.Millisecond, 50*time.Millisecond))
	_, err = c503.CreateOrder(short, newOrder("c-1"), client.WithMeta(&meta))
	if !errors.Is(err, context.DeadlineExceeded) || meta.Definitive || meta.Status != http.StatusServiceUnavailable {
		t.Fatalf("past the deadline: %v, meta %+v; want not definitive", err, meta)
	}
}

// A Retry-After longer than MaxRetryAfter, up to one whose seconds overflow
// a time.Duration, ends the call with that answer: it used to wrap into a
// short or negative wait (18446744074 s became 0.29 s) and the client
// retried at once.
func TestARetryAfterPastTheClientsLimitEndsTheCall(t *testing.T) {
	t.Parallel()
	for _, ra := range []string{"18446744074", "9223372037", "9223372036854775807", "9223372036854775808", "99999999999999999999", "3601"} {
		t.Run(ra, func(t *testing.T) {
			var hits atomic.Int32
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				hits.Add(1)
				w.Header().Set("Content-Type", "application/problem+json")
				w.Header().Set("Retry-After", ra)
				w.WriteHeader(http.StatusServiceUnavailable)
				_, _ = w.Write([]byte(`{"type":"about:blank","title":"busy","status":503}`))
			}))
			defer srv.Close()
			c, err := client.New(srv.URL, "tok", client.WithBackoff(time.Millisecond, 5*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			_, err = c.GetOrder(context.Background(), uuid.Must(uuid.NewV7()).String())
			if n := hits.Load(); n != 1 || client.AsProblem(err) == nil || client.AsProblem(err).Status != http.StatusServiceUnavailable {
				t.Fatalf("Retry-After: %s: %d attempts, err %v; want one attempt and its 503", ra, n, err)
			}
		})
	}
}

// What net/http would refuse to send (a token with its file's newline, a
// key with CR LF) and a base URL whose query or fragment would swallow
// every path are refused before any attempt: they used to be attempted 8
// times, over 6 s, with an outcome reported unknown; or sent to "/".
func TestARequestThatCouldNeverBeSentIsRefusedBeforeAnyAttempt(t *testing.T) {
	t.Parallel()
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) }))
	defer srv.Close()
	for _, bad := range []struct{ base, token string }{
		{srv.URL, "ord_token-read-from-a-file\n"}, {srv.URL, "ord with space"},
		{srv.URL + "/?tenant=x", "ord_x"}, {srv.URL + "#frag", "ord_x"}, {"http://u:p@" + srv.Listener.Addr().String(), "ord_x"},
	} {
		if _, err := client.New(bad.base, bad.token); err == nil {
			t.Errorf("New(%q, %q) accepted", bad.base, bad.token)
		}
	}
	c, err := client.New(srv.URL, "ord_x", client.WithBackoff(time.Millisecond, 5*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"ship-1\r\n", "é", strings.Repeat("k", 256)} {
		var meta client.Meta
		_, err := c.ShipOrder(context.Background(), uuid.Must(uuid.NewV7()).String(), client.WithIdempotencyKey(key), client.WithMeta(&meta))
		if err == nil || meta.Attempts != 0 || !meta.Definitive || hits.Load() != 0 {
			t.Errorf("key %q: err %v, meta %+v, %d requests; want an error, no attempt, definitive", key, err, meta, hits.Load())
		}
	}
}

// A key is stored exactly as given: one with inner spaces, quotes or
// backslashes replays on a retry and is found by the key the call reports.
// One the server would refuse (a comma) or store as another key (spaces at
// either end, a leading quote) is refused before anything is sent: it used
// to get a 400, or create under another key that the lookup did not find.
func TestAKeyIsStoredExactlyAsGiven(t *testing.T) {
	t.Parallel()
	_, direct := stack()
	c, tenant := newClient(t, direct)
	ctx := context.Background()
	for _, key := range []string{`back\slash "and" quote`, "inner space", "plain-key", `ends-with"`} {
		var meta client.Meta
		o, err := c.CreateOrder(ctx, newOrder("c-1"), client.WithIdempotencyKey(key), client.WithMeta(&meta))
		if err != nil || meta.IdempotencyKey != key {
			t.Fatalf("key %q: %v, meta key %q", key, err, meta.IdempotencyKey)
		}
		again, err := c.CreateOrder(ctx, newOrder("c-1"), client.WithIdempotencyKey(key), client.WithMeta(&meta))
		if err != nil || !meta.Replayed || again.ID != o.ID {
			t.Fatalf("key %q again: %v, replayed %v, order %s then %s", key, err, meta.Replayed, o.ID, again.ID)
		}
		if info, err := c.IdempotencyKey(ctx, key); err != nil || info.Key != key {
			t.Fatalf("key %q: lookup %+v, %v", key, info, err)
		}
	}
	before := ordersOf(t, tenant)
	for _, key := range []string{"invoice-17,attempt-1", " padded-key ", "trailing ", `"quoted"`} {
		var meta client.Meta
		_, err := c.CreateOrder(ctx, newOrder("c-1"), client.WithIdempotencyKey(key), client.WithMeta(&meta))
		if err == nil || meta.Attempts != 0 || !meta.Definitive {
			t.Fatalf("key %q: err %v, meta %+v; want it refused before any attempt", key, err, meta)
		}
	}
	if n := ordersOf(t, tenant); n != before {
		t.Fatalf("%d orders after the refused keys, want %d", n, before)
	}
}

// anOrder is an order as the api answers one.
const anOrder = `{"id":"0190b0b0-0000-7000-8000-000000000001","customer_id":"c-1","status":"pending","currency":"EUR","items":[],"total":0,"version":1}`

// A redirect that would change the method (a proxy's 301 from http to
// https, say: net/http follows it with a GET, without the body) is not
// followed by the default client: the 301 is the answer, final. With an
// HTTP client of the caller's own that follows it, the call fails without
// a retry rather than take the GET's answer for the command's.
func TestAMethodChangingRedirectIsNeverTakenForTheAnswer(t *testing.T) {
	t.Parallel()
	var posts, gets atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			posts.Add(1)
			http.Redirect(w, r, r.URL.Path, http.StatusMovedPermanently)
			return
		}
		gets.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(anOrder))
	}))
	defer srv.Close()
	for _, tc := range []struct {
		name string
		opts []client.Option
	}{
		{"the default HTTP client", nil},
		{"an HTTP client that follows every redirect", []client.Option{client.WithHTTPClient(&http.Client{})}},
	} {
		posts.Store(0)
		gets.Store(0)
		c, err := client.New(srv.URL, "tok", append(tc.opts, client.WithBackoff(time.Millisecond, 5*time.Millisecond))...)
		if err != nil {
			t.Fatal(err)
		}
		var meta client.Meta
		o, err := c.CreateOrder(context.Background(), newOrder("c-1"), client.WithMeta(&meta))
		if err == nil || posts.Load() != 1 {
			t.Errorf("%s: order %+v, err %v after %d POSTs; want an error after one", tc.name, o, err, posts.Load())
		}
		if tc.opts == nil && (gets.Load() != 0 || client.AsProblem(err) == nil || client.AsProblem(err).Status != http.StatusMovedPermanently) {
			t.Errorf("%s: %d GETs, err %v; want the 301 as the answer, no GET", tc.name, gets.Load(), err)
		}
	}
}

// A 2xx whose body is cut short (a proxy's answer without a length whose
// connection is lost) is sent again with the same key, like a lost answer:
// the replay carries the whole order. It used to end the call, marked
// definitive, while the order existed.
func TestASuccessCutShortIsSentAgainWithTheSameKey(t *testing.T) {
	t.Parallel()
	var hits atomic.Int32
	keys := make(chan string, 2)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		keys <- r.Header.Get("Idempotency-Key")
		if hits.Add(1) == 1 {
			conn, buf, err := w.(http.Hijacker).Hijack()
			if err != nil {
				t.Error(err)
				return
			}
			_, _ = buf.WriteString("HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n" + anOrder[:40])
			_ = buf.Flush()
			_ = conn.Close()
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Idempotent-Replayed", "true")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(anOrder))
	}))
	defer srv.Close()
	c, err := client.New(srv.URL, "tok", client.WithBackoff(time.Millisecond, 5*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	var meta client.Meta
	o, err := c.CreateOrder(context.Background(), newOrder("c-1"), client.WithMeta(&meta))
	if err != nil || o.ID == "" || meta.Attempts != 2 || !meta.Replayed || !meta.Definitive {
		t.Fatalf("order %+v, err %v, meta %+v; want the replayed order on attempt 2", o, err, meta)
	}
	if first, second := <-keys, <-keys; first != second {
		t.Fatalf("keys %q then %q; want one", first, second)
	}
}

// A Retry-After that reads as neither seconds nor a date (a proxy's
// garbage) does not make a final 409 retryable.
func TestAnUnreadableRetryAfterLeavesAConflictFinal(t *testing.T) {
	t.Parallel()
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.Header().Set("Content-Type", "application/problem+json")
		w.Header().Set("Retry-After", "soon")
		w.WriteHeader(http.StatusConflict)
		_, _ = w.Write([]byte(`{"type":"about:blank","title":"conflict","status":409}`))
	}))
	defer srv.Close()
	c, err := client.New(srv.URL, "tok", client.WithBackoff(time.Millisecond, 5*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	var meta client.Meta
	_, err = c.CreateOrder(context.Background(), newOrder("c-1"), client.WithMeta(&meta))
	if hits.Load() != 1 || !meta.Definitive || client.AsProblem(err) == nil {
		t.Fatalf("%d attempts, meta %+v, err %v; want one final 409", hits.Load(), meta, err)
	}
}

// A redirect to another origin (another port, host or scheme: a
// misconfigured proxy, or a hostile one) is not followed: the token, the
// key and the command go nowhere else, and the 307 is the answer.
func TestARedirectToAnotherOriginIsNotFollowed(t *testing.T) {
	t.Parallel()
	var elsewhere atomic.Int32
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		elsewhere.Add(1)
		w.WriteHeader(http.StatusTeapot)
	}))
	defer other.Close()
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, other.URL+r.URL.Path, http.StatusTemporaryRedirect)
	}))
	defer front.Close()
	c, err := client.New(front.URL, "ord_secret", client.WithBackoff(time.Millisecond, 5*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	var meta client.Meta
	_, err = c.CreateOrder(context.Background(), newOrder("c-1"), client.WithMeta(&meta))
	if p := client.AsProblem(err); p == nil || p.Status != http.StatusTemporaryRedirect || elsewhere.Load() != 0 || meta.Attempts != 1 {
		t.Fatalf("err %v after %d attempts, %d requests at the other origin; want the 307 as the answer and none there", err, meta.Attempts, elsewhere.Load())
	}
}

// A problem whose media type is written in capitals (a proxy's) is still
// read: its type and Retry-After decide, not "about:blank".
func TestAProblemIsReadWhateverTheCaseOfItsMediaType(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "Application/Problem+JSON; charset=utf-8")
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte(`{"type":"` + client.TypeNotFound + `","title":"not found","status":404}`))
	}))
	defer srv.Close()
	c, err := client.New(srv.URL, "tok")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetOrder(context.Background(), uuid.NewString()); !client.IsNotFound(err) {
		t.Fatalf("err %v; want not-found", err)
	}
}

// An answer longer than the client reads is reported as such, once: a
// retry would get it again.
func TestAnAnswerTooLargeIsNotRetried(t *testing.T) {
	t.Parallel()
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"orders":[],"pad":"`))
		_, _ = w.Write(bytes.Repeat([]byte("x"), 9<<20))
		_, _ = w.Write([]byte(`"}`))
	}))
	defer srv.Close()
	c, err := client.New(srv.URL, "tok", client.WithBackoff(time.Millisecond, 5*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.ListOrders(context.Background(), client.ListOptions{})
	if err == nil || hits.Load() != 1 || !strings.Contains(err.Error(), "more than") {
		t.Fatalf("err %v after %d attempts; want one, saying the answer is too large", err, hits.Load())
	}
}

// DailySales asks for the UTC dates of its bounds, wherever the caller's
// clock is: 22:00 on the 25th at UTC-5 is the 26th in UTC.
func TestDailySalesAsksForUTCDates(t *testing.T) {
	t.Parallel()
	got := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.URL.RawQuery
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"from":"2026-11-26","to":"2026-11-26","days":[]}`))
	}))
	defer srv.Close()
	c, err := client.New(srv.URL, "tok")
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 11, 25, 22, 0, 0, 0, time.FixedZone("UTC-5", -5*3600))
	if _, err := c.DailySales(context.Background(), client.DailySalesOptions{From: at, To: at}); err != nil {
		t.Fatal(err)
	}
	if q := <-got; q != "from=2026-11-26&to=2026-11-26" {
		t.Fatalf("query %q; want the UTC date 2026-11-26 for both", q)
	}
}
