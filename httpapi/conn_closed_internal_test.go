package httpapi

import (
	"bytes"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// closedConnWriter is the writer of a request whose connection was closed
// under it: setting a deadline fails as net/http's does then.
type closedConnWriter struct{ *httptest.ResponseRecorder }

func (closedConnWriter) SetReadDeadline(time.Time) error {
	return &net.OpError{Op: "set", Net: "tcp", Err: net.ErrClosed}
}

// A request whose connection was closed before its body was read (the
// server stopping, or the connection limit closing it as it arrived) is not
// a server failure: 499, logged at warn, and the handler is not run.
func TestARequestWhoseConnectionClosedUnderItIsNotAServerFailure(t *testing.T) {
	var logs bytes.Buffer
	s := &Server{Deps: Deps{Logger: slog.New(slog.NewJSONHandler(&logs, nil)), BodyTimeout: time.Second}}
	ran := false
	h := s.readBody(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { ran = true }))
	w := closedConnWriter{httptest.NewRecorder()}
	h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/v1/orders", strings.NewReader(`{}`)))
	if ran {
		t.Error("the handler ran for a request whose connection is gone")
	}
	if w.Code != StatusClientClosedRequest {
		t.Errorf("status %d, want %d", w.Code, StatusClientClosedRequest)
	}
	out := logs.String()
	if !strings.Contains(out, `"msg":"connection closed under request"`) || strings.Contains(out, `"level":"ERROR"`) {
		t.Errorf("want one warning, no error; logged:\n%s", out)
	}
}
