package projection

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/acme/orders/postgres"
)

// RebuildStats says what a rebuild did.
type RebuildStats struct {
	Events   int           // events applied to the new tables
	Duration time.Duration // from start to swap
}

// bookkeeping are the runner's own tables, rebuilt along with the
// projection's (dead_letters starts empty in a rebuild).
var bookkeeping = []string{"projection_positions", "inbox", "projection_checkpoints", "dead_letters"}

// Rebuild builds the projection anew from the event log (the retained
// outbox rows) into shadow tables in a schema of its own, while the live
// tables keep serving and the live runners keep applying; then, in one
// transaction that briefly holds back the live runners of this projection,
// it applies what was added meanwhile and swaps the new rows in. The
// consumer needs no reset: events it delivers after the swap that the
// rebuild already applied are in the new inbox and are skipped.
//
// The result is exact only if the outbox still holds every event (no
// retention pruning); see the README. The positions of orders the retained
// log no longer holds are kept (their read-model rows are not), so events
// of theirs delivered again stay stale.
func (r *Runner) Rebuild(ctx context.Context) (RebuildStats, error) {
	start := time.Now()
	name := r.proj.Name()
	schema := pgx.Identifier{"rebuild_" + name}.Sanitize()
	tables := append(append([]string{}, r.proj.Tables()...), bookkeeping...)

	if _, err := r.db.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+schema); err != nil {
		return RebuildStats{}, fmt.Errorf("create rebuild schema: %w", err)
	}
	defer r.db.Exec(context.WithoutCancel(ctx), "DROP SCHEMA IF EXISTS "+schema+" CASCADE") //nolint:errcheck
	for _, t := range tables {
		shadow, live := schema+"."+pgx.Identifier{t}.Sanitize(), "public."+pgx.Identifier{t}.Sanitize()
		if _, err := r.db.Exec(ctx, fmt.Sprintf("DROP TABLE IF EXISTS %s; CREATE TABLE %s (LIKE %s INCLUDING ALL)", shadow, shadow, live)); err != nil {
			return RebuildStats{}, fmt.Errorf("create shadow of %s: %w", t, err)
		}
	}
	inShadow := "SET LOCAL search_path TO " + schema + ", public"

	// Phase 1: the log so far, in batches, without holding anything up.
	var stats RebuildStats
	for {
		var n int
		err := postgres.InTx(ctx, r.db, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, inShadow); err != nil {
				return err
			}
			var err error
			n, err = r.applyUnapplied(ctx, tx, 1000)
			return err
		})
		if err != nil {
			return stats, fmt.Errorf("rebuild %s: %w", name, err)
		}
		stats.Events += n
		if n < 1000 {
			break
		}
	}

	// Phase 2: catch up and swap, with the live runners held back.
	err := postgres.InTx(ctx, r.db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1, hashtext($2))`, AdvisoryClass, name); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, inShadow); err != nil {
			return err
		}
		for {
			n, err := r.applyUnapplied(ctx, tx, 1000)
			if err != nil {
				return err
			}
			stats.Events += n
			if n < 1000 {
				break
			}
		}
		if _, err := tx.Exec(ctx, "SET LOCAL search_path TO DEFAULT"); err != nil {
			return err
		}
		for _, t := range r.proj.Tables() {
			q := pgx.Identifier{t}.Sanitize()
			if _, err := tx.Exec(ctx, fmt.Sprintf("DELETE FROM public.%s; INSERT INTO public.%s SELECT * FROM %s.%s", q, q, schema, q)); err != nil {
				return fmt.Errorf("swap %s: %w", t, err)
			}
		}
		// Positions are merged, never dropped or lowered: an order whose
		// events are all gone from the retained log (relay retention) is
		// not in the shadow, and its live position is what keeps a late
		// redelivery of its events stale once their inbox rows are pruned.
		for _, q := range []string{
			"INSERT INTO public.projection_positions SELECT * FROM " + schema + `.projection_positions
ON CONFLICT (projection, aggregate_id) DO UPDATE SET version = GREATEST(projection_positions.version, EXCLUDED.version)`,
			"INSERT INTO public.inbox SELECT * FROM " + schema + ".inbox ON CONFLICT DO NOTHING",
		} {
			if _, err := tx.Exec(ctx, q); err != nil {
				return fmt.Errorf("swap bookkeeping: %w", err)
			}
		}
		_, err := tx.Exec(ctx, NotifyAppliedSQL, name)
		return err
	})
	stats.Duration = time.Since(start)
	if err != nil {
		return stats, fmt.Errorf("swap rebuilt %s: %w", name, err)
	}
	r.logger.InfoContext(ctx, "projection rebuilt", "events", stats.Events, "duration", stats.Duration)
	return stats, nil
}

// applyUnapplied applies, in tx, up to limit outbox events that the inbox
// in scope (the shadow's, during a rebuild) does not have yet, in outbox
// order, and returns how many it took.
func (r *Runner) applyUnapplied(ctx context.Context, tx pgx.Tx, limit int) (int, error) {
	rows, _ := tx.Query(ctx, `
SELECT o.seq, o.payload::text FROM public.outbox o
WHERE NOT EXISTS (SELECT 1 FROM inbox i WHERE i.projection = $1 AND i.event_id = o.id)
ORDER BY o.seq LIMIT $2`, r.proj.Name(), limit)
	var events []*event
	var seq int64
	var payload string
	if _, err := pgx.ForEachRow(rows, []any{&seq, &payload}, func() error {
		events = append(events, &event{data: []byte(payload), deliveries: 1})
		return nil
	}); err != nil {
		return 0, fmt.Errorf("read the event log: %w", err)
	}
	if len(events) == 0 {
		return 0, nil
	}
	if err := r.commitTx(ctx, tx, decode(events)); err != nil {
		return 0, err
	}
	for _, e := range events {
		if e.undecodable || e.outcome == Gap {
			return 0, fmt.Errorf("event log entry %s cannot be applied in order (%s)", e.env.ID, e.outcome)
		}
	}
	return len(events), nil
}
