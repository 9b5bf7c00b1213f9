package app

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/acme/orders/internal/harness"
)

// With an address, the process serves its runtime profiles there (and
// stops with ctx); without one, nothing listens.
func TestServePprofOnlyWhereAsked(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	port, err := harness.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	servePprof(ctx, "", logger) // off: must not panic or listen
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	servePprof(ctx, addr, logger)
	var body string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		resp, err := http.Get("http://" + addr + "/debug/pprof/goroutine?debug=1")
		if err != nil {
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		body = string(b)
		break
	}
	if !strings.Contains(body, "goroutine profile") {
		t.Fatalf("no goroutine profile at %s; got %q", addr, body)
	}
}
