package outbox

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// advisoryClass is the first key of the relay's advisory locks
// (pg_try_advisory_lock(advisoryClass, partition)).
const advisoryClass = 0x0a7b0c5

// wantClass is the first key of the shared advisory lock (wantClass, 0)
// that a worker below its cap holds: it tells the workers above theirs to
// give their extras back.
const wantClass = advisoryClass + 1

// lease returns the connection that holds this worker's partition locks and
// the partitions it owns, rebalancing them every TakeoverInterval. The
// connection is the only one the worker keeps outside the pool. Only the
// worker's own goroutine calls it, between rounds (no transaction open, so
// a partition it gives back has no claim in flight), and its state needs no
// lock.
func (w *worker) lease(ctx context.Context) (*pgx.Conn, []int16, error) {
	if w.conn == nil || w.conn.IsClosed() {
		pc, err := w.r.db.Acquire(ctx)
		if err != nil {
			return nil, nil, fmt.Errorf("acquire the relay's connection: %w", err)
		}
		conn := pc.Hijack()
		// The claim walks the unpublished rows' index in seq order. A
		// bitmap scan of it (the planner's choice while the outbox's
		// statistics are stale) visits every entry of a row marked since
		// the last vacuum, each time; a plain index scan marks those dead
		// once and skips them after, so the claim stays fast between
		// vacuums.
		//
		// Its commits do not wait for the WAL flush either: a mark that a
		// crash of PostgreSQL loses only leaves its rows unpublished, and
		// they are published again, which JetStream's duplicate window (or
		// past it, the projectors' inbox) absorbs. That takes one fsync out
		// of every relay round. The connection runs nothing but the relay's
		// statements.
		if _, err := conn.Exec(ctx, LeaseSettingsSQL+"; "+LeaseKeepaliveSQL); err != nil {
			_ = conn.Close(context.WithoutCancel(ctx))
			return nil, nil, fmt.Errorf("set up the relay's connection: %w", err)
		}
		w.conn, w.owned, w.lastLook, w.wanting, w.seenFree = conn, nil, time.Time{}, false, nil
	}
	if time.Since(w.lastLook) >= w.r.cfg.TakeoverInterval {
		w.lastLook = time.Now()
		if err := w.rebalance(ctx); err != nil {
			w.release()
			return nil, nil, err
		}
		w.ownedCount.Store(int64(len(w.owned)))
	}
	return w.conn, w.owned, nil
}

// rebalance moves the worker's share towards its cap without ever leaving a
// partition unpublished while a worker could publish it. Below its cap the
// worker takes free partitions, and says it wants more while it still has
// room. At or above it, the worker gives its extras back when a live worker
// with room wants them (which takes them on its next look); when none does,
// it takes the partitions that stayed free for a whole TakeoverInterval
// (seen free on two looks in a row), as those have no other taker.
func (w *worker) rebalance(ctx context.Context) error {
	if len(w.owned) < w.maxPartitions {
		w.seenFree = nil
		if err := w.take(ctx, w.notOwned(), w.maxPartitions-len(w.owned)); err != nil {
			return err
		}
		return w.want(ctx, len(w.owned) < w.maxPartitions)
	}
	free, wanted, err := w.survey(ctx)
	if err != nil {
		return err
	}
	if wanted {
		w.seenFree = nil // they are the wanting worker's to take
		return w.giveBack(ctx)
	}
	stillFree := intersect(w.seenFree, free)
	w.seenFree = free
	if len(stillFree) == 0 {
		return nil
	}
	return w.take(ctx, stillFree, len(stillFree))
}

// notOwned returns the partitions the worker does not own.
func (w *worker) notOwned() []int16 {
	var ps []int16
	for p := range int16(Partitions) {
		if !slices.Contains(w.owned, p) {
			ps = append(ps, p)
		}
	}
	return ps
}

// take takes up to limit of the partitions candidates whose locks are free.
func (w *worker) take(ctx context.Context, candidates []int16, limit int) error {
	rows, _ := w.conn.Query(ctx, PartitionsTakeSQL, candidates, advisoryClass, limit)
	taken, err := pgx.CollectRows(rows, pgx.RowTo[int16])
	if err != nil {
		return fmt.Errorf("take outbox partitions: %w", err)
	}
	if len(taken) > 0 {
		w.owned = append(w.owned, taken...)
		w.logger.InfoContext(ctx, "relay took outbox partitions", "taken", taken, "owned", len(w.owned), "cap", w.maxPartitions)
	}
	return nil
}

// want holds the shared lock (wantClass, 0) while the worker has room, and
// releases it once the worker is full, so that the workers above their cap
// give their extras back only when someone will take them. The lock lives
// and dies with the lease connection, like the partitions' locks.
func (w *worker) want(ctx context.Context, room bool) error {
	if room == w.wanting {
		return nil
	}
	sql := PartitionsWantSQL
	if !room {
		sql = PartitionsUnwantSQL
	}
	var ok bool
	if err := w.conn.QueryRow(ctx, sql, wantClass).Scan(&ok); err != nil {
		return fmt.Errorf("say the relay worker wants partitions (%t): %w", room, err)
	}
	w.wanting = room && ok // not wanting if the lock was not there to release
	return nil
}

// survey reads which partitions no worker owns, and whether another worker
// that is alive wants partitions: one that ran a statement within two of
// its looks (each TakeoverInterval, and a standby's only between polls).
func (w *worker) survey(ctx context.Context) (free []int16, wanted bool, err error) {
	alive := 2 * (w.r.cfg.TakeoverInterval + w.r.cfg.PollInterval).Seconds()
	if err := w.conn.QueryRow(ctx, PartitionsSurveySQL, Partitions, advisoryClass, wantClass, alive).Scan(&free, &wanted); err != nil {
		return nil, false, fmt.Errorf("survey outbox partitions: %w", err)
	}
	return free, wanted, nil
}

// giveBack releases the partitions the worker owns beyond its cap, the last
// it took, for a worker with room to take them.
func (w *worker) giveBack(ctx context.Context) error {
	extras := w.owned[w.maxPartitions:]
	if len(extras) == 0 {
		return nil
	}
	if _, err := w.conn.Exec(ctx, PartitionsGiveBackSQL, extras, advisoryClass); err != nil {
		return fmt.Errorf("give back outbox partitions: %w", err)
	}
	w.owned = slices.Clip(w.owned[:w.maxPartitions])
	w.logger.InfoContext(ctx, "relay gave back the outbox partitions over its cap to a relay with room",
		"given", extras, "owned", len(w.owned))
	return nil
}

// intersect returns the partitions in both a and b.
func intersect(a, b []int16) []int16 {
	var both []int16
	for _, p := range a {
		if slices.Contains(b, p) {
			both = append(both, p)
		}
	}
	return both
}

// release closes the lease connection, which releases its partitions (and
// its want of more).
func (w *worker) release() {
	if w.conn != nil {
		_ = w.conn.Close(context.Background())
	}
	w.conn, w.owned, w.wanting, w.seenFree = nil, nil, false, nil
	w.ownedCount.Store(0)
}
