package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/acme/orders/command"
	"github.com/acme/orders/health"
	"github.com/acme/orders/httpapi"
	"github.com/acme/orders/outbox"
	"github.com/acme/orders/postgres"
	"github.com/acme/orders/query"
)

type config struct {
	databaseURL, natsURL, httpAddr string
	relay                          bool
	keyTTL, keyWait                time.Duration
	logFormat, logLevel            string
}

func parseConfig(args []string, env Env) (config, error) {
	var c config
	fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
	databaseURL := env.String(fs, "database-url", "DATABASE_URL", DefaultDatabaseURL, "PostgreSQL connection URL")
	natsURL := env.String(fs, "nats-url", "NATS_URL", DefaultNATSURL, "NATS server URL")
	httpAddr := env.String(fs, "http-addr", "HTTP_ADDR", ":8080", "address to serve HTTP on")
	relay := env.Bool(fs, "relay", "RELAY", true, "run the outbox relay in this process")
	keyTTL := env.Duration(fs, "idempotency-ttl", "IDEMPOTENCY_TTL", 24*time.Hour, "how long an Idempotency-Key is remembered")
	keyWait := env.Duration(fs, "idempotency-wait", "IDEMPOTENCY_WAIT", 5*time.Second, "how long a request waits for an in-flight request with its key")
	logFormat := env.String(fs, "log-format", "LOG_FORMAT", "", "log format: json or text (default: text on a terminal)")
	logLevel := env.String(fs, "log-level", "LOG_LEVEL", "info", "log level: debug, info, warn, error")
	if err := fs.Parse(args[1:]); err != nil {
		return c, err
	}
	return config{
		databaseURL: *databaseURL, natsURL: *natsURL, httpAddr: *httpAddr, relay: *relay,
		keyTTL: *keyTTL, keyWait: *keyWait, logFormat: *logFormat, logLevel: *logLevel,
	}, nil
}

// RunAPI is the whole api program (cmd/api): it serves the REST API and,
// unless -relay=false, relays the outbox. With args[1] == "migrate" it only
// applies the migrations. It returns when ctx ends, after a graceful
// shutdown. Tests call it with their own arguments, environment and output.
func RunAPI(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	sub := ""
	if len(args) > 1 && args[1] == "migrate" {
		sub, args = args[1], append([]string{args[0]}, args[2:]...)
	}
	cfg, err := parseConfig(args, getenv)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	logger := NewLogger(stdout, cfg.logFormat, cfg.logLevel).With("process", "api")

	pool, err := postgres.Open(ctx, cfg.databaseURL, 0)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := postgres.Migrate(ctx, pool); err != nil {
		return err
	}
	if sub == "migrate" {
		logger.Info("migrations applied")
		return nil
	}

	nc, err := ConnectNATS(cfg.natsURL, "orders-api", logger)
	if err != nil {
		return err
	}
	defer nc.Close()

	var wg sync.WaitGroup
	bgCtx, stopBackground := context.WithCancel(context.WithoutCancel(ctx))
	defer func() {
		stopBackground()
		wg.Wait()
		if err := nc.Drain(); err != nil {
			logger.Warn("drain nats", "err", err)
		}
	}()
	if cfg.relay {
		js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(1024), jetstream.WithPublishAsyncTimeout(10*time.Second))
		if err != nil {
			return fmt.Errorf("jetstream: %w", err)
		}
		relay := outbox.NewRelay(pool, js, logger.With("component", "relay"), outbox.Config{})
		wg.Go(func() { relay.Run(bgCtx) })
	}

	handler := httpapi.New(httpapi.Deps{
		Logger:      logger,
		Idempotency: command.NewIdempotency(pool, cfg.keyTTL),
		CreateOrder: command.NewCreateOrderHandler(),
		GetOrder:    query.NewGetOrderHandler(pool),
		KeyWait:     cfg.keyWait,
		Checks: map[string]health.Check{
			"postgres": pingPool(pool),
			"nats":     NATSReady(nc),
		},
	})
	// Serve returns once in-flight requests are done; the deferred stop of
	// the relay and the connections runs after that.
	return Serve(ctx, cfg.httpAddr, handler, logger, 10*time.Second)
}

func pingPool(pool *pgxpool.Pool) health.Check {
	return func(ctx context.Context) error { return pool.Ping(ctx) }
}
