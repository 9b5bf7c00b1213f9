package httpapi

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
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
