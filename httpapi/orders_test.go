package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/acme/orders/auth"
	"github.com/acme/orders/command"
	"github.com/acme/orders/httpapi"
	"github.com/acme/orders/internal/testenv"
	"github.com/acme/orders/query"
)

const validBody = `{"customer_id":"c-1","currency":"EUR","items":[{"sku":"sku-1","quantity":2,"unit_price":1250}]}`

// api is one API server on its own database, with a client of tenant t1.
type api struct {
	handler http.Handler
	url     string
	db      *pgxpool.Pool
	token   string // of tenant t1
	idem    *command.Idempotency
	clients *auth.Clients
}

func newAPI(tb testing.TB) api {
	tb.Helper()
	return newAPIOn(tb, testenv.DB(tb), 24*time.Hour)
}

// newAPIOn serves the API on db, remembering keys for ttl.
func newAPIOn(tb testing.TB, db *pgxpool.Pool, ttl time.Duration) api {
	tb.Helper()
	return newAPIWith(tb, db, command.IdempotencyConfig{TTL: ttl})
}

// newAPIWith serves the API on db with the idempotency settings cfg.
func newAPIWith(tb testing.TB, db *pgxpool.Pool, cfg command.IdempotencyConfig) api {
	tb.Helper()
	return newAPIWithDeps(tb, db, cfg, nil)
}

// newAPIWithDeps is newAPIWith with the Deps changed by change (if not nil).
func newAPIWithDeps(tb testing.TB, db *pgxpool.Pool, cfg command.IdempotencyConfig, change func(*httpapi.Deps)) api {
	tb.Helper()
	idem, err := command.NewIdempotency(db, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	clients := auth.NewClients(db, 0)
	deps := httpapi.Deps{
		Logger:      slog.New(slog.NewTextHandler(io.Discard, nil)),
		Auth:        clients,
		Idempotency: idem,
		Keys:        idem,
		CreateOrder: command.NewCreateOrderHandler(),
		PayOrder:    command.NewPayOrderHandler(),
		ShipOrder:   command.NewShipOrderHandler(),
		CancelOrder: command.NewCancelOrderHandler(),
		RefundOrder: command.NewRefundOrderHandler(),
		UpdateOrder: command.NewUpdateOrderHandler(),
		GetOrder:    query.NewGetOrderHandler(db, nil),
		ListOrders:  query.NewListOrdersHandler(db),

		GetCustomerSummary: query.NewGetCustomerSummaryHandler(db, nil),
	}
	if change != nil {
		change(&deps)
	}
	handler := httpapi.New(deps)
	srv := httptest.NewServer(validated(tb, handler))
	tb.Cleanup(srv.Close)
	a := api{handler: handler, url: srv.URL, db: db, idem: idem, clients: clients}
	a.token = a.newToken(tb, "t1")
	return a
}

func (a api) newToken(tb testing.TB, tenant string) string {
	tb.Helper()
	token, err := a.clients.CreateToken(context.Background(), tenant, "test")
	if err != nil {
		tb.Fatal(err)
	}
	return token
}

type response struct {
	status int
	header http.Header
	body   []byte
}

func (a api) do(tb testing.TB, method, path string, header map[string]string, body string) response {
	tb.Helper()
	req, err := http.NewRequest(method, a.url+path, strings.NewReader(body))
	if err != nil {
		tb.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+a.token)
	for k, v := range header {
		if v == "-" {
			req.Header.Del(k) // "-" sends no such header at all
			continue
		}
		req.Header.Set(k, v)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		tb.Fatal(err)
	}
	return response{status: res.StatusCode, header: res.Header, body: b}
}

func (a api) post(tb testing.TB, key, body string) response {
	tb.Helper()
	h := map[string]string{}
	if key != "" {
		h["Idempotency-Key"] = key
	}
	return a.do(tb, http.MethodPost, "/v1/orders", h, body)
}

// counts returns the number of rows in the tables a create writes, and of
// the items in its orders.
func (a api) counts(tb testing.TB) (keys, orders, items, outbox int) {
	tb.Helper()
	err := a.db.QueryRow(context.Background(), `SELECT
		(SELECT count(*) FROM idempotency_keys), (SELECT count(*) FROM orders),
		(SELECT coalesce(sum(jsonb_array_length(items)), 0) FROM orders), (SELECT count(*) FROM outbox)`).Scan(&keys, &orders, &items, &outbox)
	if err != nil {
		tb.Fatal(err)
	}
	return
}

type problemJSON struct {
	Type             string `json:"type"`
	Title            string `json:"title"`
	Status           int    `json:"status"`
	Detail           string `json:"detail"`
	Instance         string `json:"instance"`
	MismatchedFields []string
	Errors           []struct{ Field, Detail string }
}

func decodeProblem(tb testing.TB, r response) problemJSON {
	tb.Helper()
	if ct := r.header.Get("Content-Type"); ct != "application/problem+json" {
		tb.Fatalf("Content-Type = %q, want application/problem+json (body %s)", ct, r.body)
	}
	var p struct {
		problemJSON
		Mismatched []string `json:"mismatched_fields"`
	}
	if err := json.Unmarshal(r.body, &p); err != nil {
		tb.Fatalf("problem body %s: %v", r.body, err)
	}
	p.MismatchedFields = p.Mismatched
	if p.Status != r.status {
		tb.Fatalf("problem status %d != response status %d", p.Status, r.status)
	}
	return p.problemJSON
}

func TestCreateOrderRefusesBadInputAndWritesNothing(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	huge := `{"customer_id":"` + strings.Repeat("x", 1<<20) + `","currency":"EUR","items":[]}`
	tests := []struct {
		name        string
		header      map[string]string
		body        string
		status      int
		problemType string
		fields      []string
	}{
		{"missing key", nil, validBody, 400, "missing-idempotency-key", nil},
		{"empty key", map[string]string{"Idempotency-Key": ""}, validBody, 400, "invalid-idempotency-key", nil},
		{"empty quoted key", map[string]string{"Idempotency-Key": `""`}, validBody, 400, "invalid-idempotency-key", nil},
		{"key of 256 chars", map[string]string{"Idempotency-Key": strings.Repeat("k", 256)}, validBody, 400, "invalid-idempotency-key", nil},
		{"key with control char", map[string]string{"Idempotency-Key": "a\tb"}, validBody, 400, "invalid-idempotency-key", nil},
		{"key with non-ascii", map[string]string{"Idempotency-Key": "clé"}, validBody, 400, "invalid-idempotency-key", nil},
		{"two keys folded into one line", map[string]string{"Idempotency-Key": "a, b"}, validBody, 400, "invalid-idempotency-key", nil},
		{"unterminated quoted key", map[string]string{"Idempotency-Key": `"abc`}, validBody, 400, "invalid-idempotency-key", nil},
		{"quoted key then junk", map[string]string{"Idempotency-Key": `"abc"x`}, validBody, 400, "invalid-idempotency-key", nil},
		{"bad json", map[string]string{"Idempotency-Key": "k1"}, `{"customer_id":`, 400, "malformed-request", nil},
		{"not an object", map[string]string{"Idempotency-Key": "k1"}, `[1,2]`, 400, "malformed-request", nil},
		{"empty body", map[string]string{"Idempotency-Key": "k1"}, ``, 400, "malformed-request", nil},
		{"trailing data", map[string]string{"Idempotency-Key": "k1"}, validBody + `{}`, 400, "malformed-request", nil},
		{"unknown field", map[string]string{"Idempotency-Key": "k1"}, `{"customer_id":"c","currency":"EUR","items":[],"discount":5}`, 400, "malformed-request", []string{"discount"}},
		{"wrong type", map[string]string{"Idempotency-Key": "k1"}, `{"customer_id":"c","currency":"EUR","items":[{"sku":"s","quantity":1.5,"unit_price":1}]}`, 400, "malformed-request", []string{"items[0].quantity"}},
		{"number too big", map[string]string{"Idempotency-Key": "k1"}, `{"customer_id":"c","currency":"EUR","items":[{"sku":"s","quantity":1,"unit_price":99999999999999999999}]}`, 400, "malformed-request", []string{"items[0].unit_price"}},
		{"wrong content type", map[string]string{"Idempotency-Key": "k1", "Content-Type": "text/plain"}, validBody, 415, "unsupported-media-type", nil},
		{"validation", map[string]string{"Idempotency-Key": "k1"}, `{"customer_id":"","currency":"eur","items":[{"sku":"","quantity":0,"unit_price":-1}]}`, 422, "validation-failed",
			[]string{"customer_id", "currency", "items[0].sku", "items[0].quantity", "items[0].unit_price"}},
		{"no items", map[string]string{"Idempotency-Key": "k1"}, `{"customer_id":"c","currency":"EUR","items":[]}`, 422, "validation-failed", []string{"items"}},
		{"body over 1 MiB", map[string]string{"Idempotency-Key": "k1"}, huge, 413, "body-too-large", nil},
		{"body over 1 MiB in trailing space", map[string]string{"Idempotency-Key": "k1"}, validBody + strings.Repeat(" ", 1<<20), 413, "body-too-large", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := a.do(t, http.MethodPost, "/v1/orders", tt.header, tt.body)
			if res.status != tt.status {
				t.Fatalf("status = %d, want %d; body %s", res.status, tt.status, res.body)
			}
			p := decodeProblem(t, res)
			if want := "https://orders.acme.example/problems/" + tt.problemType; p.Type != want {
				t.Fatalf("type = %q, want %q", p.Type, want)
			}
			var fields []string
			for _, f := range p.Errors {
				fields = append(fields, f.Field)
			}
			if fmt.Sprint(fields) != fmt.Sprint(tt.fields) {
				t.Fatalf("fields = %v, want %v", fields, tt.fields)
			}
		})
	}
	if keys, orders, items, outbox := a.counts(t); keys+orders+items+outbox != 0 {
		t.Fatalf("bad input wrote rows: keys=%d orders=%d items=%d outbox=%d", keys, orders, items, outbox)
	}
}

func TestCreateOrderThenReplayThenMismatch(t *testing.T) {
	t.Parallel()
	a := newAPI(t)

	first := a.post(t, "key-1", validBody)
	if first.status != http.StatusCreated {
		t.Fatalf("create: status %d, body %s", first.status, first.body)
	}
	var o struct {
		ID         string `json:"id"`
		CustomerID string `json:"customer_id"`
		Status     string `json:"status"`
		Currency   string `json:"currency"`
		Items      []struct {
			SKU       string `json:"sku"`
			Quantity  int64  `json:"quantity"`
			UnitPrice int64  `json:"unit_price"`
			LineTotal int64  `json:"line_total"`
		} `json:"items"`
		Total           int64     `json:"total"`
		Version         int64     `json:"version"`
		CreatedAt       time.Time `json:"created_at"`
		UpdatedAt       time.Time `json:"updated_at"`
		ShippingAddress *struct{} `json:"shipping_address"`
		Note            string    `json:"note"`
		StatusHistory   []struct {
			Status string    `json:"status"`
			At     time.Time `json:"at"`
		} `json:"status_history"`
		Payment *struct{} `json:"payment"`
		Refund  string    `json:"refund"`
	}
	dec := json.NewDecoder(bytes.NewReader(first.body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&o); err != nil {
		t.Fatalf("order JSON %s: %v", first.body, err)
	}
	if o.Status != "pending" || o.Total != 2500 || o.Version != 1 || len(o.Items) != 1 || o.Items[0].LineTotal != 2500 ||
		o.CustomerID != "c-1" || o.Currency != "EUR" || o.CreatedAt.IsZero() || !o.CreatedAt.Equal(o.UpdatedAt) ||
		o.ShippingAddress != nil || o.Note != "" || len(o.StatusHistory) != 1 || o.StatusHistory[0].Status != "pending" ||
		o.Payment != nil || o.Refund != "" {
		t.Fatalf("order = %+v", o)
	}
	if got, want := first.header.Get("Location"), "/v1/orders/"+o.ID; got != want {
		t.Fatalf("Location = %q, want %q", got, want)
	}
	if got := first.header.Get("ETag"); got != `"1"` {
		t.Fatalf("ETag = %q", got)
	}
	if first.header.Get("Idempotent-Replayed") != "" {
		t.Fatal("first response marked as replayed")
	}
	if _, err := http.ParseTime(first.header.Get("Idempotency-Key-Expires")); err != nil {
		t.Fatalf("Idempotency-Key-Expires = %q: %v", first.header.Get("Idempotency-Key-Expires"), err)
	}

	// Same key, same request (other field order and whitespace): replay.
	reordered := `{ "items": [{"unit_price":1250, "quantity":2, "sku":"sku-1"}], "currency":"EUR", "customer_id":"c-1" }`
	for _, body := range []string{validBody, reordered} {
		replay := a.post(t, "key-1", body)
		if replay.status != http.StatusCreated || !bytes.Equal(replay.body, first.body) {
			t.Fatalf("replay: status %d, body %s; want 201 and %s", replay.status, replay.body, first.body)
		}
		for _, h := range []string{"Location", "ETag", "Content-Type"} {
			if replay.header.Get(h) != first.header.Get(h) {
				t.Fatalf("replayed %s = %q, want %q", h, replay.header.Get(h), first.header.Get(h))
			}
		}
		if replay.header.Get("Idempotent-Replayed") != "true" {
			t.Fatal("replay lacks Idempotent-Replayed: true")
		}
	}
	// The quoted (structured-field) form is the same key, parameters and all.
	for _, quoted := range []string{`"key-1"`, `"key-1";v=2`} {
		if replay := a.post(t, quoted, validBody); replay.header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("%s not treated as the key key-1: %d %s", quoted, replay.status, replay.body)
		}
	}

	// Same key, different request: 422 naming the differing fields.
	other := `{"customer_id":"c-2","currency":"EUR","items":[{"sku":"sku-1","quantity":3,"unit_price":1250}]}`
	mismatch := a.post(t, "key-1", other)
	if mismatch.status != http.StatusUnprocessableEntity {
		t.Fatalf("mismatch: status %d, body %s", mismatch.status, mismatch.body)
	}
	if p := decodeProblem(t, mismatch); !strings.HasSuffix(p.Type, "/idempotency-key-mismatch") ||
		fmt.Sprint(p.MismatchedFields) != "[customer_id items]" {
		t.Fatalf("mismatch problem = %+v", p)
	}

	if keys, orders, items, outbox := a.counts(t); keys != 1 || orders != 1 || items != 1 || outbox != 1 {
		t.Fatalf("rows: keys=%d orders=%d items=%d outbox=%d, want 1 each", keys, orders, items, outbox)
	}
}

// The same key on another route is a different request (G3): refused
// with 422 naming the route it was first used for, and nothing runs. A
// retry on the first route still replays.
func TestAKeyReusedOnAnotherRouteIsRefused(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	created := a.post(t, "key-1", validBody)
	if created.status != http.StatusCreated {
		t.Fatalf("create: %d %s", created.status, created.body)
	}
	order := created.header.Get("Location")
	for path, body := range map[string]string{order + "/cancel": `{"reason":"changed my mind"}`, order + "/pay": `{}`} {
		r := a.do(t, http.MethodPost, path, map[string]string{"Idempotency-Key": "key-1"}, body)
		if r.status != http.StatusUnprocessableEntity {
			t.Fatalf("POST %s with the create's key: %d %s, want 422", path, r.status, r.body)
		}
		p := decodeProblem(t, r)
		var named struct {
			FirstUsedFor string `json:"first_used_for"`
		}
		if err := json.Unmarshal(r.body, &named); err != nil || !strings.HasSuffix(p.Type, "/idempotency-key-mismatch") || named.FirstUsedFor != "POST /v1/orders" {
			t.Fatalf("POST %s with the create's key: problem %s, want idempotency-key-mismatch naming POST /v1/orders", path, r.body)
		}
	}
	var status string
	if err := a.db.QueryRow(context.Background(), `SELECT status FROM orders`).Scan(&status); err != nil || status != "pending" {
		t.Fatalf("the order after the refused reuses: %q %v, want it pending", status, err)
	}
	if replay := a.post(t, "key-1", validBody); replay.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("a retry of the create: %d %s, want a replay", replay.status, replay.body)
	}
	if keys, orders, _, outbox := a.counts(t); keys != 1 || orders != 1 || outbox != 1 {
		t.Fatalf("rows: keys=%d orders=%d outbox=%d, want 1 each", keys, orders, outbox)
	}
}

func TestConcurrentCreatesWithOneKeyExecuteOnce(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	const n = 50
	responses := make([]response, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			responses[i] = a.post(t, "same-key", validBody)
		})
	}
	close(start)
	wg.Wait()

	replayed := 0
	for i, r := range responses {
		if r.status != http.StatusCreated || !bytes.Equal(r.body, responses[0].body) {
			t.Fatalf("response %d: status %d body %s; want 201 and %s", i, r.status, r.body, responses[0].body)
		}
		if r.header.Get("Idempotent-Replayed") == "true" {
			replayed++
		}
	}
	if replayed != n-1 {
		t.Fatalf("%d responses replayed, want %d", replayed, n-1)
	}
	if keys, orders, items, outbox := a.counts(t); keys != 1 || orders != 1 || items != 1 || outbox != 1 {
		t.Fatalf("rows: keys=%d orders=%d items=%d outbox=%d, want 1 each", keys, orders, items, outbox)
	}
}

func TestGetOrderErrors(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	for _, tt := range []struct {
		path   string
		status int
		typ    string
	}{
		{"/v1/orders/0193b1a8-7c2e-7000-8000-000000000001", 404, "not-found"},
		{"/v1/orders/not-a-uuid", 400, "malformed-id"},
		{"/v1/orders/0193b1a87c2e70008000000000000001", 400, "malformed-id"},
		{"/v1/nothing", 404, "not-found"},
	} {
		res := a.do(t, http.MethodGet, tt.path, nil, "")
		if res.status != tt.status {
			t.Fatalf("GET %s: status %d, want %d", tt.path, res.status, tt.status)
		}
		if p := decodeProblem(t, res); !strings.HasSuffix(p.Type, "/"+tt.typ) {
			t.Fatalf("GET %s: type %q, want …/%s", tt.path, p.Type, tt.typ)
		}
	}
}

// GET answers 304 when If-None-Match names the order's current ETag: in
// any entry of a list, weak or strong, or as "*", on any of the header's
// lines (a list may be split over several).
func TestGetOrderIfNoneMatch(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	id := insertView(t, a, "t1", "c", "pending", time.Now())
	path := "/v1/orders/" + id.String()
	if res := a.do(t, http.MethodGet, path, nil, ""); res.status != http.StatusOK || res.header.Get("ETag") != `"1"` {
		t.Fatalf("GET: status %d, ETag %q; want 200 with \"1\"", res.status, res.header.Get("ETag"))
	}
	for _, tt := range []struct {
		lines  []string
		status int
	}{
		{[]string{`"1"`}, http.StatusNotModified},
		{[]string{`W/"1"`}, http.StatusNotModified},
		{[]string{`"0", "1"`}, http.StatusNotModified},
		{[]string{`*`}, http.StatusNotModified},
		{[]string{`"0"`, `"1"`}, http.StatusNotModified}, // the second line used to be ignored
		{[]string{`"0"`}, http.StatusOK},
		{[]string{`"0"`, `"2"`}, http.StatusOK},
	} {
		req, err := http.NewRequest(http.MethodGet, a.url+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+a.token)
		for _, l := range tt.lines {
			req.Header.Add("If-None-Match", l)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != tt.status {
			t.Fatalf("If-None-Match %q: status %d, want %d", tt.lines, res.StatusCode, tt.status)
		}
	}
}

// If-Match is optional on pay, ship and cancel, and kept when sent: the
// change is made only on that version, 412 on another, nothing written (it
// was ignored, and a cancel meant for version 1 cancelled a changed order).
// "*" or none: any version. A retry under the same key with another
// If-Match is refused naming it.
func TestPayShipCancelKeepTheirIfMatch(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	created := func() string {
		res := a.post(t, uuid.NewString(), validBody)
		if res.status != http.StatusCreated {
			t.Fatalf("create: %d %s", res.status, res.body)
		}
		var o struct{ ID string }
		if err := json.Unmarshal(res.body, &o); err != nil {
			t.Fatal(err)
		}
		return o.ID
	}
	version := func(id string) (v int64, status string) {
		if err := a.db.QueryRow(context.Background(), `SELECT version, status FROM orders WHERE id = $1`, id).Scan(&v, &status); err != nil {
			t.Fatal(err)
		}
		return v, status
	}
	call := func(id, verb, key, ifMatch, body string) response {
		h := map[string]string{"Idempotency-Key": key}
		if ifMatch != "" {
			h["If-Match"] = ifMatch
		}
		return a.do(t, http.MethodPost, "/v1/orders/"+id+"/"+verb, h, body)
	}
	id := created()
	if res := a.do(t, http.MethodPatch, "/v1/orders/"+id, map[string]string{"Idempotency-Key": uuid.NewString(), "If-Match": `"1"`}, `{"note":"changed"}`); res.status != http.StatusOK {
		t.Fatalf("patch: %d %s", res.status, res.body)
	}
	for _, tt := range []struct{ verb, body string }{{"cancel", `{"reason":"only if unchanged"}`}, {"pay", ""}, {"ship", ""}} {
		res := call(id, tt.verb, uuid.NewString(), `"1"`, tt.body)
		if res.status != http.StatusPreconditionFailed || decodeProblem(t, res).Type != "https://orders.acme.example/problems/precondition-failed" {
			t.Fatalf("%s with a stale If-Match: %d %s, want 412 precondition-failed", tt.verb, res.status, res.body)
		}
		if v, status := version(id); v != 2 || status != "pending" {
			t.Fatalf("after a refused %s: version %d %s, want 2 pending", tt.verb, v, status)
		}
	}
	payKey := uuid.NewString()
	if res := call(id, "pay", payKey, `"2"`, ""); res.status != http.StatusAccepted {
		t.Fatalf("pay with the current If-Match: %d %s, want 202", res.status, res.body)
	}
	res := call(id, "pay", payKey, `"1"`, "")
	if p := decodeProblem(t, res); res.status != http.StatusUnprocessableEntity || !slices.Equal(p.MismatchedFields, []string{"If-Match"}) {
		t.Fatalf("the pay's key with another If-Match: %d %s, want 422 naming If-Match", res.status, res.body)
	}

	other := created()
	if res := call(other, "cancel", uuid.NewString(), `*`, `{"reason":"any version"}`); res.status != http.StatusOK {
		t.Fatalf("cancel with If-Match *: %d %s, want 200", res.status, res.body)
	}
	if _, status := version(other); status != "cancelled" {
		t.Fatalf("order %s after the cancel, want cancelled", status)
	}
}

// A problem's instance is a URI reference (RFC 9457): the path as it was
// sent, escapes kept. Decoded, "%2F" named another resource, "%3F" began a
// query and "%C3%A9" was not a URI at all.
func TestAProblemsInstanceIsThePathAsSent(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	for _, path := range []string{"/v1/customers/a%2Fb/summary", "/v1/customers/%C3%A9/summary?min_position=x", "/v1/idempotency-keys/a%3Fb%20c%23d", "/v1/orders/%2E%2E%2Fx"} {
		r := a.do(t, http.MethodGet, path, nil, "")
		if r.status < 400 {
			t.Fatalf("GET %s: %d, want a problem", path, r.status)
		}
		want, _, _ := strings.Cut(path, "?")
		if p := decodeProblem(t, r); p.Instance != want {
			t.Errorf("GET %s: instance %q, want %q", path, p.Instance, want)
		}
	}
}

// A body that begins with a UTF-8 byte order mark is refused with a detail
// that says so (it read "it begins with 'ï'"), and stores nothing.
func TestABodyWithAByteOrderMarkIsToldSo(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	r := a.post(t, "bom-1", "\xEF\xBB\xBF"+validBody)
	if p := decodeProblem(t, r); r.status != http.StatusBadRequest || !strings.Contains(p.Detail, "byte order mark") {
		t.Fatalf("a body with a byte order mark: %d %q", r.status, p.Detail)
	}
	if keys, orders, _, _ := a.counts(t); keys != 0 || orders != 0 {
		t.Fatalf("a refused body stored %d keys, %d orders", keys, orders)
	}
}

// A 415 says what would be taken: a PATCH's formats in Accept-Patch (RFC
// 5789, 2.2), a body's codings in Accept-Encoding (RFC 9110, 15.5.16).
func TestA415SaysWhatWouldBeTaken(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	created := decodeOrder(t, a.post(t, "415-create", validBody))
	r := a.do(t, http.MethodPatch, "/v1/orders/"+created.ID, map[string]string{"Idempotency-Key": "415-patch", "If-Match": `"1"`,
		"Content-Type": "application/json-patch+json"}, `[{"op":"replace","path":"/note","value":"x"}]`)
	if p := decodeProblem(t, r); r.status != http.StatusUnsupportedMediaType || r.header.Get("Accept-Patch") != "application/merge-patch+json, application/json" ||
		!strings.Contains(p.Detail, "merge-patch") {
		t.Fatalf("PATCH as json-patch: %d Accept-Patch %q, %q", r.status, r.header.Get("Accept-Patch"), p.Detail)
	}
	r = a.do(t, http.MethodPost, "/v1/orders", map[string]string{"Idempotency-Key": "415-gzip", "Content-Encoding": "gzip"}, validBody)
	if r.status != http.StatusUnsupportedMediaType || r.header.Get("Accept-Encoding") != "identity" {
		t.Fatalf("a gzip body: %d Accept-Encoding %q", r.status, r.header.Get("Accept-Encoding"))
	}
}
