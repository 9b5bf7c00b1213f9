package settle

import (
	"context"
	"testing"
	"time"

	"github.com/acme/orders/internal/testenv"
)

// A renewal moves every lease held forward and keeps each row's new token
// with its own id (RETURNING keeps no order), and drops a lease another
// lease took meanwhile: a result under it is never written.
func TestRenewMovesEachLeaseHeldAndDropsOneTakenOver(t *testing.T) {
	db := testenv.DB(t)
	ctx := context.Background()
	l := newLeases()
	ids := make([]int64, 5)
	for i := range ids {
		var p parked
		if err := db.QueryRow(ctx, `
INSERT INTO dead_letters (projection, tenant_id, stream_seq, subject, payload, error, deliveries, status, next_attempt_at)
VALUES ('payments', 'acme', $1, 's', '\x00', 'leased', 0, 'parked', now() + interval '2 seconds')
RETURNING id, next_attempt_at`, i+1).Scan(&p.ID, &p.Lease); err != nil {
			t.Fatal(err)
		}
		ids[i] = p.ID
		l.hold(p, time.Now())
	}
	// Another process's lease of the third (this one expired unrenewed).
	if _, err := db.Exec(ctx, `UPDATE dead_letters SET next_attempt_at = now() + interval '1 hour' WHERE id = $1`, ids[2]); err != nil {
		t.Fatal(err)
	}
	renewed, lost, err := l.renew(ctx, db, time.Minute, 5*time.Second)
	if err != nil || renewed != 4 || lost != 1 {
		t.Fatalf("renew: %d renewed, %d lost, err %v; want 4, 1, nil", renewed, lost, err)
	}
	for i, id := range ids {
		h, ok := l.current(id)
		if i == 2 {
			if ok {
				t.Fatalf("lease %d taken over by another is still held", id)
			}
			continue
		}
		var due time.Time
		if err := db.QueryRow(ctx, `SELECT next_attempt_at FROM dead_letters WHERE id = $1`, id).Scan(&due); err != nil {
			t.Fatal(err)
		}
		if !ok || !h.token.Equal(due) {
			t.Fatalf("lease %d: held %v (%v), row's next_attempt_at %v: want the row's", id, h.token, ok, due)
		}
		if time.Until(due) < 50*time.Second {
			t.Fatalf("lease %d renewed to %v, want about a minute from now", id, due)
		}
	}
	if token, ok := l.take(ids[2]); ok || !token.IsZero() {
		t.Fatalf("take of a lost lease: %v, %v; want the zero time and false", token, ok)
	}
}
