package settle

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/acme/orders/postgres"
)

// renewLeasesSQL moves forward, to $3 µs from now, the lease of each
// parked intent $1[i] still under this process's lease (its attempts are
// still $2[i]), and returns the ids renewed. The rows are matched by id,
// never by position: RETURNING keeps no order.
const renewLeasesSQL = `
UPDATE dead_letters d
SET next_attempt_at = now() + $3::bigint * interval '1 microsecond'
FROM unnest($1::bigint[], $2::int[]) AS a(id, attempts)
WHERE d.id = a.id AND d.status = 'parked' AND d.attempts = a.attempts
RETURNING d.id`

// leases holds the leases of the parked intents this process has in hand,
// from the lease until the result is written (or the job dropped or handed
// back), and renews them every Lease/3 while it holds them. So a lease can
// be short, and an intent leased by a process that died waits only that
// long for another (it waited a fixed 2 min before, whatever its call
// took), while a call that outlasts any number of leases, or a job that
// waits long for a free worker, is not leased and sent again meanwhile.
//
// The lease is a fence: a result is written, and a lease renewed, only
// where the row's attempts are still what this lease made them. Every
// lease adds one (and a lease handed back unstarted takes it back), so
// another process's lease, taken once this one expired, makes this one's
// result and renewals write nothing. A renewal moves only the expiry
// (next_attempt_at), so one whose answer was lost, committed or not, loses
// nothing: the next one matches as well, and so does the result.
//
// An entry stays until its job takes it (or the job is handed back or
// dropped), lost or not, so that a lease of the same intent taken here
// again while its job is in hand is attached to that job (hold), never
// given a second one.
type leases struct {
	mu   sync.Mutex
	held map[int64]heldLease
}

type heldLease struct {
	attempts  int32     // the row's attempts under this lease
	confirmed time.Time // when the database last renewed it, by this process's clock
	lost      bool      // a renewal found the row's attempts moved on: another lease took it
}

func newLeases() *leases { return &leases{held: map[int64]heldLease{}} }

// hold starts holding the lease of p, taken at began. If this process
// holds p already (its lease expired unrenewed, through a database outage,
// and it was leased again here), the job in hand goes on under the new
// lease, and hold reports false: no second job.
func (l *leases) hold(p parked, began time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, again := l.held[p.ID] // lost or not: its job is still in hand
	l.held[p.ID] = heldLease{attempts: p.Attempts, confirmed: began}
	return !again
}

// current is p's lease and when it was last confirmed; ok is false once it
// is lost (another lease took the row: this one expired unrenewed).
func (l *leases) current(id int64) (h heldLease, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	h, ok = l.held[id]
	return h, ok && !h.lost
}

// take stops holding p's lease and returns its attempts, to write the
// result under; ok is false if it was lost.
func (l *leases) take(id int64) (attempts int32, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	h, ok := l.held[id]
	delete(l.held, id)
	if !ok || h.lost {
		return 0, false
	}
	return h.attempts, true
}

// renew renews every lease held, for lease from now, in one statement
// bounded by timeout. A lease the statement did not find (another lease
// took the row, or an operator resolved it) is lost: no longer renewed,
// and its result not written; its entry stays until its job takes it
// (hold). On an error nothing is marked lost,
// and the next renewal tries again; a lease not confirmed for half its
// length is not started (Worker.stale).
func (l *leases) renew(ctx context.Context, db postgres.DB, lease, timeout time.Duration) (renewed, lost int, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ids, attempts := make([]int64, 0, len(l.held)), make([]int32, 0, len(l.held))
	for id, h := range l.held {
		if !h.lost {
			ids, attempts = append(ids, id), append(attempts, h.attempts)
		}
	}
	if len(ids) == 0 {
		return 0, 0, nil
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	began := time.Now()
	rows, _ := db.Query(ctx, renewLeasesSQL, ids, attempts, lease.Microseconds())
	got, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return 0, 0, err
	}
	found := make(map[int64]bool, len(got))
	for _, id := range got {
		found[id] = true
	}
	for _, id := range ids {
		h := l.held[id]
		if found[id] {
			h.confirmed = began
		} else {
			h.lost = true
			lost++
		}
		l.held[id] = h
	}
	return len(got), lost, nil
}

// keepLeases renews the leases held every Lease/3 until ctx ends.
func (w *Worker) keepLeases(ctx context.Context, consumer string, l *leases) {
	every := w.leaseFor() / 3
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		_, lost, err := l.renew(ctx, w.db, w.leaseFor(), every)
		switch {
		case err != nil && ctx.Err() == nil:
			w.logger.WarnContext(ctx, "renew the leases of parked intents in hand; will try again", "consumer", consumer, "err", err)
		case lost > 0:
			w.logger.WarnContext(ctx, "leases of parked intents in hand were lost (they expired unrenewed; the newer lease decides)", "consumer", consumer, "lost", lost)
		}
	}
}
