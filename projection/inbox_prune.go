package projection

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/acme/orders/stream"
)

// Inbox retention defaults; docs/architecture.md ("Inbox retention") says
// why a pruned row cannot let a duplicate through.
const (
	// DefaultInboxRetention is how long an event's inbox row is kept,
	// counted from the event's creation (the time in its UUIDv7 id).
	DefaultInboxRetention = 7 * 24 * time.Hour
	// MinInboxRetention is the shortest retention accepted: far past the
	// stream's duplicate window and the default redelivery horizon.
	MinInboxRetention = time.Hour
	// DefaultInboxPruneInterval is how often the pruner sweeps.
	DefaultInboxPruneInterval = 5 * time.Minute
	// DefaultInboxPruneBatch is the most rows one pruning statement
	// deletes (each statement is its own short transaction).
	DefaultInboxPruneBatch = 1000
	// MaxInboxPruneBatch bounds Batch, so no statement holds many locks or
	// writes much WAL at once.
	MaxInboxPruneBatch = 10_000
)

// InboxPruneConfig tunes an InboxPruner. Zero values take the defaults.
type InboxPruneConfig struct {
	// Retention: inbox rows of events created longer ago than this are
	// deleted; default DefaultInboxRetention, at least MinInboxRetention,
	// the stream's duplicate window and the runner's RedeliveryHorizon.
	Retention time.Duration
	// Interval between sweeps; default DefaultInboxPruneInterval.
	Interval time.Duration
	// Batch is the most rows one statement deletes; default
	// DefaultInboxPruneBatch, at most MaxInboxPruneBatch.
	Batch int
}

// RedeliveryHorizon is the longest a runner with cfg keeps redelivering an
// event after its first delivery before it dead-letters it: MaxDeliver
// deliveries, each after at most AckWait (a worker that died) plus the
// longest backoff (a minute). Redeliveries beyond it (a database outage that
// keeps the dead letter from being written, a consumer replay) are judged by
// the version gate alone, which needs no inbox row.
func RedeliveryHorizon(cfg Config) time.Duration {
	cfg = cfg.withDefaults()
	return time.Duration(cfg.MaxDeliver) * (cfg.AckWait + time.Minute)
}

// InboxPruner deletes the inbox rows of the events of some projections once
// they are older than the retention, in small batches. Any number of
// pruners (one per projector process) may run at once: each statement
// skips the rows another one has locked.
type InboxPruner struct {
	db      *pgxpool.Pool
	names   []string
	cfg     InboxPruneConfig
	logger  *slog.Logger
	deleted atomic.Int64
}

// NewInboxPruner returns a pruner of the inbox rows of the projections
// names, kept by runners configured with runner. It returns an error naming
// the field if cfg is invalid, e.g. a retention that does not outlast the
// duplicate window or the redelivery horizon.
func NewInboxPruner(db *pgxpool.Pool, names []string, runner Config, cfg InboxPruneConfig, logger *slog.Logger) (*InboxPruner, error) {
	if cfg.Retention == 0 {
		cfg.Retention = DefaultInboxRetention
	}
	if cfg.Interval == 0 {
		cfg.Interval = DefaultInboxPruneInterval
	}
	if cfg.Batch == 0 {
		cfg.Batch = DefaultInboxPruneBatch
	}
	floor := max(MinInboxRetention, stream.DuplicateWindow, RedeliveryHorizon(runner))
	switch {
	case cfg.Retention < floor:
		return nil, fmt.Errorf("inbox prune config: Retention %s is shorter than %s (the minimum %s, the stream's duplicate window %s and the redelivery horizon %s)",
			cfg.Retention, floor, MinInboxRetention, stream.DuplicateWindow, RedeliveryHorizon(runner))
	case cfg.Interval < 0:
		return nil, fmt.Errorf("inbox prune config: Interval %s is negative", cfg.Interval)
	case cfg.Batch < 1 || cfg.Batch > MaxInboxPruneBatch:
		return nil, fmt.Errorf("inbox prune config: Batch %d is not between 1 and %d", cfg.Batch, MaxInboxPruneBatch)
	case len(names) == 0:
		return nil, fmt.Errorf("inbox prune config: no projection to prune")
	}
	return &InboxPruner{db: db, names: names, cfg: cfg, logger: logger}, nil
}

// Deleted counts the rows this pruner has deleted since it was made.
func (p *InboxPruner) Deleted() int64 { return p.deleted.Load() }

// Run sweeps at once and then every Interval until ctx ends. A failed sweep
// is logged and tried again at the next interval.
func (p *InboxPruner) Run(ctx context.Context) {
	t := time.NewTicker(p.cfg.Interval)
	defer t.Stop()
	for {
		if stats, err := p.Prune(ctx); err != nil {
			if ctx.Err() == nil {
				p.logger.WarnContext(ctx, "prune the inbox", "err", err, "deleted", stats.Deleted)
			}
		} else if stats.Deleted > 0 || stats.DeadLetters > 0 {
			p.logger.InfoContext(ctx, "inbox pruned", "deleted", stats.Deleted, "statements", stats.Statements,
				"dead_letters_deleted", stats.DeadLetters)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// PruneStats says what one sweep did.
type PruneStats struct {
	Deleted    int64 // inbox rows deleted
	Statements int   // DELETE statements of inbox rows run, each of at most Batch rows
	// DeadLetters counts the re-driven ('retried') dead letters deleted.
	DeadLetters int64
}

// inboxPruneSQL deletes, in one statement (its own transaction), up to $4
// inbox rows of projection $1 whose event id is above $2 (the last one the
// sweep deleted) and below the UUIDv7 floor of "now minus $3 milliseconds"
// by the database's clock (at the earliest 1970: a retention longer than
// the time since then keeps every row; without the floor to_hex of a
// negative number wrapped to a floor far in the future, and every row was
// deleted): event ids are UUIDv7, so the primary key
// (projection, event_id) orders them by creation time and gives the range,
// with no index of its own. Walking the key from the last deleted id, each
// statement reads only its own rows, never the dead ones before them.
// SKIP LOCKED: rows another pruner (or a rebuild's swap) holds are left for
// the next sweep.
const inboxPruneSQL = `
WITH doomed AS (
    SELECT event_id FROM public.inbox
    WHERE projection = $1 AND event_id > $2
      AND event_id < (lpad(to_hex(greatest((extract(epoch FROM now()) * 1000)::bigint - $3, 0)), 12, '0') || '70008000000000000000')::uuid
    ORDER BY event_id
    LIMIT $4
    FOR UPDATE SKIP LOCKED)
DELETE FROM public.inbox i USING doomed d
WHERE i.projection = $1 AND i.event_id = d.event_id
RETURNING i.event_id`

// deadLettersPruneSQL deletes, in one statement, up to $3 dead letters of
// projection $1 that a re-drive applied ('retried') more than $2
// milliseconds ago by the database's clock, oldest first, by the index
// dead_letters_retried. Open, parked and discarded rows stay: a rebuild
// reads the discarded ones.
const deadLettersPruneSQL = `
WITH doomed AS (
    SELECT id FROM public.dead_letters
    WHERE projection = $1 AND status = 'retried'
      AND resolved_at < now() - $2::bigint * interval '1 millisecond'
    ORDER BY resolved_at
    LIMIT $3
    FOR UPDATE SKIP LOCKED)
DELETE FROM public.dead_letters d USING doomed
WHERE d.id = doomed.id`

// Prune deletes the expired inbox rows of every projection of the pruner,
// a statement of at most Batch rows at a time, until a statement comes
// back short; and, the same way, the projection's dead letters re-driven
// longer ago than the retention. It is safe to call concurrently with the
// runners, rebuilds and other pruners.
func (p *InboxPruner) Prune(ctx context.Context) (PruneStats, error) {
	var stats PruneStats
	for _, name := range p.names {
		for {
			tag, err := p.db.Exec(ctx, deadLettersPruneSQL, name, p.cfg.Retention.Milliseconds(), p.cfg.Batch)
			if err != nil {
				return stats, fmt.Errorf("prune re-driven dead letters of %s: %w", name, err)
			}
			stats.DeadLetters += tag.RowsAffected()
			if tag.RowsAffected() < int64(p.cfg.Batch) {
				break
			}
		}
		after := uuid.Nil
		for {
			rows, _ := p.db.Query(ctx, inboxPruneSQL, name, after, p.cfg.Retention.Milliseconds(), p.cfg.Batch)
			ids, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID]) // a failed Query reports its error here
			if err != nil {
				return stats, fmt.Errorf("prune inbox of %s: %w", name, err)
			}
			stats.Statements++
			stats.Deleted += int64(len(ids))
			p.deleted.Add(int64(len(ids)))
			for _, id := range ids {
				if bytes.Compare(id[:], after[:]) > 0 {
					after = id
				}
			}
			if len(ids) < p.cfg.Batch {
				break
			}
		}
	}
	return stats, nil
}

// InboxRowsEstimate is the planner's estimate of the inbox's rows (all
// projections), from pg_class: one catalog lookup, whatever the table's
// size. It is 0 before the table was first analysed.
func InboxRowsEstimate(ctx context.Context, db interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}) (int64, error) {
	var n int64
	if err := db.QueryRow(ctx, `SELECT greatest(reltuples, 0)::bigint FROM pg_class WHERE oid = 'public.inbox'::regclass`).Scan(&n); err != nil {
		return 0, fmt.Errorf("estimate inbox rows: %w", err)
	}
	return n, nil
}
