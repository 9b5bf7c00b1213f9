package health_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/acme/orders/health"
	"github.com/acme/orders/internal/testenv"
)

const secret = "failed to connect to user=orders database=orders host=db.internal port=5432"

func get(t *testing.T, h http.Handler, path string) *httptest.ResponseRecorder {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return rec
}

// /readyz answers from the monitor's last round: however often it is
// called, no check runs for it; its body says only what is up, and why a
// check failed goes to the log.
func TestReadyzAnswersFromCachedStateWithoutDetails(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	var pgDown atomic.Bool
	pgDown.Store(true)
	logs := &testenv.LogBuffer{}
	m, err := health.NewMonitor(map[string]health.Check{
		"postgres": func(context.Context) error {
			calls.Add(1)
			if pgDown.Load() {
				return errors.New(secret)
			}
			return nil
		},
		"nats": func(context.Context) error { return nil },
	}, slog.New(slog.NewTextHandler(logs, nil)), health.Config{Interval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	mux := chi.NewRouter()
	health.Register(mux, m)

	if rec := get(t, mux, "/readyz"); rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "starting") {
		t.Fatalf("before the first round: %d %s; want 503 starting", rec.Code, rec.Body)
	}

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { m.Run(ctx) })
	defer func() { cancel(); wg.Wait() }()
	waitFor(t, func() bool {
		return calls.Load() == 1 && get(t, mux, "/readyz").Body.String() != "" && !strings.Contains(get(t, mux, "/readyz").Body.String(), "starting")
	})

	for range 100 {
		rec := get(t, mux, "/readyz")
		if rec.Code != http.StatusServiceUnavailable {
			t.Fatalf("postgres down: status %d", rec.Code)
		}
		if body := rec.Body.String(); body != `{"checks":{"nats":"ok","postgres":"down"},"status":"unavailable"}`+"\n" {
			t.Fatalf("body %q says more than what is up", body)
		}
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("the check ran %d times for 100 /readyz calls in one interval; want once (by the monitor)", n)
	}
	if !strings.Contains(logs.String(), "db.internal") {
		t.Fatalf("the failure's details are not in the log: %s", logs)
	}
	if rec := get(t, mux, "/healthz"); rec.Code != http.StatusOK {
		t.Fatalf("/healthz: %d", rec.Code)
	}
}

// The monitor notices a recovery at its next round, and logs it.
func TestMonitorRefreshesInTheBackground(t *testing.T) {
	t.Parallel()
	var down atomic.Bool
	down.Store(true)
	logs := &testenv.LogBuffer{}
	m, err := health.NewMonitor(map[string]health.Check{"postgres": func(context.Context) error {
		if down.Load() {
			return errors.New(secret)
		}
		return nil
	}}, slog.New(slog.NewTextHandler(logs, nil)), health.Config{Interval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	mux := chi.NewRouter()
	health.Register(mux, m)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { m.Run(ctx) })
	defer func() { cancel(); wg.Wait() }()

	waitFor(t, func() bool { return strings.Contains(logs.String(), "readiness check failed") })
	if rec := get(t, mux, "/readyz"); rec.Code != http.StatusServiceUnavailable {
		t.Fatalf("postgres down: %d", rec.Code)
	}
	time.Sleep(100 * time.Millisecond) // a few more rounds, still down
	down.Store(false)
	waitFor(t, func() bool { return get(t, mux, "/readyz").Code == http.StatusOK })
	waitFor(t, func() bool { return strings.Contains(logs.String(), "recovered") })
	if n := strings.Count(logs.String(), "readiness check failed"); n != 1 {
		t.Fatalf("the same failure was logged %d times; want once:\n%s", n, logs)
	}
}

func TestMonitorConfigIsValidated(t *testing.T) {
	t.Parallel()
	logger := slog.New(slog.DiscardHandler)
	for _, cfg := range []health.Config{
		{Interval: time.Millisecond}, {Timeout: -time.Second},
		{Interval: time.Second, Timeout: time.Second, MaxAge: 2 * time.Second}, // a healthy monitor would flap
	} {
		if _, err := health.NewMonitor(nil, logger, cfg); err == nil {
			t.Errorf("NewMonitor(%+v) accepted an invalid config", cfg)
		}
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 5s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// An advisory check is reported as it is but does not make /readyz 503:
// the api serves without NATS (the outbox keeps the events), and a load
// balancer following /readyz took every api out for a broker outage.
func TestAnAdvisoryCheckDownKeepsTheProcessReady(t *testing.T) {
	t.Parallel()
	var pgDown atomic.Bool
	m, err := health.NewMonitor(map[string]health.Check{
		"postgres": func(context.Context) error {
			if pgDown.Load() {
				return errors.New("down")
			}
			return nil
		},
		"nats": func(context.Context) error { return errors.New("no servers available") },
	}, slog.New(slog.DiscardHandler), health.Config{Interval: 20 * time.Millisecond, Advisory: []string{"nats"}})
	if err != nil {
		t.Fatal(err)
	}
	mux := chi.NewRouter()
	health.Register(mux, m)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { m.Run(ctx) })
	defer func() { cancel(); wg.Wait() }()
	want := `{"checks":{"nats":"down","postgres":"ok"},"status":"ok"}` + "\n"
	waitFor(t, func() bool {
		rec := get(t, mux, "/readyz")
		return rec.Code == http.StatusOK && rec.Body.String() == want
	})
	pgDown.Store(true)
	want = `{"checks":{"nats":"down","postgres":"down"},"status":"unavailable"}` + "\n"
	waitFor(t, func() bool {
		rec := get(t, mux, "/readyz")
		return rec.Code == http.StatusServiceUnavailable && rec.Body.String() == want
	})
}
