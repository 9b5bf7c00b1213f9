// Package postgres opens the connection pool, migrates the schema and runs
// transactions. Every package that writes runs its work through InTx.
package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/acme/orders/migrations"
)

// SQLSTATE codes the service reacts to.
const (
	CodeUniqueViolation      = "23505"
	CodeSerializationFailure = "40001"
	CodeDeadlockDetected     = "40P01"
	CodeLockNotAvailable     = "55P03" // lock_timeout expired
	CodeQueryCanceled        = "57014"
)

// Open connects a pool of at most maxConns connections to url (unless the
// url sets pool_max_conns) and waits until the server answers: for up to
// wait, or, with wait 0, until ctx ends, logging every failed attempt. A
// service started while its database restarts thus comes up by itself.
// Statements time out after a minute unless the url sets another
// statement_timeout, so a stalled database cannot hold a request (or a
// shutdown) forever.
//
// Repeated statements keep PostgreSQL's default plan caching (plan_cache_mode
// auto: a prepared statement gets a generic plan after five custom ones if
// that plan is no worse), unless the url sets plan_cache_mode. Planning every
// execution anew (force_custom_plan, set here until #12) cost the create
// path a third of its throughput (pgbench of the create SQL at 64 clients:
// 1,230–1,320 tx/s against 1,810–2,010 with auto). The relay's claim and
// mark, whose generic plans flipped to scans of the whole outbox while it
// grew from empty, plan per statement on the relay's own connection (see
// outbox.LeaseSettingsSQL).
func Open(ctx context.Context, url string, maxConns int32, wait time.Duration, logger *slog.Logger) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse database url: %w", err)
	}
	if maxConns > 0 && !strings.Contains(url, "pool_max_conns") {
		cfg.MaxConns = maxConns
	}
	if _, ok := cfg.ConnConfig.RuntimeParams["statement_timeout"]; !ok {
		cfg.ConnConfig.RuntimeParams["statement_timeout"] = "60s"
	}
	cfg.AfterConnect = func(_ context.Context, conn *pgx.Conn) error {
		RegisterUUID(conn.TypeMap())
		return nil
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open database pool: %w", err)
	}
	var deadline time.Time
	if wait > 0 {
		deadline = time.Now().Add(wait)
	}
	for backoff := 250 * time.Millisecond; ; backoff = min(2*backoff, 5*time.Second) {
		pingCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err = pool.Ping(pingCtx)
		cancel()
		if err == nil {
			return pool, nil
		}
		if ctx.Err() != nil || !deadline.IsZero() && time.Now().After(deadline) {
			pool.Close()
			return nil, fmt.Errorf("database at %s:%d not reachable: %w", cfg.ConnConfig.Host, cfg.ConnConfig.Port, err)
		}
		logger.WarnContext(ctx, "database not reachable yet; retrying", "host", cfg.ConnConfig.Host, "port", cfg.ConnConfig.Port, "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
	}
}

// Migrate applies the schema migrations on one connection of pool. It is safe
// to run from several processes at once.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("acquire connection for migrations: %w", err)
	}
	defer conn.Release()
	return migrations.Apply(ctx, conn.Conn())
}

// Beginner starts transactions; *pgxpool.Pool and *pgx.Conn are such.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// DB runs statements and starts transactions; *pgxpool.Pool is one.
// SendBatch sends a batch in one round trip; outside a transaction its
// statements are one transaction, committed when the batch ends.
type DB interface {
	Beginner
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

var _ DB = (*pgxpool.Pool)(nil)

// InTx runs fn in a transaction and commits it if fn returns nil. It retries
// the whole transaction (a few times, with a short backoff) when PostgreSQL
// aborts it for a deadlock or a serialization failure, so fn must be safe to
// run again: it must keep no state outside tx from an earlier attempt. The
// rollback runs even when ctx is cancelled, so locks are always released.
func InTx(ctx context.Context, db Beginner, fn func(tx pgx.Tx) error) error {
	const attempts = 5
	for attempt := 1; ; attempt++ {
		err := inTxOnce(ctx, db, fn)
		if err == nil || attempt == attempts || !Retryable(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(time.Duration(attempt*attempt) * 5 * time.Millisecond):
		}
	}
}

func inTxOnce(ctx context.Context, db Beginner, fn func(tx pgx.Tx) error) error {
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	if err := fn(tx); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// Retryable reports whether err is a deadlock or serialization failure, after
// which the same transaction may simply run again.
func Retryable(err error) bool {
	return HasCode(err, CodeSerializationFailure) || HasCode(err, CodeDeadlockDetected)
}

// Unavailable reports whether err says the database cannot serve now, so
// that a request failed for want of it, not for a bug of ours: a
// connection that could not be made, or that broke under a statement (a
// network error, the connection closed, its stream cut short), or the
// server refusing work while it stops, starts or is full (SQLSTATE class 08,
// 57P01 to 57P03, 53300), or that cannot do it now: a statement or lock
// wait that timed out (57014, 55P03: a table locked by DDL, a server that
// stalls), a read-only server (25006: a standby after a failover), a full
// disk or memory (53100, 53200). Context errors are not, except in a
// connection attempt: a deadline of our own or a client that left says
// nothing of the database.
func Unavailable(err error) bool {
	var connect *pgconn.ConnectError
	if errors.As(err, &connect) {
		// Whatever the server said, or that it said nothing in time
		// (connect_timeout: a host that is black-holed or failing over);
		// a password refused is no bug of a request either.
		return true
	}
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "57P01", "57P02", "57P03", "53300", // admin or crash shutdown, starting up, too many connections
			"57014", CodeLockNotAvailable, // statement or lock wait timed out
			"25006",          // read-only transaction: a standby
			"53100", "53200": // disk full, out of memory
			return true
		}
		return strings.HasPrefix(pgErr.Code, "08")
	}
	var netErr net.Error
	return errors.As(err, &netErr) || errors.Is(err, pgconn.ErrConnClosed) || errors.Is(err, io.ErrUnexpectedEOF)
}

// HasCode reports whether err is (or wraps) a PostgreSQL error with SQLSTATE code.
func HasCode(err error, code string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == code
}
