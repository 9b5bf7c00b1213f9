package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

type outboxRow struct {
	ID        uuid.UUID
	EventType string
	Payload   []byte
	CreatedAt time.Time
	// Traceparent and Tracestate are the W3C trace context of the request
	// that wrote the event (nil when it was not traced); publish replaces
	// them by its publish span's.
	Traceparent, Tracestate *string
}

// RelayBatch publishes, for each worker of the relay in turn, one batch of
// unpublished events of the partitions that worker owns, in seq order, and
// marks published the longest prefix of it that JetStream acknowledged. It
// returns how many rows it claimed. If a lease connection fails, its worker
// gives up its partitions (they are free for any relay to take) and takes
// them anew on the next call. It must not run at the same time as Run or
// another RelayBatch of the same relay (tests and tools call it instead of
// Run).
func (r *Relay) RelayBatch(ctx context.Context) (claimed int, err error) {
	for _, w := range r.workers {
		n, err := w.relayBatch(ctx)
		claimed += n
		if err != nil {
			return claimed, err
		}
	}
	return claimed, nil
}

// relayBatch is one claim, publish and mark of worker w, in one transaction
// on its lease connection. The transaction takes two round trips: its BEGIN
// goes with the claim, its COMMIT with the mark (a round that marks nothing
// commits alone). The claim's row locks are held across the publish.
func (w *worker) relayBatch(ctx context.Context) (claimed int, err error) {
	conn, owned, err := w.lease(ctx)
	if err != nil {
		return 0, err
	}
	if len(owned) == 0 {
		return 0, nil // a standby: another relay owns every partition
	}
	defer func() {
		if err != nil {
			w.abort(ctx, conn)
		}
	}()
	r := w.r
	events, err := claim(ctx, conn, r.cfg.BatchSize, owned)
	if err != nil {
		return 0, err
	}
	claimed = len(events)
	if claimed == 0 {
		return 0, commit(ctx, conn, nil)
	}
	start := time.Now()
	acked, duplicates, publishErr := r.publish(ctx, events)
	if r.cfg.PublishSeconds != nil {
		r.cfg.PublishSeconds.Observe(time.Since(start).Seconds())
	}
	ids := make([]uuid.UUID, acked)
	for i := range ids {
		ids[i] = events[i].ID
	}
	if err := commit(ctx, conn, ids); err != nil {
		return claimed, err
	}
	if acked > 0 {
		r.published.Add(int64(acked))
		r.duplicates.Add(int64(duplicates))
		if o := r.cfg.CommitToPublishedSeconds; o != nil {
			now := time.Now()
			for _, e := range events[:acked] {
				o.Observe(max(0, now.Sub(e.CreatedAt).Seconds())) // the database's clock may run ahead of ours
			}
		}
	}
	return claimed, publishErr
}

// claim begins the round's transaction on conn and claims up to size
// unpublished rows of the partitions owned, in one round trip.
func claim(ctx context.Context, conn *pgx.Conn, size int, owned []int16) ([]outboxRow, error) {
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(OutboxClaimSQL, size, owned)
	res := conn.SendBatch(ctx, b)
	defer res.Close()
	if _, err := res.Exec(); err != nil {
		return nil, fmt.Errorf("claim outbox rows: begin: %w", err)
	}
	rows, _ := res.Query()
	events, err := pgx.CollectRows(rows, pgx.RowToStructByPos[outboxRow])
	if err != nil {
		return nil, fmt.Errorf("claim outbox rows: %w", err)
	}
	return events, res.Close()
}

// commit marks the rows ids published, if any, and commits the round's
// transaction, in one round trip.
func commit(ctx context.Context, conn *pgx.Conn, ids []uuid.UUID) error {
	b := &pgx.Batch{}
	if len(ids) > 0 {
		b.Queue(OutboxMarkPublishedSQL, ids)
	}
	b.Queue("COMMIT")
	if err := conn.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("mark outbox rows published and commit: %w", err)
	}
	return nil
}

// abort ends a round that failed: it rolls back the transaction left open
// (a failed statement leaves it aborted), or, if that cannot be done or the
// connection is gone, releases the lease (its partitions are free for any
// relay to take, and taken anew on the next round).
func (w *worker) abort(ctx context.Context, conn *pgx.Conn) {
	if !conn.IsClosed() && conn.PgConn().TxStatus() != 'I' {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if _, err := conn.Exec(rctx, "ROLLBACK"); err != nil {
			_ = conn.Close(rctx)
		}
	}
	if conn.IsClosed() {
		w.release()
	}
}
