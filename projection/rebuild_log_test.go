package projection

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/acme/orders/domain"
	"github.com/acme/orders/internal/testenv"
)

// logEventsSQL writes $1 order.created events of distinct new orders to the
// event log (the outbox), published, in one statement.
const logEventsSQL = `
INSERT INTO outbox (id, tenant_id, aggregate_id, aggregate_version, event_type, payload, published_at)
SELECT e, 't1', o, 1, 'order.created', jsonb_build_object(
    'id', e, 'type', 'order.created', 'schema_version', 1, 'tenant_id', 't1', 'aggregate_id', o,
    'aggregate_version', 1, 'occurred_at', now(),
    'data', jsonb_build_object('customer_id', 'c-' || (g % 1000), 'status', 'pending', 'currency', 'EUR',
        'items', jsonb_build_array(jsonb_build_object('sku', 's', 'quantity', 1, 'unit_price', 100, 'line_total', 100)),
        'total', 100, 'created_at', now())), now()
FROM (SELECT g, gen_random_uuid() AS e, gen_random_uuid() AS o FROM generate_series(1, $1) AS g) AS x`

// A rebuild reads the event log in seq order, each batch on from where the
// last ended. A transaction that took a lower seq can commit after that walk
// has passed it (seq is taken at insert, not at commit): the rebuild must
// still apply its event, or the swap would drop an order the live read
// model has. Its second walk, with the live runners held back, starts from
// the beginning of the log again.
func TestARebuildAppliesAnEventThatCommittedBehindItsWalk(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Config{})
	ctx := context.Background()

	// The late event takes the lowest seq of the log and commits last.
	late, err := f.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer late.Rollback(ctx) //nolint:errcheck
	lateOrder := uuid.Must(uuid.NewV7())
	env := createdEvent(t, lateOrder)
	payload, err := json.Marshal(env)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := late.Exec(ctx, `INSERT INTO outbox (id, tenant_id, aggregate_id, aggregate_version, event_type, payload, published_at)
VALUES ($1, $2, $3, $4, $5, $6, now())`, env.ID, env.TenantID, env.AggregateID, env.AggregateVersion, env.Type, payload); err != nil {
		t.Fatal(err)
	}
	const logged = 2*rebuildBatch + 500 // the first walk ends in its third batch
	if _, err := f.db.Exec(ctx, logEventsSQL, logged); err != nil {
		t.Fatal(err)
	}

	// A live batch holds the projection's lock shared, so the rebuild's
	// second walk waits for it; the late event commits meanwhile.
	live := f.holdLock(t, SharedLockSQL) // as a live batch
	type result struct {
		stats RebuildStats
		err   error
	}
	done := make(chan result, 1)
	go func() {
		st, err := f.runner.Rebuild(ctx)
		done <- result{st, err}
	}()
	eventually(t, "the rebuild's second walk waits for the projection's lock", func() bool {
		select {
		case r := <-done:
			t.Fatalf("the rebuild ended (%+v) while a live batch held the projection's lock", r)
		default:
		}
		return f.lockWaiters(t) == 1
	})
	if f.count(t, `SELECT count(*) FROM rebuild_order_views.inbox WHERE event_id = $1`, env.ID) != 0 {
		t.Fatal("the first walk applied an event that had not committed")
	}
	if err := late.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := live.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.stats.Events != logged+1 {
		t.Errorf("the rebuild applied %d events, want %d", r.stats.Events, logged+1)
	}
	if v, _ := f.view(t, lateOrder); v != 1 {
		t.Errorf("the late order's view is at version %d after the rebuild, want 1", v)
	}
	if n := f.count(t, `SELECT count(*) FROM order_views`); n != logged+1 {
		t.Errorf("%d order views after the rebuild, want %d", n, logged+1)
	}
}

// logEvent writes env to the event log (the outbox), published.
func (f fixture) logEvent(t *testing.T, env domain.Envelope) {
	t.Helper()
	b, err := json.Marshal(env)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.db.Exec(context.Background(), `INSERT INTO outbox (id, tenant_id, aggregate_id, aggregate_version, event_type, payload, published_at)
VALUES ($1, $2, $3, $4, $5, $6, now())`, env.ID, env.TenantID, env.AggregateID, env.AggregateVersion, env.Type, b); err != nil {
		t.Fatal(err)
	}
}

// An event the projection cannot apply (the live runner dead-letters it)
// is left out of a rebuild, with its order's later events, and counted;
// the rest of the log, every other tenant's included, is rebuilt.
func TestARebuildLeavesOutAnEventItCannotApply(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Config{})
	ctx := context.Background()

	poisoned := lifecycleEvents(t, "c-poison") // v1, v2, v3 of one order
	poisoned[0].TenantID = "evil"
	poisoned[0].Data = json.RawMessage(`{"status": 5}`)
	good := createdEvent(t, uuid.Must(uuid.NewV7()))
	for _, env := range append(poisoned, good) {
		f.logEvent(t, env)
	}
	if _, err := f.db.Exec(ctx, logEventsSQL, rebuildBatch+10); err != nil { // a second batch, with nothing wrong in it
		t.Fatal(err)
	}

	st, err := f.runner.Rebuild(ctx)
	if err != nil {
		t.Fatalf("one tenant's poison event failed the whole rebuild: %v", err)
	}
	if st.LeftOut != len(poisoned) || st.Events != rebuildBatch+10+1 {
		t.Errorf("rebuild stats %+v, want %d events and %d skipped (the poison event and its order's later ones)", st, rebuildBatch+11, len(poisoned))
	}
	// What the CLI prints: each left out, in seq order, with its reason
	// (they were only logged, and the CLI's logger discards).
	if len(st.FirstLeftOut) != min(len(poisoned), 10) || !strings.HasPrefix(st.FirstLeftOut[0], "seq ") ||
		!slices.IsSortedFunc(st.FirstLeftOut, func(a, b string) int { return cmp.Compare(seqOf(a), seqOf(b)) }) {
		t.Errorf("first left out %q: want %d, each \"seq N: why\", in seq order", st.FirstLeftOut, min(len(poisoned), 10))
	}
	if v, _ := f.view(t, good.AggregateID); v != 1 {
		t.Errorf("the good order's view is at version %d, want 1", v)
	}
	if n := f.count(t, `SELECT count(*) FROM order_views WHERE order_id = $1`, poisoned[0].AggregateID); n != 0 {
		t.Errorf("the poisoned order has %d view rows, want 0", n)
	}
}

// With relay retention on, the log may hold an order's later events without
// its first. The live read model has that order; the rebuild cannot build
// it, and a swap would replace the live rows with ones that lack it for
// good (the merged position and inbox keep its events from applying again).
// So the rebuild refuses, names the order, and changes nothing; an order the
// live model never applied either is no reason to refuse (the test above).
func TestARebuildRefusesToLoseAnOrderWhoseFirstEventWasPruned(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Config{})
	ctx := context.Background()

	straddling := lifecycleEvents(t, "c-straddle")
	var live []*event
	for _, env := range straddling {
		f.logEvent(t, env)
		b, err := json.Marshal(env)
		if err != nil {
			t.Fatal(err)
		}
		live = append(live, &event{data: b, deliveries: 1})
	}
	if err := f.runner.commit(ctx, decode(live)); err != nil {
		t.Fatal(err)
	}
	if _, err := f.db.Exec(ctx, `DELETE FROM outbox WHERE id = $1`, straddling[0].ID); err != nil { // retention pruned v1
		t.Fatal(err)
	}
	kept := createdEvent(t, uuid.Must(uuid.NewV7()))
	f.logEvent(t, kept)

	_, err := f.runner.Rebuild(ctx)
	if !errors.Is(err, ErrRebuildWouldLose) || !strings.Contains(err.Error(), straddling[0].AggregateID.String()) {
		t.Fatalf("rebuild: %v; want ErrRebuildWouldLose naming order %s", err, straddling[0].AggregateID)
	}
	if v, _ := f.view(t, straddling[0].AggregateID); v != int64(len(straddling)) {
		t.Errorf("the live view of the straddling order is at version %d after the refused rebuild, want %d", v, len(straddling))
	}
	if n := f.count(t, `SELECT count(*) FROM order_views WHERE order_id = $1`, kept.AggregateID); n != 0 {
		t.Errorf("the refused rebuild swapped in %d rows of the kept order", n)
	}
}

// An event discarded as a dead letter (its effect skipped for good, the
// position moved past it) is skipped by a rebuild too, so the order's later
// events, which the live projection applied after the discard, are rebuilt
// as well, and the rebuilt order equals the live one.
func TestARebuildSkipsADiscardedEventAsItsDiscardDid(t *testing.T) {
	t.Parallel()
	cfg := Config{Workers: 1, MaxDeliver: 2, RetryDelay: 10 * time.Millisecond, GapDelay: 10 * time.Millisecond}
	f := newFixture(t, cfg)
	ctx := context.Background()
	f.run(t)
	envs := lifecycleEvents(t, "c-discard")
	envs[1].Data = json.RawMessage(`{"status": 5}`) // v2 cannot be applied
	for _, e := range envs {
		f.logEvent(t, e)
		f.publish(t, e, e.ID.String())
	}
	eventually(t, "v2 is an open dead letter", func() bool {
		return f.count(t, `SELECT count(*) FROM dead_letters WHERE status = 'open' AND aggregate_version = 2`) == 1
	})
	var id int64
	if err := f.db.QueryRow(ctx, `SELECT id FROM dead_letters WHERE status = 'open'`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	if _, err := f.runner.DiscardDeadLetter(ctx, id); err != nil {
		t.Fatal(err)
	}
	// v3 may have been waiting for v2 as a gap, its delay doubling from
	// 10 ms each delivery up to 10.24 s (a loaded machine, -race, delivers
	// it often before v2 is dead-lettered): wait past that.
	testenv.Eventually(t, 30*time.Second, "v3 is applied after the discard", func() bool {
		v, _ := f.view(t, envs[0].AggregateID)
		return v == 3
	})
	st, err := f.runner.Rebuild(ctx)
	if err != nil {
		t.Fatalf("rebuild after a discard: %v", err)
	}
	if st.LeftOut != 0 || st.Events != len(envs)-1 {
		t.Errorf("rebuild stats %+v, want %d events and none left out", st, len(envs)-1)
	}
	if v, _ := f.view(t, envs[0].AggregateID); v != 3 {
		t.Errorf("the order's view is at version %d after the rebuild, want 3 (as live)", v)
	}
}

// An event discarded as a dead letter while the rebuild's walk ran, after
// the walk applied it: the swap would bring back the effect the operator
// discarded, so the rebuild refuses and says to run it again.
func TestARebuildRefusesWhenAnEventItAppliedIsDiscardedMeanwhile(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Config{})
	ctx := context.Background()
	env := createdEvent(t, uuid.Must(uuid.NewV7()))
	f.logEvent(t, env)

	// A live batch holds the projection's lock shared: the rebuild's walk
	// is done and its swap waits when the discard is made.
	live := f.holdLock(t, SharedLockSQL) // as a live batch
	done := make(chan error, 1)
	go func() {
		_, err := f.runner.Rebuild(ctx)
		done <- err
	}()
	eventually(t, "the rebuild's swap waits for the projection's lock", func() bool { return f.lockWaiters(t) == 1 })
	payload, err := json.Marshal(env)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.db.Exec(ctx, `INSERT INTO dead_letters (projection, tenant_id, event_id, aggregate_id, aggregate_version, stream_seq, subject, payload, error, deliveries, status, resolved_at)
VALUES ($1, $2, $3, $4, $5, 1, 'orders.order.created', $6, 'test', 1, 'discarded', now())`,
		f.runner.Name(), env.TenantID, env.ID, env.AggregateID, env.AggregateVersion, payload); err != nil {
		t.Fatal(err)
	}
	if err := live.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, ErrRebuildWouldLose) {
		t.Fatalf("rebuild: %v; want ErrRebuildWouldLose (an event it applied was discarded meanwhile)", err)
	}
}

// seqOf is N of "seq N: why".
func seqOf(s string) int64 {
	n, _ := strconv.ParseInt(strings.TrimPrefix(strings.SplitN(s, ":", 2)[0], "seq "), 10, 64)
	return n
}
