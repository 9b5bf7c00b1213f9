package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// advisoryClass is the first key of the relay's advisory locks
// (pg_try_advisory_lock(advisoryClass, partition)).
const advisoryClass = 0x0a7b0c5

// lease returns the connection that holds this worker's partition locks and
// the partitions it owns, taking free partitions every TakeoverInterval. The
// connection is the only one the worker keeps outside the pool. Only the
// worker's own goroutine calls it, so its state needs no lock.
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
		w.conn, w.owned, w.lastTake = conn, nil, time.Time{}
	}
	if len(w.owned) < w.maxPartitions && time.Since(w.lastTake) >= w.r.cfg.TakeoverInterval {
		w.lastTake = time.Now()
		owned := make([]int32, len(w.owned))
		for i, p := range w.owned {
			owned[i] = int32(p)
		}
		rows, _ := w.conn.Query(ctx, PartitionsTakeSQL, Partitions, owned, advisoryClass, w.maxPartitions-len(w.owned))
		taken, err := pgx.CollectRows(rows, pgx.RowTo[int16])
		if err != nil {
			w.release()
			return nil, nil, fmt.Errorf("take outbox partitions: %w", err)
		}
		if len(taken) > 0 {
			w.owned = append(w.owned, taken...)
			w.logger.InfoContext(ctx, "relay took outbox partitions", "taken", taken, "owned", len(w.owned))
		}
		w.ownedCount.Store(int64(len(w.owned)))
	}
	return w.conn, w.owned, nil
}

// release closes the lease connection, which releases its partitions.
func (w *worker) release() {
	if w.conn != nil {
		_ = w.conn.Close(context.Background())
	}
	w.conn, w.owned = nil, nil
	w.ownedCount.Store(0)
}
