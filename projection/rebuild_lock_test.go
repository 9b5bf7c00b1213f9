package projection

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// A rebuild's swap holds the projection's lock exclusively so that no live
// batch commits between its last read of the event log and the swap. Every
// batch must wait for it, including a batch of brand-new orders, which have
// no position rows yet (a lock taken only when a position row matches would
// let such a batch slip past the swap, and the swap would then drop its
// effect while its inbox rows stayed).
func TestEveryBatchWaitsForARebuildSwap(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Config{})
	ctx := context.Background()

	swap := f.holdLock(t, `SELECT pg_advisory_xact_lock($1, hashtext($2))`) // as a rebuild's swap does

	orderID := uuid.Must(uuid.NewV7())
	data, err := json.Marshal(createdEvent(t, orderID))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- f.runner.commit(ctx, decode([]*event{{data: data, deliveries: 1}})) }()

	eventually(t, "the batch waits for the projection's lock", func() bool {
		select {
		case err := <-done:
			t.Fatalf("the batch committed (err %v) while a rebuild swap held the projection's lock", err)
		default:
		}
		return f.lockWaiters(t) == 1
	})
	if err := swap.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("the batch after the swap: %v", err)
	}
	if v, _ := f.view(t, orderID); v != 1 {
		t.Fatalf("view version %d, want 1", v)
	}
}

// lockWaiters is how many transactions wait for a projection's advisory
// lock (a batch behind a rebuild's swap, or a swap behind a batch).
func (f fixture) lockWaiters(t *testing.T) int {
	t.Helper()
	return f.count(t, `SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database
WHERE d.datname = current_database() AND l.locktype = 'advisory' AND NOT l.granted AND l.classid::bigint = $1`, AdvisoryClass)
}

// A dead letter's retry or discard takes the projection's lock shared, as
// a batch does, so it waits for a rebuild's swap, which reads the
// discarded events under the lock held exclusively.
func TestAResolutionWaitsForARebuildSwap(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Config{})
	ctx := context.Background()
	swap := f.holdLock(t, `SELECT pg_advisory_xact_lock($1, hashtext($2))`) // as a rebuild's swap does
	done := make(chan error, 1)
	go func() {
		_, err := f.runner.DiscardDeadLetter(ctx, 1) // no such dead letter: it finds that out after the lock
		done <- err
	}()
	eventually(t, "the discard waits for the projection's lock", func() bool {
		select {
		case err := <-done:
			t.Fatalf("the discard ended (%v) while a rebuild swap held the projection's lock", err)
		default:
		}
		return f.lockWaiters(t) == 1
	})
	if err := swap.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, ErrNoDeadLetter) {
		t.Fatalf("discard after the swap: %v, want ErrNoDeadLetter", err)
	}
}

// holdLock takes the projection's lock with sql (SharedLockSQL, as a batch,
// or the exclusive lock, as a rebuild's swap) in a transaction of its own,
// rolled back when the test ends if it has not been by then.
func (f fixture) holdLock(t *testing.T, sql string) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	tx, err := f.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	if _, err := tx.Exec(ctx, sql, AdvisoryClass, f.runner.Name()); err != nil {
		t.Fatal(err)
	}
	return tx
}

// One rebuild of a projection runs at a time. Two at once shared the
// shadow schema: the second's fresh tables took a batch of the first's
// walk, the second walked it again, and the swap counted it twice while
// both reported success. A second rebuild is now refused at once, leaving
// the first's shadow alone, and the lock is released when the first ends.
func TestOneRebuildOfAProjectionAtATime(t *testing.T) {
	t.Parallel()
	f := newFixtureFor(t, CustomerSummaries{}, Config{})
	ctx := context.Background()
	const logged = 2*rebuildBatch + 500
	if _, err := f.db.Exec(ctx, logEventsSQL, logged); err != nil {
		t.Fatal(err)
	}

	// The first rebuild walks the whole log, then waits at its swap
	// behind a live batch.
	live := f.holdLock(t, SharedLockSQL)
	first := make(chan error, 1)
	go func() {
		_, err := f.runner.Rebuild(ctx)
		first <- err
	}()
	eventually(t, "the first rebuild waits at its swap", func() bool {
		select {
		case err := <-first:
			t.Fatalf("the first rebuild ended (%v) while a live batch held the projection's lock", err)
		default:
		}
		return f.lockWaiters(t) == 1
	})

	// Another process's rebuild of the same projection is refused.
	other := mustRunner(t, f.db, nil, CustomerSummaries{}, slog.New(slog.NewTextHandler(io.Discard, nil)), Config{})
	soon, cancel := context.WithTimeout(ctx, 30*time.Second) // without the lock it would wait at the swap
	_, err := other.Rebuild(soon)
	cancel()
	if !errors.Is(err, ErrRebuildRunning) {
		t.Fatalf("a second rebuild while one runs: %v, want ErrRebuildRunning", err)
	}

	if err := live.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-first; err != nil {
		t.Fatalf("the first rebuild: %v", err)
	}
	pending := func() int {
		return f.count(t, `SELECT coalesce(sum(orders_pending), 0)::int FROM customer_summaries`)
	}
	if n := pending(); n != logged {
		t.Fatalf("customer summaries count %d pending orders, the log holds %d", n, logged)
	}

	// Its lock went with it: the next rebuild runs, and counts the same.
	if _, err := other.Rebuild(ctx); err != nil {
		t.Fatalf("a rebuild after the first ended: %v", err)
	}
	if n := pending(); n != logged {
		t.Fatalf("after a second rebuild: %d pending orders, the log holds %d", n, logged)
	}
}
