package projection

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/acme/orders/domain"
	"github.com/acme/orders/stream"
)

// parkedRow writes env to dead_letters with status, as the runner does when
// it defers (parked) or dead-letters (open) an event.
func (f fixture) parkedRow(t *testing.T, env domain.Envelope, status, reason string, deliveries uint64) int64 {
	t.Helper()
	data, err := json.Marshal(env)
	if err != nil {
		t.Fatal(err)
	}
	e := &event{subject: stream.Subject(env.Type), data: data, env: env, deliveries: deliveries}
	if err := f.runner.deadLetter(context.Background(), f.db, e, status, reason, 0); err != nil {
		t.Fatal(err)
	}
	var id int64
	if err := f.db.QueryRow(context.Background(), `SELECT id FROM dead_letters WHERE event_id = $1`, env.ID).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

// A parked (deferred) v1 of an order, and its v2 on the stream waiting for
// it: v2 reaches its last delivery long before v1 is due again (the gap
// backoff is faster than the retry backoff). v2 must wait behind v1, not
// become an open dead letter that locks v1 out; then the runner re-drives
// v1 and v2, each applied once, in order.
func TestGapBehindAParkedPredecessorWaitsForIt(t *testing.T) {
	t.Parallel()
	cfg := Config{Workers: 1, MaxDeliver: 3, GapDelay: 10 * time.Millisecond,
		RetryDelay: 500 * time.Millisecond, RedriveInterval: 50 * time.Millisecond}
	f := newFixture(t, cfg)
	evs := orderEvents(t, "t1", "c-1")
	v1, v2 := evs[0], evs[1]
	f.parkedRow(t, v1, statusParked, "deferred: tenant t1 holds its share of the consumer's window; failed 1 times", 1)
	f.publish(t, v2, v2.ID.String())
	f.run(t)

	eventually(t, "v1 and v2 are applied", func() bool {
		return f.count(t, `SELECT count(*) FROM order_views WHERE order_id = $1 AND version = 2`, v1.AggregateID) == 1
	})
	if n := f.count(t, `SELECT count(*) FROM inbox WHERE aggregate_id = $1`, v1.AggregateID); n != 2 {
		t.Fatalf("inbox rows of the order = %d, want 2 (each event once)", n)
	}
	if n := f.count(t, `SELECT count(*) FROM dead_letters WHERE status <> 'retried'`); n != 0 {
		t.Fatalf("%d dead letters not resolved as retried", n)
	}
	if s := f.runner.Stats(); s.DeadLettered != 0 {
		t.Fatalf("stats = %+v: something was dead-lettered", s)
	}
}

// An open dead letter holds back only the parked events of its order that
// come after it: a parked earlier version (left by a runner before this
// rule) is re-driven and applied.
func TestOpenLaterVersionDoesNotHoldBackAParkedEarlierOne(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Config{RetryDelay: time.Millisecond})
	evs := orderEvents(t, "t1", "c-1")
	f.parkedRow(t, evs[0], statusParked, "deferred: test", 1)
	f.parkedRow(t, evs[1], statusOpen, "version 2 never became applicable (version 1 missing) in 10 deliveries", 10)
	ctx := context.Background()
	eventually(t, "v1 is re-driven", func() bool {
		n, err := f.runner.redrive(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return n == 1
	})
	if v, _ := f.view(t, evs[0].AggregateID); v != 1 {
		t.Fatalf("view version = %d, want 1", v)
	}
	if n := f.count(t, `SELECT count(*) FROM dead_letters WHERE event_id = $1 AND status = 'retried'`, evs[0].ID); n != 1 {
		t.Fatal("v1's row is not marked retried")
	}
}

// Nor does it hold back an earlier version that comes from the stream late.
// v5 is opened as never applicable while v3 and v4 are missing; v4 comes
// (a gap: it waits for v3, it is not parked behind v5, which would leave it
// out of reach: v5 can be neither retried, with v3 missing, nor discarded,
// not being next), then v3. The order reaches v4, and a retry of v5 then
// applies it.
func TestOpenLaterVersionDoesNotHoldBackALateEarlierOne(t *testing.T) {
	t.Parallel()
	cfg := Config{Workers: 1, MaxDeliver: 1, AckWait: time.Second, RetryDelay: 10 * time.Millisecond,
		GapDelay: 10 * time.Millisecond, RedriveInterval: 50 * time.Millisecond}
	f := newFixture(t, cfg)
	order := uuid.Must(uuid.NewV7())
	v := []domain.Envelope{createdEvent(t, order)}
	for i := int64(2); i <= 5; i++ {
		e := v[0]
		e.ID, e.Type, e.AggregateVersion = uuid.Must(uuid.NewV7()), "order.noted", i
		e.OccurredAt = v[0].OccurredAt.Add(time.Duration(i) * time.Second)
		e.Data = json.RawMessage(`{"note":"n"}`)
		v = append(v, e)
	}
	publish := func(version int) { f.publish(t, v[version-1], v[version-1].ID.String()) }
	f.run(t)
	publish(1)
	publish(2)
	at := func(version int) bool {
		return f.count(t, `SELECT count(*) FROM order_views WHERE order_id = $1 AND version = $2`, order, version) == 1
	}
	eventually(t, "v2 applied", func() bool { return at(2) })
	publish(5)
	eventually(t, "v5 opened", func() bool {
		return f.count(t, `SELECT count(*) FROM dead_letters WHERE event_id = $1 AND status = 'open'`, v[4].ID) == 1
	})
	publish(4)
	eventually(t, "v4 waits for v3", func() bool {
		return f.count(t, `SELECT count(*) FROM dead_letters WHERE event_id = $1 AND status = 'parked'`, v[3].ID) == 1
	})
	var reason string
	if err := f.db.QueryRow(context.Background(), `SELECT error FROM dead_letters WHERE event_id = $1`, v[3].ID).Scan(&reason); err != nil {
		t.Fatal(err)
	} else if reason == reasonBehindOpen {
		t.Fatalf("v4 parked behind the open v5: %q", reason)
	}
	publish(3)
	eventually(t, "v3 and v4 applied", func() bool { return at(4) })
	var dead int64
	if err := f.db.QueryRow(context.Background(), `SELECT id FROM dead_letters WHERE event_id = $1`, v[4].ID).Scan(&dead); err != nil {
		t.Fatal(err)
	}
	if _, err := f.runner.RetryDeadLetter(context.Background(), dead); err != nil {
		t.Fatalf("retry of v5 after v4: %v", err)
	}
	if !at(5) {
		t.Fatal("the view is not at v5 after the retry of v5")
	}
}

// A row parked behind an open dead letter that an operator resolved while
// the row was being written (the resolution's wake of the order's parked
// successors ran before it existed) is released, not left with no next
// attempt for ever.
func TestARowParkedBehindAResolvedDeadLetterIsReleased(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Config{RedriveInterval: 10 * time.Millisecond, RetryDelay: time.Millisecond})
	evs := orderEvents(t, "t1", "c-1")
	data, err := json.Marshal(evs[0])
	if err != nil {
		t.Fatal(err)
	}
	e := &event{subject: stream.Subject(evs[0].Type), data: data, env: evs[0], deliveries: 1}
	if err := f.runner.deadLetter(context.Background(), f.db, e, statusParked, reasonBehindOpen, noAttempt); err != nil {
		t.Fatal(err)
	}
	f.run(t)
	eventually(t, "the orphan is re-driven", func() bool {
		return f.count(t, `SELECT count(*) FROM dead_letters WHERE event_id = $1 AND status = 'retried'`, evs[0].ID) == 1
	})
	if v, _ := f.view(t, evs[0].AggregateID); v != 1 {
		t.Fatalf("view version = %d, want 1", v)
	}
}

// A parked row whose payload is no event cannot be re-driven: it becomes an
// open dead letter with a reason, instead of being selected again forever.
func TestUndecodableParkedRowIsOpened(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Config{RetryDelay: time.Millisecond})
	ctx := context.Background()
	junk := &event{subject: "orders.x", data: []byte(`{"id":`), undecodable: true, seq: 7, deliveries: 1}
	if err := f.runner.deadLetter(ctx, f.db, junk, statusParked, "deferred: test", 0); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond) // due
	if n, err := f.runner.redrive(ctx); err != nil || n != 1 {
		t.Fatalf("redrive = %d, %v; want 1 taken", n, err)
	}
	var status, reason string
	if err := f.db.QueryRow(ctx, `SELECT status, error FROM dead_letters`).Scan(&status, &reason); err != nil {
		t.Fatal(err)
	}
	if status != statusOpen || !strings.Contains(reason, "not an event") {
		t.Fatalf("undecodable parked row: status %q, reason %q; want open, not an event", status, reason)
	}
	if n, err := f.runner.redrive(ctx); err != nil || n != 0 {
		t.Fatalf("second redrive = %d, %v; want nothing taken", n, err)
	}
}

// The re-drive query reads due parked rows by their next attempt, through
// the index on parked rows: never a sequential scan, and never a walk past
// the rows that are not due (many deferred ones waiting for their backoff,
// many parked behind open dead letters).
func TestRedriveQueryUsesTheDueIndex(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Config{})
	ctx := context.Background()
	if _, err := f.db.Exec(ctx, `
INSERT INTO dead_letters (projection, tenant_id, event_id, aggregate_id, aggregate_version, stream_seq,
                          subject, payload, error, deliveries, status, next_attempt_at)
SELECT p, 't1', gen_random_uuid(), gen_random_uuid(), 2, i, 'orders.x', '\x00', 'deferred: test', 1, 'parked',
       CASE WHEN i % 1000 = 0 THEN now() - interval '1 second'    -- due
            WHEN i % 3 = 0 THEN NULL                               -- behind an open dead letter
            ELSE now() + interval '1 hour' END                     -- backing off
FROM generate_series(1, 30000) AS i, unnest(ARRAY['order_views', 'daily_sales']) AS p;
ANALYZE dead_letters`); err != nil {
		t.Fatal(err)
	}
	rows, err := f.db.Query(ctx, `EXPLAIN SELECT id, subject, payload, stream_seq, deliveries FROM dead_letters WHERE `+redriveClause,
		"order_views", DefaultBatchSize)
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	plan := strings.Join(lines, "\n")
	if strings.Contains(plan, "Seq Scan on dead_letters") || !strings.Contains(plan, "dead_letters_parked_due") ||
		!regexp.MustCompile(`Index Cond: .*next_attempt_at <= now\(\)`).MatchString(plan) {
		t.Fatalf("the re-drive query does not read due rows by dead_letters_parked_due:\n%s", plan)
	}
}

// A gap whose predecessor is parked (deferred past its tenant's share) parks
// behind it on its first delivery: it does not hold a slot of the broker's
// window while the predecessor waits in dead_letters. The re-drive then
// applies both, in order.
func TestGapParksBehindAParkedPredecessorAtOnce(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Config{Workers: 1, GapDelay: time.Minute, RetryDelay: time.Hour})
	evs := orderEvents(t, "t1", "c-1")
	v1, v2 := evs[0], evs[1]
	f.parkedRow(t, v1, statusParked, "deferred: test", 1)
	f.publish(t, v2, v2.ID.String())
	f.run(t)

	eventually(t, "v2 is parked behind v1 and acked", func() bool {
		return f.count(t, `SELECT count(*) FROM dead_letters WHERE event_id = $1 AND status = 'parked'`, v2.ID) == 1 &&
			f.runner.Stats().Parked == 1 // counted once the batch committed
	})
	if s := f.runner.Stats(); s.Gaps != 0 || s.Parked != 1 {
		t.Fatalf("stats = %+v; want v2 parked on its first delivery, no gap redelivery", s)
	}
	ctx := context.Background()
	if _, err := f.db.Exec(ctx, `UPDATE dead_letters SET next_attempt_at = now() WHERE event_id = $1`, v1.ID); err != nil {
		t.Fatal(err)
	}
	eventually(t, "v1 and v2 are re-driven and applied", func() bool {
		return f.count(t, `SELECT count(*) FROM order_views WHERE order_id = $1 AND version = 2`, v1.AggregateID) == 1
	})
	if n := f.count(t, `SELECT count(*) FROM dead_letters WHERE status <> 'retried'`); n != 0 {
		t.Fatalf("%d dead letters not resolved as retried", n)
	}
}

// A predecessor that fails transiently keeps being redelivered with the
// retry backoff (1 s doubling to a minute by default), which outlasts the
// gap backoff of its successor (0.5 s doubling to 30 s). The successor must
// not give up on it: at its last delivery it is parked, waiting, and
// re-driven once the predecessor is applied; never an open dead letter that
// holds the order back after both could be applied. (Found by `make faults
// SEED=505`: a v6 dead-lettered during PostgreSQL restarts while its v5 was
// still retrying.)
func TestGapOutlivesItsPredecessorsRetries(t *testing.T) {
	t.Parallel()
	cfg := Config{Workers: 1, MaxDeliver: 4, GapDelay: 10 * time.Millisecond,
		RetryDelay: 100 * time.Millisecond, RedriveInterval: 50 * time.Millisecond}
	f := newFixture(t, cfg)
	var v1Failures atomic.Int32
	f.runner = mustRunner(t, f.db, f.js, failingProjection{OrderViews{}, func(e domain.Envelope) error {
		if e.AggregateVersion == 1 && v1Failures.Add(1) <= 3 {
			return errors.New("connection reset by peer") // transient
		}
		return nil
	}}, slog.New(slog.NewTextHandler(testLogOutput(), nil)), cfg)
	evs := orderEvents(t, "t1", "c-1")
	for _, e := range evs[:2] {
		f.publish(t, e, e.ID.String())
	}
	f.run(t)

	eventually(t, "v1 and v2 are applied", func() bool {
		return f.count(t, `SELECT count(*) FROM order_views WHERE order_id = $1 AND version = 2`, evs[0].AggregateID) == 1
	})
	if n := f.count(t, `SELECT count(*) FROM inbox WHERE aggregate_id = $1`, evs[0].AggregateID); n != 2 {
		t.Fatalf("inbox rows of the order = %d, want 2 (each event once)", n)
	}
	if n := f.count(t, `SELECT count(*) FROM dead_letters WHERE status <> 'retried'`); n != 0 {
		t.Fatalf("%d dead letters not resolved as retried", n)
	}
	if s := f.runner.Stats(); s.DeadLettered != 0 {
		t.Fatalf("stats = %+v: something was dead-lettered", s)
	}
}

// A successor parked waiting for its predecessor stays parked while the
// predecessor may still be redelivered (within the runner's redelivery
// horizon, counted from when it was parked), and only past it becomes an
// open dead letter that says which version never came.
func TestWaitingGapIsOpenedOnlyPastTheHorizon(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Config{RetryDelay: time.Millisecond})
	ctx := context.Background()
	v2 := orderEvents(t, "t1", "c-1")[1]
	id := f.parkedRow(t, v2, statusParked, "waiting for version 1", uint64(DefaultMaxDeliver))
	if n, err := f.runner.redrive(ctx); err != nil || n != 1 {
		t.Fatalf("redrive = %d, %v; want 1 taken", n, err)
	}
	var status, reason string
	var due bool
	read := func() {
		t.Helper()
		if err := f.db.QueryRow(ctx, `SELECT status, error, next_attempt_at IS NOT NULL FROM dead_letters WHERE id = $1`, id).Scan(&status, &reason, &due); err != nil {
			t.Fatal(err)
		}
	}
	read()
	if status != statusParked || !due || !strings.Contains(reason, "waiting for version 1") {
		t.Fatalf("within the horizon: status %q, reason %q, on a clock %v; want parked, waiting for version 1, on a clock", status, reason, due)
	}
	if _, err := f.db.Exec(ctx, `UPDATE dead_letters SET created_at = now() - $2::bigint * interval '1 microsecond', next_attempt_at = now() WHERE id = $1`,
		id, (f.runner.predecessorHorizon() + time.Second).Microseconds()); err != nil {
		t.Fatal(err)
	}
	if n, err := f.runner.redrive(ctx); err != nil || n != 1 {
		t.Fatalf("redrive = %d, %v; want 1 taken", n, err)
	}
	read()
	if status != statusOpen || !strings.Contains(reason, "never became applicable (version 1 missing)") {
		t.Fatalf("past the horizon: status %q, reason %q; want open, version 1 missing", status, reason)
	}
}

// A parked event's age is the database's: now() - created_at, both its
// clock. The projector's own clock (time.Since of the stored created_at)
// was minutes off on a host whose clock ran ahead, and a waiting event's
// predecessor was called missing while it was still being redelivered.
// Inside one transaction now() stands still while the wall clock moves on,
// so an age read from the wall clock shows here as the sleep added to it.
func TestAParkedEventsAgeIsTheDatabases(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Config{})
	ctx := context.Background()
	v2 := orderEvents(t, "t1", "c-1")[1]
	id := f.parkedRow(t, v2, statusParked, "waiting for version 1", uint64(DefaultMaxDeliver))
	tx, err := f.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `UPDATE dead_letters SET created_at = now() - interval '10 seconds' WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT pg_sleep(1.5)`); err != nil { // the wall clock moves on, now() does not
		t.Fatal(err)
	}
	events, err := storedEvents(ctx, tx, `id = $1`, id)
	if err != nil || len(events) != 1 {
		t.Fatalf("stored events: %v, %d", err, len(events))
	}
	if got := events[0].parkedFor; got != 10*time.Second {
		t.Fatalf("parked for %s, want 10s: the age is not the database's own", got)
	}
}
