package settle

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// renewLeasesSQL moves forward, by $3 µs from now, the lease of each
// parked intent $1[i] still under its lease $2[i] (its next_attempt_at),
// and returns each renewed one's new lease. The rows are matched by id,
// never by position: RETURNING keeps no order.
const renewLeasesSQL = `
UPDATE dead_letters d
SET next_attempt_at = now() + $3::bigint * interval '1 microsecond'
FROM unnest($1::bigint[], $2::timestamptz[]) AS a(id, lease)
WHERE d.id = a.id AND d.status = 'parked' AND d.next_attempt_at = a.lease
RETURNING d.id, d.next_attempt_at`

// leases holds the leases of the parked intents this process has in hand,
// from the lease until the result is written (or the job dropped or handed
// back), and renews them every Lease/3 while it holds them. So a lease can
// be short, and an intent leased by a process that died waits only that
// long for another (it waited a fixed 2 min before, whatever its call
// took), while a call that outlasts any number of leases, or a job that
// waits long for a free worker, is not leased and sent again meanwhile.
//
// The lease is a fence: a result is written only where the row's
// next_attempt_at is the lease in hand. Each renewal moves it, so the
// renewal and taking the token for the result are serialised by mu: take
// (under mu) either sees the renewed token or stops the renewal of that
// intent before it is sent.
type leases struct {
	mu   sync.Mutex
	held map[int64]heldLease
}

type heldLease struct {
	token     time.Time // the row's next_attempt_at under this lease
	confirmed time.Time // when the database last set it, by this process's clock
}

func newLeases() *leases { return &leases{held: map[int64]heldLease{}} }

// hold starts holding the lease of p, set at began.
func (l *leases) hold(p parked, began time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.held[p.ID] = heldLease{token: p.Lease, confirmed: began}
}

// current is p's lease token and when it was last confirmed; ok is false
// once it is lost (another lease took the row: this one expired unrenewed).
func (l *leases) current(id int64) (h heldLease, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	h, ok = l.held[id]
	return h, ok
}

// take stops holding p's lease and returns its token, to write the result
// under; ok is false if it was lost.
func (l *leases) take(id int64) (token time.Time, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	h, ok := l.held[id]
	delete(l.held, id)
	return h.token, ok
}

// renew renews every lease held, for lease from now, in one statement
// bounded by timeout. A lease the statement did not find under its token
// is lost and dropped: a result under it would not be written anyway. On
// an error nothing is dropped, and the next renewal tries again; a lease
// not confirmed for half its length is not started (Worker.stale).
func (l *leases) renew(ctx context.Context, db interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, lease, timeout time.Duration) (renewed, lost int, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.held) == 0 {
		return 0, 0, nil
	}
	ids, tokens := make([]int64, 0, len(l.held)), make([]time.Time, 0, len(l.held))
	for id, h := range l.held {
		ids, tokens = append(ids, id), append(tokens, h.token)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	began := time.Now()
	rows, _ := db.Query(ctx, renewLeasesSQL, ids, tokens, lease.Microseconds())
	type row struct {
		ID    int64
		Lease time.Time
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
	if err != nil {
		return 0, 0, err
	}
	found := make(map[int64]time.Time, len(got))
	for _, r := range got {
		found[r.ID] = r.Lease
	}
	for _, id := range ids {
		if t, ok := found[id]; ok {
			l.held[id] = heldLease{token: t, confirmed: began}
		} else {
			delete(l.held, id)
			lost++
		}
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
