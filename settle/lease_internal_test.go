package settle

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/acme/orders/internal/testenv"
)

// A renewal moves every lease held forward, matching each row by its own
// id (RETURNING keeps no order), and drops a lease another lease took
// meanwhile (its attempts moved on): a result under it is never written.
// A renewal whose answer was lost (committed, but the reply never came)
// loses nothing: the next one and the result still match.
func TestRenewMovesEachLeaseHeldAndDropsOneTakenOver(t *testing.T) {
	db := testenv.DB(t)
	ctx := context.Background()
	l := newLeases()
	ids := make([]int64, 5)
	for i := range ids {
		var p parked
		if err := db.QueryRow(ctx, `
INSERT INTO dead_letters (projection, tenant_id, stream_seq, subject, payload, error, deliveries, status, attempts, next_attempt_at)
VALUES ('payments', 'acme', $1, 's', '\x00', 'leased', 0, 'parked', 1, now() + interval '2 seconds')
RETURNING id, attempts`, i+1).Scan(&p.ID, &p.Attempts); err != nil {
			t.Fatal(err)
		}
		ids[i] = p.ID
		if !l.hold(p, time.Now()) {
			t.Fatalf("hold of %d reported it held already", p.ID)
		}
	}
	due := func(id int64) time.Time {
		var at time.Time
		if err := db.QueryRow(ctx, `SELECT next_attempt_at FROM dead_letters WHERE id = $1`, id).Scan(&at); err != nil {
			t.Fatal(err)
		}
		return at
	}
	// Another process's lease of the third (this one expired unrenewed).
	if _, err := db.Exec(ctx, `UPDATE dead_letters SET next_attempt_at = now() + interval '1 hour', attempts = attempts + 1 WHERE id = $1`, ids[2]); err != nil {
		t.Fatal(err)
	}
	// A renewal of the fourth that committed, its answer lost.
	if _, err := db.Exec(ctx, `UPDATE dead_letters SET next_attempt_at = now() + interval '40 seconds' WHERE id = $1`, ids[3]); err != nil {
		t.Fatal(err)
	}
	renewed, lost, err := l.renew(ctx, db, time.Minute, 5*time.Second)
	if err != nil || renewed != 4 || lost != 1 {
		t.Fatalf("renew: %d renewed, %d lost, err %v; want 4, 1, nil", renewed, lost, err)
	}
	for i, id := range ids {
		_, ok := l.current(id)
		if i == 2 {
			if ok {
				t.Fatalf("lease %d taken over by another is still held", id)
			}
			continue
		}
		if !ok || time.Until(due(id)) < 50*time.Second {
			t.Fatalf("lease %d: held %v, due %v; want held and renewed to about a minute from now", id, ok, due(id))
		}
	}
	if attempts, ok := l.take(ids[2]); ok || attempts != 0 {
		t.Fatalf("take of a lost lease: %d, %v; want 0 and false", attempts, ok)
	}
	attempts, ok := l.take(ids[3])
	tag, err := db.Exec(ctx, parkedDoneSQL, ids[3], attempts)
	if err != nil || !ok || tag.RowsAffected() != 1 {
		t.Fatalf("the result under a lease whose renewal answer was lost: held %v, %d rows, err %v; want written", ok, tag.RowsAffected(), err)
	}
	if err := db.QueryRow(ctx, `SELECT id FROM dead_letters WHERE id = $1`, ids[3]).Scan(new(int64)); !errors.Is(err, pgx.ErrNoRows) {
		t.Fatalf("row %d after its result: %v, want deleted", ids[3], err)
	}
}

// A process that leases again an intent whose job it still has in hand
// (its lease expired unrenewed) starts no second job: the one in hand goes
// on under the new lease.
func TestHoldingALeaseAgainStartsNoSecondJob(t *testing.T) {
	l := newLeases()
	if !l.hold(parked{ID: 7, Attempts: 1}, time.Now()) {
		t.Fatal("first hold reported held already")
	}
	if l.hold(parked{ID: 7, Attempts: 2}, time.Now()) {
		t.Fatal("second hold of the same intent reported a new job")
	}
	if attempts, ok := l.take(7); !ok || attempts != 2 {
		t.Fatalf("take: %d, %v; want the new lease's attempts 2", attempts, ok)
	}
}

// leaseOne leases the one due parked intent of tenant acme, as the
// re-drive does.
func leaseOne(t *testing.T, ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}) parked {
	t.Helper()
	rows, _ := q.Query(ctx, leaseParkedSQL, "payment_worker_charges", []string{"acme"}, []int32{1}, (30 * time.Second).Microseconds())
	ps, err := pgx.CollectRows(rows, pgx.RowToStructByPos[parked])
	if err != nil || len(ps) != 1 {
		t.Fatalf("lease: %v, %v", ps, err)
	}
	return ps[0]
}

// A lease a renewal found taken by another lease, taken here again while
// its job is still in hand, goes to that job: no second job, and the job
// writes under the new lease. Two ways there: this process's own lease
// statement racing its renewal after an outage, and another process's
// lease handed back unstarted (review).
func TestALeaseLostAndTakenAgainGoesToTheJobInHand(t *testing.T) {
	db := testenv.DB(t)
	ctx := context.Background()
	for _, way := range []string{"own lease racing the renewal", "another's lease handed back"} {
		l := newLeases()
		var id int64
		if err := db.QueryRow(ctx, `
INSERT INTO dead_letters (projection, tenant_id, stream_seq, subject, payload, error, deliveries, status, attempts, next_attempt_at)
VALUES ('payment_worker_charges', 'acme', 1, 's', '\x00', 'deferred', 0, 'parked', 0, now() - interval '1 second')
RETURNING id`).Scan(&id); err != nil {
			t.Fatal(err)
		}
		job := leaseOne(t, ctx, db)
		l.hold(job, time.Now())
		// Its lease expires unrenewed (a database outage).
		if _, err := db.Exec(ctx, `UPDATE dead_letters SET next_attempt_at = now() - interval '1 second' WHERE id = $1`, id); err != nil {
			t.Fatal(err)
		}
		var again parked
		if way == "own lease racing the renewal" {
			tx, err := db.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			again = leaseOne(t, ctx, tx) // not committed yet
			done := make(chan int)
			go func() {
				_, lost, _ := l.renew(ctx, db, 30*time.Second, 5*time.Second) // waits for the lease's row lock
				done <- lost
			}()
			for waiting, deadline := false, time.Now().Add(10*time.Second); !waiting; {
				if time.Now().After(deadline) {
					t.Fatal("the renewal never waited for the lease's row lock")
				}
				if err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%UPDATE dead_letters d%')`).Scan(&waiting); err != nil {
					t.Fatal(err)
				}
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if lost := <-done; lost != 1 {
				t.Fatalf("%s: the renewal lost %d leases, want 1", way, lost)
			}
		} else {
			other := leaseOne(t, ctx, db)
			if _, lost, err := l.renew(ctx, db, 30*time.Second, 5*time.Second); err != nil || lost != 1 {
				t.Fatalf("%s: renewal lost %d, err %v; want 1, nil", way, lost, err)
			}
			if _, err := db.Exec(ctx, unleaseSQL, id, other.Attempts); err != nil {
				t.Fatal(err)
			}
			again = leaseOne(t, ctx, db)
		}
		if l.hold(again, time.Now()) {
			t.Errorf("%s: the lease taken again started a second job while the first is in hand", way)
		}
		attempts, ok := l.take(id)
		if !ok || attempts != again.Attempts {
			t.Errorf("%s: the job in hand takes attempts %d (held %v), want the new lease's %d", way, attempts, ok, again.Attempts)
		}
	}
}
