package httpapi

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
)

// A response that cannot be encoded is a server failure like any other:
// the internal problem as problem+json, logged at ERROR, and none of the
// headers the handler had set to describe the answer it could not send.
func TestAResponseThatCannotBeEncodedIsAnInternalProblem(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	s := &Server{Deps: Deps{Logger: slog.New(slog.NewJSONHandler(&logs, nil))}}
	r := httptest.NewRequest(http.MethodGet, "/v1/orders/x", nil)
	w := httptest.NewRecorder()
	w.Header().Set("ETag", `"3"`)
	w.Header().Set("Cache-Control", "no-cache")
	s.writeJSON(w, r, http.StatusOK, map[string]any{"total": make(chan int)})

	if w.Code != http.StatusInternalServerError {
		t.Errorf("status %d, want 500", w.Code)
	}
	if ct := w.Header().Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("Content-Type %q, want application/problem+json", ct)
	}
	if etag := w.Header().Get("ETag"); etag != "" {
		t.Errorf("ETag %s kept on the failure", etag)
	}
	if cc := w.Header().Get("Cache-Control"); cc != "no-store" {
		t.Errorf("Cache-Control %q, want no-store", cc)
	}
	var p struct {
		Type     string `json:"type"`
		Instance string `json:"instance"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil || !strings.HasSuffix(p.Type, "/internal") || p.Instance != "/v1/orders/x" {
		t.Errorf("body %s (%v), want the internal problem of /v1/orders/x", w.Body, err)
	}
	if out := logs.String(); !strings.Contains(out, `"level":"ERROR"`) || !strings.Contains(out, "encode response") {
		t.Errorf("want the failure logged at ERROR; logged:\n%s", out)
	}
}

// A body of more items than any request takes is refused before it is
// decoded: a 1 MiB body of 349,505 empty items was decoded whole (60 MiB
// of heap, 69 ms of CPU) to be refused at the 101st. So is one whose
// early duplicate key hid the long array from the walk, and one whose
// bad item comes after the 101st.
func TestAnArrayPastTheLimitIsRefusedBeforeTheDecode(t *testing.T) {
	n := (maxBodyBytes - 60) / 3
	empties := strings.TrimSuffix(strings.Repeat("{},", n), ",")
	for _, tc := range []struct {
		name, body, field string
		status            int
	}{
		{"empty items", `{"customer_id":"a","currency":"EUR","items":[` + empties + `]}`, "items", 422},
		{"a bad item past the 101st", `{"customer_id":"a","currency":"EUR","items":[` + empties[:len(empties)-2] + `{"quantity":"x"}]}`, "items", 422},
		{"a duplicate key first", `{"customer_id":"a","customer_id":"b","items":[` + empties + `]}`, "customer_id", 400},
		// Not valid JSON: the decode says where, whatever the walk found.
		{"a syntax error first", `{"customer_id":"a","currency":"EUR","items":[{"sku":x},` + empties + `]}`, "", 400},
		{"cut short", `{"customer_id":"a","currency":"EUR","items":[` + empties, "", 400},
		// Values the decode skips without allocating are not capped: it
		// says what is wrong with them.
		{"an unknown field's array", `{"customer_id":"a","currency":"EUR","tags":[` + empties + `]}`, "tags", 400},
		{"an array for a string", `{"customer_id":[` + empties + `],"currency":"EUR"}`, "customer_id", 400},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var req createOrderRequest
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			r := httptest.NewRequest(http.MethodPost, "/v1/orders", strings.NewReader(tc.body))
			r.Header.Set("Content-Type", "application/json")
			p := decodeJSON(httptest.NewRecorder(), r, &req)
			runtime.ReadMemStats(&after)
			if p == nil || p.Status != tc.status || (tc.field != "" && (len(p.Errors) != 1 || p.Errors[0].Field != tc.field)) {
				t.Fatalf("problem %+v; want %d naming %s", p, tc.status, tc.field)
			}
			// The body is read (up to 2 MiB while it grows), and for those
			// the decode takes, scanned into its buffer (as much again):
			// 2 to 8 MiB, more under the race detector. Decoding the items
			// took 59 MiB.
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 24<<20 || len(req.Items) != 0 {
				t.Fatalf("%d MiB allocated, %d items decoded; want the body refused before its decode", alloc>>20, len(req.Items))
			}
		})
	}
}
