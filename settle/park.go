package settle

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/acme/orders/domain"
)

// Parking keeps a tenant's excess out of the consumer's in-flight window
// (G9). An intent whose tenant holds its share of this process's slots is
// written to dead_letters as 'parked' (the consumer's name as its
// projection; the projector never touches those) and acked: a deferral
// that only naked it would stay pending in MaxAckPending, and a tenant
// with a window's worth of slow intents would fill it and starve every
// other tenant. Each consumer re-drives its parked intents (redrive):
// leased one at a time, settled outside any transaction like a delivered
// one (the recorded-outcome check, the provider call with the intent's own
// key, the recording), then marked retried, parked again after a failure
// (backoff) or opened as a dead letter after MaxDeliver failures. A crash
// between the park and the ack delivers the intent again as well: both
// copies settle through the same inbox and key, so at most one charge.
const (
	parkSQL = `
INSERT INTO dead_letters (projection, tenant_id, event_id, aggregate_id, aggregate_version, stream_seq,
                          subject, payload, error, deliveries, status, next_attempt_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, 'parked', now() + $11 * interval '1 microsecond')`

	// leaseParkedSQL leases up to $2 due parked intents of consumer $1 for
	// $3 µs (another process takes them if this one dies with them).
	leaseParkedSQL = `
UPDATE dead_letters d SET next_attempt_at = now() + $3 * interval '1 microsecond'
FROM (SELECT id FROM dead_letters
      WHERE projection = $1 AND status = 'parked' AND next_attempt_at <= now()
      ORDER BY next_attempt_at LIMIT $2
      FOR UPDATE SKIP LOCKED) due
WHERE d.id = due.id
RETURNING d.id, d.tenant_id, d.payload, d.deliveries`

	parkedAgainSQL = `UPDATE dead_letters SET next_attempt_at = now() + $2 * interval '1 microsecond', deliveries = $3, error = $4 WHERE id = $1 AND status = 'parked'`
	parkedDoneSQL  = `UPDATE dead_letters SET status = 'retried', resolved_at = now() WHERE id = $1 AND status = 'parked'`
	parkedOpenSQL  = `UPDATE dead_letters SET status = 'open', deliveries = $2, error = $3, next_attempt_at = NULL WHERE id = $1 AND status = 'parked'`
)

// park writes the intent of m (env, of a tenant at its share) to
// dead_letters as parked, due after DeferDelay, and acks m. If it cannot be
// written, m is naked with DeferDelay instead: never lost.
func (w *Worker) park(ctx context.Context, consumer string, m jetstream.Msg, env domain.Envelope, seq, delivered uint64, fails *failures) {
	w.stats.deferred.Add(1)
	reason := fmt.Sprintf("deferred: tenant %s holds its share (%d) of this process's slots", env.TenantID, w.cfg.tenantLimit())
	// Its deliveries column counts its failures, and is at least 1 if an
	// earlier delivery may have reached the provider (one not deferred
	// here: see process), so the re-drive looks its charge up first only
	// then.
	failed := fails.failed(seq)
	if failed == 0 && int64(delivered)-int64(fails.deferrals(seq)) > 1 {
		failed = 1
	}
	if _, err := w.db.Exec(ctx, parkSQL, consumer, env.TenantID, env.ID, env.AggregateID, env.AggregateVersion, int64(seq),
		m.Subject(), m.Data(), reason, int64(failed), w.cfg.DeferDelay.Microseconds()); err != nil {
		w.logger.WarnContext(ctx, "park deferred intent; handing it back instead", "consumer", consumer, "stream_seq", seq, "err", err)
		if seq != 0 {
			fails.deferral(seq, time.Now())
		}
		if err := m.NakWithDelay(w.cfg.DeferDelay); err != nil {
			w.logger.WarnContext(ctx, "nak deferred intent (it will be redelivered after the ack wait)", "consumer", consumer, "stream_seq", seq, "err", err)
		}
		return
	}
	w.stats.parked.Add(1)
	fails.forget(seq)
	if err := m.Ack(); err != nil {
		// Delivered again later: settled once through the inbox and key.
		w.logger.WarnContext(ctx, "ack parked intent", "consumer", consumer, "stream_seq", seq, "err", err)
	}
}

// parked is a leased parked intent.
type parked struct {
	ID         int64
	Tenant     string
	Payload    []byte
	Deliveries int32 // failed deliveries so far (at least 1 if one may have reached the provider)
}

// redrive settles the due parked intents of consumer every DeferDelay
// until ctx ends, each in a goroutine of wg once its tenant has a free
// slot; work is the context of the settling (it outlives ctx, as for
// delivered intents).
func (w *Worker) redrive(ctx, work context.Context, consumer string, slots *tenantSlots, wg *sync.WaitGroup) {
	t := time.NewTicker(w.cfg.DeferDelay)
	defer t.Stop()
	lease := w.cfg.AckWait
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rows, _ := w.db.Query(ctx, leaseParkedSQL, consumer, w.cfg.Concurrency, lease.Microseconds())
		due, err := pgx.CollectRows(rows, pgx.RowToStructByPos[parked])
		if err != nil {
			if ctx.Err() == nil {
				w.logger.WarnContext(ctx, "lease parked intents; will try again", "consumer", consumer, "err", err)
			}
			continue
		}
		for _, p := range due {
			if !slots.acquire(p.Tenant) {
				// Still at its share: due again after the delay.
				if _, err := w.db.Exec(ctx, parkedAgainSQL, p.ID, w.cfg.DeferDelay.Microseconds(), p.Deliveries,
					fmt.Sprintf("deferred: tenant %s holds its share (%d) of this process's slots", p.Tenant, w.cfg.tenantLimit())); err != nil {
					w.logger.WarnContext(ctx, "hand back a parked intent (its lease expires instead)", "consumer", consumer, "id", p.ID, "err", err)
				}
				continue
			}
			wg.Go(func() {
				defer slots.release(p.Tenant)
				w.settleParked(work, consumer, p)
			})
		}
	}
}

// settleParked settles the parked intent p and records the result in its
// dead_letters row. If it may have reached the provider before (a failed
// delivery), the charge or refund its key made is looked up first.
func (w *Worker) settleParked(ctx context.Context, consumer string, p parked) {
	r := w.settle(ctx, consumer, p.Payload, p.Deliveries > 0)
	var err error
	switch r.verdict {
	case done:
		if r.timing != nil && w.cfg.Observe != nil {
			w.cfg.Observe(consumer, *r.timing)
		}
		_, err = w.db.Exec(ctx, parkedDoneSQL, p.ID)
	case abandon: // its lease expires, and it is tried again
		w.logger.WarnContext(ctx, "parked intent abandoned before recording; it is tried again after its lease", "consumer", consumer, "id", p.ID, "err", r.err)
	case retry:
		failed := int(p.Deliveries) + 1
		if failed < w.cfg.MaxDeliver {
			w.logger.WarnContext(ctx, "parked intent failed; retrying with the same key", "consumer", consumer, "id", p.ID, "failures", failed, "err", r.err)
			_, err = w.db.Exec(ctx, parkedAgainSQL, p.ID, w.backoff(uint64(failed)).Microseconds(), failed, r.err.Error())
			break
		}
		r.err = fmt.Errorf("still failing after %d failed deliveries: %w", failed, r.err)
		p.Deliveries = int32(failed)
		fallthrough
	case dead:
		w.stats.deadLettered(consumer)
		w.logger.ErrorContext(ctx, "parked intent dead-lettered", "consumer", consumer, "id", p.ID, "err", r.err)
		_, err = w.db.Exec(ctx, parkedOpenSQL, p.ID, p.Deliveries, r.err.Error())
	}
	if err != nil {
		w.logger.WarnContext(ctx, "record a parked intent's result (it is tried again after its lease, and found recorded)", "consumer", consumer, "id", p.ID, "err", err)
	}
}
