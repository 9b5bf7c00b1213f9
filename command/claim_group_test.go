package command_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/acme/orders/command"
	"github.com/acme/orders/internal/testenv"
)

// groupCreates returns a function that creates an order of tenant under
// key through CreateOrderHandler.Run, as the api does, with ctx.
func groupCreates(idem *command.Idempotency) func(ctx context.Context, tenant, key string) (command.Result, error) {
	create := command.NewCreateOrderHandler()
	return func(ctx context.Context, tenant, key string) (command.Result, error) {
		cmd := command.CreateOrder{TenantID: tenant, Key: key, NewOrder: newOrder("c-1")}
		return create.Run(ctx, idem, command.OrderRequest[command.CreateOrder]{
			TenantID: tenant, Scope: "POST /v1/orders", Key: key, Wait: 5 * time.Second, Command: cmd}, render)
	}
}

// holdKey inserts tenant's key row in a transaction it leaves open, so
// that a claim of that key waits for it; release ends it (rolled back).
func holdKey(t *testing.T, db *pgxpool.Pool, tenant, key string) (release func()) {
	t.Helper()
	tx, err := db.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(context.Background(), command.KeyInsert, tenant, "POST /v1/orders", key, []byte("fp"), command.FingerprintVersion,
		[]byte(`{}`), 3600, 2); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release = func() { once.Do(func() { _ = tx.Rollback(context.Background()) }) }
	t.Cleanup(release)
	return release
}

// heldGroup returns a test database and an Idempotency whose create group
// has one slot, batches of maxBatch (0: the default) and batches that wait
// up to 10 s for a lock, so that a held key holds the slot.
func heldGroup(t *testing.T, maxBatch int) (*pgxpool.Pool, *command.Idempotency, func(ctx context.Context, tenant, key string) (command.Result, error)) {
	t.Helper()
	db := testenv.DB(t)
	idem := newIdem(t, db, command.IdempotencyConfig{KeyQuotaRefresh: time.Hour, GroupSlots: 1, GroupMaxBatch: maxBatch})
	command.HoldGroupBatches(idem, "10s")
	return db, idem, groupCreates(idem)
}

// waitingForLock waits until a backend of db waits for a lock (the batch
// in flight, waiting for a held key).
func waitingForLock(t *testing.T, db *pgxpool.Pool) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, "a batch waits for the held key", func() bool {
		return count(t, db, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`) > 0
	})
}

// Concurrent creates commit in groups, and each exactly once: 300
// requests under 150 keys (every key sent twice at once) leave 150 orders,
// 150 events and 150 key rows, and both requests of a key get the same
// answer. Fewer batches than creates committed: they were grouped.
func TestConcurrentCreatesCommitInGroupsEachOnce(t *testing.T) {
	t.Parallel()
	db := testenv.DB(t)
	idem := newIdem(t, db, command.IdempotencyConfig{KeyQuotaRefresh: time.Hour, GroupSlots: 2, GroupMaxBatch: 16})
	create := groupCreates(idem)
	const keys = 150
	results := make([]command.Result, 2*keys)
	errs := make([]error, 2*keys)
	var wg sync.WaitGroup
	for i := range 2 * keys {
		wg.Go(func() {
			results[i], errs[i] = create(context.Background(), fmt.Sprintf("t%d", i%3), fmt.Sprintf("k%d", i%keys))
		})
	}
	wg.Wait()
	for i := range keys {
		a, b := results[i], results[i+keys]
		if errs[i] != nil || errs[i+keys] != nil {
			t.Fatalf("key k%d: %v, %v", i, errs[i], errs[i+keys])
		}
		if a.Status != http.StatusCreated || string(a.Body) != string(b.Body) || a.Replayed == b.Replayed {
			t.Fatalf("key k%d answered %d %s (replayed %v) and %d %s (replayed %v); want one 201 and its replay",
				i, a.Status, a.Body, a.Replayed, b.Status, b.Body, b.Replayed)
		}
	}
	for table, want := range map[string]int{"orders": keys, "outbox": keys, "idempotency_keys": keys} {
		if n := count(t, db, "SELECT count(*) FROM "+table); n != want {
			t.Errorf("%d rows in %s, want %d", n, table, want)
		}
	}
	st := idem.GroupStats()
	if st.Grouped+st.Alone < keys || st.Batches >= st.Grouped {
		t.Fatalf("group stats %+v: want the %d creates committed in fewer batches than creates", st, keys)
	}
}

// A create whose statement fails in its batch (its key created an order
// before, and its row expired) fails only its own tenant's creates: the
// batch is sent again without them and commits the others' at once. The
// failing tenant's go alone, to their usual answers, and so do its next
// creates for a while, so that its failures cannot stall every batch.
func TestACreateThatFailsInItsBatchFailsOnlyItself(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, idem, create := heldGroup(t, 0)
	if r, err := create(ctx, "t1", "old"); err != nil || r.Status != http.StatusCreated {
		t.Fatalf("first create of old: %+v %v", r, err)
	}
	if _, err := db.Exec(ctx, `DELETE FROM idempotency_keys WHERE key = 'old'`); err != nil { // as the janitor would
		t.Fatal(err)
	}

	// The group's one slot waits for a held key, while the next batch queues.
	release := holdKey(t, db, "t1", "held")
	var wg sync.WaitGroup
	var held command.Result
	var heldErr error
	wg.Go(func() { held, heldErr = create(ctx, "t1", "held") })
	waitingForLock(t, db)
	results := make([]command.Result, 11)
	errs := make([]error, 11)
	for i := range results {
		tenant, key := "t2", fmt.Sprintf("k%d", i)
		if i == 5 {
			tenant, key = "t1", "old"
		}
		wg.Go(func() { results[i], errs[i] = create(ctx, tenant, key) })
	}
	testenv.Eventually(t, 10*time.Second, "11 creates queued", func() bool { return command.GroupQueued(idem) == 11 })
	before := idem.GroupStats()
	release()
	wg.Wait()

	if heldErr != nil || held.Status != http.StatusCreated {
		t.Fatalf("create of the held key after its holder rolled back: %+v %v", held, heldErr)
	}
	for i, r := range results {
		want := http.StatusCreated
		if i == 5 {
			want = http.StatusConflict // the key created an order before
		}
		if errs[i] != nil || r.Status != want || r.Replayed {
			t.Fatalf("create %d: %d %s %v; want a fresh %d", i, r.Status, r.Body, errs[i], want)
		}
	}
	st := idem.GroupStats()
	if got := (command.ClaimGroupStats{Batches: st.Batches - before.Batches, Grouped: st.Grouped - before.Grouped, Alone: st.Alone - before.Alone, Failed: st.Failed - before.Failed}); got != (command.ClaimGroupStats{Batches: 2, Grouped: 11, Alone: 1, Failed: 1}) {
		t.Fatalf("group did %+v; want the held key's batch and the ten others' committed, the failing one alone", got)
	}
	if n := count(t, db, `SELECT count(*) FROM orders`); n != 12 {
		t.Fatalf("%d orders, want 12 (old, held and ten)", n)
	}

	before = idem.GroupStats()
	for _, tenant := range []string{"t1", "t2"} {
		if r, err := create(ctx, tenant, "next"); err != nil || r.Status != http.StatusCreated {
			t.Fatalf("%s's next create: %+v %v", tenant, r, err)
		}
	}
	st = idem.GroupStats()
	if got := (command.ClaimGroupStats{Batches: st.Batches - before.Batches, Grouped: st.Grouped - before.Grouped, Alone: st.Alone - before.Alone, Failed: st.Failed - before.Failed}); got != (command.ClaimGroupStats{Batches: 1, Grouped: 1, Alone: 1}) {
		t.Fatalf("group did %+v; want the failing tenant's next create alone, the other's grouped", got)
	}
}

// A request that ends while its create waits in the group's queue is never
// sent: its key stays free, and the group goes on with the others.
func TestACreateWithdrawnFromTheQueueWritesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, idem, create := heldGroup(t, 0)
	release := holdKey(t, db, "t1", "held")
	var wg sync.WaitGroup
	wg.Go(func() { _, _ = create(ctx, "t1", "held") })
	waitingForLock(t, db)

	gone, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { _, err := create(gone, "t1", "gone"); done <- err }()
	testenv.Eventually(t, 10*time.Second, "the create queued", func() bool { return command.GroupQueued(idem) == 1 })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("withdrawn create: %v; want context.Canceled", err)
	}
	if n := command.GroupQueued(idem); n != 0 {
		t.Fatalf("%d creates still queued after the withdrawal", n)
	}
	release()
	wg.Wait()
	if n := count(t, db, `SELECT count(*) FROM idempotency_keys WHERE key = 'gone'`); n != 0 {
		t.Fatalf("the withdrawn create's key was stored")
	}
	if r, err := create(ctx, "t1", "gone"); err != nil || r.Status != http.StatusCreated || r.Replayed {
		t.Fatalf("the withdrawn key's retry: %+v %v; want a fresh 201", r, err)
	}
}

// A tenant whose create failed a batch has its other queued creates taken
// out of the queue and sent alone at once: four failing creates queued in
// batches of two fail one batch, not four.
func TestAStruckTenantsQueuedCreatesGoAlone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, idem, create := heldGroup(t, 2)
	for i := range 4 {
		if r, err := create(ctx, "t1", fmt.Sprintf("old%d", i)); err != nil || r.Status != http.StatusCreated {
			t.Fatalf("first create of old%d: %+v %v", i, r, err)
		}
	}
	if _, err := db.Exec(ctx, `DELETE FROM idempotency_keys`); err != nil { // as the janitor would
		t.Fatal(err)
	}
	release := holdKey(t, db, "t0", "held")
	var wg sync.WaitGroup
	wg.Go(func() { _, _ = create(ctx, "t0", "held") })
	waitingForLock(t, db)
	statuses := make([]int, 8)
	for i := range 4 {
		wg.Go(func() { r, _ := create(ctx, "t1", fmt.Sprintf("old%d", i)); statuses[i] = r.Status })
		wg.Go(func() { r, _ := create(ctx, "t2", fmt.Sprintf("k%d", i)); statuses[4+i] = r.Status })
	}
	testenv.Eventually(t, 10*time.Second, "8 creates queued", func() bool { return command.GroupQueued(idem) == 8 })
	before := idem.GroupStats()
	release()
	wg.Wait()
	for i, st := range statuses {
		if want := map[bool]int{true: http.StatusConflict, false: http.StatusCreated}[i < 4]; st != want {
			t.Fatalf("create %d answered %d, want %d", i, st, want)
		}
	}
	if failed := idem.GroupStats().Failed - before.Failed; failed != 1 {
		t.Fatalf("%d batches failed; want 1: the struck tenant's queued creates must not fail more", failed)
	}
}
