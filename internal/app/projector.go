package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/acme/orders/health"
	"github.com/acme/orders/postgres"
	"github.com/acme/orders/projection"
)

// RunProjector is the whole projector program (cmd/projector): it keeps
// every read model and serves /healthz and /readyz. It returns when ctx ends,
// after each projection has finished and acked its batch in hand. Tests call
// it with their own arguments, environment and output.
func RunProjector(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	env := NewEnv(getenv)
	fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
	databaseURL := env.String(fs, "database-url", "DATABASE_URL", DefaultDatabaseURL, "PostgreSQL connection URL")
	natsURL := env.String(fs, "nats-url", "NATS_URL", DefaultNATSURL, "NATS server URL")
	httpAddr := env.String(fs, "http-addr", "PROJECTOR_HTTP_ADDR", ":8081", "address to serve /healthz and /readyz on")
	batchSize := env.Int(fs, "batch-size", "PROJECTOR_BATCH_SIZE", 100, "most events applied in one transaction")
	replicas := env.Int(fs, "stream-replicas", "STREAM_REPLICAS", 1, "replicas of the JetStream stream (3 on a cluster)")
	poolSize := env.Int(fs, "db-pool-size", "DB_POOL_SIZE", 10, "most PostgreSQL connections of this process")
	logFormat := env.String(fs, "log-format", "LOG_FORMAT", "", "log format: json or text (default: text on a terminal)")
	logLevel := env.String(fs, "log-level", "LOG_LEVEL", "info", "log level: debug, info, warn, error")
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if err := env.Err(); err != nil {
		return err
	}
	if *batchSize < 1 || *batchSize > 1000 || *replicas < 1 || *replicas > 5 || *poolSize < 4 {
		return fmt.Errorf("-batch-size must be 1 to 1000, -stream-replicas 1 to 5, -db-pool-size at least 4")
	}
	logger := NewLogger(stdout, *logFormat, *logLevel).With("process", "projector")

	pool, err := postgres.Open(ctx, *databaseURL, int32(*poolSize))
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := postgres.Migrate(ctx, pool); err != nil {
		return err
	}
	nc, err := ConnectNATS(*natsURL, "orders-projector", logger)
	if err != nil {
		return err
	}
	defer CloseNATS(nc, logger)
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}

	// Each projection has its own durable consumer, inbox rows, positions
	// and checkpoint.
	var runners []*projection.Runner
	for _, p := range []projection.Projection{projection.OrderViews{}, projection.CustomerSummaries{}, projection.DailySales{}} {
		runners = append(runners, projection.NewRunner(pool, js, p, logger, projection.Config{BatchSize: *batchSize, StreamReplicas: *replicas}))
	}
	// The runners and the health server stop together: when ctx ends, or when
	// any of them fails. Each runner finishes and acks its batch in hand.
	g, gctx := errgroup.WithContext(ctx)
	for _, r := range runners {
		g.Go(func() error { return r.Run(gctx) })
	}
	mux := chi.NewRouter()
	health.Register(mux, map[string]health.Check{
		"postgres": func(ctx context.Context) error { return pool.Ping(ctx) },
		"nats":     NATSReady(nc),
	})
	g.Go(func() error { return Serve(gctx, *httpAddr, mux, logger, 5*time.Second) })
	return g.Wait() // the deferred CloseNATS flushes the last acks
}
