package app

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"regexp"
	"strconv"

	"github.com/acme/orders/httpapi"
)

// problemRefusals wraps ln so that the answers net/http writes itself, to a
// request it refuses before any handler sees it, are problem+json like
// every other refusal of the service (G7): a header past MaxHeaderBytes
// (431), a malformed request line, header or Host (400), a
// Transfer-Encoding it does not support (501) or an HTTP version it does
// not speak (505). net/http writes those as text/plain, and its two 5xx
// are the client's fault; here they are 400. Only those answers are
// rewritten: net/http writes each in one Write to the connection, with a
// header block of exactly its status line, "Content-Type: text/plain;
// charset=utf-8" and "Connection: close", and no Date, which every answer
// of a handler has. The one other answer net/http makes itself, 417 to an
// Expect other than 100-continue, is an empty answer with a Date: its
// exact header block is rewritten too (no handler answers 417).
func problemRefusals(ln net.Listener) net.Listener { return refusalListener{ln} }

type refusalListener struct{ net.Listener }

func (l refusalListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return refusalConn{c}, nil
}

type refusalConn struct{ net.Conn }

// CloseWrite half-closes the connection, as net/http does before its
// short wait after some refusals (a *net.TCPConn can).
func (c refusalConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

func (c refusalConn) Write(p []byte) (int, error) {
	if answer, ok := rewriteRefusal(p); ok {
		if _, err := c.Conn.Write(answer); err != nil {
			return 0, err
		}
		return len(p), nil
	}
	return c.Conn.Write(p)
}

// netHTTPRefusalHeaders ends the header block of net/http's own refusals.
const netHTTPRefusalHeaders = "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"

// expectationFailed matches net/http's answer to an Expect it does not
// meet, for an HTTP/1.1 or HTTP/1.0 request: its header block, all of it.
var expectationFailed = regexp.MustCompile(`\AHTTP/1\.[01] 417 Expectation Failed\r\nConnection: close\r\nDate: [^\r\n]{29}\r\nContent-Length: 0\r\n\r\n\z`)

// rewriteRefusal returns p as a problem+json answer if p is one of
// net/http's own refusals (see problemRefusals).
func rewriteRefusal(p []byte) ([]byte, bool) {
	const maxRefusal = 512 // net/http's are under 200 bytes
	if len(p) > maxRefusal {
		return nil, false
	}
	if expectationFailed.Match(p) {
		return problemAnswer(http.StatusExpectationFailed, "expectation-failed", "Expectation failed",
			"the only expectation this server meets is Expect: 100-continue"), true
	}
	if !bytes.HasPrefix(p, []byte("HTTP/1.1 ")) {
		return nil, false
	}
	statusLine, body, found := bytes.Cut(p, []byte(netHTTPRefusalHeaders))
	if !found || bytes.Contains(statusLine, []byte("\r\n")) {
		return nil, false
	}
	code, err := strconv.Atoi(string(statusLine[len("HTTP/1.1 "):min(len(statusLine), len("HTTP/1.1 000"))]))
	if err != nil || code < 400 || code > 599 {
		return nil, false
	}
	kind, title := "malformed-request", "Malformed request"
	switch {
	case code == http.StatusRequestHeaderFieldsTooLarge:
		kind, title = "headers-too-large", "Request header fields too large"
	case code >= 500: // 501 Transfer-Encoding, 505 HTTP version: the request's
		code = http.StatusBadRequest
	}
	return problemAnswer(code, kind, title, "refused before it was read: "+string(body)), true
}

// problemAnswer is a whole answer, problem+json, that closes the connection.
func problemAnswer(code int, kind, title, detail string) []byte {
	problem, _ := json.Marshal(struct {
		Type   string `json:"type"`
		Title  string `json:"title"`
		Status int    `json:"status"`
		Detail string `json:"detail"`
	}{httpapi.ProblemBase + kind, title, code, detail})
	return fmt.Appendf(nil, "HTTP/1.1 %d %s\r\nContent-Type: application/problem+json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		code, http.StatusText(code), len(problem), problem)
}
