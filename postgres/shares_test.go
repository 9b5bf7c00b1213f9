package postgres_test

import (
	"context"
	"errors"
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
	shares, err := postgres.NewShares(db, 1)
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
