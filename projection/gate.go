package projection

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/acme/orders/domain"
	"github.com/acme/orders/postgres"
)

// AdvisoryClass is the first key of the projector's advisory locks: every
// batch holds the projection's lock shared, a rebuild's swap holds it
// exclusively.
const AdvisoryClass = 0x0b7b0c5

const (
	// SharedLockSQL takes the projection's lock shared. It is a statement
	// of its own, sent before PositionsLockSQL in the same round trip: so
	// every batch takes it (a lock joined into the positions query would be
	// skipped when no position row matches, as for a batch of new orders),
	// and the positions are read with a snapshot taken after it is granted
	// (so after any rebuild swap that held it).
	SharedLockSQL = `SELECT pg_advisory_xact_lock_shared($1, hashtext($2))`

	// PositionsLockSQL locks the position of every aggregate of the batch
	// ($2, sorted, so that concurrent batches lock in the same order), and
	// reads it with the tenant that owns the aggregate. One
	// index probe per aggregate, whatever the table's statistics say: with
	// "aggregate_id = ANY($2)" a table not analysed yet (a new deployment's
	// first minute) got a plan that read every position of the projection,
	// 15 ms a batch at 27k positions.
	PositionsLockSQL = `
SELECT p.aggregate_id, p.version, p.tenant_id
FROM unnest($2::uuid[]) AS a(id)
CROSS JOIN LATERAL (
    SELECT aggregate_id, version, tenant_id FROM projection_positions
    WHERE projection = $1 AND aggregate_id = a.id
    FOR UPDATE) AS p`

	// PositionsAdvanceSQL records the versions ($4) a batch applied to its
	// orders ($3, of tenants $2), each from the position the batch found
	// and holds locked ($5; 0: none yet), and returns how many it wrote.
	// An order with no position gets one only if none was made since the
	// batch looked: the batch locked every position that existed, so only
	// such a new one can be elsewhere, made by another batch that applied
	// the same order's first version (two different events both claiming
	// version 1: a forged stream). Then the count is short and the batch
	// must not commit; without the check both applied. Both halves are
	// inserts, probing the primary key per order, whatever the statistics.
	PositionsAdvanceSQL = `
WITH p AS (
    SELECT * FROM unnest($2::text[], $3::uuid[], $4::bigint[], $5::bigint[]) AS p(tenant_id, aggregate_id, version, before)
), moved AS (
    INSERT INTO projection_positions (projection, tenant_id, aggregate_id, version)
    SELECT $1, tenant_id, aggregate_id, version FROM p WHERE before > 0
    ORDER BY aggregate_id
    ON CONFLICT (projection, aggregate_id) DO UPDATE SET version = EXCLUDED.version
    RETURNING 1
), added AS (
    INSERT INTO projection_positions (projection, tenant_id, aggregate_id, version)
    SELECT $1, tenant_id, aggregate_id, version FROM p WHERE before = 0
    ORDER BY aggregate_id
    ON CONFLICT (projection, aggregate_id) DO NOTHING
    RETURNING 1
)
SELECT (SELECT count(*) FROM moved) + (SELECT count(*) FROM added)`

	// InboxInsertSQL records a batch's events, returning those not seen before.
	InboxInsertSQL = `
INSERT INTO inbox (projection, event_id, tenant_id, aggregate_id, aggregate_version, stream_seq)
SELECT $1, event_id, tenant_id, aggregate_id, aggregate_version, stream_seq
FROM unnest($2::uuid[], $3::text[], $4::uuid[], $5::bigint[], $6::bigint[])
     AS i(event_id, tenant_id, aggregate_id, aggregate_version, stream_seq)
ON CONFLICT (projection, event_id) DO NOTHING
RETURNING event_id`

	// Orders of the batch ($2 tenants, $3 aggregates) with an unresolved
	// dead letter of their tenant: the lowest open version and the lowest
	// parked version (0: none). Their later events are parked behind it,
	// not applied; an earlier one is not held back by it (it may be the
	// very predecessor the later one waits for). (Another tenant's dead
	// letter naming the same order, a forged event, holds nothing back.)
	deadAggregatesSQL = `
SELECT d.tenant_id, d.aggregate_id,
       coalesce(min(d.aggregate_version) FILTER (WHERE d.status = 'open'), 0),
       coalesce(min(d.aggregate_version) FILTER (WHERE d.status = 'parked'), 0)
FROM unnest($2::text[], $3::uuid[]) AS g(tenant_id, aggregate_id)
JOIN dead_letters d ON d.projection = $1 AND d.aggregate_id = g.aggregate_id AND d.tenant_id = g.tenant_id
WHERE d.status IN ('open', 'parked')
GROUP BY d.tenant_id, d.aggregate_id`

	// CheckpointAdvanceSQL moves the projection's stream checkpoint forward:
	// an autocommit statement of the runner's checkpoint loop, never a
	// statement of a batch (one row per projection, locked by every batch
	// that wrote it until its commit, made each projection's workers
	// commit one at a time: 0.5 ms of lock wait per paid order).
	CheckpointAdvanceSQL = `
INSERT INTO projection_checkpoints (projection, stream_seq, updated_at)
VALUES ($1, $2, now())
ON CONFLICT (projection) DO UPDATE
SET stream_seq = GREATEST(projection_checkpoints.stream_seq, EXCLUDED.stream_seq), updated_at = now()`

	// NotifyAppliedSQL wakes every reader waiting to read its own writes
	// of projection $1 (query.Changes): a rebuild's swap sends it. Batches
	// do not: Config.Applied names their orders after the commit.
	NotifyAppliedSQL = `SELECT pg_notify('projection_applied', $1)`
)

// queue checks each event's envelope (domain.Envelope.CheckValues: no
// projection consumes an event of a newer schema, or one whose time JSON
// cannot hold, whether or not it uses the event's type: each is
// dead-lettered for its order, to be retried after the upgrade) and queues
// the projection's writes of envs to b.
func (r *Runner) queue(b *pgx.Batch, envs []domain.Envelope) error {
	for _, env := range envs {
		if err := env.CheckValues(); err != nil {
			return err
		}
	}
	return r.proj.Queue(b, envs)
}

// commit applies events in one transaction of their own and, after it
// committed, reports the orders it applied (and their versions) to
// Config.Applied. The common batch (every event new and next in line)
// commits in two round trips (commitPipelined); any other is applied the
// careful way (commitTx), which sorts out each event.
func (r *Runner) commit(ctx context.Context, events []*event) error {
	if r.commitPipelined(ctx, events) {
		r.pipelined.Add(1)
	} else if err := r.commitCarefully(ctx, events); err != nil {
		return err
	}
	r.advanceCheckpoint(events)
	r.reportApplied(events)
	return nil
}

// commitCarefully applies events the careful way (commitTx) in a
// transaction of its own, again if a position moved under it: the second
// time the batch finds the position that moved, and sorts its events by it.
func (r *Runner) commitCarefully(ctx context.Context, events []*event) error {
	var err error
	for range 3 {
		err = postgres.InTx(ctx, r.db, func(tx pgx.Tx) error { return r.commitTx(ctx, tx, events) })
		if !errors.Is(err, errPositionMoved) {
			return err
		}
	}
	return err
}

// errPositionMoved is commitTx's error when a position moved between its
// lock and its advance (see PositionsAdvanceSQL): roll back and sort the
// batch again.
var errPositionMoved = errors.New("an order's position moved under the batch")

// advanceCheckpoint raises the checkpoint the checkpoint loop writes to the
// highest stream sequence of the events a committed transaction recorded
// in the inbox (applied, stale or duplicate): a batch from the stream or a
// re-drive. (A dead-letter retry from `projector retry` runs in a process
// without the loop: the next batch moves the checkpoint past it.)
func (r *Runner) advanceCheckpoint(events []*event) {
	var top uint64
	for _, e := range events {
		if e.outcome == Applied || e.outcome == Stale || e.outcome == Duplicate {
			top = max(top, e.seq)
		}
	}
	for {
		cur := r.checkpoint.Load()
		if top <= cur || r.checkpoint.CompareAndSwap(cur, top) {
			return
		}
	}
}

// checkpointLoop writes the checkpoint every CheckpointInterval while it
// advanced, until done is closed (after the workers finished their last
// batches), and then once more. The checkpoint is what `projector status`
// reports as the highest sequence applied; nothing depends on it for
// exactness (the inbox and the positions carry that), so it may lag the
// commits by an interval, and a crash loses at most the last interval's
// advance (the next batch after the restart moves it on).
func (r *Runner) checkpointLoop(ctx context.Context, done <-chan struct{}) {
	ctx = context.WithoutCancel(ctx) // the last batches commit after ctx ends
	t := time.NewTicker(r.cfg.CheckpointInterval)
	defer t.Stop()
	var written uint64
	write := func(timeout time.Duration) {
		cur := r.checkpoint.Load()
		if cur <= written {
			return
		}
		wctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		if _, err := r.db.Exec(wctx, CheckpointAdvanceSQL, r.proj.Name(), int64(cur)); err != nil {
			r.logger.WarnContext(ctx, "write the checkpoint; will try again", "checkpoint", cur, "err", err)
			return
		}
		written = cur
	}
	for {
		select {
		case <-done:
			write(time.Second)
			return
		case <-t.C:
			write(r.cfg.CheckpointInterval)
		}
	}
}

// reportApplied calls Config.Applied with the aggregates of the events that
// a committed transaction applied, each at the last version applied, if any.
func (r *Runner) reportApplied(events []*event) {
	if r.cfg.Applied == nil {
		return
	}
	var reached []Reached
	for _, e := range events { // sorted by aggregate
		if e.outcome != Applied {
			continue
		}
		if n := len(reached); n > 0 && reached[n-1].Order == e.env.AggregateID {
			reached[n-1].Version = max(reached[n-1].Version, e.env.AggregateVersion)
			continue
		}
		reached = append(reached, Reached{Order: e.env.AggregateID, Version: e.env.AggregateVersion})
	}
	if len(reached) > 0 {
		r.cfg.Applied(r.proj.Name(), reached)
	}
}

// Reached is an order a batch applied, and the version its row reached.
type Reached struct {
	Order   uuid.UUID
	Version int64
}

// commitTx applies the well-formed events in tx:
//
//  1. lock the projection's position of every aggregate in the batch and
//     sort each event: next in line (applied), already passed (stale), or
//     ahead of a missing predecessor (gap, left for redelivery; parked in
//     dead_letters if the aggregate has an open dead letter); an event
//     naming an order of another tenant (its position's, or that of the
//     order's first version applied in the batch) is malformed (foreign);
//  2. record applied and stale events in the inbox; one already there is a
//     duplicate and is not applied again;
//  3. apply the new events and advance the positions (the checkpoint
//     follows after the commit: advanceCheckpoint, checkpointLoop).
//
// It sends no NOTIFY: that would serialise every commit in the cluster.
// The caller reports the applied orders once tx committed (reportApplied).
//
// It sets each event's outcome; a retried transaction starts afresh.
func (r *Runner) commitTx(ctx context.Context, tx pgx.Tx, events []*event) error {
	name := r.proj.Name()
	var live []*event
	var aggregates []uuid.UUID
	for _, e := range events {
		if e.undecodable {
			continue
		}
		e.outcome, e.err = 0, nil
		live = append(live, e)
		if len(aggregates) == 0 || aggregates[len(aggregates)-1] != e.env.AggregateID {
			aggregates = append(aggregates, e.env.AggregateID)
		}
	}
	if len(live) == 0 {
		return nil
	}

	positions, err := lockPositions(ctx, tx, name, aggregates)
	if err != nil {
		return err
	}
	found := make(map[uuid.UUID]int64, len(positions)) // the versions locked, for the advance
	for id, p := range positions {
		found[id] = p.version
	}
	var recorded, gaps []*event // recorded: applied or stale, they go into the inbox
	seen := make(map[uuid.UUID]bool, len(live))
	for _, e := range live { // in (aggregate, version) order
		// An order's tenant is its position's, or its first version's,
		// applied in this batch; a gap names none (a forged one would
		// otherwise make the order's own events foreign).
		pos := positions[e.env.AggregateID]
		if pos.tenant != "" && e.env.TenantID != pos.tenant {
			e.outcome, e.err, e.permanent = Malformed, foreign(e.env, pos.tenant), true
			continue
		}
		if seen[e.env.ID] { // the same event twice in one batch
			e.outcome = Duplicate
			continue
		}
		seen[e.env.ID] = true
		switch v := e.env.AggregateVersion; {
		case v <= pos.version:
			e.outcome = Stale
		case v == pos.version+1:
			e.outcome = Applied
			pos.version, pos.tenant = v, e.env.TenantID
			positions[e.env.AggregateID] = pos
		default:
			e.outcome = Gap
			gaps = append(gaps, e)
			continue
		}
		recorded = append(recorded, e)
	}
	if err := r.park(ctx, tx, gaps); err != nil {
		return err
	}
	if len(recorded) == 0 {
		return nil
	}

	isNew, err := idSet(tx.Query(ctx, InboxInsertSQL, inboxArgs(name, recorded)...))
	if err != nil {
		return fmt.Errorf("insert inbox rows: %w", err)
	}

	var applied []*event
	for _, e := range recorded {
		switch {
		case !isNew[e.env.ID]:
			e.outcome = Duplicate
		case e.outcome == Applied:
			applied = append(applied, e)
		}
	}
	if len(applied) == 0 {
		return nil
	}
	// The projection's writes and the positions, in one round trip.
	b := &pgx.Batch{}
	if err := r.queue(b, envelopes(applied)); err != nil {
		return fmt.Errorf("apply %d events: %w", len(applied), err)
	}
	args, orders := advanceArgs(name, applied, func(id uuid.UUID, _ int64) int64 { return found[id] })
	var moved int
	b.Queue(PositionsAdvanceSQL, args...).QueryRow(func(row pgx.Row) error { return row.Scan(&moved) })
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("apply %d events: %w", len(applied), err)
	}
	if moved != orders {
		return fmt.Errorf("%w: %d of %d positions advanced", errPositionMoved, moved, orders)
	}
	return nil
}

// inboxArgs are InboxInsertSQL's arguments for events.
func inboxArgs(projection string, events []*event) []any {
	n := len(events)
	ids, tenants, aggs := make([]uuid.UUID, n), make([]string, n), make([]uuid.UUID, n)
	versions, seqs := make([]int64, n), make([]int64, n)
	for i, e := range events {
		ids[i], tenants[i], aggs[i] = e.env.ID, e.env.TenantID, e.env.AggregateID
		versions[i], seqs[i] = e.env.AggregateVersion, int64(e.seq)
	}
	return []any{projection, ids, tenants, aggs, versions, seqs}
}

// advanceArgs are PositionsAdvanceSQL's arguments for events, sorted by
// aggregate: one row per aggregate, at its last version, from the position
// before(order, its first version in events) the batch found. It also
// returns the number of orders.
func advanceArgs(projection string, events []*event, before func(order uuid.UUID, first int64) int64) (args []any, orders int) {
	var tenants []string
	var aggs []uuid.UUID
	var versions, befores []int64
	for _, e := range events {
		if n := len(aggs); n > 0 && aggs[n-1] == e.env.AggregateID {
			versions[n-1] = e.env.AggregateVersion
			continue
		}
		tenants, aggs, versions = append(tenants, e.env.TenantID), append(aggs, e.env.AggregateID), append(versions, e.env.AggregateVersion)
		befores = append(befores, before(e.env.AggregateID, e.env.AggregateVersion))
	}
	return []any{projection, tenants, aggs, versions, befores}, len(aggs)
}

// envelopes are the envelopes of events.
func envelopes(events []*event) []domain.Envelope {
	envs := make([]domain.Envelope, len(events))
	for i, e := range events {
		envs[i] = e.env
	}
	return envs
}

// commitPipelined applies events as the batch the stream usually brings,
// every event new and next in line for its order, in two round trips. The
// first is one pipeline: BEGIN, the projection's shared lock, the positions
// (PositionsLockSQL), the inbox rows (InboxInsertSQL), the projection's
// writes and the positions' advance (PositionsAdvanceSQL), written as if
// the premise held. Its answers tell whether it did: each position at the
// version before the batch's first event of its order, every event new in
// the inbox, and every write's own check passed. The second round trip is
// COMMIT if so, ROLLBACK if not. It reports whether the batch committed
// (each event Applied then); when not, nothing was written and commit
// applies the batch the careful way (commitTx), which also reports a
// malformed event or a failure. Nothing is raised for a premise that does
// not hold, and a write's failed check is kept out of the batch's error, so
// a refusal logs no error in PostgreSQL and drops no prepared statement;
// it costs the pipeline's writes, rolled back (their WAL, their row locks
// until the ROLLBACK), then the careful way. The statements and their
// locks come in the careful way's order (positions by aggregate first), so
// batches of either way cannot deadlock each other.
func (r *Runner) commitPipelined(ctx context.Context, events []*event) bool {
	name := r.proj.Name()
	var live []*event
	var aggregates []uuid.UUID
	before := map[uuid.UUID]position{} // each order's position the batch needs
	for _, e := range events {         // in (aggregate, version) order
		if e.undecodable {
			continue
		}
		if n := len(live); n > 0 && live[n-1].env.AggregateID == e.env.AggregateID {
			// The batch must hold an order's versions without a hole or a
			// copy (a decoded version is at least 1: v-1 cannot overflow),
			// all of one tenant.
			if e.env.AggregateVersion-1 != live[n-1].env.AggregateVersion || e.env.TenantID != live[n-1].env.TenantID {
				return false
			}
		} else {
			aggregates = append(aggregates, e.env.AggregateID)
			before[e.env.AggregateID] = position{version: e.env.AggregateVersion - 1, tenant: e.env.TenantID}
		}
		live = append(live, e)
	}
	if len(live) == 0 {
		return false
	}
	n := len(live)

	premise := true
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(SharedLockSQL, AdvisoryClass, name)
	b.Queue(PositionsLockSQL, name, aggregates).Query(func(rows pgx.Rows) error {
		var id uuid.UUID
		var at position
		_, err := pgx.ForEachRow(rows, []any{&id, &at.version, &at.tenant}, func() error {
			premise = premise && at == before[id]
			delete(before, id) // left: the orders without a position
			return nil
		})
		return err
	})
	b.Queue(InboxInsertSQL, inboxArgs(name, live)...).Query(func(rows pgx.Rows) error {
		recorded := 0
		_, err := pgx.ForEachRow(rows, []any{new(uuid.UUID)}, func() error { recorded++; return nil })
		premise = premise && recorded == n
		return err
	})
	writes := len(b.QueuedQueries)
	if err := r.queue(b, envelopes(live)); err != nil {
		return false // the careful way reports it
	}
	// A write's own check that fails refuses the batch like a premise
	// that does not hold, without an error out of the batch: pgx drops the
	// prepared statements of a batch that returns one. (A server error
	// still ends the batch: pgx keeps it apart from the callbacks'.)
	for _, qq := range b.QueuedQueries[writes:] {
		if check := qq.Fn; check != nil {
			qq.Fn = func(br pgx.BatchResults) error {
				if err := check(br); err != nil {
					premise = false
				}
				return nil
			}
		}
	}
	// In line, an order's first event of the batch is the one after its
	// position.
	args, orders := advanceArgs(name, live, func(_ uuid.UUID, first int64) int64 { return first - 1 })
	b.Queue(PositionsAdvanceSQL, args...).QueryRow(func(row pgx.Row) error {
		var moved int
		err := row.Scan(&moved)
		premise = premise && moved == orders
		return err
	})

	conn, err := r.db.Acquire(ctx)
	if err != nil {
		return false
	}
	defer conn.Release() // a connection left in a transaction is closed, not pooled
	if err := conn.SendBatch(ctx, b).Close(); err != nil {
		r.logger.DebugContext(ctx, "pipelined batch failed; applying it the careful way", "events", n, "err", err)
		premise = false
	}
	for _, p := range before { // an order without a position needs its first event
		premise = premise && p.version == 0
	}
	if !premise {
		if _, err := conn.Exec(ctx, "ROLLBACK"); err != nil {
			_ = conn.Conn().Close(ctx)
		}
		return false
	}
	if tag, err := conn.Exec(ctx, "COMMIT"); err != nil || tag.String() != "COMMIT" {
		// Committed or not, the careful way finds out: what committed is
		// in the inbox and comes out a duplicate. (A transaction that had
		// failed answers COMMIT with ROLLBACK.)
		r.logger.DebugContext(ctx, "commit of a pipelined batch failed; applying it the careful way", "events", n, "tag", tag.String(), "err", err)
		return false
	}
	for _, e := range live {
		e.outcome, e.err = Applied, nil
	}
	return true
}

// position is where a projection stands on an order: the last version it
// applied, and the tenant the order belongs to.
type position struct {
	version int64
	tenant  string
}

// foreign is the error of an event that names an order of another tenant:
// malformed, since no retry makes it that tenant's. Its dead letter is its
// own tenant's and holds nothing of the order's tenant back.
func foreign(env domain.Envelope, owner string) error {
	return fmt.Errorf("%w: an event of tenant %q names order %s of tenant %q", domain.ErrMalformedEvent, env.TenantID, env.AggregateID, owner)
}

// advanceOne moves env's order's position from before, where the caller
// holds it locked (positionForUpdate), to env's version
// (PositionsAdvanceSQL), for an event skipped on purpose (a discard), and
// fails if an order without a position got one meanwhile.
func advanceOne(ctx context.Context, tx pgx.Tx, projection string, env domain.Envelope, before int64) error {
	var moved int
	if err := tx.QueryRow(ctx, PositionsAdvanceSQL, projection, []string{env.TenantID}, []uuid.UUID{env.AggregateID},
		[]int64{env.AggregateVersion}, []int64{before}).Scan(&moved); err != nil {
		return err
	}
	if moved != 1 {
		return fmt.Errorf("%w: order %s is no longer at version %d", errPositionMoved, env.AggregateID, before)
	}
	return nil
}

// positionForUpdateSQL locks and reads an order's position ($1 the
// projection, $2 the order), for advanceOne.
const positionForUpdateSQL = `SELECT version, tenant_id FROM projection_positions WHERE projection = $1 AND aggregate_id = $2 FOR UPDATE`

// lockPositions takes the projection's shared lock and then locks and reads
// the positions of aggregates, in one round trip.
func lockPositions(ctx context.Context, tx pgx.Tx, name string, aggregates []uuid.UUID) (map[uuid.UUID]position, error) {
	b := &pgx.Batch{}
	b.Queue(SharedLockSQL, AdvisoryClass, name)
	b.Queue(PositionsLockSQL, name, aggregates)
	res := tx.SendBatch(ctx, b)
	defer res.Close()
	if _, err := res.Exec(); err != nil {
		return nil, fmt.Errorf("take the projection's shared lock: %w", err)
	}
	rows, _ := res.Query()
	positions := make(map[uuid.UUID]position, len(aggregates))
	var aggID uuid.UUID
	var at position
	if _, err := pgx.ForEachRow(rows, []any{&aggID, &at.version, &at.tenant}, func() error {
		positions[aggID] = at
		return nil
	}); err != nil {
		return nil, fmt.Errorf("lock projection positions: %w", err)
	}
	return positions, res.Close()
}

// park moves the gap events of aggregates with an unresolved dead letter
// into dead_letters (status parked), in tx, so that they wait there, in
// order, instead of cycling through redeliveries: behind an open dead letter
// until an operator resolves it; behind a parked earlier version (deferred
// past its tenant's share of the window) until the re-drive applies that
// one, which makes its parked successors due at once (the gap delay is a
// fallback).
func (r *Runner) park(ctx context.Context, tx pgx.Tx, gaps []*event) error {
	if len(gaps) == 0 {
		return nil
	}
	tenants, aggs := make([]string, len(gaps)), make([]uuid.UUID, len(gaps))
	for i, e := range gaps {
		tenants[i], aggs[i] = e.env.TenantID, e.env.AggregateID
	}
	type unresolved struct {
		lowestOpen, lowestParked int64 // 0: none
	}
	held := map[orderKey]unresolved{}
	rows, _ := tx.Query(ctx, deadAggregatesSQL, r.proj.Name(), tenants, aggs)
	var k orderKey
	var u unresolved
	if _, err := pgx.ForEachRow(rows, []any{&k.tenant, &k.id, &u.lowestOpen, &u.lowestParked}, func() error {
		held[k] = u
		return nil
	}); err != nil {
		return fmt.Errorf("find dead-lettered aggregates: %w", err)
	}
	for _, e := range gaps {
		h, ok := held[keyOf(e.env)]
		if !ok || e.msg == nil {
			continue
		}
		var err error
		switch {
		case h.lowestOpen > 0 && h.lowestOpen < e.env.AggregateVersion:
			err = r.deadLetter(ctx, tx, e, statusParked, reasonBehindOpen, noAttempt)
		case h.lowestParked > 0 && h.lowestParked < e.env.AggregateVersion:
			err = r.deadLetter(ctx, tx, e, statusParked, reasonBehindParked, r.gapDelay(e.deliveries))
		default:
			continue
		}
		if err != nil {
			return err
		}
		e.outcome = Parked
	}
	return nil
}

// idSet collects the ids a query returns, one per row, as a set.
func idSet(rows pgx.Rows, err error) (map[uuid.UUID]bool, error) {
	if err != nil {
		return nil, err
	}
	set := map[uuid.UUID]bool{}
	var id uuid.UUID
	_, err = pgx.ForEachRow(rows, []any{&id}, func() error {
		set[id] = true
		return nil
	})
	return set, err
}
