package httpapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"

	"github.com/acme/orders/domain"
	"github.com/acme/orders/internal/testenv"
)

// charge records the payment worker's outcome of an order's current
// payment attempt (succeeded, or declined), as the worker will.
func (a api) charge(tb testing.TB, orderID string, ok bool) domain.Order {
	tb.Helper()
	return testenv.SettlePayment(tb, a.db, uuid.MustParse(orderID), ok)
}

type payOut struct {
	orderOut
	Payment *struct {
		Attempt     int    `json:"attempt"`
		Method      string `json:"payment_method"`
		ChargeID    string `json:"charge_id"`
		DeclineCode string `json:"decline_code"`
	} `json:"payment"`
	Refund string `json:"refund"`
}

func decodePay(t *testing.T, r response) payOut {
	t.Helper()
	var o payOut
	if err := json.Unmarshal(r.body, &o); err != nil {
		t.Fatalf("order JSON %s: %v", r.body, err)
	}
	return o
}

func TestPayOverHTTP(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	created := decodeOrder(t, a.post(t, "create", validBody))
	path := "/v1/orders/" + created.ID
	pay := func(key, body string) response {
		return a.do(t, http.MethodPost, path+"/pay", map[string]string{"Idempotency-Key": key}, body)
	}
	requests := func() int {
		var n int
		if err := a.db.QueryRow(context.Background(), `SELECT count(*) FROM outbox WHERE event_type = 'payment.requested'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	// Bad input writes nothing: a malformed payment method, a body pay does not take.
	keys, orders, _, events := a.counts(t)
	for _, tt := range []struct {
		body   string
		status int
		typ    string
	}{
		{`{"payment_method":"visa"}`, 422, "validation-failed"},
		{`{"payment_method":""}`, 422, "validation-failed"},
		{`{"payment_method":"pm_` + strings.Repeat("x", 65) + `"}`, 422, "validation-failed"},
		{`{"payment_method":"pm_card visa"}`, 422, "validation-failed"},
		{`{"payment_method":7}`, 400, "malformed-request"},
		{`{"amount":100}`, 400, "malformed-request"},
	} {
		r := pay("bad-"+tt.body, tt.body)
		p := decodeProblem(t, r)
		if r.status != tt.status || !strings.HasSuffix(p.Type, tt.typ) || r.header.Get("Content-Type") != "application/problem+json" {
			t.Fatalf("pay %s: %d %s; want %d %s", tt.body, r.status, r.body, tt.status, tt.typ)
		}
		if tt.status == 422 && (len(p.Errors) != 1 || p.Errors[0].Field != "payment_method") {
			t.Fatalf("pay %s: errors %+v; want payment_method named", tt.body, p.Errors)
		}
	}
	if k, o, _, e := a.counts(t); k != keys || o != orders || e != events {
		t.Fatalf("bad input wrote rows: keys %d→%d, outbox %d→%d", keys, k, events, e)
	}
	if r := a.do(t, http.MethodPost, path+"/ship", map[string]string{"Idempotency-Key": "ship-body"}, `{"carrier":"ups"}`); r.status != 400 {
		t.Fatalf("a body on ship: %d %s", r.status, r.body)
	}

	// Attempt 1 with a method that declines: 202, Location, payment_pending.
	first := pay("pay-1", `{"payment_method":"pm_card_chargeDeclined"}`)
	if o := decodePay(t, first); first.status != 202 || first.header.Get("Location") != path || o.Status != "payment_pending" ||
		o.Payment == nil || o.Payment.Attempt != 1 || o.Payment.Method != "pm_card_chargeDeclined" {
		t.Fatalf("pay: %d %s", first.status, first.body)
	}
	// Another key on the same order: no second attempt, 200 with the order as it is.
	if r := pay("pay-other-client", ""); r.status != 200 || decodePay(t, r).Payment.Attempt != 1 || requests() != 1 {
		t.Fatalf("second pay with another key: %d %s, %d payment requests", r.status, r.body, requests())
	}
	// Cancelling while the charge may be in flight is refused for now:
	// Retry-After, and not stored, so the same key runs again later (below).
	if r := a.do(t, http.MethodPost, path+"/cancel", map[string]string{"Idempotency-Key": "cancel-1"}, `{"reason":"changed my mind"}`); r.status != 409 ||
		!strings.Contains(string(r.body), `"current_status":"payment_pending"`) || r.header.Get("Retry-After") != "1" {
		t.Fatalf("cancel of a payment_pending order: %d %v %s", r.status, r.header, r.body)
	}
	// So is shipping it: once the payment settles, the same key ships.
	if r := a.do(t, http.MethodPost, path+"/ship", map[string]string{"Idempotency-Key": "ship-early"}, ""); r.status != 409 ||
		!strings.Contains(string(r.body), `"current_status":"payment_pending"`) || r.header.Get("Retry-After") != "1" {
		t.Fatalf("ship of a payment_pending order: %d %v %s", r.status, r.header, r.body)
	}
	var stored int
	if err := a.db.QueryRow(context.Background(), `SELECT count(*) FROM idempotency_keys WHERE key IN ('cancel-1', 'ship-early')`).Scan(&stored); err != nil || stored != 0 {
		t.Fatalf("the refusals for now were stored under their keys: %d rows (%v)", stored, err)
	}

	// Declined: payment_failed; paying again starts attempt 2 with a new key.
	if o := a.charge(t, created.ID, false); o.Status != domain.StatusPaymentFailed {
		t.Fatalf("declined: %s", o.Status)
	}
	second := pay("pay-2", "")
	if o := decodePay(t, second); second.status != 202 || o.Payment.Attempt != 2 || o.Payment.Method != domain.DefaultPaymentMethod || requests() != 2 {
		t.Fatalf("pay after a decline: %d %s", second.status, second.body)
	}
	var k1, k2 string
	if err := a.db.QueryRow(context.Background(), `SELECT min(payload->'data'->>'payment_key'), max(payload->'data'->>'payment_key')
FROM outbox WHERE event_type = 'payment.requested'`).Scan(&k1, &k2); err != nil {
		t.Fatal(err)
	}
	if k1 == k2 || !strings.HasSuffix(k1, ":charge:1") || !strings.HasSuffix(k2, ":charge:2") {
		t.Fatalf("payment keys %q, %q: want one per attempt", k1, k2)
	}

	// Charged: paid; pay is a 200 no-op.
	if o := a.charge(t, created.ID, true); o.Status != domain.StatusPaid {
		t.Fatalf("charged: %s", o.Status)
	}
	if r := pay("pay-3", ""); r.status != 200 || decodePay(t, r).Status != "paid" || requests() != 2 {
		t.Fatalf("pay of a paid order: %d %s", r.status, r.body)
	}

	// Cancel of a paid order: cancelled at once, refund pending, two events.
	_, _, _, before := a.counts(t)
	c := a.do(t, http.MethodPost, path+"/cancel", map[string]string{"Idempotency-Key": "cancel-1"}, `{"reason":"changed my mind"}`)
	if o := decodePay(t, c); c.status != 200 || o.Status != "cancelled" || o.Refund != "pending" || o.Version != 7 ||
		c.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("cancel of a paid order (the key refused for now before): %d %v %s", c.status, c.header, c.body)
	}
	if _, _, _, after := a.counts(t); after != before+2 {
		t.Fatalf("cancel of a paid order wrote %d events, want 2 (order.cancelled, refund.requested)", after-before)
	}
	// Paying a cancelled order: 409, nothing written.
	_, _, _, before = a.counts(t)
	if r := pay("pay-4", ""); r.status != 409 || !strings.Contains(string(r.body), `"current_status":"cancelled"`) {
		t.Fatalf("pay of a cancelled order: %d %s", r.status, r.body)
	}
	if _, _, _, after := a.counts(t); after != before {
		t.Fatal("paying a cancelled order wrote events")
	}
}

// Clients racing to pay one order under different keys make one payment
// attempt: exactly one gets 202, the others 200 with the order as it is.
func TestConcurrentPayMakesOneAttempt(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	id := decodeOrder(t, a.post(t, "create", validBody)).ID
	const clients = 8
	statuses := make(chan int, clients)
	var wg sync.WaitGroup
	for i := range clients {
		wg.Go(func() {
			r := a.do(t, http.MethodPost, "/v1/orders/"+id+"/pay", map[string]string{"Idempotency-Key": fmt.Sprintf("racer-%d", i)}, "")
			statuses <- r.status
		})
	}
	wg.Wait()
	close(statuses)
	got := map[int]int{}
	for s := range statuses {
		got[s]++
	}
	if got[202] != 1 || got[200] != clients-1 {
		t.Fatalf("statuses %v; want one 202 and %d × 200", got, clients-1)
	}
	var n int
	if err := a.db.QueryRow(context.Background(), `SELECT count(*) FROM outbox WHERE event_type = 'payment.requested'`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d payment.requested events (%v), want 1", n, err)
	}
}

// An order no provider charge can pay (a total of 0, or above
// domain.MaxChargeAmount) is refused at pay: 422 amount-not-chargeable,
// nothing written (not even the key, so a retry is refused again), no
// payment.requested; the order stays pending. The most a charge can be pays.
func TestPayOfAnUnchargeableTotalIsRefused(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	body := func(qty, price int64) string {
		return fmt.Sprintf(`{"customer_id":"c-1","currency":"EUR","items":[{"sku":"sku-1","quantity":%d,"unit_price":%d}]}`, qty, price)
	}
	for _, tt := range []struct {
		name       string
		qty, price int64
		chargeable bool
		wantTotal  int64
	}{
		{"free", 3, 0, false, 0},
		{"above the charge limit", 2, 50_000_000, false, 100_000_000},
		{"far above", 10_000, 100_000_000, false, 1_000_000_000_000},
		{"at the charge limit", 1, domain.MaxChargeAmount, true, domain.MaxChargeAmount},
	} {
		created := a.post(t, "create-"+tt.name, body(tt.qty, tt.price))
		if created.status != 201 {
			t.Fatalf("%s: create %d %s", tt.name, created.status, created.body)
		}
		id := decodeOrder(t, created).ID
		keys, _, _, events := a.counts(t)
		for range 2 { // a retry with the same key is refused again
			r := a.do(t, http.MethodPost, "/v1/orders/"+id+"/pay", map[string]string{"Idempotency-Key": "pay-" + tt.name}, "")
			if tt.chargeable {
				if r.status != 202 {
					t.Fatalf("%s: pay %d %s; want 202", tt.name, r.status, r.body)
				}
				break
			}
			p := decodeProblem(t, r)
			if r.status != 422 || !strings.HasSuffix(p.Type, "/amount-not-chargeable") || r.header.Get("Content-Type") != "application/problem+json" ||
				!strings.Contains(string(r.body), fmt.Sprint(tt.wantTotal)) || !strings.Contains(string(r.body), `"current_status":"pending"`) {
				t.Fatalf("%s: pay %d %v %s; want 422 amount-not-chargeable naming the total", tt.name, r.status, r.header, r.body)
			}
			if k, _, _, e := a.counts(t); k != keys || e != events {
				t.Fatalf("%s: the refused pay wrote rows: keys %d→%d, outbox %d→%d", tt.name, keys, k, events, e)
			}
		}
		var status string
		if err := a.db.QueryRow(context.Background(), `SELECT status FROM orders WHERE id = $1`, id).Scan(&status); err != nil {
			t.Fatal(err)
		}
		if want := map[bool]string{true: "payment_pending", false: "pending"}[tt.chargeable]; status != want {
			t.Fatalf("%s: order %s after pay; want %s", tt.name, status, want)
		}
	}
}

// A refund that failed is asked for again with POST /refund: a new refund
// attempt with its own key (202), never while one is pending or after one
// succeeded (200, nothing written), never for an order not cancelled or
// never paid (409, nothing written). A retry of the request replays.
func TestRefundOverHTTP(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	refund := func(id, key string) response {
		return a.do(t, http.MethodPost, "/v1/orders/"+id+"/refund", map[string]string{"Idempotency-Key": key}, "")
	}
	refundRequests := func(id string) []string {
		rows, err := a.db.Query(context.Background(), `SELECT payload->'data'->>'refund_key' FROM outbox
WHERE aggregate_id = $1 AND event_type = 'refund.requested' ORDER BY aggregate_version`, id)
		if err != nil {
			t.Fatal(err)
		}
		var keys []string
		for rows.Next() {
			var k string
			if err := rows.Scan(&k); err != nil {
				t.Fatal(err)
			}
			keys = append(keys, k)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return keys
	}
	cancel := func(id string) {
		if r := a.do(t, http.MethodPost, "/v1/orders/"+id+"/cancel", map[string]string{"Idempotency-Key": "cancel-" + id}, `{"reason":"changed my mind"}`); r.status != 200 {
			t.Fatalf("cancel: %d %s", r.status, r.body)
		}
	}

	// Not cancelled, or cancelled never paid: 409, nothing written.
	pending := decodeOrder(t, a.post(t, "create-pending", validBody))
	if r := refund(pending.ID, "refund-pending"); r.status != 409 || !strings.Contains(string(r.body), `"current_status":"pending"`) {
		t.Fatalf("refund of a pending order: %d %s", r.status, r.body)
	}
	cancel(pending.ID)
	_, _, _, events := a.counts(t)
	if r := refund(pending.ID, "refund-never-paid"); r.status != 409 || !strings.Contains(string(r.body), "never paid") {
		t.Fatalf("refund of a cancelled order never paid: %d %s", r.status, r.body)
	}
	if _, _, _, e := a.counts(t); e != events {
		t.Fatalf("a refused refund wrote %d events", e-events)
	}

	paid := decodeOrder(t, a.post(t, "create-paid", validBody))
	if r := a.do(t, http.MethodPost, "/v1/orders/"+paid.ID+"/pay", map[string]string{"Idempotency-Key": "pay-paid"}, ""); r.status != 202 {
		t.Fatalf("pay: %d %s", r.status, r.body)
	}
	a.charge(t, paid.ID, true)
	if r := refund(paid.ID, "refund-paid"); r.status != 409 || !strings.Contains(string(r.body), "cancel") {
		t.Fatalf("refund of a paid order not cancelled: %d %s", r.status, r.body)
	}
	cancel(paid.ID) // refund attempt 1, version 5
	if r := refund(paid.ID, "refund-while-pending"); r.status != 200 || decodePay(t, r).Refund != "pending" || len(refundRequests(paid.ID)) != 1 {
		t.Fatalf("refund while attempt 1 is pending: %d %s, %d refund requests", r.status, r.body, len(refundRequests(paid.ID)))
	}

	// Attempt 1 failed: asked again, attempt 2 with its own key.
	if o := testenv.SettleRefund(t, a.db, uuid.MustParse(paid.ID), false); o.Refund.Status != domain.RefundFailed {
		t.Fatalf("refund 1 recorded as %q, want failed", o.Refund.Status)
	}
	again := refund(paid.ID, "refund-again")
	o := decodePay(t, again)
	if again.status != 202 || again.header.Get("Location") != "/v1/orders/"+paid.ID || o.Refund != "pending" || o.Version != 7 ||
		!strings.Contains(string(again.body), `"refund_details":{"attempt":2}`) {
		t.Fatalf("refund after a failed one: %d %v %s", again.status, again.header, again.body)
	}
	keys := refundRequests(paid.ID)
	if len(keys) != 2 || !strings.HasSuffix(keys[0], ":refund:1") || !strings.HasSuffix(keys[1], ":refund:2") {
		t.Fatalf("refund keys %q: want one per attempt", keys)
	}
	// Its retry replays; another key while attempt 2 is pending changes nothing.
	if r := refund(paid.ID, "refund-again"); r.status != 202 || r.header.Get("Idempotent-Replayed") != "true" || len(refundRequests(paid.ID)) != 2 {
		t.Fatalf("retry of the refund: %d %v %s", r.status, r.header, r.body)
	}
	if r := refund(paid.ID, "refund-again-other"); r.status != 200 || len(refundRequests(paid.ID)) != 2 {
		t.Fatalf("refund with another key while attempt 2 is pending: %d %s", r.status, r.body)
	}

	// Succeeded: asked again, nothing.
	if o := testenv.SettleRefund(t, a.db, uuid.MustParse(paid.ID), true); o.Refund.Status != domain.RefundSucceeded {
		t.Fatalf("refund 2 recorded as %q, want succeeded", o.Refund.Status)
	}
	if r := refund(paid.ID, "refund-after-success"); r.status != 200 || decodePay(t, r).Refund != "succeeded" || len(refundRequests(paid.ID)) != 2 {
		t.Fatalf("refund of a refunded order: %d %s", r.status, r.body)
	}
	// A body refund does not take: 400, nothing written.
	if r := a.do(t, http.MethodPost, "/v1/orders/"+paid.ID+"/refund", map[string]string{"Idempotency-Key": "refund-body"}, `{"amount":1}`); r.status != 400 {
		t.Fatalf("a body on refund: %d %s", r.status, r.body)
	}
}
