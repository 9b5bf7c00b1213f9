package projection

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/acme/orders/postgres"
)

// RebuildStats says what a rebuild did.
type RebuildStats struct {
	Events  int // events applied to the new tables
	LeftOut int // events left out: they cannot be applied (logged)
	// FirstLeftOut names the first ten of them, in seq order: "seq N: why".
	FirstLeftOut []string
	Duration     time.Duration // from start to swap
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
//
// One rebuild of a projection runs at a time, across processes: a second
// one started while it runs returns ErrRebuildRunning at once. (Two at once
// shared the shadow schema; the second's fresh tables took the first's
// next batch, and the second walked it again: the swap counted it twice.)
func (r *Runner) Rebuild(ctx context.Context) (RebuildStats, error) {
	conn, unlock, err := r.lockRebuild(ctx)
	if err != nil {
		return RebuildStats{}, err
	}
	defer unlock()
	return r.rebuild(ctx, conn)
}

// rebuildLockClass is the first key of the session advisory lock a
// rebuild holds for its whole run (the second is hashtext of the
// projection's name, as for AdvisoryClass).
const rebuildLockClass = AdvisoryClass + 1

// ErrRebuildRunning is returned by Rebuild while another rebuild of the
// same projection runs (in this process or another).
var ErrRebuildRunning = errors.New("a rebuild of this projection is already running")

// lockRebuild takes the projection's rebuild lock, held until unlock (a
// session lock: the rebuild is many transactions), on the connection the
// rebuild then works on, so it needs one connection whatever the pool's
// size.
func (r *Runner) lockRebuild(ctx context.Context) (conn *pgxpool.Conn, unlock func(), err error) {
	name := r.proj.Name()
	conn, unlock, got, err := postgres.TrySessionLock(ctx, r.db, "$1, hashtext($2)", rebuildLockClass, name)
	switch {
	case err != nil:
		return nil, nil, fmt.Errorf("rebuild %s: %w", name, err)
	case !got:
		return nil, nil, fmt.Errorf("rebuild %s: %w; wait for it to end (its shadow tables are in schema rebuild_%s)", name, ErrRebuildRunning, name)
	}
	return conn, unlock, nil
}

func (r *Runner) rebuild(ctx context.Context, db postgres.DB) (RebuildStats, error) {
	start := time.Now()
	name := r.proj.Name()
	schema := pgx.Identifier{"rebuild_" + name}.Sanitize()
	tables := append(append([]string{}, r.proj.Tables()...), bookkeeping...)

	if _, err := db.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+schema); err != nil {
		return RebuildStats{}, fmt.Errorf("create rebuild schema: %w", err)
	}
	defer db.Exec(context.WithoutCancel(ctx), "DROP SCHEMA IF EXISTS "+schema+" CASCADE") //nolint:errcheck
	for _, t := range tables {
		shadow, live := schema+"."+pgx.Identifier{t}.Sanitize(), "public."+pgx.Identifier{t}.Sanitize()
		if _, err := db.Exec(ctx, fmt.Sprintf("DROP TABLE IF EXISTS %s; CREATE TABLE %s (LIKE %s INCLUDING ALL)", shadow, shadow, live)); err != nil {
			return RebuildStats{}, fmt.Errorf("create shadow of %s: %w", t, err)
		}
	}
	inShadow := "SET LOCAL search_path TO " + schema + ", public"

	// Phase 1: the log so far, in seq order, in batches, without holding
	// anything up. Each batch reads on from where the last one ended, so
	// the log is read once. An event whose transaction took a lower seq and
	// committed after the walk passed it is left behind here; phase 2
	// finds it.
	var stats RebuildStats
	discarded, err := r.discardedEvents(ctx, db)
	if err != nil {
		return stats, fmt.Errorf("rebuild %s: %w", name, err)
	}
	skipped := map[int64]leftOut{} // by seq: the events left out
	var after int64
	for {
		var got, applied int
		var last int64
		var left map[int64]leftOut
		err := postgres.InTx(ctx, db, func(tx pgx.Tx) error {
			left = maps.Clone(skipped)
			if _, err := tx.Exec(ctx, inShadow); err != nil {
				return err
			}
			rows, _ := tx.Query(ctx, rebuildWalkSQL, after, rebuildBatch)
			log, err := pgx.CollectRows(rows, pgx.RowToStructByPos[loggedEvent])
			if err != nil {
				return fmt.Errorf("read the event log: %w", err)
			}
			if got = len(log); got > 0 {
				last = log[got-1].Seq
			}
			applied, err = r.applyLogged(ctx, tx, log, discarded, left)
			return err
		})
		if err != nil {
			return stats, fmt.Errorf("rebuild %s: %w", name, err)
		}
		stats.Events, skipped = stats.Events+applied, left
		if got < rebuildBatch {
			break
		}
		after = last
	}

	// Phase 2: catch up and swap, with the live runners held back. Every
	// event committed before the lock was granted is visible here, and one
	// anti-join of the whole log against the shadow inbox finds those the
	// walk did not apply: the late ones, and what arrived since.
	var caughtUp int
	var left map[int64]leftOut
	err = postgres.InTx(ctx, db, func(tx pgx.Tx) error {
		caughtUp, left = 0, maps.Clone(skipped)
		// Without statistics the planner takes the shadow inbox for
		// empty, and its plan compares every event with every row.
		if _, err := tx.Exec(ctx, "ANALYZE "+schema+".inbox"); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1, hashtext($2))`, AdvisoryClass, name); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, inShadow); err != nil {
			return err
		}
		// A discard made while the walk ran: the walk may have applied
		// what the live projection now skips for good.
		now, err := r.discardedEvents(ctx, tx)
		if err != nil {
			return err
		}
		var late []uuid.UUID
		for id := range now {
			if !discarded[id] {
				late = append(late, id)
			}
		}
		if len(late) > 0 {
			var applied int
			if err := tx.QueryRow(ctx, `SELECT count(*) FROM inbox WHERE projection = $1 AND event_id = ANY($2)`, name, late).Scan(&applied); err != nil {
				return fmt.Errorf("look for events discarded during the rebuild: %w", err)
			}
			if applied > 0 {
				return fmt.Errorf("%w: %d events were discarded as dead letters while it ran, after it applied them; run it again", ErrRebuildWouldLose, applied)
			}
		}
		discarded := now
		rows, _ := tx.Query(ctx, rebuildMissingSQL, name)
		missing, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			return fmt.Errorf("find the events not applied: %w", err)
		}
		slices.Sort(missing)
		for chunk := range slices.Chunk(missing, rebuildBatch) {
			rows, _ := tx.Query(ctx, rebuildReadSQL, chunk)
			log, err := pgx.CollectRows(rows, pgx.RowToStructByPos[loggedEvent])
			if err != nil {
				return fmt.Errorf("read the event log: %w", err)
			}
			n, err := r.applyLogged(ctx, tx, log, discarded, left)
			if err != nil {
				return err
			}
			caughtUp += n
		}
		if err := r.checkNothingLost(ctx, tx, schema, left); err != nil {
			return err
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
		_, err = tx.Exec(ctx, NotifyAppliedSQL, name)
		return err
	})
	stats.Duration = time.Since(start)
	if err != nil {
		return stats, fmt.Errorf("swap rebuilt %s: %w", name, err)
	}
	stats.Events += caughtUp
	skipped = left
	stats.LeftOut = len(skipped)
	if stats.LeftOut > 0 {
		seqs := slices.Sorted(maps.Keys(skipped))
		first := seqs[:min(len(seqs), 10)]
		why := make([]string, len(first))
		for i, seq := range first {
			why[i] = fmt.Sprintf("seq %d: %s", seq, skipped[seq].reason)
		}
		stats.FirstLeftOut = why
		r.logger.WarnContext(ctx, "rebuild left out events it could not apply", "projection", name, "left_out", stats.LeftOut, "first", why)
	}
	r.logger.InfoContext(ctx, "projection rebuilt", "events", stats.Events, "left_out", stats.LeftOut, "duration", stats.Duration)
	return stats, nil
}

// rebuildBatch is how many events a rebuild applies per transaction of
// its walk, and per statement of its catch-up.
const rebuildBatch = 1000

const (
	// rebuildWalkSQL reads the event log on from seq $1, in seq order.
	rebuildWalkSQL = `SELECT seq, payload::text FROM public.outbox WHERE seq > $1 ORDER BY seq LIMIT $2`
	// rebuildMissingSQL finds the events of the log the inbox in scope (the
	// shadow's) does not have.
	rebuildMissingSQL = `
SELECT o.seq FROM public.outbox o
WHERE NOT EXISTS (SELECT 1 FROM inbox i WHERE i.projection = $1 AND i.event_id = o.id)`
	// rebuildReadSQL reads the events $1 of the log, in seq order.
	rebuildReadSQL = `SELECT seq, payload::text FROM public.outbox WHERE seq = ANY($1) ORDER BY seq`
)

// loggedEvent is an event as the event log (the outbox) holds it.
type loggedEvent struct {
	Seq     int64
	Payload string
}

// leftOut is an event a rebuild left out: its order (uuid.Nil if the
// envelope does not decode) and why.
type leftOut struct {
	order  uuid.UUID
	reason string
}

// applyLogged applies, in tx, the events of log (in seq order) that the
// projection can apply, and returns how many it recorded (applied, or
// already there). An event discarded as a dead letter of the live
// projection is skipped as its discard skipped it (the position moves past
// it, nothing is applied). One it cannot apply is left out and noted in
// skipped, as the live runner would dead-letter it: an envelope that does
// not decode, data its projection refuses, or an event whose predecessor
// the log does not hold (pruned by relay retention, or itself left out);
// checkNothingLost then refuses the swap if the live read model has gone
// past it. The batch goes in one savepoint; if that fails (or holds a
// discarded event), each event goes in one of its own, so one bad event
// leaves out only itself and its order's later events.
func (r *Runner) applyLogged(ctx context.Context, tx pgx.Tx, log []loggedEvent, discarded map[uuid.UUID]bool, skipped map[int64]leftOut) (int, error) {
	if len(log) == 0 {
		return 0, nil
	}
	events := make([]*event, len(log))
	bySeq := make(map[*event]int64, len(log))
	for i, l := range log {
		events[i] = &event{data: []byte(l.Payload), deliveries: 1}
		bySeq[events[i]] = l.Seq
	}
	events = decode(events)
	apart := slices.ContainsFunc(events, func(e *event) bool { return !e.undecodable && discarded[e.env.ID] })
	if !apart {
		err, txErr := inSavepoint(ctx, tx, func(sp pgx.Tx) error { return r.commitTx(ctx, sp, events) })
		if txErr != nil {
			return 0, txErr
		}
		apart = err != nil
	}
	if apart {
		for _, e := range events {
			if e.undecodable {
				continue
			}
			if discarded[e.env.ID] {
				if err := r.skipDiscarded(ctx, tx, e); err != nil {
					return 0, err
				}
				continue
			}
			err, txErr := inSavepoint(ctx, tx, func(sp pgx.Tx) error { return r.commitTx(ctx, sp, []*event{e}) })
			switch {
			case txErr != nil:
				return 0, txErr
			case err != nil && !Permanent(err):
				return 0, err // a deadlock, a lost connection, …: not the event's fault
			case err != nil:
				e.outcome, e.err = Malformed, err
			}
		}
	}
	recorded := 0
	for _, e := range events {
		switch {
		case e.undecodable:
			skipped[bySeq[e]] = leftOut{reason: e.err.Error()}
		case e.outcome == Malformed:
			skipped[bySeq[e]] = leftOut{e.env.AggregateID, fmt.Sprintf("%s v%d of order %s: %v", e.env.Type, e.env.AggregateVersion, e.env.AggregateID, e.err)}
		case e.outcome == Gap:
			skipped[bySeq[e]] = leftOut{e.env.AggregateID, fmt.Sprintf("%s v%d of order %s: its predecessor is not in the log, or was left out", e.env.Type, e.env.AggregateVersion, e.env.AggregateID)}
		case discarded[e.env.ID]:
			delete(skipped, bySeq[e]) // skipped as discarded: not counted as recorded
		default:
			delete(skipped, bySeq[e]) // a late event applied on a second look
			recorded++
		}
	}
	return recorded, nil
}

// discardedEvents are the events discarded as dead letters of this
// projection (`projector dead-letters discard`): skipped for good, so a
// rebuild skips them too.
func (r *Runner) discardedEvents(ctx context.Context, db postgres.DB) (map[uuid.UUID]bool, error) {
	rows, _ := db.Query(ctx, `SELECT event_id FROM public.dead_letters WHERE projection = $1 AND status = 'discarded' AND event_id IS NOT NULL`, r.proj.Name())
	ids, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		return nil, fmt.Errorf("read discarded dead letters: %w", err)
	}
	discarded := make(map[uuid.UUID]bool, len(ids))
	for _, id := range ids {
		discarded[id] = true
	}
	return discarded, nil
}

// skipDiscarded moves the rebuilt position of e's order past e, as its
// discard did live, if the order is at the version before it; otherwise e
// is a gap (its predecessor left out) and left out with it.
func (r *Runner) skipDiscarded(ctx context.Context, tx pgx.Tx, e *event) error {
	var pos int64
	var owner string
	if err := tx.QueryRow(ctx, positionForUpdateSQL, r.proj.Name(), e.env.AggregateID).Scan(&pos, &owner); err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("read the rebuilt position of order %s: %w", e.env.AggregateID, err)
	}
	switch v := e.env.AggregateVersion; {
	case v <= pos:
		e.outcome = Stale
	case v == pos+1:
		if err := advanceOne(ctx, tx, r.proj.Name(), e.env, pos); err != nil {
			return fmt.Errorf("skip discarded event %s: %w", e.env.ID, err)
		}
		e.outcome = Stale
	default:
		e.outcome = Gap
	}
	return nil
}

// checkNothingLost refuses the swap (an error naming them) if, for an order
// with an event left out, the live read model has gone further than the
// rebuilt one: the live projection applied what the rebuild could not, and
// the swap would replace its rows with ones that lack it, for good (the
// merged position and inbox keep the events from ever applying again). An
// order the live projection holds back at the same event (a dead letter)
// is rebuilt as it is live.
func (r *Runner) checkNothingLost(ctx context.Context, tx pgx.Tx, schema string, left map[int64]leftOut) error {
	var orders []uuid.UUID
	for _, l := range left {
		if l.order != uuid.Nil {
			orders = append(orders, l.order)
		}
	}
	if len(orders) == 0 {
		return nil
	}
	rows, _ := tx.Query(ctx, `
SELECT l.aggregate_id, l.version, coalesce(s.version, 0)
FROM public.projection_positions l
LEFT JOIN `+schema+`.projection_positions s ON s.projection = l.projection AND s.aggregate_id = l.aggregate_id
WHERE l.projection = $1 AND l.aggregate_id = ANY($2) AND l.version > coalesce(s.version, 0)
ORDER BY l.aggregate_id LIMIT 10`, r.proj.Name(), orders)
	var lost []string
	var order uuid.UUID
	var live, rebuilt int64
	if _, err := pgx.ForEachRow(rows, []any{&order, &live, &rebuilt}, func() error {
		lost = append(lost, fmt.Sprintf("order %s at version %d live, %d rebuilt", order, live, rebuilt))
		return nil
	}); err != nil {
		return fmt.Errorf("compare the rebuilt positions with the live ones: %w", err)
	}
	if len(lost) == 0 {
		return nil
	}
	var why []string
	for _, seq := range slices.Sorted(maps.Keys(left)) {
		if len(why) == 10 {
			break
		}
		why = append(why, fmt.Sprintf("seq %d: %s", seq, left[seq].reason))
	}
	return fmt.Errorf("%w: it would lose what the live read model applied (%s); events left out: %s",
		ErrRebuildWouldLose, strings.Join(lost, "; "), strings.Join(why, "; "))
}

// ErrRebuildWouldLose is returned by Rebuild when the events it cannot
// apply are ones the live projection went past: it swaps nothing.
var ErrRebuildWouldLose = errors.New("rebuild refused")
