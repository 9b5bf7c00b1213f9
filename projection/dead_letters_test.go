package projection

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/acme/orders/domain"
	"github.com/acme/orders/stream"
)

// A poison event (here: a read-model constraint it breaks, standing for a
// bug in the projection) is dead-lettered on its first delivery, since no
// retry can fix a constraint violation; the
// same order's later events park behind it; other orders keep flowing; and
// once the cause is fixed, retry applies the poison event and the parked
// ones, in order.
func TestPoisonEventIsDeadLetteredAndItsAggregateParked(t *testing.T) {
	t.Parallel()
	cfg := Config{Workers: 1, MaxDeliver: 3, RetryDelay: 10 * time.Millisecond, GapDelay: 10 * time.Millisecond}
	f := newFixture(t, cfg)
	ctx := context.Background()
	if _, err := f.db.Exec(ctx, `ALTER TABLE order_views ADD CONSTRAINT no_poison CHECK (customer_id <> 'poison')`); err != nil {
		t.Fatal(err)
	}
	f.run(t)

	poison, healthy := lifecycleEvents(t, "poison"), lifecycleEvents(t, "healthy")
	f.publish(t, poison[0], poison[0].ID.String())
	eventually(t, "the poison event is dead-lettered", func() bool {
		return f.count(t, `SELECT count(*) FROM dead_letters WHERE status = 'open'`) == 1
	})
	for _, e := range append(poison[1:], healthy...) {
		f.publish(t, e, e.ID.String())
	}
	eventually(t, "the healthy order is applied and the poisoned one's later events are parked", func() bool {
		var v int64
		_ = f.db.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM order_views WHERE customer_id = 'healthy'`).Scan(&v)
		return v == 3 && f.count(t, `SELECT count(*) FROM dead_letters WHERE status = 'parked'`) == 2
	})
	var id int64
	var deliveries int
	var reason string
	if err := f.db.QueryRow(ctx, `SELECT id, deliveries, error FROM dead_letters WHERE status = 'open'`).Scan(&id, &deliveries, &reason); err != nil {
		t.Fatal(err)
	}
	if deliveries != 1 || reason == "" {
		t.Fatalf("dead letter after %d deliveries, reason %q; want 1 and the error", deliveries, reason)
	}
	if n := f.count(t, `SELECT count(*) FROM order_views WHERE customer_id = 'poison'`); n != 0 {
		t.Fatal("a poisoned order's event was applied out of order")
	}

	if _, err := f.runner.RetryDeadLetter(ctx, id); err == nil {
		t.Fatal("retry succeeded while the cause is still there")
	}
	if _, err := f.db.Exec(ctx, `ALTER TABLE order_views DROP CONSTRAINT no_poison`); err != nil {
		t.Fatal(err)
	}
	applied, err := f.runner.RetryDeadLetter(ctx, id)
	if err != nil || applied != 3 {
		t.Fatalf("retry applied %d events, err %v; want 3", applied, err)
	}
	var status string
	var version int64
	if err := f.db.QueryRow(ctx, `SELECT status, version FROM order_views WHERE customer_id = 'poison'`).Scan(&status, &version); err != nil {
		t.Fatal(err)
	}
	if status != "shipped" || version != 3 {
		t.Fatalf("after retry the poisoned order is %s v%d, want shipped v3", status, version)
	}
	if n := f.count(t, `SELECT count(*) FROM dead_letters WHERE status IN ('open', 'parked')`); n != 0 {
		t.Fatalf("%d dead letters still unresolved", n)
	}
	if _, err := f.runner.RetryDeadLetter(ctx, id); err == nil {
		t.Fatal("a resolved dead letter was retried again")
	}
}

// Discard skips a dead letter for good: the order's position moves past it
// and the events parked behind it are applied.
func TestDiscardSkipsTheDeadLetterAndReleasesItsParkedEvents(t *testing.T) {
	t.Parallel()
	cfg := Config{Workers: 1, MaxDeliver: 2, RetryDelay: 10 * time.Millisecond, GapDelay: 10 * time.Millisecond}
	f := newFixture(t, cfg)
	ctx := context.Background()
	// The paid event (v2) is the poison here: paid_at may not be set.
	if _, err := f.db.Exec(ctx, `ALTER TABLE order_views ADD CONSTRAINT no_payments CHECK (paid_at IS NULL)`); err != nil {
		t.Fatal(err)
	}
	f.run(t)
	envs := lifecycleEvents(t, "c-d")
	for _, e := range envs {
		f.publish(t, e, e.ID.String())
	}
	eventually(t, "v2 is dead-lettered and v3 parked", func() bool {
		return f.count(t, `SELECT count(*) FROM dead_letters WHERE status = 'open' AND aggregate_version = 2`) == 1 &&
			f.count(t, `SELECT count(*) FROM dead_letters WHERE status = 'parked' AND aggregate_version = 3`) == 1
	})
	var id int64
	if err := f.db.QueryRow(ctx, `SELECT id FROM dead_letters WHERE status = 'open'`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	applied, err := f.runner.DiscardDeadLetter(ctx, id)
	if err != nil || applied != 1 {
		t.Fatalf("discard applied %d, err %v; want the parked v3", applied, err)
	}
	var status string
	var version int64
	var paidAt *time.Time
	if err := f.db.QueryRow(ctx, `SELECT status, version, paid_at FROM order_views WHERE order_id = $1`, envs[0].AggregateID).Scan(&status, &version, &paidAt); err != nil {
		t.Fatal(err)
	}
	if status != "shipped" || version != 3 || paidAt != nil {
		t.Fatalf("after discard: %s v%d paid_at %v; want shipped v3 without the discarded payment", status, version, paidAt)
	}
}

// A retry settles each parked event by its own row, whatever order the rows
// were stored in: parked v4 and v2 behind an open v1, v3 missing. The retry
// applies v1 and v2, marks exactly their rows retried, and leaves v4 parked.
func TestRetryMarksEachParkedEventByItsOwnRow(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		order []int64 // versions of the parked rows, in storage order
	}{
		{"v4 stored before v2", []int64{4, 2}},
		{"v2 stored before v4", []int64{2, 4}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, Config{})
			ctx := context.Background()
			// Without the index (a plan that does not use it) the rows come
			// back in storage order, not version order.
			if _, err := f.db.Exec(ctx, `DROP INDEX dead_letters_unresolved`); err != nil {
				t.Fatal(err)
			}
			envs := lifecycleEvents(t, "c-order")
			v4 := envs[2]
			v4.ID, v4.Type, v4.AggregateVersion = uuid.Must(uuid.NewV7()), "order.noted", 4
			v4.Data = json.RawMessage(`{"note":"fragile"}`)
			byVersion := map[int64]domain.Envelope{1: envs[0], 2: envs[1], 4: v4}
			store := func(v int64, status string) int64 {
				t.Helper()
				env := byVersion[v]
				data, err := json.Marshal(env)
				if err != nil {
					t.Fatal(err)
				}
				e := &event{subject: stream.Subject(env.Type), data: data, seq: uint64(v), deliveries: 1, env: env}
				if err := f.runner.deadLetter(ctx, f.db, e, status, "test", noAttempt); err != nil {
					t.Fatal(err)
				}
				var id int64
				if err := f.db.QueryRow(ctx, `SELECT max(id) FROM dead_letters`).Scan(&id); err != nil {
					t.Fatal(err)
				}
				return id
			}
			open := store(1, statusOpen)
			ids := map[int64]int64{}
			for _, v := range tc.order {
				ids[v] = store(v, statusParked)
			}

			applied, err := f.runner.RetryDeadLetter(ctx, open)
			if err != nil || applied != 2 {
				t.Fatalf("retry applied %d, err %v; want v1 and v2", applied, err)
			}
			for v, want := range map[int64]string{2: statusRetried, 4: statusParked} {
				var status string
				if err := f.db.QueryRow(ctx, `SELECT status FROM dead_letters WHERE id = $1`, ids[v]).Scan(&status); err != nil {
					t.Fatal(err)
				}
				if status != want {
					t.Errorf("v%d's row is %s, want %s", v, status, want)
				}
			}
			if v, _ := f.view(t, envs[0].AggregateID); v != 2 {
				t.Fatalf("view at v%d, want v2", v)
			}
		})
	}
}

// Two poison versions of one order in a row: v2 is an open dead letter and
// v3 is parked behind it. Discarding v2 must not fail on v3: v3 becomes an
// open dead letter of its own, which the CLI can then resolve, and the
// order is not stuck.
func TestAParkedEventThatFailsDoesNotUndoTheResolutionBeforeIt(t *testing.T) {
	t.Parallel()
	cfg := Config{Workers: 1, MaxDeliver: 2, RetryDelay: 10 * time.Millisecond, GapDelay: 10 * time.Millisecond}
	f := newFixture(t, cfg)
	ctx := context.Background()
	f.run(t)
	envs := lifecycleEvents(t, "c-poison")
	envs[1].Data = json.RawMessage(`{"status": 5}`)
	envs[2].Data = json.RawMessage(`{"status": 6}`)
	for _, e := range envs {
		f.publish(t, e, e.ID.String())
	}
	eventually(t, "v2 is dead-lettered and v3 parked", func() bool {
		return f.count(t, `SELECT count(*) FROM dead_letters WHERE status = 'open' AND aggregate_version = 2`) == 1 &&
			f.count(t, `SELECT count(*) FROM dead_letters WHERE status = 'parked' AND aggregate_version = 3`) == 1
	})
	var v2 int64
	if err := f.db.QueryRow(ctx, `SELECT id FROM dead_letters WHERE status = 'open'`).Scan(&v2); err != nil {
		t.Fatal(err)
	}
	if _, err := f.runner.DiscardDeadLetter(ctx, v2); err != nil {
		t.Fatalf("discard v2: %v", err)
	}
	var v3 int64
	if err := f.db.QueryRow(ctx, `SELECT id FROM dead_letters WHERE status = 'open' AND aggregate_version = 3`).Scan(&v3); err != nil {
		t.Fatalf("v3 is not an open dead letter after v2's discard: %v", err)
	}
	if _, err := f.runner.DiscardDeadLetter(ctx, v3); err != nil {
		t.Fatalf("discard v3: %v", err)
	}
	if n := f.count(t, `SELECT count(*) FROM dead_letters WHERE status IN ('open', 'parked')`); n != 0 {
		t.Errorf("%d dead letters unresolved, want 0", n)
	}
	if v, _ := f.view(t, envs[0].AggregateID); v != 1 {
		t.Errorf("view at version %d, want 1 (v2 and v3 discarded)", v)
	}
}

// A rebuild after a projection bug was fixed applies the dead-lettered v2
// and the v3 parked behind it. A discard of v2 then is refused with the
// advice that works (retry), not "resolve the earlier version first"
// (there is none); marked discarded, v2 would be skipped by the next
// rebuild though this read model holds it. The retry resolves both
// without applying anything twice.
func TestADiscardOfADeadLetterARebuildAppliedSaysRetry(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Config{})
	ctx := context.Background()
	evs := orderEvents(t, "t1", "c-1")
	for _, e := range evs {
		f.logEvent(t, e)
	}
	open := f.parkedRow(t, evs[1], statusOpen, "permanent failure (no retry can fix it): bug", 1)
	f.parkedRow(t, evs[2], statusParked, reasonBehindOpen, 1)
	if _, err := f.db.Exec(ctx, `UPDATE dead_letters SET next_attempt_at = NULL WHERE status = 'parked'`); err != nil {
		t.Fatal(err)
	}
	if _, err := f.runner.Rebuild(ctx); err != nil {
		t.Fatal(err)
	}
	last := evs[len(evs)-1].AggregateVersion
	if v := f.count(t, `SELECT version FROM order_views WHERE order_id = $1`, evs[0].AggregateID); int64(v) != last {
		t.Fatalf("view at version %d after the rebuild, want %d", v, last)
	}
	_, err := f.runner.DiscardDeadLetter(ctx, open)
	if err == nil || !strings.Contains(err.Error(), "retry it instead") {
		t.Fatalf("discard of a dead letter the rebuild applied: %v, want the advice to retry it", err)
	}
	if n, err := f.runner.RetryDeadLetter(ctx, open); err != nil || n != 0 {
		t.Fatalf("retry: %d applied, %v; want 0 (both applied by the rebuild)", n, err)
	}
	if n := f.count(t, `SELECT count(*) FROM dead_letters WHERE status IN ('open', 'parked')`); n != 0 {
		t.Fatalf("%d dead letters still open or parked after the retry", n)
	}
	if v := f.count(t, `SELECT version FROM order_views WHERE order_id = $1`, evs[0].AggregateID); int64(v) != last {
		t.Fatalf("view at version %d after the retry, want %d", v, last)
	}
}
