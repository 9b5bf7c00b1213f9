package httpapi_test

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/acme/orders/internal/testenv"
)

// expireKeys makes every stored key expired, as 24 hours later.
func (a api) expireKeys(tb testing.TB) {
	tb.Helper()
	if _, err := a.db.Exec(context.Background(), `UPDATE idempotency_keys SET expires_at = now() - interval '1 second'`); err != nil {
		tb.Fatal(err)
	}
}

// A retry that comes after its key's record expired never runs again and
// is never told it did not run: the order keeps the keys of its create,
// pays and updates, and each late retry gets 409 with the order's
// Location, answered anew each time (never stored, so that no other
// request under the key takes it over).
func TestALateRetryIsToldItsKeyRanBefore(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	created := decodeOrder(t, a.post(t, "late-create", validBody))
	path := "/v1/orders/" + created.ID
	expireKeys := func() { t.Helper(); a.expireKeys(t) }
	state := func() (version int64, requests, keys int) {
		t.Helper()
		if err := a.db.QueryRow(context.Background(), `SELECT (SELECT version FROM orders WHERE id = $1),
			(SELECT count(*) FROM outbox WHERE event_type = 'payment.requested'),
			(SELECT count(*) FROM idempotency_keys WHERE expires_at > now())`, created.ID).Scan(&version, &requests, &keys); err != nil {
			t.Fatal(err)
		}
		return version, requests, keys
	}
	lateRetry := func(what string, r func() response) {
		t.Helper()
		v, n, k := state()
		for range 2 {
			res := r()
			p := decodeProblem(t, res)
			if res.status != http.StatusConflict || res.header.Get("Location") != path || res.header.Get("Idempotent-Replayed") != "" ||
				!strings.Contains(p.Detail, "already") || !strings.Contains(p.Detail, "expired") {
				t.Fatalf("late retry of the %s: %d %v %s; want 409 naming the order", what, res.status, res.header, res.body)
			}
			if v2, n2, k2 := state(); v2 != v || n2 != n || k2 != k {
				t.Fatalf("late retry of the %s wrote: version %d→%d, payment requests %d→%d, live keys %d→%d", what, v, v2, n, n2, k, k2)
			}
		}
	}
	pay := func(key string) response {
		return a.do(t, http.MethodPost, path+"/pay", map[string]string{"Idempotency-Key": key}, `{"payment_method":"pm_card_chargeDeclined"}`)
	}

	// A pay whose attempt was declined: its late retry starts no second attempt.
	if r := pay("late-pay"); r.status != 202 {
		t.Fatalf("pay: %d %s", r.status, r.body)
	}
	a.charge(t, created.ID, false)
	expireKeys()
	lateRetry("pay", func() response { return pay("late-pay") })
	// Nor after another key paid (and was declined) in between.
	if r := pay("late-pay-2"); r.status != 202 {
		t.Fatalf("pay with a new key: %d %s", r.status, r.body)
	}
	a.charge(t, created.ID, false)
	expireKeys()
	lateRetry("first pay, after a second", func() response { return pay("late-pay") })

	// An update: told it ran, not 412 "not applied".
	v, _, _ := state()
	patch := func() response {
		return a.do(t, http.MethodPatch, path, map[string]string{"Idempotency-Key": "late-patch", "If-Match": `"` + strconv.FormatInt(v, 10) + `"`}, `{"note":"leave at the door"}`)
	}
	if r := patch(); r.status != 200 {
		t.Fatalf("patch: %d %s", r.status, r.body)
	}
	expireKeys()
	lateRetry("update", patch)

	// A create: another body under its key is refused without being
	// stored, so the original request's own late retry is not told it
	// mismatches.
	other := strings.Replace(validBody, `"c-1"`, `"c-other"`, 1)
	if other == validBody {
		t.Fatal("validBody has no customer c-1")
	}
	lateRetry("create, with another body", func() response { return a.post(t, "late-create", other) })
	lateRetry("create", func() response { return a.post(t, "late-create", validBody) })
}

// A ship or a cancel sent with If-Match that ran, retried after its key
// expired (or after its answer was lost while another client did the same
// step), finds the order shipped or cancelled at a newer version. It is
// answered 200 with the order unchanged, as it is without If-Match, not 412:
// that would tell the client its step did not happen, and the 412 would be
// stored under the key and replayed for a day.
func TestALateShipOrCancelWithIfMatchIsNotTold412(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	expireKeys := func() { t.Helper(); a.expireKeys(t) }
	events := func(id string) (n int) {
		t.Helper()
		if err := a.db.QueryRow(context.Background(), `SELECT count(*) FROM outbox WHERE aggregate_id = $1`, id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	step := func(id, what, key string, version int64, body string) response {
		return a.do(t, http.MethodPost, "/v1/orders/"+id+"/"+what,
			map[string]string{"Idempotency-Key": key, "If-Match": `"` + strconv.FormatInt(version, 10) + `"`}, body)
	}
	check := func(id, what, key string, version int64, body, status string) {
		t.Helper()
		first := step(id, what, key, version, body)
		if first.status != http.StatusOK {
			t.Fatalf("%s: %d %s", what, first.status, first.body)
		}
		ran := decodeOrder(t, first)
		n := events(id)
		expireKeys()
		for i := range 2 {
			r := step(id, what, key, version, body)
			if r.status != http.StatusOK {
				t.Fatalf("late retry %d of the %s with If-Match %d (the order is %s at %d): %d %s; want 200 with the order unchanged",
					i+1, what, version, ran.Status, ran.Version, r.status, r.body)
			}
			if o := decodeOrder(t, r); o.Status != status || o.Version != ran.Version {
				t.Fatalf("late retry %d of the %s: the order is %s at %d, want %s at %d", i+1, what, o.Status, o.Version, status, ran.Version)
			}
			if m := events(id); m != n {
				t.Fatalf("late retry %d of the %s wrote %d events", i+1, what, m-n)
			}
		}
		// Another step under If-Match of a stale version is still refused.
		if r := step(id, "pay", key+"-pay", version, ""); r.status != http.StatusPreconditionFailed && r.status != http.StatusConflict {
			t.Fatalf("a pay with a stale If-Match on a %s order: %d %s", status, r.status, r.body)
		}
	}

	pending := decodeOrder(t, a.post(t, "late-cancel-create", validBody))
	check(pending.ID, "cancel", "late-cancel", pending.Version, `{"reason":"ordered twice"}`, "cancelled")

	paid := decodeOrder(t, a.post(t, "late-ship-create", validBody))
	if r := a.do(t, http.MethodPost, "/v1/orders/"+paid.ID+"/pay", map[string]string{"Idempotency-Key": "late-ship-pay"}, ""); r.status != 202 {
		t.Fatalf("pay: %d %s", r.status, r.body)
	}
	a.charge(t, paid.ID, true)
	check(paid.ID, "ship", "late-ship", paid.Version+2, "", "shipped")
}

// A pay or a refund that changed nothing (another key's attempt was under
// way: 200) ran all the same. Its retry after the key's record expired,
// once that attempt failed, must not start the attempt the first run did
// not: it is told its key ran before (409), while a late retry that still
// changes nothing is answered 200 as the first run was.
func TestALateRetryOfAStepThatChangedNothingStartsNoAttempt(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	expireKeys := func() { t.Helper(); a.expireKeys(t) }
	intents := func(id, eventType string) (n int) {
		t.Helper()
		if err := a.db.QueryRow(context.Background(), `SELECT count(*) FROM outbox WHERE aggregate_id = $1 AND event_type = $2`, id, eventType).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	step := func(id, what, key, body string) response {
		return a.do(t, http.MethodPost, "/v1/orders/"+id+"/"+what, map[string]string{"Idempotency-Key": key}, body)
	}
	late := func(id, what, key, body, eventType string) {
		t.Helper()
		n := intents(id, eventType)
		for range 2 {
			r := step(id, what, key, body)
			if r.status != http.StatusConflict || !strings.Contains(decodeProblem(t, r).Detail, "expired") {
				t.Fatalf("late retry of the %s that changed nothing, after the attempt under way failed: %d %s; want 409 (its key ran before)", what, r.status, r.body)
			}
			if m := intents(id, eventType); m != n {
				t.Fatalf("late retry of the %s started %d attempts", what, m-n)
			}
		}
	}

	// Pay: A's attempt under way, B's pay changes nothing; A is declined.
	order := decodeOrder(t, a.post(t, "noop-create", validBody))
	declining := `{"payment_method":"pm_card_chargeDeclined"}`
	if r := step(order.ID, "pay", "noop-pay-a", declining); r.status != 202 {
		t.Fatalf("pay A: %d %s", r.status, r.body)
	}
	if r := step(order.ID, "pay", "noop-pay-b", declining); r.status != 200 {
		t.Fatalf("pay B while A's attempt is under way: %d %s; want 200", r.status, r.body)
	}
	// While nothing failed, B's late retry still changes nothing: 200.
	expireKeys()
	if r := step(order.ID, "pay", "noop-pay-b", declining); r.status != 200 || intents(order.ID, "payment.requested") != 1 {
		t.Fatalf("late retry of pay B while A's attempt is still under way: %d %s", r.status, r.body)
	}
	a.charge(t, order.ID, false)
	expireKeys()
	late(order.ID, "pay", "noop-pay-b", declining, "payment.requested")

	// Refund: refund 1 pending, another key's refund changes nothing; refund 1 fails.
	paid := decodeOrder(t, a.post(t, "noop-create-2", validBody))
	if r := step(paid.ID, "pay", "noop-pay-2", ""); r.status != 202 {
		t.Fatalf("pay: %d %s", r.status, r.body)
	}
	a.charge(t, paid.ID, true)
	// A pay of a paid order changes nothing, and nothing later can make
	// its retry start an attempt: its key is not kept (no row per request).
	if r := step(paid.ID, "pay", "noop-pay-paid", ""); r.status != 200 {
		t.Fatalf("pay of a paid order: %d %s", r.status, r.body)
	}
	var kept int
	if err := a.db.QueryRow(context.Background(), `SELECT count(*) FROM order_requests WHERE idempotency_key = 'noop-pay-paid'`).Scan(&kept); err != nil || kept != 0 {
		t.Fatalf("a pay of a paid order kept %d order_requests rows (%v), want none", kept, err)
	}
	if r := step(paid.ID, "cancel", "noop-cancel", `{"reason":"ordered twice"}`); r.status != 200 {
		t.Fatalf("cancel: %d %s", r.status, r.body)
	}
	if r := step(paid.ID, "refund", "noop-refund", ""); r.status != 200 {
		t.Fatalf("refund while refund 1 is pending: %d %s; want 200", r.status, r.body)
	}
	testenv.SettleRefund(t, a.db, uuid.MustParse(paid.ID), false)
	expireKeys()
	late(paid.ID, "refund", "noop-refund", "", "refund.requested")

	// An update that changed nothing, and a pay with If-Match of a paid
	// order: once the order moved on, their late retries fail If-Match.
	// They are told their key ran (409, never stored), not 412 "not
	// applied", which would be stored and replayed for a day.
	edited := decodeOrder(t, a.post(t, "noop-create-3", validBody))
	patch := func(key string, version int64, note string) response {
		return a.do(t, http.MethodPatch, "/v1/orders/"+edited.ID, map[string]string{"Idempotency-Key": key, "If-Match": `"` + strconv.FormatInt(version, 10) + `"`},
			`{"note":"`+note+`"}`)
	}
	if r := patch("noop-patch-first", edited.Version, "a"); r.status != 200 {
		t.Fatalf("patch: %d %s", r.status, r.body)
	}
	if r := patch("noop-patch", edited.Version+1, "a"); r.status != 200 || decodeOrder(t, r).Version != edited.Version+1 {
		t.Fatalf("patch that changes nothing: %d %s", r.status, r.body)
	}
	if r := patch("noop-patch-other", edited.Version+1, "b"); r.status != 200 {
		t.Fatalf("another patch: %d %s", r.status, r.body)
	}
	shipped := decodeOrder(t, a.post(t, "noop-create-4", validBody))
	if r := step(shipped.ID, "pay", "noop-pay-4", ""); r.status != 202 {
		t.Fatalf("pay: %d %s", r.status, r.body)
	}
	a.charge(t, shipped.ID, true)
	paidAt := shipped.Version + 2
	payIfMatch := func(key string, version int64) response {
		return a.do(t, http.MethodPost, "/v1/orders/"+shipped.ID+"/pay", map[string]string{"Idempotency-Key": key, "If-Match": `"` + strconv.FormatInt(version, 10) + `"`}, "")
	}
	if r := payIfMatch("noop-pay-if-match", paidAt); r.status != 200 {
		t.Fatalf("pay with If-Match of a paid order: %d %s", r.status, r.body)
	}
	if r := step(shipped.ID, "ship", "noop-ship", ""); r.status != 200 {
		t.Fatalf("ship: %d %s", r.status, r.body)
	}
	expireKeys()
	for _, tc := range []struct {
		what string
		r    func() response
	}{
		{"update that changed nothing", func() response { return patch("noop-patch", edited.Version+1, "a") }},
		{"pay with If-Match that changed nothing", func() response { return payIfMatch("noop-pay-if-match", paidAt) }},
	} {
		for range 2 {
			r := tc.r()
			if r.status != http.StatusConflict || r.header.Get("Idempotent-Replayed") != "" || !strings.Contains(decodeProblem(t, r).Detail, "expired") {
				t.Fatalf("late retry of the %s, the order moved on: %d %v %s; want 409 (its key ran), not stored", tc.what, r.status, r.header, r.body)
			}
		}
	}
}
