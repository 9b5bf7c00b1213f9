package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/acme/orders/postgres"
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
// on its lease connection.
func (w *worker) relayBatch(ctx context.Context) (claimed int, err error) {
	conn, owned, err := w.lease(ctx)
	if err != nil {
		return 0, err
	}
	if len(owned) == 0 {
		return 0, nil // a standby: another relay owns every partition
	}
	r := w.r
	var publishErr error
	err = postgres.InTx(ctx, conn, func(tx pgx.Tx) error {
		rows, _ := tx.Query(ctx, OutboxClaimSQL, r.cfg.BatchSize, owned)
		events, err := pgx.CollectRows(rows, pgx.RowToStructByPos[outboxRow])
		if err != nil {
			return fmt.Errorf("claim outbox rows: %w", err)
		}
		claimed = len(events)
		if claimed == 0 {
			return nil
		}
		start := time.Now()
		acked, duplicates, perr := r.publish(ctx, events)
		publishErr = perr
		if r.cfg.PublishSeconds != nil {
			r.cfg.PublishSeconds.Observe(time.Since(start).Seconds())
		}
		if acked == 0 {
			return nil
		}
		ids := make([]uuid.UUID, acked)
		for i := range ids {
			ids[i] = events[i].ID
		}
		if _, err := tx.Exec(ctx, OutboxMarkPublishedSQL, ids); err != nil {
			return fmt.Errorf("mark outbox rows published: %w", err)
		}
		r.published.Add(int64(acked))
		r.duplicates.Add(int64(duplicates))
		if o := r.cfg.CommitToPublishedSeconds; o != nil {
			now := time.Now()
			for _, e := range events[:acked] {
				o.Observe(now.Sub(e.CreatedAt).Seconds())
			}
		}
		return nil
	})
	if err != nil && conn.IsClosed() {
		w.release()
	}
	if err == nil && publishErr != nil {
		err = publishErr
	}
	return claimed, err
}
