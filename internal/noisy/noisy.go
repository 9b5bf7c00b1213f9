// Package noisy proves that tenants are isolated in resources (G9): one
// tenant floods the api with each attack in turn (waiting readers, trickling
// bodies, forged tokens, a burst past its rate, an Idempotency-Key flood, a
// /readyz flood) while another runs a paced, normal workload, and the quiet
// tenant must not notice: at least 99.9% of its requests succeed, its p99
// stays within Bound of its p99 alone, its read model is never more than
// MaxViewLag behind its writes, and each attack was really made and shed.
//
// The api must run with APIEnv's limits, so that the attacks cross them.
// Run is called by the noisy-neighbour test of internal/app (an in-process
// api, short phases) and by the fault suite (internal/faults: the real
// processes, before any fault is injected, long phases in `make faults`).
package noisy

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
)

// Defaults of Config.
const (
	// DefaultPhase is how long each measured phase of the quiet tenant runs.
	DefaultPhase = 3 * time.Second
	// DefaultWarmup is how long the quiet tenant works, unmeasured, before
	// its baseline: prepared statements, pools and the projector warm up.
	DefaultWarmup = time.Second
	// DefaultLead is how long an attack runs at least before the quiet
	// tenant is measured.
	DefaultLead = 500 * time.Millisecond
	// DefaultMaxLead is how long an attack runs at most before the quiet
	// tenant is measured, waiting for the attack's first shed answer.
	DefaultMaxLead = 20 * time.Second
)

// APIEnv returns the environment the api must run with for Run's attacks
// to cross its limits: small enough that they do, large enough for the
// quiet tenant's paced workload (about 100 requests per second, never more
// than 2 at once). Keys live 15 s (the janitor sweeps every 5 s), so that
// the quiet tenant, storing about 30 keys a second, keeps at most ~600 of
// its 1,000 whatever the phase length, while the key flood (~150 a second)
// fills its quota within seconds. Give it only to an api whose tenants do
// not retry after 15 s: a longer-lived workload needs the default TTL and
// quota. Expiry is per key, so an api with this environment never expires
// the keys other apis stored on the same database.
func APIEnv() map[string]string {
	return map[string]string{
		"TENANT_RATE":                  "200",
		"TENANT_BURST":                 "50",
		"TENANT_MAX_IN_FLIGHT":         "32",
		"TENANT_MAX_WAITING":           "8",
		"BODY_TIMEOUT":                 "1s",
		"IDEMPOTENCY_KEY_QUOTA":        "1000",
		"IDEMPOTENCY_TTL":              "15s",
		"IDEMPOTENCY_JANITOR_INTERVAL": "5s",
	}
}

// Config is one run. API and both tokens are required; zero durations take
// the defaults.
type Config struct {
	// API is the base URL of the api (http://host:port), reached directly.
	API string
	// QuietToken and HostileToken are tokens of two different tenants.
	QuietToken, HostileToken string
	// Phase is how long each measured phase runs (DefaultPhase): the
	// baseline, and the quiet tenant under each attack (twice if the first
	// is over the bound).
	Phase time.Duration
	// Warmup is the unmeasured work before the baseline (DefaultWarmup).
	Warmup time.Duration
	// Lead is how long an attack runs at least before the quiet tenant is
	// measured (DefaultLead); after it, Run waits for the attack's first
	// shed answer (the key flood needs seconds to fill APIEnv's key
	// quota), but at most MaxLead (DefaultMaxLead) in all.
	Lead, MaxLead time.Duration
	// Logf, if set, gets a line per measured phase.
	Logf func(format string, args ...any)
}

func (c Config) withDefaults() Config {
	c.Phase = cmp.Or(c.Phase, DefaultPhase)
	c.Warmup = cmp.Or(c.Warmup, DefaultWarmup)
	c.Lead = cmp.Or(c.Lead, DefaultLead)
	c.MaxLead = cmp.Or(c.MaxLead, DefaultMaxLead)
	if c.Logf == nil {
		c.Logf = func(string, ...any) {}
	}
	return c
}

func (c Config) validate() error {
	switch {
	case !strings.HasPrefix(c.API, "http://") && !strings.HasPrefix(c.API, "https://"):
		return fmt.Errorf("noisy: Config.API must be an http(s) URL, got %q", c.API)
	case c.QuietToken == "":
		return errors.New("noisy: Config.QuietToken is required")
	case c.HostileToken == "":
		return errors.New("noisy: Config.HostileToken is required")
	case c.QuietToken == c.HostileToken:
		return errors.New("noisy: Config.QuietToken and Config.HostileToken must be tokens of two tenants")
	case c.Phase < 0, c.Warmup < 0, c.Lead < 0:
		return fmt.Errorf("noisy: Config.Phase, Warmup and Lead must not be negative, got %s, %s, %s", c.Phase, c.Warmup, c.Lead)
	case c.MaxLead < c.Lead:
		return fmt.Errorf("noisy: Config.MaxLead must be at least Lead (%s), got %s", c.Lead, c.MaxLead)
	}
	return nil
}

// Run measures the quiet tenant alone, then under each attack in turn, and
// returns what it saw; Report.Violations judges it. It returns an error only
// for an invalid Config or a cancelled ctx. If the quiet tenant fails alone
// the attacks are not run (the report's Alone says why).
//
// The quiet tenant is measured once the attack is being shed (see
// Config.Lead). A phase whose p99 is over Bound is measured again, up to
// MaxAttempts phases in all: the attack is stopped, the quiet tenant
// measured alone again, the attack started again, and the last phase under
// it is the one judged, against the slowest of the baselines. A burst of noise on a shared machine
// (other processes, the attacking clients on the same cores) seldom lasts
// through that, while starvation by the attack comes back with the attack.
// A phase with a failed request is never measured again: a failure always
// counts.
func Run(ctx context.Context, cfg Config) (Report, error) {
	cfg = cfg.withDefaults()
	var rep Report
	if err := cfg.validate(); err != nil {
		return rep, err
	}
	quiet := &quietClient{api: cfg.API, token: cfg.QuietToken,
		http: &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 4}}}
	defer quiet.http.CloseIdleConnections()
	hostile := &target{api: cfg.API, token: cfg.HostileToken,
		http: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1000}}}
	defer hostile.http.CloseIdleConnections()

	quiet.run(ctx, cfg.Warmup)
	rep.Alone = quiet.run(ctx, cfg.Phase)
	if err := ctx.Err(); err != nil {
		return rep, fmt.Errorf("noisy: %w", err)
	}
	cfg.Logf("quiet tenant alone: %d requests, %d failed, p99 %s", rep.Alone.Total, rep.Alone.Failed, rep.Alone.P99)
	if rep.Alone.Failed > 0 {
		return rep, nil
	}
	for _, a := range attacks {
		res := AttackResult{Name: a.name, Shed: a.shed, Bound: Bound(rep.Alone.P99)}
		hostileStatuses := map[int]int{}
		slowest := rep.Alone.P99
		for res.Attempts < MaxAttempts {
			res.Attempts++
			if res.Attempts > 1 {
				// The machine may be slower than when the quiet tenant was
				// measured alone: measure it alone again, the attack
				// stopped, and judge the second phase by the slower of the
				// two baselines.
				again := quiet.run(ctx, cfg.Phase)
				cfg.Logf("%s: quiet tenant alone again: %d requests, p99 %s", a.name, again.Total, again.P99)
				slowest = max(slowest, again.P99)
				res.Bound = Bound(slowest)
			}
			res.Quiet = measureUnder(ctx, cfg, a, hostile, quiet, hostileStatuses)
			cfg.Logf("%s (attempt %d): quiet tenant %d requests, %d failed, p99 %s, lag %s",
				a.name, res.Attempts, res.Quiet.Total, res.Quiet.Failed, res.Quiet.P99, res.Quiet.MaxLag)
			if res.Quiet.Failed > 0 || res.Quiet.P99 <= res.Bound || ctx.Err() != nil {
				break
			}
		}
		res.Hostile = hostileStatuses
		cfg.Logf("%s: hostile statuses %v", a.name, res.Hostile)
		rep.Attacks = append(rep.Attacks, res)
		if err := ctx.Err(); err != nil {
			return rep, fmt.Errorf("noisy: %w", err)
		}
	}
	return rep, nil
}

// MaxAttempts is how many phases an attack is measured in at most (see Run).
const MaxAttempts = 3

// measureUnder starts attack a, lets it reach its limits (at least the
// lead, then until its first shed answer, at most MaxLead), measures the
// quiet tenant for one phase and stops the attack again. The hostile
// tenant's answers are added to statuses.
func measureUnder(ctx context.Context, cfg Config, a attack, hostile *target, quiet *quietClient, statuses map[int]int) Workload {
	attackCtx, stop := context.WithCancel(ctx)
	var mu sync.Mutex
	var wg sync.WaitGroup
	wg.Go(func() {
		a.run(attackCtx, hostile, func(st int) {
			mu.Lock()
			statuses[st]++
			mu.Unlock()
		})
	})
	pause(ctx, cfg.Lead)
	shedding := func() bool { mu.Lock(); defer mu.Unlock(); return statuses[a.shed] > 0 }
	for deadline := time.Now().Add(cfg.MaxLead - cfg.Lead); !shedding() && time.Now().Before(deadline) && ctx.Err() == nil; {
		pause(ctx, 50*time.Millisecond)
	}
	w := quiet.run(ctx, cfg.Phase)
	stop()
	wg.Wait()
	return w
}

// quietClient is the quiet tenant.
type quietClient struct {
	api, token string
	http       *http.Client
}

// run runs the quiet tenant's normal work for d (or until ctx ends) with
// two paced workers: create an order, read it back with min_version
// (read-your-writes), read it plainly, list orders.
func (q *quietClient) run(ctx context.Context, d time.Duration) Workload {
	var mu sync.Mutex
	var res Workload
	var latencies []time.Duration
	record := func(what string, status, want int, took time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		res.Total++
		latencies = append(latencies, took)
		if status != want {
			res.Failed++
			if len(res.Errors) < 5 {
				res.Errors = append(res.Errors, fmt.Sprintf("%s: %d", what, status))
			}
		}
	}
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for ctx.Err() == nil {
				st, body, took := q.send(http.MethodPost, "/v1/orders", uuid.NewString(), orderBody("quiet-c"), nil)
				record("create", st, http.StatusCreated, took)
				var o struct{ ID string }
				_ = json.Unmarshal(body, &o)
				time.Sleep(15 * time.Millisecond)
				st, _, took = q.send(http.MethodGet, "/v1/orders/"+o.ID+"?min_version=1", "", "", http.Header{"Prefer": {"wait=5"}})
				record("read-your-writes", st, http.StatusOK, took)
				if st == http.StatusOK {
					mu.Lock()
					res.MaxLag = max(res.MaxLag, took)
					mu.Unlock()
				}
				time.Sleep(15 * time.Millisecond)
				st, _, took = q.send(http.MethodGet, "/v1/orders/"+o.ID, "", "", nil)
				record("get", st, http.StatusOK, took)
				time.Sleep(15 * time.Millisecond)
				st, _, took = q.send(http.MethodGet, "/v1/orders?limit=10", "", "", nil)
				record("list", st, http.StatusOK, took)
				time.Sleep(15 * time.Millisecond)
			}
		})
	}
	wg.Wait()
	slices.Sort(latencies)
	if len(latencies) > 0 {
		res.P99 = latencies[min(len(latencies)-1, len(latencies)*99/100)]
	}
	return res
}

// send sends one request of the quiet tenant, not bound to the phase's
// context (a request once sent is seen through), and returns its status (0
// on a transport error), body and latency.
func (q *quietClient) send(method, path, key, body string, header http.Header) (int, []byte, time.Duration) {
	req, err := http.NewRequest(method, q.api+path, strings.NewReader(body))
	if err != nil {
		return 0, nil, 0
	}
	if header != nil {
		req.Header = header.Clone()
	}
	req.Header.Set("Authorization", "Bearer "+q.token)
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
		req.Header.Set("Content-Type", "application/json")
	}
	start := time.Now()
	r, err := q.http.Do(req)
	if err != nil {
		return 0, nil, time.Since(start)
	}
	b, err := io.ReadAll(r.Body)
	r.Body.Close()
	if err != nil {
		return 0, nil, time.Since(start)
	}
	return r.StatusCode, b, time.Since(start)
}

func orderBody(customer string) string {
	return fmt.Sprintf(`{"customer_id":%q,"currency":"EUR","items":[{"sku":"book","quantity":2,"unit_price":1999}]}`, customer)
}

// pause waits d or until ctx ends.
func pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
