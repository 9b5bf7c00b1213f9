package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/acme/orders/health"
	"github.com/acme/orders/internal/mono"
	"github.com/acme/orders/metrics"
	"github.com/acme/orders/postgres"
	"github.com/acme/orders/projection"
	"github.com/acme/orders/settle"
	"github.com/acme/orders/stream"
)

const projectorUsage = `usage:
  projector [flags]                                   keep every read model (serve)
  projector status [flags]                            lag, checkpoint and dead letters per projection
  projector rebuild [flags] PROJECTION                rebuild a projection from the event log, live
  projector dead-letters list [-all] [flags]          unresolved dead letters (with -all: every one)
  projector dead-letters retry [flags] ID             apply a dead letter again, then what is parked behind it
  projector dead-letters discard [flags] ID           skip a dead letter for good, then apply what is parked behind it
projections: order_views, customer_summaries, daily_sales`

// DefaultProjectorHTTPAddr is where the projector serves /healthz, /readyz
// and /metrics unless -http-addr, PROJECTOR_HTTP_ADDR or HTTP_ADDR (in that
// order) says otherwise: loopback only, since /metrics is for a local
// scraper or sidecar, not the world.
const DefaultProjectorHTTPAddr = "127.0.0.1:8081"

// projections are every read model the projector keeps.
func projections() []projection.Projection {
	return []projection.Projection{projection.OrderViews{}, projection.CustomerSummaries{}, projection.DailySales{}}
}

// projectionNames lists the projections' names, for messages.
func projectionNames() string {
	var names []string
	for _, p := range projections() {
		names = append(names, p.Name())
	}
	return strings.Join(names, ", ")
}

type projectorConfig struct {
	databaseURL, natsURL, httpAddr string
	logFormat, logLevel            string
	runner                         projection.Config
	inbox                          projection.InboxPruneConfig
	notify                         postgres.NotifierConfig
	poolSize                       int
	all                            bool // dead-letters list -all
	pprofAddr                      string
}

// RunProjector is the whole projector program (cmd/projector): it keeps
// every read model and serves /healthz, /readyz and /metrics; its
// subcommands (see projectorUsage) operate it. Serving returns when ctx
// ends, after each projection has finished and acked its batch in hand.
// Tests call it with their own arguments, environment and output.
func RunProjector(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	return runProjector(ctx, args, getenv, stdout, false)
}

// RunProjectorProcess is RunProjector for a projector that has its process
// to itself (cmd/projector): serving, it also keeps the process's soft
// memory limit at ProjectorMemoryBudget and its GOGC at GCPercent, unless
// GOMEMLIMIT is set (keepMemoryBudget). Tests run RunProjector, which
// leaves their process's settings alone.
func RunProjectorProcess(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	return runProjector(ctx, args, getenv, stdout, true)
}

func runProjector(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer, process bool) error {
	sub, rest := "", args[1:]
	if len(rest) > 0 {
		switch rest[0] {
		case "status", "rebuild":
			sub, rest = rest[0], rest[1:]
		case "dead-letters":
			if len(rest) > 1 && isHelp(rest[1]) {
				fmt.Fprintln(os.Stderr, projectorUsage)
				return nil
			}
			if len(rest) < 2 || (rest[1] != "list" && rest[1] != "retry" && rest[1] != "discard") {
				return fmt.Errorf("unknown dead-letters command\n%s", projectorUsage)
			}
			sub, rest = "dead-letters "+rest[1], rest[2:]
		}
	}

	env := NewEnv(getenv)
	fs := flag.NewFlagSet("projector "+sub, flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), projectorUsage)
		fs.PrintDefaults()
	}
	var cfg projectorConfig
	databaseURL := env.String(fs, "database-url", "DATABASE_URL", DefaultDatabaseURL, "PostgreSQL connection URL")
	natsURL := env.String(fs, "nats-url", "NATS_URL", DefaultNATSURL, "NATS server URL")
	// HTTP_ADDR as for the api; PROJECTOR_HTTP_ADDR wins where both
	// processes share one environment (scripts/stack.sh sets both).
	defaultAddr := DefaultProjectorHTTPAddr
	if v := getenv("HTTP_ADDR"); v != "" {
		defaultAddr = v
	}
	httpAddr := env.String(fs, "http-addr", "PROJECTOR_HTTP_ADDR", defaultAddr, "address to serve /healthz, /readyz and /metrics on, else $HTTP_ADDR")
	batchSize := env.Int(fs, "batch-size", "PROJECTOR_BATCH_SIZE", projection.DefaultBatchSize, "most events applied in one transaction")
	workers := env.Int(fs, "workers", "PROJECTOR_WORKERS", projection.DefaultWorkers, "batches each projection applies at once in this process")
	batchWait := env.Duration(fs, "batch-wait", "PROJECTOR_BATCH_WAIT", projection.DefaultBatchWait, "while the stream is busy, wait this long after a batch's first event for more (idle: take what is buffered; negative: never wait)")
	notifyInterval := env.Duration(fs, "notify-interval", "NOTIFY_INTERVAL", postgres.DefaultNotifyInterval, "shortest time between two read-your-writes notifications (NOTIFY projection_applied, sent after commits, coalesced)")
	ackWait := env.Duration(fs, "ack-wait", "PROJECTOR_ACK_WAIT", projection.DefaultAckWait, "redeliver an event after this long without an ack")
	maxDeliver := env.Int(fs, "max-deliver", "PROJECTOR_MAX_DELIVER", projection.DefaultMaxDeliver, "dead-letter an event after this many deliveries")
	maxAckPending := env.Int(fs, "max-ack-pending", "PROJECTOR_MAX_ACK_PENDING", 0,
		fmt.Sprintf("each consumer's in-flight window (0: %d × batch size × workers)", projection.DefaultAckPendingBatches))
	tenantShare := env.Int(fs, "tenant-share-percent", "PROJECTOR_TENANT_SHARE_PERCENT", int(projection.DefaultTenantShare*100),
		"most of the in-flight window one tenant's delayed events may hold in this process, in percent (per process: divide the intended share by the number of projector processes); the excess is parked and re-driven")
	replicas := env.Int(fs, "stream-replicas", "STREAM_REPLICAS", stream.DefaultReplicas, "replicas of the JetStream stream and consumers (3 on a cluster)")
	poolSize := env.Int(fs, "db-pool-size", "DB_POOL_SIZE", DefaultProjectorPoolSize, "most PostgreSQL connections of this process")
	logFormat := env.String(fs, "log-format", "LOG_FORMAT", "", "log format: json or text (default: text on a terminal)")
	logLevel := env.String(fs, "log-level", "LOG_LEVEL", "info", "log level: debug, info, warn, error")
	all := fs.Bool("all", false, "dead-letters list: also the resolved ones")
	inboxRetention := env.Duration(fs, "inbox-retention", "INBOX_RETENTION", projection.DefaultInboxRetention,
		"delete a projection's inbox row this long after its event was created (the version gate needs none)")
	inboxPruneInterval := env.Duration(fs, "inbox-prune-interval", "INBOX_PRUNE_INTERVAL", projection.DefaultInboxPruneInterval, "how often expired inbox rows are pruned")
	pprofAddr := env.String(fs, "pprof-addr", "PPROF_ADDR", "", pprofUsage)
	only := env.String(fs, "projections", "PROJECTOR_PROJECTIONS", "", "comma-separated projections this process keeps (default: all)")
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
		// A mistyped subcommand ("rebiuld") must not start a projector.
		return fmt.Errorf("unexpected argument %q\n%s", fs.Arg(0), projectorUsage)
	}
	if *only != "" {
		// Every name, not only one: a typo ("customer_summary") would
		// leave that projection to no process, silently.
		for _, name := range strings.Split(*only, ",") {
			if !slices.ContainsFunc(projections(), func(p projection.Projection) bool { return p.Name() == name }) {
				return fmt.Errorf("-projections: no projection %q (there are %s)\n%s", name, projectionNames(), projectorUsage)
			}
		}
	}
	switch {
	case *batchSize < 1 || *batchSize > 1000:
		return fmt.Errorf("-batch-size must be 1 to 1000, got %d", *batchSize)
	case *replicas < 1 || *replicas > stream.MaxReplicas:
		return fmt.Errorf("-stream-replicas must be 1 to %d, got %d", stream.MaxReplicas, *replicas)
	case *poolSize < 4 || *poolSize > MaxPoolSize:
		return fmt.Errorf("-db-pool-size must be 4 to %d, got %d", MaxPoolSize, *poolSize)
	case *workers < 1 || *workers > 16:
		return fmt.Errorf("-workers must be 1 to 16, got %d", *workers)
	case *maxDeliver < 1 || *maxDeliver > projection.MaxMaxDeliver:
		return fmt.Errorf("-max-deliver must be 1 to %d, got %d", projection.MaxMaxDeliver, *maxDeliver)
	case *ackWait < time.Second || *ackWait > projection.MaxAckWait:
		return fmt.Errorf("-ack-wait must be 1s to %s, got %s", projection.MaxAckWait, *ackWait)
	case *maxAckPending < 0:
		return fmt.Errorf("-max-ack-pending must be at least 0, got %d", *maxAckPending)
	case *tenantShare < 1 || *tenantShare > 100:
		return fmt.Errorf("-tenant-share-percent must be 1 to 100, got %d", *tenantShare)
	case *inboxRetention < projection.MinInboxRetention:
		// 0 too: as a Config field it means the default, which a user
		// who wrote 0 (never prune? prune at once?) did not ask for.
		return fmt.Errorf("-inbox-retention (INBOX_RETENTION) must be at least %s, got %s (the default is %s)",
			projection.MinInboxRetention, *inboxRetention, projection.DefaultInboxRetention)
	case *inboxPruneInterval <= 0:
		return fmt.Errorf("-inbox-prune-interval (INBOX_PRUNE_INTERVAL) must be positive, got %s", *inboxPruneInterval)
	}
	cfg = projectorConfig{
		databaseURL: *databaseURL, natsURL: *natsURL, httpAddr: *httpAddr,
		logFormat: *logFormat, logLevel: *logLevel, poolSize: *poolSize, all: *all, pprofAddr: *pprofAddr,
		runner: projection.Config{BatchSize: *batchSize, Workers: *workers, BatchWait: *batchWait, AckWait: *ackWait, MaxDeliver: *maxDeliver,
			StreamReplicas: *replicas, MaxAckPending: *maxAckPending, TenantShare: float64(*tenantShare) / 100},
		inbox:  projection.InboxPruneConfig{Retention: *inboxRetention, Interval: *inboxPruneInterval},
		notify: postgres.NotifierConfig{Channel: "projection_applied", Interval: *notifyInterval},
	}
	if err := cfg.runner.Validate(); err != nil {
		return err
	}
	if err := CheckLogFlags(cfg.logFormat, cfg.logLevel); err != nil {
		return err
	}
	logger := NewLogger(stdout, cfg.logFormat, cfg.logLevel).With("process", "projector")
	if sub != "" {
		logger = NewLogger(io.Discard, "", "") // subcommands print their result only
	} else {
		if process {
			defer keepMemoryBudget(getenv, ProjectorMemoryBudget, "ProjectorMemoryBudget", logger)()
		}
		servePprof(ctx, cfg.pprofAddr, logger)
	}
	if sub == "" {
		stopTracing, err := startTracing(ctx, env.Tracing("orders-projector"), logger)
		if err != nil {
			return err
		}
		defer stopTracing() // last: after the last batch's spans ended
	}

	pool, err := openDB(ctx, cfg.databaseURL, cfg.poolSize, sub != "", logger)
	if err != nil {
		return err
	}
	defer closeDB(pool, logger)
	runnerOf := func(js jetstream.JetStream, name string) (*projection.Runner, error) {
		for _, p := range projections() {
			if p.Name() == name {
				return projection.NewRunner(pool, js, p, logger, cfg.runner)
			}
		}
		return nil, fmt.Errorf("no projection %q\n%s", name, projectorUsage)
	}

	switch sub {
	case "rebuild":
		if fs.NArg() != 1 {
			return fmt.Errorf("rebuild needs one PROJECTION\n%s", projectorUsage)
		}
		r, err := runnerOf(nil, fs.Arg(0))
		if err != nil {
			return err
		}
		stats, err := r.Rebuild(ctx)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "rebuilt %s from %d events in %s\n", r.Name(), stats.Events, stats.Duration.Round(time.Millisecond))
		if stats.LeftOut > 0 {
			fmt.Fprintf(stdout, "left out %d events it cannot apply (the live projector dead-letters such events); the first, by seq:\n", stats.LeftOut)
			for _, why := range stats.FirstLeftOut {
				fmt.Fprintf(stdout, "  %s\n", why)
			}
		}
		return nil
	case "dead-letters list":
		return listDeadLetters(ctx, pool, cfg.all, stdout)
	case "dead-letters retry", "dead-letters discard":
		id, err := strconv.ParseInt(fs.Arg(0), 10, 64)
		if fs.NArg() != 1 || err != nil {
			return fmt.Errorf("%s needs one dead letter ID\n%s", sub, projectorUsage)
		}
		name, err := projection.DeadLetterProjection(ctx, pool, id)
		if err != nil {
			return err
		}
		if slices.Contains(settle.Consumers, name) {
			return fmt.Errorf("dead letter %d belongs to the payment worker (%s): use `worker %s %d`", id, name, sub, id)
		}
		r, err := runnerOf(nil, name)
		if err != nil {
			return err
		}
		resolve, verb := r.RetryDeadLetter, "retried"
		if sub == "dead-letters discard" {
			resolve, verb = r.DiscardDeadLetter, "discarded"
		}
		applied, err := resolve(ctx, id)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%s dead letter %d of %s; %d events applied\n", verb, id, name, applied)
		return nil
	}

	nc, err := ConnectNATS(cfg.natsURL, "orders-projector", logger)
	if err != nil {
		return err
	}
	defer CloseNATS(nc, logger)
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	// Each projection has its own durable consumer, inbox rows, positions
	// and checkpoint; a process keeps all of them, or those it is told to.
	reg := metrics.NewRegistry()
	cfg.runner.Observers = runnerObservers(reg)
	// Read-your-writes: each batch's orders, after its commit, in one
	// coalesced NOTIFY per interval (never inside the batch transaction).
	notifier, err := postgres.NewNotifier(pool, logger.With("component", "notifier"), cfg.notify)
	if err != nil {
		return fmt.Errorf("-notify-interval: %w", err)
	}
	cfg.runner.Applied = func(name string, reached []projection.Reached) {
		ids := make([]string, len(reached))
		for i, r := range reached {
			ids[i] = r.Order.String() + "@" + strconv.FormatInt(r.Version, 10) // query.Changes reads it
		}
		notifier.NotifyIDs(name, ids)
	}
	var runners []*projection.Runner
	for _, p := range projections() {
		if *only == "" || slices.Contains(strings.Split(*only, ","), p.Name()) {
			r, err := projection.NewRunner(pool, js, p, logger, cfg.runner)
			if err != nil {
				return err
			}
			runners = append(runners, r)
		}
	}
	if len(runners) == 0 {
		return fmt.Errorf("-projections %q names no projection\n%s", *only, projectorUsage)
	}
	if sub == "status" {
		if err := printStatus(ctx, runners, stdout); err != nil && !nc.IsConnected() {
			// A read of the consumer that timed out says nothing of why.
			return fmt.Errorf("NATS at %s not reachable (set NATS_URL or -nats-url; is it running?): %w", redactURL(cfg.natsURL), err)
		} else if err != nil {
			return err
		}
		return nil
	}
	names := make([]string, len(runners))
	for i, r := range runners {
		names[i] = r.Name()
	}
	pruner, err := projection.NewInboxPruner(pool, names, cfg.runner, cfg.inbox, logger)
	if err != nil {
		return fmt.Errorf("-inbox-retention, -inbox-prune-interval: %w", err)
	}
	if err := metrics.Register(reg, projectorMetrics(ctx, runners, pruner, pool, logger)...); err != nil {
		return err
	}
	return serveProjector(ctx, cfg, pool, nc, runners, pruner, notifier, reg, logger)
}

// runnerObservers registers the runners' histograms on reg and returns
// their Config.Observers: each projection gets its own series.
func runnerObservers(reg prometheus.Registerer) func(string) projection.Observers {
	size := prometheus.NewHistogramVec(metrics.HistogramOpts("projection_batch_events",
		"messages per batch a projection applied in one transaction", metrics.BatchBuckets), []string{"projection"})
	took := prometheus.NewHistogramVec(metrics.HistogramOpts("projection_batch_duration_seconds",
		"time a projection took for one batch, from decoding to the last ack", metrics.LatencyBuckets), []string{"projection"})
	delay := prometheus.NewHistogramVec(metrics.HistogramOpts("projection_commit_to_applied_seconds",
		"time from an event's occurred_at (its command's commit) to its batch acked, for events applied", metrics.LatencyBuckets), []string{"projection"})
	reg.MustRegister(size, took, delay)
	return func(name string) projection.Observers {
		return projection.Observers{BatchEvents: size.WithLabelValues(name), BatchSeconds: took.WithLabelValues(name),
			CommitToAppliedSeconds: delay.WithLabelValues(name)}
	}
}

func serveProjector(ctx context.Context, cfg projectorConfig, pool *pgxpool.Pool, nc *nats.Conn, runners []*projection.Runner,
	pruner *projection.InboxPruner, notifier *postgres.Notifier, reg *prometheus.Registry, logger *slog.Logger) error {
	// The notifier outlives the runners, to send the wake-up of their last
	// batches.
	notifyCtx, stopNotifier := context.WithCancel(context.WithoutCancel(ctx))
	notified := make(chan struct{})
	go func() { defer close(notified); notifier.Run(notifyCtx) }()
	defer func() { stopNotifier(); <-notified }()

	// The runners, the inbox pruner and the health server stop together:
	// when ctx ends, or when any of them fails. Each runner finishes and
	// acks its batch in hand.
	g, gctx := errgroup.WithContext(ctx)
	for _, r := range runners {
		g.Go(func() error { return r.Run(gctx) })
	}
	monitor, err := health.NewMonitor(map[string]health.Check{
		"postgres": writablePool(pool),
		"nats":     NATSReady(nc),
	}, logger.With("component", "health"), health.Config{})
	if err != nil {
		return err
	}
	g.Go(func() error { monitor.Run(gctx); return nil })
	g.Go(func() error { pruner.Run(gctx); return nil })
	mux := chi.NewRouter()
	health.Register(mux, monitor)
	mux.Method(http.MethodGet, "/metrics", metrics.Handler(reg))
	g.Go(func() error { return Serve(gctx, cfg.httpAddr, mux, logger, ProjectorShutdownTimeout) })
	var stopping atomic.Int64 // when gctx ended (unix ns)
	stop := context.AfterFunc(gctx, func() { stopping.Store(mono.Now()) })
	defer stop()
	err = g.Wait()
	logger.Info("shutdown: projections stopped (batches in hand committed; their acks go out with the NATS flush)",
		"duration", mono.Since(stopping.Load()), "err", err)
	return err // the deferred CloseNATS flushes the last acks
}

// projectorMetrics are the counters of this process's runners and the lag
// of each projection (shared by all workers, read at scrape time). A scrape
// is cheap whatever the table sizes: the counters and the applied rate are
// in memory, and the lag gauges share one projection.Lag per runner (one
// bounded statement and a few JetStream calls each), never the inbox.
func projectorMetrics(ctx context.Context, runners []*projection.Runner, pruner *projection.InboxPruner, pool *pgxpool.Pool, logger *slog.Logger) []metrics.Metric {
	perRunner := func(name, help string, counter bool, f func(projection.Stats) int64) metrics.Metric {
		return metrics.Metric{Name: name, Help: help, Counter: counter, Labels: []string{"projection"}, Read: func() []metrics.Sample {
			var out []metrics.Sample
			for _, r := range runners {
				out = append(out, metrics.Sample{Labels: map[string]string{"projection": r.Name()}, Value: float64(f(r.Stats()))})
			}
			return out
		}}
	}
	lags := &lagCache{ctx: ctx, runners: runners, logger: logger, maxAge: time.Second}
	lag := func(name, help string, f func(projection.Lag) float64) metrics.Metric {
		return metrics.Metric{Name: name, Help: help, Labels: []string{"projection"}, Read: func() []metrics.Sample {
			var out []metrics.Sample
			for _, l := range lags.get() {
				out = append(out, metrics.Sample{Labels: map[string]string{"projection": l.Projection}, Value: f(l)})
			}
			return out
		}}
	}
	rates := make([]*rateWindow, len(runners))
	for i := range runners {
		rates[i] = newRateWindow(time.Now(), time.Minute)
	}
	applied := metrics.Metric{Name: "projection_applied_per_second", Help: "events this process applied per second over about the last minute (sum the processes for the projection's rate)",
		Labels: []string{"projection"},
		Read: func() []metrics.Sample {
			out := make([]metrics.Sample, len(runners))
			for i, r := range runners {
				out[i] = metrics.Sample{Labels: map[string]string{"projection": r.Name()}, Value: rates[i].observe(time.Now(), r.Stats().Applied)}
			}
			return out
		}}
	return []metrics.Metric{
		perRunner("projection_events_applied_total", "events applied by this process", true, func(s projection.Stats) int64 { return s.Applied }),
		perRunner("projection_duplicates_skipped_total", "redelivered or copied events skipped by the inbox", true, func(s projection.Stats) int64 { return s.Duplicates }),
		perRunner("projection_stale_skipped_total", "events the projection was already past", true, func(s projection.Stats) int64 { return s.Stale }),
		perRunner("projection_gaps_waited_total", "events that arrived before their predecessor and were redelivered later (each counted once, however often it came back)", true, func(s projection.Stats) int64 { return s.Gaps }),
		perRunner("projection_pipelined_batches_total", "batches committed in two round trips (every event new and next in line); the others took the careful way", true, func(s projection.Stats) int64 { return s.Pipelined }),
		perRunner("projection_parked_total", "events parked behind a dead letter", true, func(s projection.Stats) int64 { return s.Parked }),
		perRunner("projection_deferred_total", "delayed events parked past their tenant's share of the in-flight window, re-driven later", true, func(s projection.Stats) int64 { return s.Deferred }),
		perRunner("projection_dead_lettered_total", "events dead-lettered (malformed ones included)", true, func(s projection.Stats) int64 { return s.DeadLettered }),
		applied,
		lag("projection_pending_events", "events in the stream not yet delivered", func(l projection.Lag) float64 { return float64(l.Pending) }),
		lag("projection_ack_pending_events", "events delivered and not yet acked", func(l projection.Lag) float64 { return float64(l.AckPending) }),
		lag("projection_oldest_unapplied_seconds", "age of the oldest event not yet applied", func(l projection.Lag) float64 { return l.OldestUnapplied.Seconds() }),
		lag("projection_dead_letters_open", "open dead letters, each blocking its order until retried or discarded (counted up to 10000)", func(l projection.Lag) float64 { return float64(l.DeadOpen) }),
		lag("projection_dead_letters_parked", "events parked out of the consumer's window, not applied yet: behind an open dead letter, waiting for a predecessor, or deferred past their tenant's share, re-driven from there (counted up to 10000; acked, so in no other lag gauge)", func(l projection.Lag) float64 { return float64(l.DeadParked) }),
		lag("projection_events_deleted_unapplied", "events the stream deleted before this projection applied them (a limit set on the stream): lost to its read model until `projector rebuild` applies them from the outbox; 0 unless the stream has limits", func(l projection.Lag) float64 { return float64(l.DeletedUnapplied) }),
		lag("projection_consumer_missing", "1 while the projection's consumer (or the stream) does not exist: nothing applies the stream, and pending counts from the checkpoint", func(l projection.Lag) float64 {
			if l.ConsumerMissing {
				return 1
			}
			return 0
		}),
		{Name: "projection_inbox_pruned_total", Help: "inbox rows this process deleted past their retention", Counter: true, Read: metrics.One(pruner.Deleted)},
		{Name: "projection_inbox_rows_estimated", Help: "inbox rows of every projection, as the planner estimates them (pg_class)", Read: func() []metrics.Sample {
			ectx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			n, err := projection.InboxRowsEstimate(ectx, pool)
			if err != nil {
				logger.WarnContext(ctx, "read the inbox estimate for /metrics", "err", err)
				return nil
			}
			return []metrics.Sample{{Value: float64(n)}}
		}},
	}
}

// lagCache reads the Lag of every runner at most once per maxAge, so that
// the lag gauges of one scrape share one reading instead of each reading
// every projection again. The slice get returns is never written again:
// callers read it without the lock.
type lagCache struct {
	ctx     context.Context
	runners []*projection.Runner
	logger  *slog.Logger
	maxAge  time.Duration

	mu   sync.Mutex
	at   time.Time
	lags []projection.Lag // of the runners whose reading succeeded
}

func (c *lagCache) get() []projection.Lag {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.at.IsZero() && time.Since(c.at) < c.maxAge {
		return c.lags
	}
	// A new slice each time: an earlier scrape may still be reading the
	// last one outside the lock.
	lags := make([]projection.Lag, 0, len(c.runners))
	for _, r := range c.runners {
		ctx, cancel := context.WithTimeout(c.ctx, 2*time.Second)
		l, err := r.Lag(ctx)
		cancel()
		if err != nil {
			c.logger.WarnContext(c.ctx, "read projection lag for /metrics", "projection", r.Name(), "err", err)
			continue
		}
		lags = append(lags, l)
	}
	c.lags, c.at = lags, time.Now()
	return lags
}

// rateWindow turns a counter sampled at each scrape into a rate over about
// the last window: it keeps the samples of the last window and the newest
// one older than that, and measures from the oldest it keeps.
type rateWindow struct {
	window time.Duration

	mu      sync.Mutex
	samples []rateSample // oldest first
}

type rateSample struct {
	at time.Time
	n  int64
}

// newRateWindow starts a window at start with the counter at zero.
func newRateWindow(start time.Time, window time.Duration) *rateWindow {
	return &rateWindow{window: window, samples: []rateSample{{at: start}}}
}

// observe records that the counter is at n at now and returns its rate per
// second since the base sample.
func (w *rateWindow) observe(now time.Time, n int64) float64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.samples = append(w.samples, rateSample{at: now, n: n})
	for len(w.samples) > 2 && now.Sub(w.samples[1].at) >= w.window {
		w.samples = w.samples[1:]
	}
	base := w.samples[0]
	dt := now.Sub(base.at).Seconds()
	if dt <= 0 {
		return 0
	}
	return float64(n-base.n) / dt
}

// printStatus prints each projection's lag. A projection whose consumer is
// missing says so (CONSUMER missing, and a note under the table): its
// PENDING then counts from the checkpoint, and nothing applies it.
func printStatus(ctx context.Context, runners []*projection.Runner, stdout io.Writer) error {
	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "PROJECTION\tPENDING\tACK PENDING\tOLDEST UNAPPLIED\tCHECKPOINT\tDEAD LETTERS\tPARKED\tCONSUMER")
	var missing, deleted []string
	for _, r := range runners {
		l, err := r.Lag(ctx)
		if err != nil {
			return err
		}
		oldest := "-"
		if l.OldestUnapplied > 0 {
			oldest = l.OldestUnapplied.Round(time.Millisecond).String()
		}
		consumer := "ok"
		if l.ConsumerMissing {
			consumer = "missing"
			missing = append(missing, l.Projection)
		}
		if l.DeletedUnapplied > 0 {
			deleted = append(deleted, fmt.Sprintf("%s (%d)", l.Projection, l.DeletedUnapplied))
		}
		fmt.Fprintf(w, "%s\t%d\t%d\t%s\t%d\t%d\t%d\t%s\n", l.Projection, l.Pending, l.AckPending, oldest,
			l.Checkpoint, l.DeadOpen, l.DeadParked, consumer)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if len(deleted) > 0 {
		fmt.Fprintf(stdout, "\nevents the stream deleted before they were applied (a limit set on the stream): %s.\n"+
			"They are missing from the read model: rebuild it from the outbox (projector rebuild NAME).\n", strings.Join(deleted, ", "))
	}
	if len(missing) > 0 {
		_, err := fmt.Fprintf(stdout, "\nno consumer (so nothing applies the stream) for: %s. A running projector creates it again within seconds;\n"+
			"if it stays missing, start the projector. PENDING counts the stream's events past the checkpoint.\n", strings.Join(missing, ", "))
		return err
	}
	return nil
}

func listDeadLetters(ctx context.Context, pool *pgxpool.Pool, all bool, stdout io.Writer) error {
	dls, err := projection.ListDeadLetters(ctx, pool, settle.Consumers, all)
	if err != nil {
		return err
	}
	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "ID\tPROJECTION\tSTATUS\tORDER\tVERSION\tSTREAM SEQ\tDELIVERIES\tSINCE\tERROR")
	for _, d := range dls {
		order, version := "-", "-"
		if d.AggregateID != nil {
			order = d.AggregateID.String()
		}
		if d.AggregateVersion != nil {
			version = strconv.FormatInt(*d.AggregateVersion, 10)
		}
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\n", d.ID, d.Projection, d.Status, order, version, d.StreamSeq,
			d.Deliveries, d.CreatedAt.UTC().Format(time.RFC3339), d.Error)
	}
	return w.Flush()
}
