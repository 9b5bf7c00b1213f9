package httpapi_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
)

type orderOut struct {
	ID              string `json:"id"`
	Status          string `json:"status"`
	Version         int64  `json:"version"`
	Note            string `json:"note"`
	ShippingAddress *struct {
		City string `json:"city"`
	} `json:"shipping_address"`
	StatusHistory []struct {
		Status string `json:"status"`
		Reason string `json:"reason"`
	} `json:"status_history"`
}

func decodeOrder(t *testing.T, r response) orderOut {
	t.Helper()
	var o orderOut
	if err := json.Unmarshal(r.body, &o); err != nil {
		t.Fatalf("order JSON %s: %v", r.body, err)
	}
	return o
}

func TestLifecycleOverHTTP(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	created := decodeOrder(t, a.post(t, "create", validBody))
	path := "/v1/orders/" + created.ID
	outbox := func() int {
		_, _, _, n := a.counts(t)
		return n
	}
	step := func(method, suffix, key, body string, header map[string]string) response {
		h := map[string]string{"Idempotency-Key": key}
		for k, v := range header {
			h[k] = v
		}
		return a.do(t, method, path+suffix, h, body)
	}

	// pay: 202 at v2 (payment_pending, its Location); the retry replays; a
	// new key is a no-op 200 without an event (no second attempt).
	paid := step(http.MethodPost, "/pay", "pay-1", "", nil)
	if o := decodeOrder(t, paid); paid.status != 202 || o.Status != "payment_pending" || o.Version != 2 || paid.header.Get("ETag") != `"2"` ||
		paid.header.Get("Location") != path {
		t.Fatalf("pay: %d %s %v", paid.status, paid.body, paid.header)
	}
	if again := step(http.MethodPost, "/pay", "pay-1", "", nil); again.status != 202 || string(again.body) != string(paid.body) || again.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("pay retried: %d %s", again.status, again.body)
	}
	events := outbox()
	if noop := step(http.MethodPost, "/pay", "pay-2", "{}", nil); noop.status != 200 || decodeOrder(t, noop).Version != 2 || outbox() != events {
		t.Fatalf("pay again with a new key: %d %s, %d events (was %d)", noop.status, noop.body, outbox(), events)
	}
	// The payment worker's part, driven directly: the charge succeeded (v3).
	a.charge(t, created.ID, true)

	// PATCH: 428 without If-Match, 412 when stale, 200 with the new ETag.
	patch := `{"note":"ring twice","shipping_address":{"name":"Ada","line1":"1 Main St","city":"Berlin","postal_code":"10115","country":"DE"}}`
	if r := step(http.MethodPatch, "", "patch-0", patch, nil); r.status != http.StatusPreconditionRequired {
		t.Fatalf("PATCH without If-Match: %d %s", r.status, r.body)
	}
	if r := step(http.MethodPatch, "", "patch-1", patch, map[string]string{"If-Match": `"2"`}); r.status != http.StatusPreconditionFailed {
		t.Fatalf("PATCH with a stale If-Match: %d %s", r.status, r.body)
	}
	// Strong comparison: the ETag's exact text, not a number that parses
	// the same (these were taken as version 3).
	for i, tag := range []string{`"03"`, `"+3"`, `"003"`, `W/"3"`, `"3`, `3`, `""3""`} {
		if r := step(http.MethodPatch, "", "patch-tag-"+strconv.Itoa(i), patch, map[string]string{"If-Match": tag}); r.status != http.StatusPreconditionFailed {
			t.Fatalf("PATCH with If-Match %s (the ETag is \"3\"): %d %s", tag, r.status, r.body)
		}
	}
	// Two If-Match lines are one list (RFC 9110, 5.3), refused as the
	// same list in one line is; the first line alone was taken before.
	// Empty lines are no elements: only empty ones are no If-Match.
	for i, tt := range []struct {
		tags []string
		want int
	}{
		{[]string{`"3"`, `"9"`}, http.StatusPreconditionFailed},
		{[]string{`"3", "9"`}, http.StatusPreconditionFailed},
		{[]string{"", " "}, http.StatusPreconditionRequired},
		{[]string{"*"}, http.StatusPreconditionRequired}, // true for any version: names none
	} {
		tags := tt.tags
		req, _ := http.NewRequest(http.MethodPatch, a.url+"/v1/orders/"+created.ID, strings.NewReader(patch))
		req.Header.Set("Authorization", "Bearer "+a.token)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "patch-list-"+strconv.Itoa(i))
		req.Header["If-Match"] = tags
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != tt.want {
			t.Fatalf("PATCH with If-Match lines %q: %d, want %d", tags, res.StatusCode, tt.want)
		}
	}
	patched := step(http.MethodPatch, "", "patch-2", patch, map[string]string{"If-Match": `"3"`})
	if o := decodeOrder(t, patched); patched.status != 200 || o.Version != 4 || o.Note != "ring twice" || o.ShippingAddress == nil ||
		o.ShippingAddress.City != "Berlin" || patched.header.Get("ETag") != `"4"` {
		t.Fatalf("PATCH: %d %s", patched.status, patched.body)
	}
	if r := step(http.MethodPatch, "", "patch-3", `{"note":"x","colour":"red"}`, map[string]string{"If-Match": `"4"`}); r.status != 400 {
		t.Fatalf("PATCH with an unknown field: %d %s", r.status, r.body)
	}

	// ship, then cancel is refused with the current status; ship again is a no-op.
	if r := step(http.MethodPost, "/ship", "ship-1", "", nil); r.status != 200 || decodeOrder(t, r).Status != "shipped" {
		t.Fatalf("ship: %d %s", r.status, r.body)
	}
	refused := step(http.MethodPost, "/cancel", "cancel-1", `{"reason":"too late"}`, nil)
	if refused.status != http.StatusConflict || !strings.Contains(string(refused.body), `"current_status":"shipped"`) {
		t.Fatalf("cancel of a shipped order: %d %s", refused.status, refused.body)
	}
	if again := step(http.MethodPost, "/cancel", "cancel-1", `{"reason":"too late"}`, nil); again.status != 409 || again.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("the refusal is stored and replayed: %d %q", again.status, again.header.Get("Idempotent-Replayed"))
	}
	if r := step(http.MethodPatch, "", "patch-4", `{"note":"late"}`, map[string]string{"If-Match": `"5"`}); r.status != http.StatusConflict {
		t.Fatalf("PATCH of a shipped order: %d %s", r.status, r.body)
	}
	if r := step(http.MethodPost, "/ship", "ship-2", "", nil); r.status != 200 || decodeOrder(t, r).Version != 5 {
		t.Fatalf("ship again: %d %s", r.status, r.body)
	}
	if r := step(http.MethodPost, "/pay", "pay-3", "", nil); r.status != http.StatusConflict || !strings.Contains(string(r.body), `"current_status":"shipped"`) {
		t.Fatalf("pay of a shipped order: %d %s", r.status, r.body)
	}
	if n := outbox(); n != 5 {
		t.Fatalf("%d events, want 5 (created, payment requested, paid, updated, shipped)", n)
	}

	// Bad requests on lifecycle routes.
	for _, tt := range []struct {
		method, path, key, body string
		status                  int
	}{
		{http.MethodPost, path + "/pay", "", "", 400},                                              // no key
		{http.MethodPost, "/v1/orders/nope/pay", "k", "", 400},                                     // bad id
		{http.MethodPost, "/v1/orders/0193b1a8-7c2e-7000-8000-000000000001/pay", "k-404", "", 404}, // unknown order
		{http.MethodPost, path + "/cancel", "k-c", `{}`, 422},                                      // no reason
		{http.MethodPost, path + "/cancel", "k-c2", `{"reason":"x","refund":true}`, 400},           // unknown field
		{http.MethodPost, path + "/pay", "k-p", `{"x":1}`, 400},                                    // a body pay does not take
	} {
		if r := a.do(t, tt.method, tt.path, map[string]string{"Idempotency-Key": tt.key}, tt.body); r.status != tt.status {
			t.Fatalf("%s %s (key %q, body %s): %d %s; want %d", tt.method, tt.path, tt.key, tt.body, r.status, r.body, tt.status)
		}
	}

	// A cancelled order: pay is refused naming "cancelled".
	other := decodeOrder(t, a.post(t, "create-2", validBody))
	cancelled := a.do(t, http.MethodPost, "/v1/orders/"+other.ID+"/cancel", map[string]string{"Idempotency-Key": "c-2"}, `{"reason":"duplicate order"}`)
	if o := decodeOrder(t, cancelled); cancelled.status != 200 || o.Status != "cancelled" || o.StatusHistory[1].Reason != "duplicate order" {
		t.Fatalf("cancel: %d %s", cancelled.status, cancelled.body)
	}
	if r := a.do(t, http.MethodPost, "/v1/orders/"+other.ID+"/pay", map[string]string{"Idempotency-Key": "p-2"}, ""); r.status != 409 ||
		!strings.Contains(string(r.body), `"current_status":"cancelled"`) {
		t.Fatalf("pay of a cancelled order: %d %s", r.status, r.body)
	}
}

// A key reused with another request is refused naming what the client sent
// differently, as it sent it: If-Match, a body field, the order's id in the
// path; never the canonical command's own fields (expected_version,
// set_note, order_id).
func TestMismatchedFieldsNameWhatTheClientSent(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	first := decodeOrder(t, a.post(t, "create-1", validBody))
	second := decodeOrder(t, a.post(t, "create-2", validBody))
	do := func(method, id, suffix, key, body, ifMatch string) response {
		h := map[string]string{"Idempotency-Key": key}
		if ifMatch != "" {
			h["If-Match"] = ifMatch
		}
		return a.do(t, method, "/v1/orders/"+id+suffix, h, body)
	}
	if r := do(http.MethodPatch, first.ID, "", "patch", `{"note":"a"}`, `"1"`); r.status != 200 {
		t.Fatalf("PATCH: %d %s", r.status, r.body)
	}
	if r := do(http.MethodPost, first.ID, "/pay", "pay", "", ""); r.status != 202 {
		t.Fatalf("pay: %d %s", r.status, r.body)
	}
	for _, tt := range []struct {
		name                    string
		method, id, suffix, key string
		body, ifMatch           string
		want                    string
	}{
		{"another If-Match", http.MethodPatch, first.ID, "", "patch", `{"note":"a"}`, `"2"`, "[If-Match]"},
		{"another body field", http.MethodPatch, first.ID, "", "patch", `{"shipping_address":null}`, `"1"`, "[note shipping_address]"},
		{"a field more", http.MethodPatch, first.ID, "", "patch", `{"note":"a","shipping_address":null}`, `"1"`, "[shipping_address]"},
		{"another order", http.MethodPost, second.ID, "/pay", "pay", "", "", "[id]"},
		{"another method", http.MethodPost, first.ID, "/pay", "pay", `{"payment_method":"pm_card_chargeDeclined"}`, "", "[payment_method]"},
	} {
		r := do(tt.method, tt.id, tt.suffix, tt.key, tt.body, tt.ifMatch)
		p := decodeProblem(t, r)
		if r.status != 422 || fmt.Sprint(p.MismatchedFields) != tt.want {
			t.Errorf("%s: %d %s; want 422 with mismatched_fields %s", tt.name, r.status, r.body, tt.want)
		}
	}
}
