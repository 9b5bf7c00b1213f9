package httpapi_test

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// expectProblem checks status, problem type and (if given) the first field named.
func expectProblem(t *testing.T, what string, res response, status int, typ, field string) {
	t.Helper()
	if res.status != status {
		t.Fatalf("%s: status %d, want %d; body %s", what, res.status, status, res.body)
	}
	p := decodeProblem(t, res)
	if !strings.HasSuffix(p.Type, "/"+typ) {
		t.Fatalf("%s: type %q, want …/%s", what, p.Type, typ)
	}
	if field != "" && (len(p.Errors) == 0 || p.Errors[0].Field != field) {
		t.Fatalf("%s: errors %+v, want the field %s named", what, p.Errors, field)
	}
}

// Duplicate keys and keys that differ from a field only in case are
// refused at every level of every body, naming the key; nothing is stored.
func TestDuplicateAndCaseVariantKeysAreRefused(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	id := decodeOrder(t, a.post(t, "create", validBody)).ID
	for _, tt := range []struct {
		name, method, path, body, field string
	}{
		{"duplicate top-level key", "POST", "/v1/orders", `{"customer_id":"first","customer_id":"second","currency":"EUR","items":[{"sku":"s","quantity":1,"unit_price":1}]}`, "customer_id"},
		{"case-variant duplicate", "POST", "/v1/orders", `{"customer_id":"first","Customer_Id":"second","currency":"EUR","items":[{"sku":"s","quantity":1,"unit_price":1}]}`, "Customer_Id"},
		{"case variant alone", "POST", "/v1/orders", `{"Customer_ID":"c","currency":"EUR","items":[{"sku":"s","quantity":1,"unit_price":1}]}`, "Customer_ID"},
		{"fold variant (long s)", "POST", "/v1/orders", `{"customer_id":"c","currency":"EUR","items":[{"ſku":"s","quantity":1,"unit_price":1}]}`, "items[0].ſku"},
		{"nested duplicate", "POST", "/v1/orders", `{"customer_id":"c","currency":"EUR","items":[{"sku":"s","quantity":1,"quantity":2,"unit_price":1}]}`, "items[0].quantity"},
		{"cancel duplicate", "POST", "/v1/orders/" + id + "/cancel", `{"reason":"a","REASON":"b"}`, "REASON"},
		{"pay duplicate", "POST", "/v1/orders/" + id + "/pay", `{"a":1,"a":2}`, ""},
		{"patch duplicate", "PATCH", "/v1/orders/" + id, `{"note":"a","note":"b"}`, "note"},
		{"patch nested duplicate", "PATCH", "/v1/orders/" + id, `{"shipping_address":{"name":"A","line1":"1 Main","city":"Berlin","city":"Paris","postal_code":"1","country":"DE"}}`, "shipping_address.city"},
		{"patch nested case variant", "PATCH", "/v1/orders/" + id, `{"shipping_address":{"name":"A","line1":"1 Main","City":"Berlin","postal_code":"1","country":"DE"}}`, "shipping_address.City"},
	} {
		res := a.do(t, tt.method, tt.path, map[string]string{"Idempotency-Key": "k-" + tt.name, "If-Match": `"1"`}, tt.body)
		expectProblem(t, tt.name, res, http.StatusBadRequest, "malformed-request", tt.field)
	}
	if keys, orders, _, _ := a.counts(t); keys != 1 || orders != 1 {
		t.Fatalf("refused bodies stored something: keys=%d orders=%d", keys, orders)
	}
}

// A body that is present is a JSON object: null (which encoding/json takes
// as an object with nothing to change) is 400 on every route, and a pay or
// ship with it used to run (202 and a payment attempt recorded); a create
// got 422. An absent body is still no body where the body is optional.
func TestBodiesThatAreNotObjectsAreRefused(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	id := decodeOrder(t, a.post(t, "create", validBody)).ID
	order := "/v1/orders/" + id
	for _, tt := range []struct {
		name, method, path, body string
	}{
		{"create null", "POST", "/v1/orders", `null`},
		{"create null with spaces", "POST", "/v1/orders", " \n null \t"},
		{"create string", "POST", "/v1/orders", `"{}"`},
		{"create array", "POST", "/v1/orders", `[` + validBody + `]`},
		{"pay null", "POST", order + "/pay", `null`},
		{"pay array", "POST", order + "/pay", `[]`},
		{"ship null", "POST", order + "/ship", `null`},
		{"cancel null", "POST", order + "/cancel", `null`},
		{"patch null", "PATCH", order, `null`},
	} {
		res := a.do(t, tt.method, tt.path, map[string]string{"Idempotency-Key": "k-" + tt.name, "If-Match": `"1"`}, tt.body)
		expectProblem(t, tt.name, res, http.StatusBadRequest, "malformed-request", "")
		if !strings.Contains(string(res.body), "must be a JSON object") {
			t.Fatalf("%s: %s, want it to say the body must be a JSON object", tt.name, res.body)
		}
	}
	res := a.do(t, http.MethodPost, "/v1/orders", map[string]string{"Idempotency-Key": "k-garbage"}, "garbage")
	expectProblem(t, "create garbage", res, http.StatusBadRequest, "malformed-request", "")
	if !strings.Contains(string(res.body), "not valid JSON") {
		t.Fatalf("create garbage: %s, want it to say the body is not valid JSON", res.body)
	}
	if keys, orders, _, outbox := a.counts(t); keys != 1 || orders != 1 || outbox != 1 {
		t.Fatalf("refused bodies stored something: keys=%d orders=%d outbox=%d", keys, orders, outbox)
	}
	for _, body := range []string{"", "{}"} {
		if res := a.do(t, http.MethodPost, order+"/pay", map[string]string{"Idempotency-Key": "pay " + body}, body); res.status/100 != 2 {
			t.Fatalf("pay with the body %q: %d %s", body, res.status, res.body)
		}
	}
}

// A null for a field whose schema is not nullable is 400 naming the field:
// encoding/json took it as the zero value, and a unit_price of null was an
// order at price 0. The fields the document makes nullable (payment_method,
// a patch's shipping_address and note) still take null.
func TestNullFieldsAreRefused(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	id := decodeOrder(t, a.post(t, "create", validBody)).ID
	order := "/v1/orders/" + id
	address := `"name":"Ada","line1":"1 Main St","city":"Berlin","postal_code":"10115","country":"DE"`
	for _, tt := range []struct {
		name, method, path, body, field string
	}{
		{"null unit_price", "POST", "/v1/orders", `{"customer_id":"c-1","currency":"EUR","items":[{"sku":"sku-1","quantity":2,"unit_price":null}]}`, "items[0].unit_price"},
		{"null quantity", "POST", "/v1/orders", `{"customer_id":"c-1","currency":"EUR","items":[{"sku":"sku-1","quantity":null,"unit_price":1}]}`, "items[0].quantity"},
		{"null customer_id", "POST", "/v1/orders", `{"customer_id":null,"currency":"EUR","items":[{"sku":"sku-1","quantity":1,"unit_price":1}]}`, "customer_id"},
		{"null items", "POST", "/v1/orders", `{"customer_id":"c-1","currency":"EUR","items":null}`, "items"},
		{"null item", "POST", "/v1/orders", `{"customer_id":"c-1","currency":"EUR","items":[null]}`, "items[0]"},
		{"null reason", "POST", order + "/cancel", `{"reason":null}`, "reason"},
		{"null address field", "PATCH", order, `{"shipping_address":{` + address + `,"line2":null}}`, "shipping_address.line2"},
	} {
		res := a.do(t, tt.method, tt.path, map[string]string{"Idempotency-Key": "k-" + tt.name, "If-Match": `"1"`}, tt.body)
		expectProblem(t, tt.name, res, http.StatusBadRequest, "malformed-request", tt.field)
		if p := decodeProblem(t, res); !strings.HasSuffix(p.Errors[0].Detail, "got null") {
			t.Fatalf("%s: %+v, want the detail to say null is not taken", tt.name, p.Errors)
		}
	}
	if keys, orders, _, outbox := a.counts(t); keys != 1 || orders != 1 || outbox != 1 {
		t.Fatalf("refused bodies stored something: keys=%d orders=%d outbox=%d", keys, orders, outbox)
	}

	res := a.do(t, http.MethodPatch, order, map[string]string{"Idempotency-Key": "patch", "If-Match": `"1"`},
		`{"shipping_address":{`+address+`},"note":null}`)
	if res.status != http.StatusOK {
		t.Fatalf("patch with a null note: %d %s", res.status, res.body)
	}
	res = a.do(t, http.MethodPatch, order, map[string]string{"Idempotency-Key": "unpatch", "If-Match": `"2"`}, `{"shipping_address":null}`)
	if o := decodeOrder(t, res); res.status != http.StatusOK || o.ShippingAddress != nil {
		t.Fatalf("patch with a null shipping_address: %d %s", res.status, res.body)
	}
	if res := a.do(t, http.MethodPost, order+"/pay", map[string]string{"Idempotency-Key": "pay"}, `{"payment_method":null}`); res.status != http.StatusAccepted {
		t.Fatalf("pay with a null payment_method: %d %s", res.status, res.body)
	}
}

// Only the media types the document lists are taken: application/json,
// and for PATCH application/merge-patch+json. Any other +json type was
// taken as JSON (and created an order) while the document said 415.
func TestOnlyDocumentedMediaTypesAreTaken(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	for _, ct := range []string{"application/vnd.foo+json", "application/merge-patch+json", "application/problem+json", "text/json", "application/json-seq"} {
		res := a.do(t, http.MethodPost, "/v1/orders", map[string]string{"Idempotency-Key": "k-" + ct, "Content-Type": ct}, validBody)
		expectProblem(t, ct, res, http.StatusUnsupportedMediaType, "unsupported-media-type", "")
	}
	id := decodeOrder(t, a.post(t, "create", validBody)).ID
	res := a.do(t, http.MethodPatch, "/v1/orders/"+id, map[string]string{"Idempotency-Key": "p-1", "If-Match": `"1"`, "Content-Type": "application/json-patch+json"},
		`{"note":"x"}`)
	expectProblem(t, "PATCH as json-patch+json", res, http.StatusUnsupportedMediaType, "unsupported-media-type", "")
	for i, ct := range []string{"application/merge-patch+json", "application/merge-patch+json; charset=utf-8", "application/json"} {
		res := a.do(t, http.MethodPatch, "/v1/orders/"+id, map[string]string{"Idempotency-Key": "p-ok-" + ct, "If-Match": `"` + strconv.Itoa(i+1) + `"`, "Content-Type": ct},
			`{"note":"x`+strconv.Itoa(i)+`"}`)
		if res.status != http.StatusOK {
			t.Fatalf("PATCH as %s: %d %s", ct, res.status, res.body)
		}
	}
	if keys, orders, _, _ := a.counts(t); keys != 4 || orders != 1 {
		t.Fatalf("keys=%d orders=%d, want 4 keys (the create, three patches) and 1 order", keys, orders)
	}
}

// Two Content-Type lines are refused with 400, whatever they say: read by
// the first line alone, application/json then text/plain was taken, and
// the other order refused.
func TestTwoContentTypesAreRefused(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	for i, cts := range [][]string{
		{"application/json", "text/plain"},
		{"text/plain", "application/json"},
		{"application/json; charset=utf-8", "application/json; charset=latin1"},
	} {
		req, err := http.NewRequest(http.MethodPost, a.url+"/v1/orders", strings.NewReader(validBody))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+a.token)
		req.Header.Set("Idempotency-Key", "two-ct-"+strconv.Itoa(i))
		for _, ct := range cts {
			req.Header.Add("Content-Type", ct)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		expectProblem(t, strings.Join(cts, " + "), response{status: res.StatusCode, header: res.Header, body: b}, http.StatusBadRequest, "malformed-request", "")
	}
	if keys, orders, _, _ := a.counts(t); keys != 0 || orders != 0 {
		t.Fatalf("keys=%d orders=%d, want nothing written", keys, orders)
	}
}

// A JSON body in another charset than UTF-8, or with a Content-Encoding
// (read as it is, "br" over plain JSON was taken), is refused with 415.
func TestOtherCharsetsAreRefused(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	for _, ct := range []string{"application/json; charset=utf-16", "application/json; charset=latin1", "application/json;charset=\"UTF-16LE\""} {
		res := a.do(t, http.MethodPost, "/v1/orders", map[string]string{"Idempotency-Key": "k", "Content-Type": ct}, validBody)
		expectProblem(t, ct, res, http.StatusUnsupportedMediaType, "unsupported-media-type", "")
	}
	for _, ce := range []string{"gzip", "br", "identity, gzip"} {
		res := a.do(t, http.MethodPost, "/v1/orders", map[string]string{"Idempotency-Key": "k", "Content-Encoding": ce}, validBody)
		expectProblem(t, "Content-Encoding "+ce, res, http.StatusUnsupportedMediaType, "unsupported-media-type", "")
	}
	for i, ct := range []string{"application/json; charset=utf-8", "application/json; charset=UTF-8", "application/json"} {
		res := a.do(t, http.MethodPost, "/v1/orders", map[string]string{"Idempotency-Key": "ok-" + string(rune('a'+i)), "Content-Type": ct}, validBody)
		if res.status != http.StatusCreated {
			t.Fatalf("%s: %d %s", ct, res.status, res.body)
		}
	}
	if keys, _, _, _ := a.counts(t); keys != 3 {
		t.Fatalf("%d keys, want 3", keys)
	}
}

// A body that is not Unicode text in UTF-8 is refused, not taken with
// U+FFFD in place of what was sent: invalid UTF-8, UTF-16 (its NUL bytes)
// and escaped lone surrogates. encoding/json used to store "a\xffb" as
// "a\ufffdb", and replayed one key's response to four different bodies. A
// surrogate pair, an escaped backslash before "ud800", and U+FFFD itself
// are text and pass.
func TestBodiesThatAreNotUnicodeTextAreRefused(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	id := decodeOrder(t, a.post(t, "create", validBody)).ID
	version := 1
	patch := func(key, note string) response {
		return a.do(t, http.MethodPatch, "/v1/orders/"+id, map[string]string{"Idempotency-Key": key, "If-Match": `"` + strconv.Itoa(version) + `"`},
			`{"note":"`+note+`"}`)
	}
	for _, tt := range []struct {
		name, note string
		status     int
		typ        string
	}{
		{"invalid UTF-8", "a\xffb", 415, "unsupported-media-type"},
		{"overlong encoding", "a\xc0\xafb", 415, "unsupported-media-type"},
		{"NUL byte", "a\x00b", 415, "unsupported-media-type"},
		{"lone high surrogate", `x\ud800y`, 400, "malformed-request"},
		{"lone low surrogate", `x\uDFFFy`, 400, "malformed-request"},
		{"high surrogate at the end", `x\ud800`, 400, "malformed-request"},
		{"reversed pair", `\udc00\ud800`, 400, "malformed-request"},
	} {
		expectProblem(t, tt.name, patch("k-"+tt.name, tt.note), tt.status, tt.typ, "")
	}
	for _, tt := range []struct{ name, note, want string }{
		{"surrogate pair", `\ud83d\ude00`, "😀"},
		{"escaped backslash before ud800", `\\ud800`, `\ud800`},
		{"U+FFFD sent as such", `x\ufffdy`, "x\ufffdy"},
	} {
		res := patch("ok-"+tt.name, tt.note)
		if res.status != http.StatusOK {
			t.Fatalf("%s: %d %s", tt.name, res.status, res.body)
		}
		var note string
		if err := a.db.QueryRow(context.Background(), `SELECT note FROM orders WHERE id = $1`, id).Scan(&note); err != nil {
			t.Fatal(err)
		}
		if note != tt.want {
			t.Fatalf("%s: stored note %q, want %q", tt.name, note, tt.want)
		}
		version++
	}
	if keys, orders, _, _ := a.counts(t); keys != 4 || orders != 1 {
		t.Fatalf("keys=%d orders=%d, want 4 keys (the create, three text notes) and 1 order", keys, orders)
	}
}

// HEAD is served by every GET route, with GET's status and headers and no
// body; a method a path does not have is 405 problem+json naming the ones
// it has in Allow (both were missing: HEAD was 405, and 405 had no Allow).
func TestHeadAndMethodNotAllowed(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	id := decodeOrder(t, a.post(t, "create", validBody)).ID
	for _, path := range []string{"/v1/idempotency-keys/create", "/v1/orders/" + id} {
		get := a.do(t, http.MethodGet, path, nil, "")
		head := a.do(t, http.MethodHead, path, nil, "")
		if head.status != get.status || len(head.body) != 0 || head.header.Get("Content-Type") != get.header.Get("Content-Type") ||
			head.header.Get("ETag") != get.header.Get("ETag") {
			t.Fatalf("HEAD %s: %d %v %q; GET: %d %v", path, head.status, head.header, head.body, get.status, get.header)
		}
		if strings.HasPrefix(path, "/v1/idempotency-keys/") && head.status != http.StatusOK {
			t.Fatalf("HEAD %s: %d, want 200 (the key exists)", path, head.status)
		}
	}
	if r := a.do(t, http.MethodHead, "/healthz", nil, ""); r.status != http.StatusOK {
		t.Fatalf("HEAD /healthz: %d", r.status)
	}
	if r := a.do(t, http.MethodHead, "/v1/orders/"+id, map[string]string{"Authorization": "-"}, ""); r.status != http.StatusUnauthorized {
		t.Fatalf("HEAD without a token: %d", r.status)
	}
	for _, tt := range []struct{ method, path, allow string }{
		{http.MethodDelete, "/v1/orders/" + id, "GET, HEAD, PATCH"},
		{http.MethodPut, "/v1/orders", "GET, HEAD, POST"},
		{http.MethodGet, "/v1/orders/" + id + "/pay", "POST"},
		{http.MethodPost, "/healthz", "GET, HEAD"},
	} {
		r := a.do(t, tt.method, tt.path, map[string]string{"Idempotency-Key": "k-405"}, "{}")
		expectProblem(t, tt.method+" "+tt.path, r, http.StatusMethodNotAllowed, "method-not-allowed", "")
		if got := r.header.Get("Allow"); got != tt.allow {
			t.Fatalf("%s %s: Allow %q, want %q", tt.method, tt.path, got, tt.allow)
		}
	}
	// An unknown method on no path of ours is 404, not a 405 allowing nothing.
	expectProblem(t, "FOO /nope", a.do(t, "FOO", "/nope", nil, ""), http.StatusNotFound, "not-found", "")
}

// Path parameters are decoded exactly once: %2F is a '/', %41 an 'A', %25
// a '%', whichever parameter they are in.
func TestPathParametersAreDecodedOnce(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	for _, tt := range []struct{ customer, path string }{
		{"a/b", "a%2Fb"}, {"A", "%41"}, {"100%", "100%25"}, {"x%41", "x%2541"},
	} {
		// The read model as a projector would leave it for this customer.
		if _, err := a.db.Exec(context.Background(), `INSERT INTO customer_summaries
			(tenant_id, customer_id, currency, orders_pending, last_order_at) VALUES ('t1', $1, 'EUR', 1, now())`, tt.customer); err != nil {
			t.Fatal(err)
		}
		res := a.do(t, http.MethodGet, "/v1/customers/"+tt.path+"/summary", nil, "")
		if res.status != http.StatusOK || !strings.Contains(string(res.body), `"customer_id":`+strconv.Quote(tt.customer)) {
			t.Fatalf("summary at %s: %d %s; want customer %q", tt.path, res.status, res.body, tt.customer)
		}
	}
	// Keys: "k/1" is reached as k%2F1, "kA" as k%41, "k%41" as k%2541.
	for _, tt := range []struct{ key, path string }{{"k/1", "k%2F1"}, {"kA", "k%41"}, {"k%41", "k%2541"}, {"k%", "k%25"}} {
		if res := a.post(t, tt.key, validBody); res.status != http.StatusCreated {
			t.Fatalf("create with key %q: %d %s", tt.key, res.status, res.body)
		}
		res := a.do(t, http.MethodGet, "/v1/idempotency-keys/"+tt.path, nil, "")
		if res.status != http.StatusOK || !strings.Contains(string(res.body), `"key":"`+tt.key+`"`) {
			t.Fatalf("GET /v1/idempotency-keys/%s: %d %s; want the key %q", tt.path, res.status, res.body, tt.key)
		}
	}
	// An order id with an encoded character is the same id.
	id := decodeOrder(t, a.post(t, "for-id", validBody)).ID
	res := a.do(t, http.MethodGet, "/v1/orders/"+strings.Replace(id, "-", "%2D", 1), nil, "")
	if res.status == http.StatusBadRequest {
		t.Fatalf("order id with %%2D: %d %s", res.status, res.body)
	}
}

// A chunked body of a command without one is empty only if no byte comes:
// whitespace is a body, and as JSON it is malformed, as with a length.
func TestChunkedEmptyBody(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	id := decodeOrder(t, a.post(t, "create", validBody)).ID
	send := func(key, body string) int {
		req, err := http.NewRequest(http.MethodPost, a.url+"/v1/orders/"+id+"/pay", io.MultiReader(strings.NewReader(body)))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+a.token)
		req.Header.Set("Idempotency-Key", key)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	if got := send("ws", "  \n"); got != http.StatusBadRequest {
		t.Fatalf("chunked whitespace body: %d, want 400", got)
	}
	if got := send("empty", ""); got != http.StatusAccepted {
		t.Fatalf("chunked empty body: %d, want 202 (a payment attempt started)", got)
	}
	if got := send("obj", "{}"); got != http.StatusOK {
		t.Fatalf("chunked {}: %d, want 200 (payment under way: no second attempt)", got)
	}
}

// A PATCH's shipping_address replaces the address whole (it is not merged
// field by field): a partial one is a 422 that says so, and changes nothing.
func TestPatchTakesAWholeAddress(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	id := decodeOrder(t, a.post(t, "create", validBody)).ID
	res := a.do(t, http.MethodPatch, "/v1/orders/"+id, map[string]string{"Idempotency-Key": "p1", "If-Match": `"1"`}, `{"shipping_address":{"city":"Paris"}}`)
	expectProblem(t, "partial address", res, http.StatusUnprocessableEntity, "validation-failed", "")
	if !strings.Contains(string(res.body), "replaced whole") {
		t.Fatalf("the 422 does not say the address is replaced whole: %s", res.body)
	}
}
