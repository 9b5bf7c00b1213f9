package health_test

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/acme/orders/health"
)

// A check that hangs (ignoring its deadline) stops the monitor's rounds;
// /readyz must not serve the last "ok" forever: past the maximum age it
// answers 503 "stale".
func TestReadyzGoesStaleWhenChecksHang(t *testing.T) {
	t.Parallel()
	var hang atomic.Bool
	block := make(chan struct{})
	m, err := health.NewMonitor(map[string]health.Check{"postgres": func(context.Context) error {
		if hang.Load() {
			<-block // ignores ctx, as a stuck driver call may
		}
		return nil
	}}, slog.New(slog.DiscardHandler), health.Config{Interval: 20 * time.Millisecond, Timeout: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	mux := chi.NewRouter()
	health.Register(mux, m)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { m.Run(ctx) })
	defer func() { cancel(); close(block); wg.Wait() }()

	waitFor(t, func() bool { return get(t, mux, "/readyz").Code == http.StatusOK })
	hang.Store(true)
	waitFor(t, func() bool { return get(t, mux, "/readyz").Code == http.StatusServiceUnavailable })
	if body := get(t, mux, "/readyz").Body.String(); !strings.Contains(body, `"status":"stale"`) {
		t.Fatalf("/readyz with hung checks: %s; want status stale", body)
	}
}
