// Package faults proves the guarantees under faults: it runs the real
// binaries as separate processes against a real PostgreSQL and nats-server,
// drives them with careful clients, injects crashes, restarts and network
// faults on a seeded schedule, lets the system drain, and checks the
// invariants. cmd/faults runs it; `make faults` and the short run in CI call
// that.
package faults

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/acme/orders/fakepsp"
	"github.com/acme/orders/internal/noisy"
	"github.com/acme/orders/settle"
	"github.com/acme/orders/stream"
)

// Config is one run.
type Config struct {
	Seed     uint64
	Duration time.Duration // of the faulty phase
	Clients  int
	// Every is the mean time between faults.
	Every time.Duration
	// Root is the repository; Dir the state directory (wiped first).
	Root, Dir string
	// NoisyPhase is each measured phase of the noisy-neighbour run that
	// precedes the faults (DefaultNoisyPhase if zero): the quiet tenant
	// alone, then under each of internal/noisy's attacks.
	NoisyPhase time.Duration
}

// Kinds are every fault the suite injects; each run injects each at least
// once (the first len(Kinds) faults are a seeded permutation of them).
var Kinds = []string{
	"kill-api",            // SIGKILL of an api replica, restarted after a moment
	"kill-relay",          // SIGKILL of the relay that owns partitions
	"kill-projector",      // SIGKILL of a projector worker
	"restart-nats",        // SIGKILL of nats-server, then start
	"restart-postgres",    // immediate shutdown (a crash) of PostgreSQL, then start
	"latency-api-db",      // 100-300 ms on api→PostgreSQL
	"cut-api-db",          // api→PostgreSQL connections reset: replies lost, some after COMMIT
	"cut-relay-nats",      // relay→NATS down for a while
	"cut-projector-nats",  // projector→NATS down for a while
	"lost-responses",      // api→client replies held back until the client times out
	"duplicate-delivery",  // stored events republished under fresh Nats-Msg-Ids
	"reordered-delivery",  // stored events republished shuffled
	"kill-payment-worker", // SIGKILL of a worker with provider calls in flight, then one that kills itself between a provider answer and its recording
	"psp-lost-responses",  // fakepsp commits, then loses answers (closed or stalled) for a while
	"psp-errors",          // fakepsp answers a share of calls 500 (nothing executed) for a while
	"psp-stored-errors",   // fakepsp fails the next 1-3 keyed calls with a 500 stored under the key (as Stripe does)
	"restart-psp",         // SIGKILL of fakepsp, then start on the same port and ledger
}

// Report is what a run found.
type Report struct {
	Seed                                uint64
	Duration                            time.Duration
	Ops                                 map[string]int
	Succeeded, Refused, GaveUp, Retries int
	Faults                              map[string]int
	Drain                               time.Duration
	// LostResponses is how many provider answers fakepsp lost (summed over
	// its restarts); SecondCharges how many charges its ledger shows beyond
	// one per paid order and one per key (the invariants make any a
	// violation); WindowCrashes how many workers killed themselves between
	// a provider answer and its recording.
	LostResponses, SecondCharges, WindowCrashes int64
	// Noisy is the noisy-neighbour run before the faults.
	Noisy      noisy.Report
	Violations []string
}

// Run runs the suite and writes a one-screen report to out. It returns an
// error only if the run itself could not be carried out; violations are in
// the report.
func Run(ctx context.Context, cfg Config, out io.Writer) (Report, error) {
	rep := Report{Seed: cfg.Seed, Duration: cfg.Duration, Ops: map[string]int{}, Faults: map[string]int{}}
	if cfg.NoisyPhase == 0 {
		cfg.NoisyPhase = DefaultNoisyPhase
	}
	if cfg.NoisyPhase < 0 {
		return rep, fmt.Errorf("faults: Config.NoisyPhase must not be negative, got %s", cfg.NoisyPhase)
	}
	if err := os.RemoveAll(cfg.Dir); err != nil {
		return rep, err
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return rep, err
	}
	logFile, err := os.Create(filepath.Join(cfg.Dir, "harness.log"))
	if err != nil {
		return rep, err
	}
	defer logFile.Close()
	logger := slog.New(slog.NewTextHandler(io.MultiWriter(logFile), nil))
	say := func(format string, args ...any) { fmt.Fprintf(out, "faults: "+format+"\n", args...) }

	s := &stack{root: cfg.Root, dir: cfg.Dir, log: logger}
	say("seed %d: starting PostgreSQL, nats-server, 2 api, 2 relays, 2 projectors, fakepsp, 2 payment workers (state in %s)", cfg.Seed, cfg.Dir)
	defer s.down()
	if err := s.up(ctx); err != nil {
		return rep, err
	}

	// Tenant isolation first, on a healthy system (G9).
	say("noisy neighbour: a hostile tenant attacks a third api replica, a quiet one is measured (%s per phase)", cfg.NoisyPhase)
	noisyRep, noisyViolations, err := s.noisyNeighbour(ctx, cfg.NoisyPhase, func(format string, args ...any) {
		logger.Info(fmt.Sprintf(format, args...), "phase", "noisy neighbour")
	})
	if err != nil {
		return rep, fmt.Errorf("noisy neighbour: %w", err)
	}
	rep.Noisy = noisyRep
	for _, v := range append(noisyRep.Violations(), noisyViolations...) {
		rep.Violations = append(rep.Violations, "noisy neighbour: "+v)
	}

	// Clients through the per-api proxies.
	var apis []string
	for _, name := range []string{"client-api-1", "client-api-2"} {
		apis = append(apis, "http://"+s.proxies[name].Listen)
	}
	var retries atomic.Int64
	clients := make([]*client, cfg.Clients)
	loadCtx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	var wg sync.WaitGroup
	for i := range clients {
		api, err := newAPIClient(apis, s.token, cfg.Seed+uint64(i), 3*time.Second)
		if err != nil {
			return rep, err
		}
		clients[i] = &client{id: i, api: api, rng: rand.New(rand.NewPCG(cfg.Seed, uint64(i))),
			deadline: 90 * time.Second, retries: &retries}
		wg.Add(1)
		go clients[i].run(loadCtx, &wg)
	}

	say("injecting faults for %s, one every ~%s", cfg.Duration, cfg.Every)
	rng := rand.New(rand.NewPCG(cfg.Seed, 999))
	order := rng.Perm(len(Kinds))
	faultsEnd := time.Now().Add(cfg.Duration)
	// Past Duration only to inject each kind once (a short run with slow
	// kinds would otherwise miss some).
	for n := 0; (n < len(order) || time.Now().Before(faultsEnd)) && ctx.Err() == nil; n++ {
		kind := Kinds[rng.IntN(len(Kinds))]
		if n < len(order) {
			kind = Kinds[order[n]]
		}
		pause := cfg.Every/2 + time.Duration(rng.Int64N(int64(cfg.Every)))
		time.Sleep(pause / 2)
		if err := s.inject(ctx, kind, rng); err != nil {
			rep.Violations = append(rep.Violations, fmt.Sprintf("fault %s could not be injected or healed: %v", kind, err))
		}
		rep.Faults[kind]++
		logger.Info("fault", "n", n, "kind", kind)
		time.Sleep(pause / 2)
		if err := s.restartDead(); err != nil {
			return rep, err
		}
	}

	say("faults over; letting the clients finish and the system drain")
	stopLoad()
	wg.Wait()
	drainStart := time.Now()
	if err := s.restartDead(); err != nil {
		return rep, err
	}
	for _, p := range s.procs {
		if err := s.waitReady(ctx, p, 60*time.Second); err != nil {
			rep.Violations = append(rep.Violations, "process did not come back by itself: "+err.Error())
		}
	}
	var ops []*op
	for _, c := range clients {
		ops = append(ops, c.ops...)
	}
	rep.Retries = int(retries.Load())
	for _, o := range ops {
		rep.Ops[o.Kind]++
		switch {
		case o.Status == 0:
			rep.GaveUp++
		case o.Status < 300:
			rep.Succeeded++
		default:
			rep.Refused++
		}
	}
	// The bound covers the slowest designed recovery: a parked intent
	// leased by a worker that was killed waits out its lease
	// (settle.DefaultLease, 30 s; it was 2 min, unrenewed, and seeds
	// 960660 and 540230 drained in 100 s) before another worker leases
	// it, then a backoff of up to 30 s, with room for a slow machine.
	violations, second, err := check(ctx, s, ops, settle.DefaultLease+90*time.Second)
	if err != nil {
		return rep, err
	}
	rep.SecondCharges = int64(second)
	if rep.LostResponses, err = s.lostResponsesTotal(ctx); err != nil {
		return rep, err
	}
	s.mu.Lock()
	rep.WindowCrashes = int64(s.windowCrashes)
	s.mu.Unlock()
	rep.Drain = time.Since(drainStart)
	rep.Violations = append(rep.Violations, violations...)
	s.mu.Lock()
	for _, p := range s.procs {
		if r := p.crashReport(); r != "" {
			rep.Violations = append(rep.Violations, r)
		}
	}
	s.mu.Unlock()
	rep.print(out)
	return rep, nil
}

// inject injects one fault of kind and heals it.
func (s *stack) inject(ctx context.Context, kind string, rng *rand.Rand) error {
	pick := func(prefix string) *proc { return s.procs[fmt.Sprintf("%s-%d", prefix, 1+rng.IntN(2))] }
	briefly := func() time.Duration {
		return 500*time.Millisecond + time.Duration(rng.Int64N(int64(1500*time.Millisecond)))
	}
	toxic := func(proxy, spec string) error {
		if _, err := s.proxies[proxy].Toxics.AddToxicJson(strings.NewReader(spec)); err != nil {
			return err
		}
		time.Sleep(briefly())
		s.proxies[proxy].Toxics.ResetToxics(ctx)
		return nil
	}
	switch kind {
	case "kill-api", "kill-relay", "kill-projector":
		p := pick(strings.TrimPrefix(kind, "kill-"))
		if kind == "kill-relay" {
			p = s.partitionOwner()
		}
		s.kill9(p)
		time.Sleep(briefly())
		return s.start(p, nil, false)
	case "restart-nats":
		if err := s.killNATS(); err != nil {
			return err
		}
		time.Sleep(briefly())
		return s.startNATS(ctx)
	case "restart-postgres":
		if err := s.crashPostgres(ctx); err != nil {
			return err
		}
		time.Sleep(briefly())
		return s.startPostgres(ctx)
	case "latency-api-db":
		return toxic("api-postgres", fmt.Sprintf(`{"name":"lat","type":"latency","stream":"downstream","attributes":{"latency":%d,"jitter":50}}`, 100+rng.IntN(200)))
	case "cut-api-db":
		return toxic("api-postgres", `{"name":"cut","type":"reset_peer","stream":"downstream","attributes":{"timeout":0}}`)
	case "cut-relay-nats", "cut-projector-nats":
		p := s.proxies[strings.TrimPrefix(kind, "cut-")]
		p.Stop()
		time.Sleep(briefly())
		return p.Start()
	case "lost-responses":
		return toxic(fmt.Sprintf("client-api-%d", 1+rng.IntN(2)), `{"name":"hold","type":"timeout","stream":"downstream","attributes":{"timeout":0}}`)
	case "duplicate-delivery", "reordered-delivery":
		return s.republish(ctx, kind == "reordered-delivery", rng)
	case "kill-payment-worker":
		return s.killPaymentWorker(ctx, pick("worker"), rng, briefly)
	case "psp-lost-responses":
		mode := []string{fakepsp.LoseClose, fakepsp.LoseStall}[rng.IntN(2)]
		return s.pspFaultFor(ctx, fakepsp.Faults{LoseResponseRate: 0.2 + 0.3*rng.Float64(), LoseMode: mode}, 2*time.Second+2*briefly())
	case "psp-errors":
		return s.pspFaultFor(ctx, fakepsp.Faults{ErrorRate: 0.2 + 0.5*rng.Float64()}, 2*briefly())
	case "psp-stored-errors":
		return s.pspFaultFor(ctx, fakepsp.Faults{StoreErrorNext: 1 + rng.IntN(3)}, 2*briefly())
	case "restart-psp":
		p := s.procs["fakepsp"]
		st, err := s.pspStats(ctx)
		if err != nil {
			return fmt.Errorf("stats before the restart: %w", err)
		}
		s.kill9(p)
		s.mu.Lock()
		s.lostResponses += st.LostResponses
		s.mu.Unlock()
		time.Sleep(briefly())
		if err := s.start(p, nil, false); err != nil {
			return err
		}
		return s.waitReady(ctx, p, 30*time.Second)
	}
	return fmt.Errorf("unknown fault %q", kind)
}

// pspFaultFor makes fakepsp inject f for d, then none.
func (s *stack) pspFaultFor(ctx context.Context, f fakepsp.Faults, d time.Duration) error {
	if err := s.setPSPFaults(ctx, f); err != nil {
		return err
	}
	time.Sleep(d)
	return s.setPSPFaults(ctx, fakepsp.Faults{})
}

// killPaymentWorker kills worker p twice: first with SIGKILL while provider
// calls are in flight (fakepsp slowed to 300 ms a call meanwhile), then it
// restarts it with the test-only crash hook, so that it kills itself right
// after one of its next few provider answers, before recording it (waited
// for up to 8 s, then killed anyway); then p starts as usual.
func (s *stack) killPaymentWorker(ctx context.Context, p *proc, rng *rand.Rand, briefly func() time.Duration) error {
	if err := s.setPSPFaults(ctx, fakepsp.Faults{LatencyMS: 300}); err != nil {
		return err
	}
	time.Sleep(briefly())
	s.kill9(p)
	if err := s.setPSPFaults(ctx, fakepsp.Faults{}); err != nil {
		return err
	}
	hook := fmt.Sprintf("WORKER_TEST_CRASH_AFTER_PROVIDER_CALLS=%d", 1+rng.IntN(3))
	if err := s.start(p, []string{hook}, true); err != nil {
		return err
	}
	select {
	case <-p.exited:
		s.mu.Lock()
		s.windowCrashes++
		s.mu.Unlock()
		s.log.Info("worker killed itself between a provider answer and its recording", "process", p.name)
	case <-time.After(8 * time.Second):
		s.kill9(p)
	}
	return s.start(p, nil, false)
}

// partitionOwner is the relay that currently publishes (the other is a
// standby), or either if that cannot be told.
func (s *stack) partitionOwner() *proc {
	for _, name := range []string{"relay-1", "relay-2"} {
		p := s.procs[name]
		res, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", p.port))
		if err != nil {
			continue
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if strings.Contains(string(b), "orders_relay_partitions_owned 16") {
			return p
		}
	}
	return s.procs["relay-1"]
}

// republish puts up to 50 stored events on the stream again under fresh
// Nats-Msg-Ids: a run of consecutive ones, shuffled if reorder.
func (s *stack) republish(ctx context.Context, reorder bool, rng *rand.Rand) error {
	nc, err := nats.Connect(fmt.Sprintf("nats://127.0.0.1:%d", s.natsPort), nats.Timeout(2*time.Second))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	st, err := js.Stream(ctx, stream.Name)
	if err != nil {
		return err
	}
	info, err := st.Info(ctx)
	if err != nil {
		return err
	}
	if info.State.Msgs == 0 {
		return nil
	}
	from := info.State.FirstSeq + uint64(rng.Int64N(int64(info.State.Msgs)))
	var msgs []*jetstream.RawStreamMsg
	for seq := from; seq <= info.State.LastSeq && len(msgs) < 50; seq++ {
		if m, err := st.GetMsg(ctx, seq); err == nil {
			msgs = append(msgs, m)
		}
	}
	if reorder {
		rng.Shuffle(len(msgs), func(i, j int) { msgs[i], msgs[j] = msgs[j], msgs[i] })
	}
	for i, m := range msgs {
		if _, err := js.Publish(ctx, m.Subject, m.Data, jetstream.WithMsgID(fmt.Sprintf("fault-copy-%d-%d-%d", from, i, rng.Uint64()))); err != nil {
			return err
		}
	}
	return nil
}

func (r Report) print(out io.Writer) {
	kinds := make([]string, 0, len(r.Ops))
	for k := range r.Ops {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	var opParts []string
	total := 0
	for _, k := range kinds {
		opParts = append(opParts, fmt.Sprintf("%s %d", k, r.Ops[k]))
		total += r.Ops[k]
	}
	var faultParts []string
	missing := 0
	for _, k := range Kinds {
		faultParts = append(faultParts, fmt.Sprintf("%s %d", k, r.Faults[k]))
		if r.Faults[k] == 0 {
			missing++
		}
	}
	fmt.Fprintf(out, "\n================ fault suite report ================\n")
	fmt.Fprintf(out, "seed        %d (reproduce: SEED=%d)\n", r.Seed, r.Seed)
	fmt.Fprintf(out, "faulty for  %s\n", r.Duration)
	fmt.Fprintf(out, "operations  %d (%s)\n", total, strings.Join(opParts, ", "))
	fmt.Fprintf(out, "answers     %d succeeded, %d refused, %d gave up; %d retries\n", r.Succeeded, r.Refused, r.GaveUp, r.Retries)
	fmt.Fprintf(out, "faults      %s\n", wrap(faultParts, 12))
	if missing > 0 {
		fmt.Fprintf(out, "            (%d kinds not injected: run longer)\n", missing)
	}
	fmt.Fprintf(out, "payments    lost responses %d, second charges %d; workers crashed between provider answer and commit %d\n",
		r.LostResponses, r.SecondCharges, r.WindowCrashes)
	fmt.Fprintf(out, "drain       settled, converged and checked in %s\n", r.Drain.Round(time.Millisecond))
	if r.Noisy.Alone.Total > 0 {
		fmt.Fprintf(out, "noisy       quiet tenant alone %d req, p99 %s, lag ≤ %s; under each attack:\n",
			r.Noisy.Alone.Total, r.Noisy.Alone.P99.Round(100*time.Microsecond), r.Noisy.Alone.MaxLag.Round(time.Millisecond))
		for _, a := range r.Noisy.Attacks {
			fmt.Fprintf(out, "  %s\n", a)
		}
	}
	fmt.Fprintf(out, "violations  %d\n", len(r.Violations))
	for i, v := range r.Violations {
		if i == 20 {
			fmt.Fprintf(out, "  … and %d more\n", len(r.Violations)-20)
			break
		}
		fmt.Fprintf(out, "  - %s\n", v)
	}
	if len(r.Violations) == 0 {
		fmt.Fprintln(out, "PASS")
	} else {
		fmt.Fprintln(out, "FAIL")
	}
}

func wrap(parts []string, indent int) string {
	var b strings.Builder
	line := 0
	for i, p := range parts {
		if i > 0 {
			if line+len(p) > 64 {
				b.WriteString(",\n" + strings.Repeat(" ", indent))
				line = 0
			} else {
				b.WriteString(", ")
			}
		}
		b.WriteString(p)
		line += len(p) + 2
	}
	return b.String()
}
