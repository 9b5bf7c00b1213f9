package app

import (
	"bufio"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/acme/orders/httpapi"
)

// Requests too broken for a handler to see are refused by net/http itself;
// the api answers them as problem+json too (G7), never with a 5xx, and
// answers the next connection's good request as before.
func TestRequestsRefusedBeforeTheHandlerGetProblemJSON(t *testing.T) {
	t.Parallel()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	h := httpapi.New(httpapi.Deps{Logger: logger, BodyTimeout: time.Second})
	addr := serveConns(t, h, logger, 8, nil)

	tests := []struct {
		name, request string
		status        int
		kind          string
	}{
		{"a control byte in a header", "POST /v1/orders HTTP/1.1\r\nHost: x\r\nIdempotency-Key: a\x01b\r\n\r\n", 400, "malformed-request"},
		{"a bad percent-encoding in the path", "GET /v1/orders/%zz HTTP/1.1\r\nHost: x\r\n\r\n", 400, "malformed-request"},
		{"no Host", "GET /healthz HTTP/1.1\r\n\r\n", 400, "malformed-request"},
		{"a header name with a space", "GET /healthz HTTP/1.1\r\nHost: x\r\nBad Name: y\r\n\r\n", 400, "malformed-request"},
		{"an unsupported Transfer-Encoding (net/http: 501)", "POST /v1/orders HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", 400, "malformed-request"},
		{"an unknown HTTP version (net/http: 505)", "GET /healthz HTTP/9.9\r\nHost: x\r\n\r\n", 400, "malformed-request"},
		{"headers past 64 KiB", "GET /healthz HTTP/1.1\r\nHost: x\r\nIdempotency-Key: " + strings.Repeat("k", 70<<10) + "\r\n\r\n", 431, "headers-too-large"},
		{"an Expect other than 100-continue", "POST /v1/orders HTTP/1.1\r\nHost: x\r\nExpect: 200-ok\r\nContent-Length: 2\r\n\r\n{}", 417, "expectation-failed"},
		{"an Expect in HTTP/1.0", "GET /healthz HTTP/1.0\r\nExpect: foo\r\n\r\n", 417, "expectation-failed"},
	}
	for _, tt := range tests {
		c := dialUntilListening(t, addr)
		if _, err := io.WriteString(c, tt.request); err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		res, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		body, _ := io.ReadAll(res.Body)
		c.Close()
		var p struct {
			Type   string `json:"type"`
			Status int    `json:"status"`
			Detail string `json:"detail"`
		}
		if res.StatusCode != tt.status || res.Header.Get("Content-Type") != "application/problem+json" ||
			json.Unmarshal(body, &p) != nil || p.Type != httpapi.ProblemBase+tt.kind || p.Status != tt.status || p.Detail == "" {
			t.Errorf("%s: %d %q %s; want %d application/problem+json of type %s", tt.name, res.StatusCode, res.Header.Get("Content-Type"), body, tt.status, tt.kind)
		}
	}
	res, err := http.Get("http://" + addr + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("a good request after the refusals: %d", res.StatusCode)
	}
}

// rewriteRefusal leaves every answer of a handler alone: they carry a
// Date, which net/http's own refusals never do.
func TestRewriteRefusalLeavesHandlerAnswersAlone(t *testing.T) {
	for _, answer := range []string{
		"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\nDate: Tue, 24 Nov 2026 15:00:00 GMT\r\n\r\n400 Bad Request",
		"HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\nok",
		"HTTP/1.1 400 Bad Request\r\nContent-Type: application/problem+json\r\nContent-Length: 2\r\n\r\n{}",
		"a body chunk HTTP/1.1 400" + netHTTPRefusalHeaders,
		"HTTP/1.1 417 Expectation Failed\r\nConnection: close\r\nDate: Tue, 24 Nov 2026 15:00:00 GMT\r\nContent-Length: 2\r\n\r\n{}",
		"HTTP/1.1 417 Expectation Failed\r\nConnection: close\r\nDate: Tue, 24 Nov 2026 15:00:00 GMT\r\nX-Other: 1\r\nContent-Length: 0\r\n\r\n",
	} {
		if got, ok := rewriteRefusal([]byte(answer)); ok {
			t.Errorf("rewrote %q as %q", answer, got)
		}
	}
}
