// Package health serves the liveness and readiness endpoints that every
// process of the service exposes.
//
// /readyz is public and may be called by anything that can reach the port,
// as often as it likes, so it never runs a check itself: a Monitor runs the
// checks in the background and /readyz answers from the state it last saw.
// The answer says only which dependency is up; why one is down (an error
// text, which may name hosts, users or databases) goes to the logs.
package health

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Check reports whether one dependency is usable; nil means it is.
type Check func(ctx context.Context) error

// Defaults of Config.
const (
	// DefaultInterval is how often the checks run.
	DefaultInterval = 2 * time.Second
	// DefaultTimeout bounds one run of each check.
	DefaultTimeout = 2 * time.Second
)

// Config configures a Monitor. A zero field takes its default.
type Config struct {
	// Interval is how often the checks run; default DefaultInterval.
	Interval time.Duration
	// Timeout bounds each check's run; default DefaultTimeout.
	Timeout time.Duration
	// Advisory names checks that the body reports ("ok" or "down") but
	// that do not make /readyz 503: a dependency the process serves
	// without (the api's NATS, which only its relay needs: the outbox
	// holds the events meanwhile, so taking the api out of a load
	// balancer for it would turn a broker outage into an api outage).
	Advisory []string
	// MaxAge is how old the last round may be before /readyz answers 503
	// "stale" instead (a check that hangs, ignoring its Timeout, stops the
	// rounds). It must exceed Interval + Timeout, the age a healthy monitor
	// reaches; default 3 × Interval + Timeout.
	MaxAge time.Duration
}

// Monitor runs readiness checks in the background and holds their last
// results for /readyz. Until its first round of checks has finished it
// reports not ready.
type Monitor struct {
	checks map[string]Check
	cfg    Config
	logger *slog.Logger

	state atomic.Pointer[state]
	stale *state            // answered when state is older than MaxAge
	last  map[string]string // each check's last error text ("" when up); Run's own
}

// state is what /readyz answers, rendered once per round.
type state struct {
	status int
	body   []byte
	at     time.Time // when it was rendered
}

// NewMonitor returns a Monitor of checks, which logs with logger. It
// returns an error naming an invalid Config field. Start it with Run.
func NewMonitor(checks map[string]Check, logger *slog.Logger, cfg Config) (*Monitor, error) {
	if cfg.Interval == 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.MaxAge == 0 {
		cfg.MaxAge = 3*cfg.Interval + cfg.Timeout
	}
	switch {
	case cfg.Interval < 10*time.Millisecond:
		return nil, fmt.Errorf("health config: Interval must be at least 10ms, got %s", cfg.Interval)
	case cfg.Timeout < time.Millisecond:
		return nil, fmt.Errorf("health config: Timeout must be at least 1ms, got %s", cfg.Timeout)
	case cfg.MaxAge <= cfg.Interval+cfg.Timeout:
		return nil, fmt.Errorf("health config: MaxAge must exceed Interval + Timeout (%s), got %s", cfg.Interval+cfg.Timeout, cfg.MaxAge)
	case logger == nil:
		return nil, fmt.Errorf("health: a logger is required")
	}
	m := &Monitor{checks: maps.Clone(checks), cfg: cfg, logger: logger, last: map[string]string{}}
	results := map[string]bool{}
	for name := range checks {
		results[name] = false
	}
	m.state.Store(render(results, "starting"))
	unknown := map[string]string{}
	for name := range checks {
		unknown[name] = "unknown"
	}
	m.stale = renderChecks(unknown, "stale")
	return m, nil
}

// Run runs every check now and then every Interval, until ctx ends. Call it
// once, in a goroutine its owner joins.
func (m *Monitor) Run(ctx context.Context) {
	t := time.NewTicker(m.cfg.Interval)
	defer t.Stop()
	for {
		m.refresh(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// refresh runs every check at once, logs what changed and stores the answer.
func (m *Monitor) refresh(parent context.Context) {
	ctx, cancel := context.WithTimeout(parent, m.cfg.Timeout)
	defer cancel()
	errs := make(map[string]error, len(m.checks))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for name, check := range m.checks {
		wg.Go(func() {
			err := check(ctx)
			mu.Lock()
			defer mu.Unlock()
			errs[name] = err
		})
	}
	wg.Wait()
	if parent.Err() != nil {
		return // shutting down: keep the last state
	}
	results := make(map[string]bool, len(errs))
	for _, name := range slices.Sorted(maps.Keys(errs)) {
		err := errs[name]
		results[name] = err == nil
		text := ""
		if err != nil {
			text = err.Error()
		}
		prev, seen := m.last[name]
		switch {
		case err != nil && (!seen || text != prev):
			m.logger.WarnContext(ctx, "readiness check failed", "check", name, "err", err)
		case err == nil && seen && prev != "":
			m.logger.InfoContext(ctx, "readiness check recovered", "check", name)
		}
		m.last[name] = text
	}
	word := "ok"
	for name, up := range results {
		if !up && !slices.Contains(m.cfg.Advisory, name) {
			word = "unavailable"
		}
	}
	m.state.Store(render(results, word))
}

func render(results map[string]bool, word string) *state {
	checks := make(map[string]string, len(results))
	for name, up := range results {
		checks[name] = "down"
		if up {
			checks[name] = "ok"
		}
	}
	return renderChecks(checks, word)
}

func renderChecks(checks map[string]string, word string) *state {
	status := http.StatusOK
	if word != "ok" {
		status = http.StatusServiceUnavailable
	}
	b, err := json.Marshal(map[string]any{"status": word, "checks": checks})
	if err != nil { // cannot happen: strings only
		panic(err)
	}
	return &state{status: status, body: append(b, '\n'), at: time.Now()}
}

// Register adds GET /healthz (the process is alive: always 200) and GET
// /readyz (200 if every check of m passed in its last round, else 503; the
// body names each check with "ok" or "down", nothing more) to mux. /readyz
// runs no check: it answers from m's last round, or, when that round is
// older than MaxAge (the checks hang), 503 with status "stale" and each
// check "unknown". A nil m has no checks and is always ready.
func Register(mux interface {
	Get(pattern string, h http.HandlerFunc)
}, m *Monitor) {
	mux.Get("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		write(w, http.StatusOK, []byte(`{"status":"ok"}`+"\n"))
	})
	ready := render(nil, "ok")
	mux.Get("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		st := ready
		if m != nil {
			st = m.state.Load()
			if time.Since(st.at) > m.cfg.MaxAge {
				st = m.stale
			}
		}
		write(w, st.status, st.body)
	})
}

func write(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}
