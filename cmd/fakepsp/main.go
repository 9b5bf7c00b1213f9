// Command fakepsp is the local payment provider: it speaks the subset of
// Stripe's API that the payment package uses (PaymentIntents, Refunds,
// search by metadata), keeps its ledger in its own PostgreSQL database
// (created if absent, with its own schema) and injects faults on request.
// See package fakepsp for the endpoints.
//
//	fakepsp [-addr 127.0.0.1:12111] [-database-url URL] [-database fakepsp] [fault flags]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/acme/orders/fakepsp"
	"github.com/acme/orders/internal/app"
	"github.com/acme/orders/postgres"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args, os.Getenv, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "fakepsp:", err)
		os.Exit(1)
	}
}

// DefaultAddr is where the fake listens (stripe-mock's port).
const DefaultAddr = "127.0.0.1:12111"

// poolSize is the fake's PostgreSQL connections: a charge holds one for its
// whole keyed transaction (six round trips), and at 10 the fake capped the
// bench's pay → paid near 200/s while the worker settles 32 at once.
const poolSize = 32

// run is the whole program; tests call it with their own arguments,
// environment and output. It returns when ctx ends, after a graceful
// shutdown.
func run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	fs := flag.NewFlagSet("fakepsp", flag.ContinueOnError)
	env := app.NewEnv(getenv)
	addr := env.String(fs, "addr", "FAKEPSP_ADDR", DefaultAddr, "address to serve on (keep it on loopback: /_admin and /_ledger need no key)")
	serverURL := env.String(fs, "database-url", "DATABASE_URL", app.DefaultDatabaseURL, "PostgreSQL server to keep the ledger on (any database of it; -database is created there if absent)")
	dbName := env.String(fs, "database", "FAKEPSP_DATABASE", "fakepsp", "name of the fake's own database")
	keyTTL := env.Duration(fs, "key-ttl", "FAKEPSP_KEY_TTL", fakepsp.DefaultKeyTTL, "how long an idempotency key is kept")
	latency := env.Duration(fs, "latency", "FAKEPSP_LATENCY", 0, "fault: delay every /v1 answer by this long")
	errorRate := env.String(fs, "error-rate", "FAKEPSP_ERROR_RATE", "0", "fault: share (0 to 1) of /v1 requests answered 500 before executing")
	loseRate := env.String(fs, "lose-response-rate", "FAKEPSP_LOSE_RESPONSE_RATE", "0", "fault: share (0 to 1) of POSTs whose answer is lost after the outcome committed")
	loseMode := env.String(fs, "lose-mode", "FAKEPSP_LOSE_MODE", fakepsp.LoseClose, "how an answer is lost: close (drop the connection) or stall (hold it until the client gives up)")
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
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	faults := fakepsp.Faults{LatencyMS: int(*latency / time.Millisecond), LoseMode: *loseMode}
	var err error
	if faults.ErrorRate, err = strconv.ParseFloat(*errorRate, 64); err != nil {
		return fmt.Errorf("-error-rate: %w", err)
	}
	if faults.LoseResponseRate, err = strconv.ParseFloat(*loseRate, 64); err != nil {
		return fmt.Errorf("-lose-response-rate: %w", err)
	}
	if err := faults.Validate(); err != nil {
		return err
	}
	if err := app.CheckLogFlags(*logFormat, *logLevel); err != nil {
		return err
	}
	logger := app.NewLogger(stdout, *logFormat, *logLevel)

	dbURL, err := fakepsp.EnsureDatabase(ctx, *serverURL, *dbName)
	if err != nil {
		return err
	}
	pool, err := postgres.Open(ctx, dbURL, poolSize, 0, logger)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := fakepsp.Migrate(ctx, pool); err != nil {
		return err
	}
	srv, err := fakepsp.New(fakepsp.Config{Pool: pool, KeyTTL: *keyTTL, Faults: faults, Logger: logger})
	if err != nil {
		return err
	}
	logger.Info("fake payment provider", "database", *dbName, "faults", srv.Faults())

	// Expired keys are ignored anyway; purging them bounds the table.
	purgeCtx, stopPurge := context.WithCancel(ctx)
	var purging sync.WaitGroup
	purging.Go(func() {
		for t := time.NewTicker(time.Hour); ; {
			if n, err := srv.PurgeExpiredKeys(purgeCtx); err != nil && purgeCtx.Err() == nil {
				logger.Warn("purge expired idempotency keys", "err", err)
			} else if n > 0 {
				logger.Info("purged expired idempotency keys", "count", n)
			}
			select {
			case <-purgeCtx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
	})
	err = app.Serve(ctx, *addr, srv, logger, 5*time.Second)
	stopPurge()
	purging.Wait()
	return err
}
