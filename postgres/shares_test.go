package postgres_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/acme/orders/internal/testenv"
	"github.com/acme/orders/postgres"
)

// A tenant's share: a request holding it runs its other statements on it
// (no request waits on itself); a second request of the tenant waits until
// the first gives it back, or gives up with its context; another tenant and
// statements of no tenant are not held up; and every way a statement ends
// (Scan, rows read to the end or closed, a batch closed, commit, rollback)
// gives the share back.
func TestSharesBoundEachTenantsStatements(t *testing.T) {
	t.Parallel()
	db := testenv.DB(t)
	shares, err := postgres.NewShares(db, 4, 1)
	if err != nil {
		t.Fatal(err)
	}
	bg := context.Background()
	req := func() context.Context { return postgres.ForTenant(bg, "t1") }

	first := req()
	tx, err := shares.Begin(first)
	if err != nil {
		t.Fatal(err)
	}
	var one int
	if err := shares.QueryRow(first, `SELECT 1`).Scan(&one); err != nil || one != 1 {
		t.Fatalf("the request's own statement while it holds the share: %d, %v", one, err)
	}
	waitCtx, cancel := context.WithTimeout(req(), 100*time.Millisecond)
	defer cancel()
	if err := shares.QueryRow(waitCtx, `SELECT 1`).Scan(&one); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a second request of t1 while the first holds its share: %v; want it to wait, then give up", err)
	}
	if err := shares.QueryRow(postgres.ForTenant(bg, "t2"), `SELECT 1`).Scan(&one); err != nil {
		t.Fatalf("another tenant: %v", err)
	}
	if _, err := shares.Exec(bg, `SELECT 1`); err != nil {
		t.Fatalf("no tenant: %v", err)
	}
	if got := shares.Held("t1"); got != 1 {
		t.Fatalf("t1 holds %d, want 1", got)
	}
	if err := tx.Commit(first); err != nil {
		t.Fatal(err)
	}
	_ = tx.Rollback(first) // as a deferred rollback does: gives back nothing twice

	ways := map[string]func(ctx context.Context) error{
		"rows read to the end": func(ctx context.Context) error {
			rows, err := shares.Query(ctx, `SELECT generate_series(1, 3)`)
			if err != nil {
				return err
			}
			_, err = pgx.CollectRows(rows, pgx.RowTo[int32])
			return err
		},
		"rows closed early": func(ctx context.Context) error {
			rows, err := shares.Query(ctx, `SELECT generate_series(1, 3)`)
			if err != nil {
				return err
			}
			rows.Next()
			rows.Close()
			return nil
		},
		"batch": func(ctx context.Context) error {
			b := &pgx.Batch{}
			b.Queue(`SELECT 1`)
			return shares.SendBatch(ctx, b).Close()
		},
		"exec": func(ctx context.Context) error { _, err := shares.Exec(ctx, `SELECT 1`); return err },
		"rollback": func(ctx context.Context) error {
			tx, err := shares.Begin(ctx)
			if err != nil {
				return err
			}
			return tx.Rollback(ctx)
		},
		"failed statement": func(ctx context.Context) error {
			_, _ = shares.Exec(ctx, `SELECT nonsense`)
			return nil
		},
	}
	// A statement that gave up waiting for the share reads its error
	// from its rows, as pgxpool's callers do (they were nil: a panic).
	holder, err := shares.Begin(first)
	if err != nil {
		t.Fatal(err)
	}
	gaveUp, cancelWait := context.WithTimeout(req(), 50*time.Millisecond)
	rows, _ := shares.Query(gaveUp, `SELECT 1`)
	if _, err := pgx.CollectRows(rows, pgx.RowTo[int32]); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("rows of a statement that gave up waiting: %v", err)
	}
	cancelWait()
	if err := holder.Rollback(first); err != nil {
		t.Fatal(err)
	}

	for name, way := range ways {
		if err := way(req()); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		ctx, cancel := context.WithTimeout(req(), 2*time.Second)
		err := shares.QueryRow(ctx, `SELECT 1`).Scan(&one)
		cancel()
		if err != nil || shares.Held("t1") != 0 {
			t.Fatalf("after %s: the next request %v, t1 holds %d; want the share back", name, err, shares.Held("t1"))
		}
	}
}

// Tenants together: two busy tenants never take the connections a third
// needs (the last conns-share go only to a tenant that holds none), and a
// connection given back goes to the waiting tenant that holds the fewest,
// not to the one that waited longest. Before, each tenant's share was
// bounded alone: two tenants at their share took every connection.
func TestSharesKeepConnectionsForTenantsThatHoldNone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := postgres.Open(ctx, testenv.DatabaseURL(t), 8, 10*time.Second, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	const conns, share = 6, 4 // the last 2 only for a tenant that holds none
	shares, err := postgres.NewShares(pool, conns, share)
	if err != nil {
		t.Fatal(err)
	}
	// Whatever the test ends with, every transaction ends before the pool
	// closes (it waits for them).
	var (
		mu      sync.Mutex
		opened  []pgx.Tx
		waiters sync.WaitGroup
	)
	waitCtx, stopWaiting := context.WithCancel(ctx)
	t.Cleanup(func() {
		stopWaiting()
		waiters.Wait()
		for _, tx := range opened {
			_ = tx.Rollback(ctx)
		}
	})
	open := func(ctx context.Context, tenant string) (pgx.Tx, error) {
		tx, err := shares.Begin(postgres.ForTenant(ctx, tenant))
		if err == nil {
			mu.Lock()
			opened = append(opened, tx)
			mu.Unlock()
		}
		return tx, err
	}
	begin := func(tenant string) pgx.Tx {
		t.Helper()
		tctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		tx, err := open(tctx, tenant)
		if err != nil {
			t.Fatalf("%s: a connection at once: %v", tenant, err)
		}
		return tx
	}
	// wait begins a transaction of tenant that has to wait for a slot.
	wait := func(tenant string) <-chan pgx.Tx {
		t.Helper()
		got := make(chan pgx.Tx, 1)
		before := shares.Waiting(tenant)
		waiters.Go(func() {
			tx, err := open(waitCtx, tenant)
			if err != nil && waitCtx.Err() == nil {
				t.Errorf("%s: %v", tenant, err)
			}
			got <- tx
		})
		testenv.Eventually(t, 5*time.Second, tenant+"'s request waits", func() bool { return shares.Waiting(tenant) == before+1 })
		return got
	}
	end := func(tx pgx.Tx) {
		t.Helper()
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
	}
	granted := func(what string, got <-chan pgx.Tx) pgx.Tx {
		t.Helper()
		select {
		case tx := <-got:
			return tx
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: not granted", what)
			return nil
		}
	}
	held := func(want map[string]int) {
		t.Helper()
		for tenant, n := range want {
			if got := shares.Held(tenant); got != n {
				t.Errorf("%s holds %d, want %d", tenant, got, n)
			}
		}
	}

	var t1 []pgx.Tx
	for range share {
		t1 = append(t1, begin("t1"))
	}
	t1Next := wait("t1") // past its share
	t2 := begin("t2")
	t2Next := wait("t2") // 5 held: t2 holds one, the last 2 are not its
	t3 := begin("t3")    // holds none: takes one of the last 2
	t4 := wait("t4")     // all 6 held
	held(map[string]int{"t1": 4, "t2": 1, "t3": 1, "t4": 0})

	end(t1[0]) // 5 held: only a tenant that holds none may take the 6th
	t4tx := granted("t4, holding none, after t1 gave one back", t4)
	held(map[string]int{"t1": 3, "t2": 1, "t4": 1})
	end(t1[1])
	end(t4tx) // 4 held: still none for t1 or t2, each holding some
	held(map[string]int{"t1": 2, "t2": 1, "t4": 0})
	if n := shares.Waiting("t1") + shares.Waiting("t2"); n != 2 {
		t.Fatalf("%d of t1's and t2's requests wait, want 2", n)
	}

	end(t3) // 3 held: t2 holds the fewest, and gets it though t1 waited longer
	t2tx := granted("t2, holding the fewest, after t3 gave one back", t2Next)
	held(map[string]int{"t1": 2, "t2": 2})
	if n := shares.Waiting("t1"); n != 1 {
		t.Fatalf("%d of t1's requests wait, want 1", n)
	}
	end(t2tx)
	end(t2)
	t1tx := granted("t1, after t2 gave its back", t1Next)
	held(map[string]int{"t1": 3, "t2": 0})
	end(t1tx)
	for _, tx := range t1[2:] {
		end(tx)
	}
	held(map[string]int{"t1": 0, "t2": 0, "t3": 0, "t4": 0})
}
