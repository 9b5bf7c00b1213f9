package settle

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/acme/orders/domain"
	"github.com/acme/orders/postgres"
)

// Parking keeps a tenant's excess out of the consumer's in-flight window
// (G9). A delivered intent of a tenant that holds its share of this
// process's slots, or that has intents parked already (so that they are
// not overtaken for ever), is written to dead_letters as 'parked' (the
// consumer's name as its projection; the projector never touches those)
// and acked. Handing it back (Nak) instead would keep it pending in
// MaxAckPending, and a tenant with a window's worth of slow intents would
// fill the window and stall every other tenant. A delivered intent that
// fails transiently is parked the same way, due when its backoff ends
// (parkFailed): handed back, it would wait out its backoff in the window,
// and a tenant whose calls all fail at once (never holding two slots, so
// never deferred) filled the window with them.
//
// The re-drive (redrive) runs beside the consumer's workers. Whenever a
// tenant with due parked intents gives a slot back, and after each scan
// (every DeferDelay), it leases the oldest due parked intents of each such tenant, one slot
// at a time round the tenants (in a random order), up to the tenants' free
// slots and Concurrency in all, and hands them to the workers, which take
// them between delivered intents and settle them as delivered ones (the
// recorded-outcome check, the provider call with the intent's own key, the
// recording); a job whose lease was lost, or not confirmed by a renewal
// for half its length, while it waited for a worker is dropped, and tried
// again after the lease. A settled one is deleted (payment_inbox and payments hold its
// outcome); a failed one is parked again on the backoff, and opened as a
// dead letter after MaxDeliver failed deliveries (counted on the row, with
// the ones before it was parked), unless the provider gave no outcome
// (exhausted): that one waits, parked, until the provider answers.
//
// G8 holds through the attempts column, which counts the attempts that
// may have reached the provider: the lease adds one before the call, so an
// intent leased again after any crash, abandon or lost update looks up the
// charge (or refund) its key made first, as a redelivered one does, and so
// does one parked for over an hour (another copy of its event may have
// reached the provider). A lease lasts Lease and is renewed every Lease/3
// while this process has the intent in hand (lease.go); one that outlives
// it anyway (renewals failing) is harmless for G8 (a second copy looks the
// key up, the provider replays it, the inbox records it once), and each
// result is written only under its own lease (the attempts the lease made,
// which every later lease moves on). A crash between the park and the ack delivers the intent
// again as well: both copies settle through the same inbox and key.
const (
	parkSQL = `
INSERT INTO dead_letters (projection, tenant_id, event_id, aggregate_id, aggregate_version, stream_seq,
                          subject, payload, error, deliveries, attempts, status, next_attempt_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, 'parked', now() + $12::bigint * interval '1 microsecond')`

	// parkedTenantsSQL lists up to $2 tenants with parked intents of
	// consumer $1, each with whether one is due: two probes of
	// dead_letters_parked_tenant per tenant (a skip scan, then its
	// earliest due time), however many intents each has parked.
	parkedTenantsSQL = `
WITH RECURSIVE t(tenant_id) AS (
    (SELECT tenant_id FROM dead_letters
     WHERE projection = $1 AND status = 'parked' AND tenant_id IS NOT NULL
     ORDER BY tenant_id LIMIT 1)
  UNION ALL
    SELECT (SELECT d.tenant_id FROM dead_letters d
            WHERE d.projection = $1 AND d.status = 'parked' AND d.tenant_id > t.tenant_id
            ORDER BY d.tenant_id LIMIT 1)
    FROM t WHERE t.tenant_id IS NOT NULL
)
SELECT t.tenant_id,
       coalesce((SELECT min(d.next_attempt_at) FROM dead_letters d
                 WHERE d.projection = $1 AND d.status = 'parked' AND d.tenant_id = t.tenant_id) <= now(), false)
FROM t WHERE t.tenant_id IS NOT NULL LIMIT $2`

	// leaseParkedSQL leases, for each tenant $2[i], up to $3[i] of its due
	// parked intents of consumer $1, oldest due first, for $4 µs, counting
	// the attempt; rows another process holds are skipped. (The ids go
	// through an array: joined, the planner reads every row of the table.)
	leaseParkedSQL = `
UPDATE dead_letters d
SET next_attempt_at = now() + $4::bigint * interval '1 microsecond', attempts = d.attempts + 1
WHERE d.id = ANY (ARRAY(
      SELECT p.id
      FROM unnest($2::text[], $3::int[]) AS a(tenant_id, n)
      CROSS JOIN LATERAL (SELECT id FROM dead_letters
                          WHERE projection = $1 AND status = 'parked' AND tenant_id = a.tenant_id
                            AND next_attempt_at <= now()
                          ORDER BY next_attempt_at
                          LIMIT a.n
                          FOR UPDATE SKIP LOCKED) p))
RETURNING d.id, d.tenant_id, d.payload, d.attempts, d.deliveries,
          d.created_at < now() - interval '1 hour'`

	// The results of a leased intent $1, written only under its own lease
	// (attempts = $2, as the lease made them: lease.go).
	parkedDoneSQL  = `DELETE FROM dead_letters WHERE id = $1 AND status = 'parked' AND attempts = $2`
	parkedAgainSQL = `UPDATE dead_letters SET next_attempt_at = now() + $3::bigint * interval '1 microsecond', deliveries = $4, error = $5 WHERE id = $1 AND status = 'parked' AND attempts = $2`
	parkedOpenSQL  = `UPDATE dead_letters SET status = 'open', deliveries = $3, error = $4, next_attempt_at = NULL, last_tried_at = now() WHERE id = $1 AND status = 'parked' AND attempts = $2`
	// unleaseSQL hands back a lease never started (on shutdown).
	unleaseSQL = `UPDATE dead_letters SET next_attempt_at = now(), attempts = attempts - 1 WHERE id = $1 AND status = 'parked' AND attempts = $2`

	// maxParkedTenants bounds the tenants one scan lists; past it, a scan
	// only adds to the tenants known to have parked intents.
	maxParkedTenants = 10_000
	// unleaseTimeout bounds handing back the leases in hand on shutdown:
	// a lease left to expire is harmless.
	unleaseTimeout = 5 * time.Second
)

// park writes the delivered intent m (env, of a tenant at its share or with
// intents parked) to dead_letters as parked, due now, and acks m. If it
// cannot be written, m is handed back for DeferDelay instead: never lost.
func (w *Worker) park(ctx context.Context, consumer string, m jetstream.Msg, env domain.Envelope, seq, delivered uint64, slots *tenantSlots, fails *failures) {
	w.stats.deferred.Add(1)
	// Its failed deliveries so far, and whether an earlier delivery may
	// have reached the provider (one not handed back here, see process),
	// so that its re-drive looks its charge up first.
	f := fails.get(seq)
	attempts := 0
	if f.n > 0 || int64(delivered)-int64(f.deferred) > 1 {
		attempts = 1
	}
	reason := fmt.Sprintf("deferred: tenant %s holds its share (%d) of this process's slots or has intents parked before", env.TenantID, w.cfg.tenantLimit())
	if err := w.insertParked(ctx, consumer, m, env, seq, f.n, attempts, 0, reason); err != nil {
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
	slots.parked(env.TenantID, time.Now())
	w.ackParked(ctx, consumer, m, seq)
}

// parkFailed writes the delivered intent m (env), whose failed-th failed
// delivery this was, to dead_letters as parked, due after delay (its
// backoff), and acks m; it reports false, having done nothing, if the row
// cannot be written (m is then handed back on its backoff by the caller).
// The re-drive retries it as a parked intent that failed: its failures go
// on counting on the row, and it is opened as a dead letter at MaxDeliver.
// Its call may have reached the provider (an answer lost), so it is parked
// as attempted once: its first lease looks the charge or refund up by key
// first (G8). Its tenant's later intents are parked too meanwhile
// (acquireDirect), and re-driven as they fall due.
func (w *Worker) parkFailed(ctx context.Context, consumer string, m jetstream.Msg, env domain.Envelope, seq uint64, failed int, delay time.Duration, cause error, slots *tenantSlots, fails *failures) bool {
	if err := w.insertParked(ctx, consumer, m, env, seq, failed, 1, delay, cause.Error()); err != nil {
		w.logger.WarnContext(ctx, "park failed intent; handing it back instead", "consumer", consumer, "stream_seq", seq, "err", err)
		return false
	}
	w.stats.retryParked.Add(1)
	fails.forget(seq)
	slots.parkedLater(env.TenantID, time.Now())
	w.ackParked(ctx, consumer, m, seq)
	return true
}

// insertParked writes the delivered intent m (env) to dead_letters as
// parked, due after delay, with its failed deliveries so far and the
// attempts that may have reached the provider (1 makes its first lease
// look the charge or refund up by key first).
func (w *Worker) insertParked(ctx context.Context, consumer string, m jetstream.Msg, env domain.Envelope, seq uint64, failures, attempts int, delay time.Duration, reason string) error {
	_, err := w.db.Exec(ctx, parkSQL, consumer, env.TenantID, env.ID, env.AggregateID, env.AggregateVersion, int64(seq),
		postgres.Text(m.Subject()), m.Data(), postgres.Text(reason), int64(failures), attempts, delay.Microseconds())
	return err
}

// ackParked acks m, parked (its row committed).
func (w *Worker) ackParked(ctx context.Context, consumer string, m jetstream.Msg, seq uint64) {
	if err := m.Ack(); err != nil {
		// Delivered again later: settled once through the inbox and key.
		w.logger.WarnContext(ctx, "ack parked intent", "consumer", consumer, "stream_seq", seq, "err", err)
	}
}

// parked is a leased parked intent.
type parked struct {
	ID      int64
	Tenant  string
	Payload []byte
	// Attempts counts the attempts that may have reached the provider,
	// this one included.
	Attempts int32
	// Failures counts the failed deliveries before this one.
	Failures int32
	// Old says it was parked over an hour ago.
	Old bool
}

// leaseFor is how long a lease of a parked intent lasts (Config.Lease).
func (w *Worker) leaseFor() time.Duration { return w.cfg.Lease }

// stale says the job p is not to be started: its lease was lost, or not
// confirmed for half its length (the renewals failed while it waited for a
// worker), so it may be over. It is dropped, and tried again (looked up
// first) once the lease is over.
func (w *Worker) stale(l *leases, p parked) bool {
	h, ok := l.current(p.ID)
	return !ok || time.Since(h.confirmed) > w.leaseFor()/2
}

// redrive leases due parked intents of consumer and sends them to jobs,
// when a tenant with due parked intents gives a slot back or parks one it
// has a slot for, and every DeferDelay, until ctx ends. Each job holds a
// slot of its tenant, which the worker gives back.
func (w *Worker) redrive(ctx context.Context, consumer string, slots *tenantSlots, l *leases, jobs chan<- parked) {
	w.scanParked(ctx, consumer, slots) // intents parked by a process gone
	// The scans go on while a lease round waits for workers.
	done := make(chan struct{})
	defer func() { <-done }()
	go func() {
		defer close(done)
		tick := time.NewTicker(w.cfg.DeferDelay)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				w.scanParked(ctx, consumer, slots)
				slots.signal()
			}
		}
	}()
	for {
		w.leaseParked(ctx, consumer, slots, l, jobs)
		select {
		case <-ctx.Done():
			return
		case <-slots.wake:
		}
	}
}

// scanParked refreshes which tenants have parked intents, and which of
// them have one due.
func (w *Worker) scanParked(ctx context.Context, consumer string, slots *tenantSlots) {
	slots.scanning(time.Now())
	rows, _ := w.db.Query(ctx, parkedTenantsSQL, consumer, maxParkedTenants)
	type tenant struct {
		ID  string
		Due bool
	}
	tenants, err := pgx.CollectRows(rows, pgx.RowToStructByPos[tenant])
	if err != nil {
		if ctx.Err() == nil {
			w.logger.WarnContext(ctx, "list tenants with parked intents; will try again", "consumer", consumer, "err", err)
		}
		return
	}
	due := make(map[string]bool, len(tenants))
	for _, t := range tenants {
		due[t.ID] = t.Due
	}
	slots.found(due, len(tenants) == maxParkedTenants)
}

// leaseParked leases due parked intents, up to Concurrency in all, one
// slot of a tenant at a time round the tenants with due parked intents and
// free slots (in a random order, so that none is always first), and hands
// them to jobs; a tenant that had fewer due than it was given slots for is
// not asked again until it parks one or a scan finds one due.
func (w *Worker) leaseParked(ctx context.Context, consumer string, slots *tenantSlots, l *leases, jobs chan<- parked) {
	for n := w.cfg.Concurrency; n > 0 && ctx.Err() == nil; {
		tenants := slots.dueTenants()
		rand.Shuffle(len(tenants), func(i, j int) { tenants[i], tenants[j] = tenants[j], tenants[i] })
		allotted := map[string]int{}
		for left := n; left > 0; {
			took := false
			for _, t := range tenants {
				if left > 0 && slots.acquire(t) {
					allotted[t]++
					left--
					took = true
				}
			}
			if !took {
				break
			}
		}
		if len(allotted) == 0 {
			return
		}
		names, counts := make([]string, 0, len(allotted)), make([]int32, 0, len(allotted))
		for t, k := range allotted {
			names, counts = append(names, t), append(counts, int32(k))
		}
		began := time.Now()
		rows, _ := w.db.Query(ctx, leaseParkedSQL, consumer, names, counts, w.leaseFor().Microseconds())
		leased, err := pgx.CollectRows(rows, pgx.RowToStructByPos[parked])
		if err != nil {
			// Rows leased before the error are tried again after their
			// lease.
			for t, k := range allotted {
				slots.giveBack(t, k)
			}
			if ctx.Err() == nil {
				w.logger.WarnContext(ctx, "lease parked intents; will try again", "consumer", consumer, "err", err)
			}
			return
		}
		started := leased[:0]
		for _, p := range leased {
			allotted[p.Tenant]--
			if l.hold(p, began) {
				started = append(started, p)
			} else {
				slots.giveBack(p.Tenant, 1) // its job is in hand already
			}
		}
		leased = started
		for t, k := range allotted {
			if k > 0 {
				slots.giveBack(t, k)
				slots.dry(t, began)
			}
		}
		for i, p := range leased {
			select {
			case jobs <- p:
			case <-ctx.Done():
				w.unlease(ctx, consumer, slots, l, leased[i:])
				return
			}
		}
		n -= len(leased)
	}
}

// unlease hands back leases never started (on shutdown), within
// unleaseTimeout: a lease left to expire is harmless.
func (w *Worker) unlease(ctx context.Context, consumer string, slots *tenantSlots, l *leases, ps []parked) {
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), unleaseTimeout)
	defer cancel()
	for _, p := range ps {
		attempts, ok := l.take(p.ID)
		if !ok {
			slots.giveBack(p.Tenant, 1)
			continue
		}
		if _, err := w.db.Exec(uctx, unleaseSQL, p.ID, attempts); err != nil {
			w.logger.WarnContext(ctx, "hand back a leased parked intent (its lease expires instead)", "consumer", consumer, "id", p.ID, "err", err)
		}
		slots.giveBack(p.Tenant, 1)
	}
}

// settleParked settles the leased parked intent p and writes the result to
// its row, under its lease. If an earlier attempt may have reached the
// provider, the charge or refund its key made is looked up first.
func (w *Worker) settleParked(ctx context.Context, consumer string, l *leases, p parked) {
	if w.stale(l, p) {
		l.take(p.ID)
		w.logger.WarnContext(ctx, "parked intent's lease lost or unconfirmed for half its length before a worker took it; it is tried again after the lease", "consumer", consumer, "id", p.ID)
		return
	}
	w.stats.redriven.Add(1)
	r := w.settle(ctx, consumer, p.Payload, p.Attempts > 1 || p.Old)
	failed := p.Failures + 1 // if this one failed
	if r.providerDown {
		failed = p.Failures // the provider's failures are not counted (exhausted)
	}
	// The result is written under this process's lease; renewals stop
	// here. One lost meanwhile writes nothing: the newer lease decides.
	fence, held := l.take(p.ID)
	if !held {
		w.logger.WarnContext(ctx, "a parked intent's lease ended before its result; the newer lease decides", "consumer", consumer, "id", p.ID, "verdict", r.verdict)
		return
	}
	var (
		tag pgconn.CommandTag
		err error
	)
	switch r.verdict {
	case done:
		if r.timing != nil && w.cfg.Observe != nil {
			w.cfg.Observe(consumer, *r.timing)
		}
		tag, err = w.db.Exec(ctx, parkedDoneSQL, p.ID, fence)
	case abandon: // its lease expires, and it is tried again (looked up first)
		w.logger.WarnContext(ctx, "parked intent abandoned before recording; it is tried again after its lease", "consumer", consumer, "id", p.ID, "err", r.err)
	case retry:
		if !w.exhausted(r, int(failed)) {
			// Every lease is an attempt: the backoff grows with them,
			// the provider's failures included.
			delay := w.backoff(uint64(max(failed, p.Attempts)))
			w.logger.WarnContext(ctx, "parked intent failed; retrying with the same key", "consumer", consumer, "id", p.ID,
				"failures", failed, "retry_in", delay, "err", r.err)
			tag, err = w.db.Exec(ctx, parkedAgainSQL, p.ID, fence, delay.Microseconds(), failed, postgres.Text(r.err.Error()))
			break
		}
		r.err = fmt.Errorf("still failing after %d failed deliveries: %w", failed, r.err)
		fallthrough
	case dead:
		w.stats.deadLettered(consumer)
		w.logger.ErrorContext(ctx, "parked intent dead-lettered", "consumer", consumer, "id", p.ID, "err", r.err)
		tag, err = w.db.Exec(ctx, parkedOpenSQL, p.ID, fence, failed, postgres.Text(r.err.Error()))
	}
	switch {
	case err != nil:
		w.logger.WarnContext(ctx, "record a parked intent's result (it is tried again after its lease, and found recorded)", "consumer", consumer, "id", p.ID, "err", err)
	case r.verdict != abandon && tag.RowsAffected() == 0:
		w.logger.WarnContext(ctx, "a parked intent's lease ended before its result; the newer lease decides", "consumer", consumer, "id", p.ID, "verdict", r.verdict)
	}
}
