package projection

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/acme/orders/postgres"
)

// redriveClause selects (for storedEvents) the parked events of the
// projection whose next attempt is due (deferred past their tenant's share,
// waiting for a parked predecessor, or left behind by a retry or discard
// because their own predecessor was still missing) and that no open dead
// letter of an earlier version of their order holds back, oldest due
// first. It reads them by the index dead_letters_parked_due, so a batch
// costs what it takes, however many parked rows wait (rows parked behind
// an open dead letter have no next attempt and are not in the range). Rows
// another runner is re-driving are skipped.
const redriveClause = `projection = $1 AND status = 'parked' AND next_attempt_at <= now()
  AND NOT EXISTS (SELECT 1 FROM dead_letters o
                  WHERE o.projection = dead_letters.projection AND o.aggregate_id = dead_letters.aggregate_id
                    AND o.tenant_id = dead_letters.tenant_id
                    AND o.status = 'open' AND o.aggregate_version < dead_letters.aggregate_version)
ORDER BY next_attempt_at
LIMIT $2
FOR UPDATE SKIP LOCKED`

// orphanReleaseTicks is how many re-drive intervals go between two runs of
// releaseOrphansSQL (5 minutes by default). The statement reads every row
// parked behind an open dead letter (2.2 s for 200,000 of them on a busy
// two-core machine), and what it finds comes of a rare race.
const orphanReleaseTicks = 300

// releaseOrphansSQL makes due (up to 1,000 of) the rows of projection $1
// parked with no next attempt that no open dead letter of an earlier
// version holds back: one parked while an operator's retry or discard
// resolved the dead letter it was parked behind, whose wake of the order's
// parked successors ran before the row was there, or one parked behind a
// dead letter that could not be written. Nothing else would ever take it.
// A row released wrongly (an open one committed after this statement's
// snapshot) is harmless: the re-drive does not select it while that open
// one stands, and its resolution takes it as any parked row.
const releaseOrphansSQL = `
UPDATE dead_letters SET next_attempt_at = now()
WHERE id IN (
    SELECT p.id FROM dead_letters p
    WHERE p.projection = $1 AND p.status = 'parked' AND p.next_attempt_at IS NULL
      AND NOT EXISTS (SELECT 1 FROM dead_letters o
                      WHERE o.projection = p.projection AND o.aggregate_id = p.aggregate_id
                        AND o.tenant_id = p.tenant_id
                        AND o.status = 'open' AND o.aggregate_version < p.aggregate_version)
    LIMIT 1000
    FOR UPDATE SKIP LOCKED)`

// redriveUpdateSQL records one re-driven event's result; a parked one is
// due again $5 microseconds from now (NULL: not on a clock).
const redriveUpdateSQL = `
UPDATE dead_letters
SET status = $2, deliveries = $3, error = $4,
    next_attempt_at = CASE WHEN $2 = 'parked' THEN now() + $5::bigint * interval '1 microsecond' END,
    resolved_at = CASE WHEN $2 = 'retried' THEN now() END
WHERE id = $1`

// redriveWakeSQL makes due now the parked events of the orders $2 that a
// re-drive applied events of (their successors, waiting for them), except
// the rows $3 of that re-drive itself.
const redriveWakeSQL = `
UPDATE dead_letters SET next_attempt_at = now()
WHERE projection = $1 AND aggregate_id = ANY($2) AND status = 'parked' AND next_attempt_at > now()
  AND id <> ALL($3)`

// redriveLoop re-drives due parked events every RedriveInterval until ctx
// ends, a batch at a time while batches come back full.
func (r *Runner) redriveLoop(ctx context.Context) {
	t := time.NewTicker(r.cfg.RedriveInterval)
	defer t.Stop()
	var lastRelease time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if time.Since(lastRelease) >= orphanReleaseTicks*r.cfg.RedriveInterval {
			lastRelease = time.Now()
			if tag, err := r.db.Exec(ctx, releaseOrphansSQL, r.proj.Name()); err != nil {
				if ctx.Err() == nil {
					r.logger.ErrorContext(ctx, "release parked events whose dead letter was resolved; will try again", "err", err)
				}
			} else if n := tag.RowsAffected(); n > 0 {
				r.logger.WarnContext(ctx, "released parked events whose dead letter was resolved while they were parked", "events", n)
			}
		}
		for ctx.Err() == nil {
			n, err := r.redrive(ctx)
			if err != nil {
				if ctx.Err() == nil {
					r.logger.ErrorContext(ctx, "re-drive parked events; will try again", "err", err)
				}
				break
			}
			if n < r.cfg.BatchSize {
				break
			}
		}
	}
}

// redrive takes up to BatchSize due parked events (redriveClause) and, in
// one transaction, applies them through the same gate as the stream (inbox,
// positions: each exactly once, in version order) and records each result:
// applied, duplicate or stale → retried; a permanent failure, or deliveries
// used up → open dead letter; behind an open dead letter → stays parked
// behind it; otherwise parked again with one more delivery, to be tried
// after the backoff; a row that is no event at all → open. It returns how
// many events it took.
func (r *Runner) redrive(ctx context.Context) (int, error) {
	var taken int
	var counts [outcomeCount]int64 // of the attempt that committed (InTx may retry)
	var events []*event
	err := postgres.InTx(ctx, r.db, func(tx pgx.Tx) (err error) {
		counts = [outcomeCount]int64{}
		events, err = storedEvents(ctx, tx, redriveClause, r.proj.Name(), r.cfg.BatchSize)
		if err != nil {
			return err
		}
		taken = len(events)
		if taken == 0 {
			return nil
		}
		if err := r.applyStored(ctx, tx, events); err != nil {
			return err
		}
		return r.recordRedriven(ctx, tx, events, &counts)
	})
	if err != nil {
		return 0, fmt.Errorf("re-drive parked events: %w", err)
	}
	r.advanceCheckpoint(events)
	for o, n := range counts {
		r.stats[o].Add(n)
	}
	return taken, nil
}

// applyStored applies events in tx, all in one savepoint or, if that fails,
// each in a savepoint of its own, setting each failed event's err. It
// returns an error only when tx itself is unusable.
func (r *Runner) applyStored(ctx context.Context, tx pgx.Tx, events []*event) error {
	err, txErr := inSavepoint(ctx, tx, func(sp pgx.Tx) error { return r.commitTx(ctx, sp, events) })
	if txErr != nil || err == nil {
		return txErr
	}
	for _, e := range events {
		if e.undecodable {
			continue
		}
		err, txErr := inSavepoint(ctx, tx, func(sp pgx.Tx) error { return r.commitTx(ctx, sp, []*event{e}) })
		if txErr != nil {
			return txErr
		}
		if err != nil {
			e.outcome, e.err, e.permanent = 0, err, Permanent(err)
		}
	}
	return nil
}

// inSavepoint runs fn in a savepoint of tx: fnErr is fn's error (the
// savepoint is rolled back), txErr an error of tx itself.
func inSavepoint(ctx context.Context, tx pgx.Tx, fn func(pgx.Tx) error) (fnErr, txErr error) {
	sp, err := tx.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("begin savepoint: %w", err)
	}
	if fnErr = fn(sp); fnErr != nil {
		if err := sp.Rollback(ctx); err != nil {
			return fnErr, fmt.Errorf("roll back to savepoint after %v: %w", fnErr, err)
		}
		return fnErr, nil
	}
	if err := sp.Commit(ctx); err != nil {
		return nil, fmt.Errorf("release savepoint: %w", err)
	}
	return nil, nil
}

// recordRedriven writes each re-driven event's result to its dead_letters
// row, in tx, in (aggregate, version) order.
func (r *Runner) recordRedriven(ctx context.Context, tx pgx.Tx, events []*event, counts *[outcomeCount]int64) error {
	held, err := r.heldBackInTx(ctx, tx, events)
	if err != nil {
		return err
	}
	opened := map[orderKey]bool{} // orders dead-lettered in this pass
	var applied []uuid.UUID       // aggregates with events applied in this pass
	b := &pgx.Batch{}
	for _, e := range events {
		deliveries := e.deliveries + 1
		final := deliveries >= uint64(r.cfg.MaxDeliver)
		status, reason, retryIn := statusParked, "", r.retryDelay(deliveries)
		switch {
		case e.undecodable: // no event: no retry can apply it
			status, reason, deliveries = statusOpen, fmt.Sprintf("re-driven but not an event (only discard resolves it): %v", e.err), e.deliveries
		case e.err != nil && e.permanent:
			status, reason = statusOpen, fmt.Sprintf("permanent failure (no retry can fix it): %v", e.err)
		case e.err != nil && final:
			status, reason = statusOpen, fmt.Sprintf("failed %d times; last error: %v", deliveries, e.err)
		case e.err != nil:
			reason = fmt.Sprintf("re-driven; failed %d times; last error: %v", deliveries, e.err)
		case e.outcome == Gap && (opened[keyOf(e.env)] || held[e.env.ID] == reasonBehindOpen):
			reason, deliveries, retryIn = reasonBehindOpen, e.deliveries, noAttempt
		case e.outcome == Gap && held[e.env.ID] != "":
			// The re-drive that applies the predecessor makes it due; the
			// backoff is a fallback.
			reason, deliveries, retryIn = held[e.env.ID], e.deliveries, r.retryDelay(e.deliveries)
		case e.outcome == Gap && final && e.parkedFor < r.predecessorHorizon():
			// Its predecessor may still be redelivered: keep waiting.
			reason, deliveries, retryIn = waitingFor(e), e.deliveries, r.gapDelay(e.deliveries)
		case e.outcome == Gap && final:
			status, reason = statusOpen, fmt.Sprintf("version %d never became applicable (version %d missing) in %d deliveries",
				e.env.AggregateVersion, e.env.AggregateVersion-1, deliveries)
		case e.outcome == Gap:
			reason = fmt.Sprintf("re-driven; version %d waits for version %d", e.env.AggregateVersion, e.env.AggregateVersion-1)
		default: // applied, duplicate or stale
			status, reason, deliveries = statusRetried, "re-driven and "+e.outcome.String(), e.deliveries
			counts[e.outcome]++
			if e.outcome == Applied {
				applied = append(applied, e.env.AggregateID)
			}
		}
		if status == statusOpen && !e.undecodable {
			opened[keyOf(e.env)] = true // its later events in this batch stay parked behind it
		}
		if status == statusOpen {
			counts[DeadLettered]++
			r.logger.ErrorContext(ctx, "re-driven event dead-lettered", "event_id", e.env.ID,
				"aggregate_id", e.env.AggregateID, "aggregate_version", e.env.AggregateVersion, "reason", reason)
		}
		b.Queue(redriveUpdateSQL, e.deadID, status, int64(deliveries), postgres.Text(reason), attemptIn(retryIn))
	}
	if len(applied) > 0 {
		b.Queue(redriveWakeSQL, r.proj.Name(), applied, deadIDs(events))
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("record re-driven events: %w", err)
	}
	return nil
}

// redriveHeldBackSQL finds, of the gap events $2 (aggregates $3, versions
// $4, tenants $5), those that an unresolved dead letter of their order (and
// tenant) holds back: an open or parked earlier version (a later one holds
// nothing back: it waits for this one). It returns each such event's id
// and whether an open one holds it.
const redriveHeldBackSQL = `
SELECT g.event_id,
       EXISTS (SELECT 1 FROM dead_letters d
               WHERE d.projection = $1 AND d.aggregate_id = g.aggregate_id AND d.tenant_id = g.tenant_id AND d.status = 'open'
                 AND d.aggregate_version < g.version)
FROM unnest($2::uuid[], $3::uuid[], $4::bigint[], $5::text[]) AS g(event_id, aggregate_id, version, tenant_id)
WHERE EXISTS (SELECT 1 FROM dead_letters d
              WHERE d.projection = $1 AND d.aggregate_id = g.aggregate_id AND d.tenant_id = g.tenant_id
                AND d.status IN ('open', 'parked') AND d.aggregate_version < g.version)`

// heldBackInTx maps each re-driven gap event of events that an unresolved
// dead letter of its order holds back to the reason it stays parked. Such
// an event keeps its deliveries: it waits for its predecessor, it has not
// failed.
func (r *Runner) heldBackInTx(ctx context.Context, tx pgx.Tx, events []*event) (map[uuid.UUID]string, error) {
	var ids, aggs []uuid.UUID
	var versions []int64
	var tenants []string
	for _, e := range events {
		if e.err == nil && e.outcome == Gap {
			ids, aggs, versions = append(ids, e.env.ID), append(aggs, e.env.AggregateID), append(versions, e.env.AggregateVersion)
			tenants = append(tenants, e.env.TenantID)
		}
	}
	held := map[uuid.UUID]string{}
	if len(ids) == 0 {
		return held, nil
	}
	rows, _ := tx.Query(ctx, redriveHeldBackSQL, r.proj.Name(), ids, aggs, versions, tenants)
	var id uuid.UUID
	var open bool
	if _, err := pgx.ForEachRow(rows, []any{&id, &open}, func() error {
		held[id] = reasonBehindParked
		if open {
			held[id] = reasonBehindOpen
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("find re-driven events held back by dead letters: %w", err)
	}
	return held, nil
}
