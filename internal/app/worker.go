package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/acme/orders/health"
	"github.com/acme/orders/internal/mono"
	"github.com/acme/orders/metrics"
	"github.com/acme/orders/payment"
	"github.com/acme/orders/postgres"
	"github.com/acme/orders/settle"
	"github.com/acme/orders/stream"
)

const workerUsage = `usage:
  worker [flags]                                 settle payment and refund intents with the provider (serve)
  worker dead-letters list [-all] [flags]        the worker's open dead letters (with -all: every one)
  worker dead-letters retry [flags] ID           settle a dead letter again (same idempotency key), then mark it retried
  worker dead-letters discard [flags] ID         stop trying a dead letter: record what the provider holds under its key, or a decline or failed refund`

// Defaults of the worker program.
const (
	// DefaultWorkerHTTPAddr is where the worker serves /healthz, /readyz
	// and /metrics: loopback only, like the projector's.
	DefaultWorkerHTTPAddr = "127.0.0.1:8082"
	// DefaultProviderURL is the local provider that `make run` starts
	// (cmd/fakepsp); DefaultProviderKey is a key it accepts.
	DefaultProviderURL = "http://127.0.0.1:12111"
	DefaultProviderKey = "sk_test_local"
	// DefaultWorkerPoolSize is the worker's default -db-pool-size.
	DefaultWorkerPoolSize = 10
	// WorkerShutdownTimeout bounds how long the worker's HTTP server waits
	// for in-flight requests when it stops.
	WorkerShutdownTimeout = 5 * time.Second
)

// RunWorker is the whole payment worker program (cmd/worker): it settles
// payment.requested and refund.requested intents with the provider (see
// package settle) and serves /healthz, /readyz (PostgreSQL, NATS, the
// provider) and /metrics; its dead-letters subcommands operate it. Serving
// returns when ctx ends, after the intents in hand are settled and acked.
func RunWorker(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	sub, rest := "", args[1:]
	if len(rest) > 0 && rest[0] == "dead-letters" {
		if len(rest) > 1 && isHelp(rest[1]) {
			fmt.Fprintln(os.Stderr, workerUsage)
			return nil
		}
		if len(rest) < 2 || (rest[1] != "list" && rest[1] != "retry" && rest[1] != "discard") {
			return fmt.Errorf("unknown dead-letters command\n%s", workerUsage)
		}
		sub, rest = "dead-letters "+rest[1], rest[2:]
	}
	env := NewEnv(getenv)
	fs := flag.NewFlagSet("worker "+sub, flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), workerUsage)
		fs.PrintDefaults()
	}
	databaseURL := env.String(fs, "database-url", "DATABASE_URL", DefaultDatabaseURL, "PostgreSQL connection URL")
	natsURL := env.String(fs, "nats-url", "NATS_URL", DefaultNATSURL, "NATS server URL")
	httpAddr := env.String(fs, "http-addr", "WORKER_HTTP_ADDR", DefaultWorkerHTTPAddr, "address to serve /healthz, /readyz and /metrics on")
	providerURL := env.String(fs, "provider-url", "PAYMENT_PROVIDER_URL", DefaultProviderURL, "base URL of the Stripe-compatible provider (https://api.stripe.com for Stripe)")
	providerKey := env.String(fs, "provider-key", "PAYMENT_PROVIDER_KEY", DefaultProviderKey, "the provider's secret key")
	providerTimeout := env.Duration(fs, "provider-timeout", "PAYMENT_PROVIDER_TIMEOUT", payment.DefaultTimeout, "bound of one provider HTTP attempt")
	providerSearchLag := env.Duration(fs, "provider-search-lag", "PAYMENT_PROVIDER_SEARCH_LAG", settle.DefaultProviderSearchLag,
		"how long the provider's search may lag its writes (Stripe's: a minute; 0 for fakepsp, whose search is immediate)")
	pprofAddr := env.String(fs, "pprof-addr", "PPROF_ADDR", "", pprofUsage)
	concurrency := env.Int(fs, "concurrency", "WORKER_CONCURRENCY", settle.DefaultConcurrency, "intents of each kind settled at once in this process")
	ackWait := env.Duration(fs, "ack-wait", "WORKER_ACK_WAIT", settle.DefaultAckWait, "redeliver an intent after this long without an ack")
	maxDeliver := env.Int(fs, "max-deliver", "WORKER_MAX_DELIVER", settle.DefaultMaxDeliver, "dead-letter an intent after this many failed deliveries")
	tenantShare := env.Int(fs, "tenant-share-percent", "WORKER_TENANT_SHARE_PERCENT", int(settle.DefaultTenantShare*100),
		"most of -concurrency (percent, at least one slot) one tenant's intents hold at once; its excess is parked out of the consumer's window")
	replicas := env.Int(fs, "stream-replicas", "STREAM_REPLICAS", stream.DefaultReplicas, "replicas of the JetStream stream and consumers (3 on a cluster)")
	poolSize := env.Int(fs, "db-pool-size", "DB_POOL_SIZE", DefaultWorkerPoolSize, "most PostgreSQL connections of this process")
	logFormat := env.String(fs, "log-format", "LOG_FORMAT", "", "log format: json or text (default: text on a terminal)")
	logLevel := env.String(fs, "log-level", "LOG_LEVEL", "info", "log level: debug, info, warn, error")
	notifyInterval := env.Duration(fs, "notify-interval", "NOTIFY_INTERVAL", postgres.DefaultNotifyInterval, "shortest time between two wake-ups of the relays (NOTIFY outbox, sent after outcome commits, coalesced)")
	crashAfter := env.Int(fs, "test-crash-after-provider-calls", "WORKER_TEST_CRASH_AFTER_PROVIDER_CALLS", 0,
		"TEST ONLY (the fault suite): SIGKILL this process right after its N-th provider answer, before recording it (0: never)")
	all := fs.Bool("all", false, "dead-letters list: also the resolved ones")
	if err := fs.Parse(rest); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if err := env.Err(); err != nil {
		return err
	}
	if takesNoArgs(sub) && fs.NArg() > 0 {
		// A mistyped subcommand ("dead-lettres list") must not start a worker.
		return fmt.Errorf("unexpected argument %q\n%s", fs.Arg(0), workerUsage)
	}
	if *poolSize < 2 || *poolSize > MaxPoolSize {
		return fmt.Errorf("-db-pool-size must be 2 to %d, got %d", MaxPoolSize, *poolSize)
	}
	if err := CheckLogFlags(*logFormat, *logLevel); err != nil {
		return err
	}
	logger := NewLogger(stdout, *logFormat, *logLevel).With("process", "worker")
	if sub != "" {
		logger = NewLogger(io.Discard, "", "")
	} else {
		servePprof(ctx, *pprofAddr, logger)
	}
	if sub == "" {
		stopTracing, err := startTracing(ctx, env.Tracing("orders-worker"), logger)
		if err != nil {
			return err
		}
		defer stopTracing() // last: after the last batch's spans ended
	}
	provider, err := payment.NewStripe(payment.Config{BaseURL: *providerURL, SecretKey: *providerKey, Timeout: *providerTimeout,
		Logger: logger.With("component", "provider")})
	if err != nil {
		return fmt.Errorf("-provider-url, -provider-key, -provider-timeout: %w", err)
	}
	providerCheck, err := ProviderReady(*providerURL, *providerKey)
	if err != nil {
		return err
	}
	if *crashAfter < 0 {
		return fmt.Errorf("-test-crash-after-provider-calls must not be negative, got %d", *crashAfter)
	}
	if *tenantShare < 1 || *tenantShare > 100 {
		return fmt.Errorf("-tenant-share-percent must be 1 to 100, got %d", *tenantShare)
	}
	if *providerSearchLag < 0 {
		return fmt.Errorf("-provider-search-lag must not be negative, got %s", *providerSearchLag)
	}
	searchLag := *providerSearchLag
	if searchLag == 0 {
		searchLag = -1 // none (settle.Config's 0 is its default)
	}
	cfg := settle.Config{Concurrency: *concurrency, AckWait: *ackWait, MaxDeliver: *maxDeliver, StreamReplicas: *replicas,
		TenantShare: float64(*tenantShare) / 100, ProviderSearchLag: searchLag, AfterProviderCall: crashAfterProviderCalls(*crashAfter, killSelf)}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("-concurrency, -ack-wait, -max-deliver, -stream-replicas, -tenant-share-percent: %w", err)
	}

	pool, err := openDB(ctx, *databaseURL, *poolSize, sub != "", logger)
	if err != nil {
		return err
	}
	defer closeDB(pool, logger)

	switch sub {
	case "dead-letters list":
		return listWorkerDeadLetters(ctx, pool, *all, stdout)
	case "dead-letters retry", "dead-letters discard":
		id, err := strconv.ParseInt(fs.Arg(0), 10, 64)
		if fs.NArg() != 1 || err != nil {
			return fmt.Errorf("%s needs one dead letter ID\n%s", sub, workerUsage)
		}
		w, err := settle.New(pool, nil, provider, logger, cfg)
		if err != nil {
			return err
		}
		if sub == "dead-letters discard" {
			outcome, err := w.DiscardDeadLetter(ctx, id)
			if err != nil {
				return err
			}
			wakeRelays(ctx, pool, logger)
			fmt.Fprintf(stdout, "discarded dead letter %d: %s\n", id, outcome)
			return nil
		}
		if err := w.RetryDeadLetter(ctx, id); err != nil {
			return err
		}
		wakeRelays(ctx, pool, logger)
		fmt.Fprintf(stdout, "retried dead letter %d\n", id)
		return nil
	}

	nc, err := ConnectNATS(*natsURL, "orders-worker", logger)
	if err != nil {
		return err
	}
	defer CloseNATS(nc, logger)
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	// The outcomes' outbox events wake the relay (in the api process) with
	// one coalesced NOTIFY per interval, after their commits.
	notifier, err := postgres.NewNotifier(pool, logger.With("component", "notifier"), postgres.NotifierConfig{Channel: "outbox", Interval: *notifyInterval})
	if err != nil {
		return fmt.Errorf("-notify-interval: %w", err)
	}
	notifyCtx, stopNotifier := context.WithCancel(context.WithoutCancel(ctx))
	notified := make(chan struct{})
	go func() { defer close(notified); notifier.Run(notifyCtx) }()
	defer func() { stopNotifier(); <-notified }() // after the last outcome
	cfg.AfterRecord = notifier.Notify
	timings := newSettleTimings()
	cfg.Observe = timings.observe
	w, err := settle.New(pool, js, provider, logger, cfg)
	if err != nil {
		return err
	}
	logger.Info("payment worker", "provider", redactURL(*providerURL), "concurrency", *concurrency)

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return w.Run(gctx) })
	monitor, err := health.NewMonitor(map[string]health.Check{
		"postgres": writablePool(pool),
		"nats":     NATSReady(nc),
		"provider": providerCheck,
	}, logger.With("component", "health"), health.Config{})
	if err != nil {
		return err
	}
	g.Go(func() error { monitor.Run(gctx); return nil })
	mux := chi.NewRouter()
	health.Register(mux, monitor)
	reg := metrics.NewRegistry()
	if err := metrics.Register(reg, workerMetrics(w)...); err != nil {
		return err
	}
	reg.MustRegister(timings.provider, timings.record, timings.settled)
	mux.Method(http.MethodGet, "/metrics", metrics.Handler(reg))
	g.Go(func() error { return Serve(gctx, *httpAddr, mux, logger, WorkerShutdownTimeout) })
	var stopping atomic.Int64
	stop := context.AfterFunc(gctx, func() { stopping.Store(mono.Now()) })
	defer stop()
	err = g.Wait()
	logger.Info("shutdown: payment worker stopped (intents in hand settled; their acks go out with the NATS flush)",
		"duration", mono.Since(stopping.Load()), "err", err)
	return err
}

// errCrashed abandons an intent whose process is being killed by the
// test-only crash hook.
var errCrashed = errors.New("test crash hook: process killed after the provider answered")

// crashAfterProviderCalls is the test-only hook of
// WORKER_TEST_CRASH_AFTER_PROVIDER_CALLS: it calls crash at the n-th
// provider answer and at every later one, before the outcome is recorded,
// and abandons those intents (errCrashed) in case crash returns. n = 0 is no
// hook (nil). Safe for concurrent use.
func crashAfterProviderCalls(n int, crash func()) func(context.Context, string, uuid.UUID) error {
	if n <= 0 {
		return nil
	}
	var calls atomic.Int64
	return func(context.Context, string, uuid.UUID) error {
		if calls.Add(1) < int64(n) {
			return nil
		}
		crash()
		return errCrashed
	}
}

// killSelf kills this process with SIGKILL: no deferred call, no graceful
// shutdown, exactly as `kill -9` would.
func killSelf() { _ = syscall.Kill(os.Getpid(), syscall.SIGKILL) }

// ProviderReady is a readiness check of the provider at baseURL: for
// Stripe (api.stripe.com) an authenticated GET /v1/balance, the cheapest
// call that proves the key works; for any other (the local fakepsp) GET
// /healthz. Anything but a 200 within the check's timeout is not ready.
func ProviderReady(baseURL, key string) (health.Check, error) {
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("-provider-url %q: want an http(s) URL", baseURL)
	}
	base := strings.TrimSuffix(baseURL, "/") // as payment.NewStripe takes it
	check, auth := base+"/healthz", false
	if u.Hostname() == "api.stripe.com" {
		check, auth = base+"/v1/balance", true
	}
	client := &http.Client{}
	return func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, check, nil)
		if err != nil {
			return fmt.Errorf("provider: %w", err)
		}
		if auth {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := client.Do(req)
		if err != nil {
			return fmt.Errorf("provider: %w", err)
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("provider: GET %s: %s", redactURL(check), resp.Status)
		}
		return nil
	}, nil
}

func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}

// settleTimings are the worker's latency histograms, by kind (charge,
// refund): where an intent's time goes, from its event to its outcome.
type settleTimings struct{ provider, record, settled *prometheus.HistogramVec }

func newSettleTimings() settleTimings {
	vec := func(name, help string) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(metrics.HistogramOpts(name, help, metrics.LatencyBuckets), []string{"kind"})
	}
	return settleTimings{
		provider: vec("payment_provider_seconds", "the provider's answer to one intent (the call with the adapter's retries, or a redelivery's look-up by key)"),
		record:   vec("payment_record_seconds", "the transaction recording one outcome (order, charge or refund row, inbox row, outbox event)"),
		settled: vec("payment_intent_to_recorded_seconds",
			"from an intent's event (the api's clock) to its outcome committed: relay, queue, provider and recording"),
	}
}

func (t settleTimings) observe(consumer string, tm settle.Timing) {
	kind := "charge"
	if consumer == settle.RefundConsumer {
		kind = "refund"
	}
	t.provider.WithLabelValues(kind).Observe(tm.Provider.Seconds())
	t.record.WithLabelValues(kind).Observe(tm.Record.Seconds())
	if tm.Settled > 0 {
		t.settled.WithLabelValues(kind).Observe(tm.Settled.Seconds())
	}
}

// workerMetrics are the worker's counters, read at scrape time.
func workerMetrics(w *settle.Worker) []metrics.Metric {
	kinds := func(f func(settle.Stats) (charge, refund int64)) func() []metrics.Sample {
		return func() []metrics.Sample {
			c, r := f(w.Stats())
			return []metrics.Sample{{Labels: map[string]string{"kind": "charge"}, Value: float64(c)},
				{Labels: map[string]string{"kind": "refund"}, Value: float64(r)}}
		}
	}
	return []metrics.Metric{
		{Name: "payment_charges_total", Help: "charges recorded by this process, by outcome", Counter: true, Labels: []string{"outcome"}, Read: func() []metrics.Sample {
			s := w.Stats()
			return []metrics.Sample{{Labels: map[string]string{"outcome": "succeeded"}, Value: float64(s.ChargesSucceeded)},
				{Labels: map[string]string{"outcome": "declined"}, Value: float64(s.ChargesDeclined)}}
		}},
		{Name: "payment_refunds_total", Help: "refunds recorded by this process, by outcome", Counter: true, Labels: []string{"outcome"}, Read: func() []metrics.Sample {
			s := w.Stats()
			return []metrics.Sample{{Labels: map[string]string{"outcome": "succeeded"}, Value: float64(s.RefundsSucceeded)},
				{Labels: map[string]string{"outcome": "failed"}, Value: float64(s.RefundsFailed)}}
		}},
		{Name: "payment_provider_transient_failures_total", Help: "provider calls that failed in a way a retry with the same key may cure", Counter: true, Labels: []string{"kind"},
			Read: kinds(func(s settle.Stats) (int64, int64) { return s.ChargeTransient, s.RefundTransient })},
		{Name: "payment_dead_lettered_total", Help: "intents dead-lettered by this process", Counter: true, Labels: []string{"kind"},
			Read: kinds(func(s settle.Stats) (int64, int64) { return s.ChargeDeadLettered, s.RefundDeadLettered })},
		{Name: "payment_duplicates_skipped_total", Help: "deliveries of intents found already recorded (most before the provider call; a racing copy after it, its answer the same charge by key)", Counter: true,
			Read: metrics.One(func() int64 { return w.Stats().Duplicates })},
		{Name: "payment_deferred_total", Help: "deliveries deferred (not failures) because their tenant held its share of this process's slots or had intents parked", Counter: true,
			Read: metrics.One(func() int64 { return w.Stats().Deferred })},
		{Name: "payment_parked_total", Help: "deferred intents parked in dead_letters out of the consumer's window", Counter: true,
			Read: metrics.One(func() int64 { return w.Stats().Parked })},
		{Name: "payment_redriven_total", Help: "parked intents this process leased and tried again (each lease once)", Counter: true,
			Read: metrics.One(func() int64 { return w.Stats().Redriven })},
		{Name: "payment_retry_parked_total", Help: "delivered intents that failed transiently, parked on their backoff out of the consumer's window (retried by the re-drive)", Counter: true,
			Read: metrics.One(func() int64 { return w.Stats().RetryParked })},
	}
}

func listWorkerDeadLetters(ctx context.Context, db postgres.DB, all bool, stdout io.Writer) error {
	dls, err := settle.ListDeadLetters(ctx, db, all)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tCONSUMER\tSTATUS\tORDER\tSTREAM SEQ\tDELIVERIES\tSINCE\tERROR")
	for _, d := range dls {
		order := "-"
		if d.AggregateID != nil {
			order = d.AggregateID.String()
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%d\t%s\t%s\n", d.ID, d.Consumer, d.Status, order, d.StreamSeq, d.Deliveries,
			d.CreatedAt.UTC().Format(time.RFC3339), d.Error)
	}
	return tw.Flush()
}

// wakeRelays tells the relays that an outcome's events were committed, so
// they publish them now rather than at their next poll (a second later).
// Best effort: the poll covers a failure.
func wakeRelays(ctx context.Context, pool postgres.DB, logger *slog.Logger) {
	if _, err := pool.Exec(ctx, "NOTIFY outbox"); err != nil {
		logger.Warn("could not wake the relays; they publish at their next poll", "err", err)
	}
}
