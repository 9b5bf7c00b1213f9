package httpapi_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/acme/orders/httpapi"
	"github.com/acme/orders/internal/testenv"
)

// A chunked body (no length declared) that sends one byte past the limit
// and stalls gets 413 at once and its connection is closed within the body
// timeout: the server neither waits for the rest with no deadline (which
// held a goroutine and a socket forever) nor keeps the connection. (A body
// that declares more than the limit is refused before it is read:
// TestBodyDeclaredTooLongIs413AtOnce.)
func TestOverLimitBodyThenStallIsClosed(t *testing.T) {
	t.Parallel()
	const bodyTimeout = 500 * time.Millisecond
	a := newLimitedAPI(t, httpapi.TenantLimitConfig{MaxInFlight: 1}, 0, bodyTimeout)
	tok := a.token(t, "big")
	conn, err := net.Dial("tcp", strings.TrimPrefix(a.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	const limit = 1 << 20
	start := time.Now()
	fmt.Fprintf(conn, "POST /v1/orders HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nIdempotency-Key: k1\r\n"+
		"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n", tok, limit+100<<10)
	if _, err := conn.Write(bytes.Repeat([]byte(" "), limit+1)); err != nil {
		t.Fatal(err)
	}
	// Now go silent, with 100 KiB of the chunk still owed.
	_ = conn.SetReadDeadline(time.Now().Add(bodyTimeout + 5*time.Second))
	br := bufio.NewReader(conn)
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no response to the over-limit body after %s: %v", time.Since(start), err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(string(b), "body-too-large") {
		t.Fatalf("over-limit body: %d %s, want 413 body-too-large", res.StatusCode, b)
	}
	if !res.Close {
		t.Fatalf("413 without Connection: close (header %q)", res.Header.Get("Connection"))
	}
	// The server closes its end within the body timeout.
	_ = conn.SetReadDeadline(time.Now().Add(bodyTimeout + 3*time.Second))
	if _, err := br.ReadByte(); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("connection still open %s after the 413: %v", time.Since(start), err)
	}
	testenv.Eventually(t, time.Second, "the tenant slot is free", func() bool { return a.tenants.Stats().InFlight == 0 })
}

// A body that declares more than the limit gets 413 before any of it is
// read: not a 408 after the body timeout, when the client sends only part
// of it (sending the rest could never succeed), and its slot is free.
func TestBodyDeclaredTooLongIs413AtOnce(t *testing.T) {
	t.Parallel()
	a := newLimitedAPI(t, httpapi.TenantLimitConfig{MaxInFlight: 1}, 0, time.Minute)
	tok := a.token(t, "big")
	conn, err := net.Dial("tcp", strings.TrimPrefix(a.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /v1/orders HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nIdempotency-Key: k1\r\n"+
		"Content-Type: application/json\r\nContent-Length: 99999999999\r\n\r\n{\"customer_id\": \"c1\"", tok)
	_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second)) // the body timeout is a minute
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no response to a body declared too long: %v", err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(string(b), "body-too-large") || !res.Close {
		t.Fatalf("body declared too long: %d close=%v %s, want 413 body-too-large with Connection: close", res.StatusCode, res.Close, b)
	}
	testenv.Eventually(t, time.Second, "the tenant slot is free", func() bool { return a.tenants.Stats().InFlight == 0 })
}
