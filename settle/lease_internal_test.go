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
