package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/acme/orders/internal/testenv"
	"github.com/acme/orders/outbox"
	"github.com/acme/orders/stream"
)

// Relays capped to share the partitions (8 on each of two) cover for each
// other: when one stops, the other takes its partitions beyond its cap, as
// no relay with room is left to, and publishes their events. Its cap was a
// wall before: the stopped relay's partitions stayed unpublished until it
// came back.
func TestCappedRelaysTakeOverAStoppedOnesPartitions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, js, _ := newPipeline(t, stream.Settings{})
	cfg := outbox.Config{TakeoverInterval: 50 * time.Millisecond, MaxPartitions: 8, Workers: 1}
	first, second := newRelay(t, db, js, cfg), newRelay(t, db, js, cfg)
	createOrders(t, db, 10, "a")
	relayAll(t, first)
	relayAll(t, second)
	if first.Stats().Partitions != 8 || second.Stats().Partitions != 8 {
		t.Fatalf("partitions: first %d, second %d; want 8 each", first.Stats().Partitions, second.Stats().Partitions)
	}

	stop(first)
	createOrders(t, db, 40, "b")
	testenv.Eventually(t, 10*time.Second, "the second relay took over and published", func() bool {
		if _, err := second.RelayBatch(ctx); err != nil {
			t.Fatal(err)
		}
		return unpublished(t, db) == 0
	})
	if n := second.Stats().Partitions; n != outbox.Partitions {
		t.Fatalf("the second relay owns %d partitions; want all %d", n, outbox.Partitions)
	}
}

// A relay at its cap leaves the partitions a stopped relay freed to a
// relay with room for them: it does not take them, however long they stay
// free, while such a relay wants more.
func TestARelayAtItsCapLeavesFreePartitionsToARelayWithRoom(t *testing.T) {
	t.Parallel()
	db, js, _ := newPipeline(t, stream.Settings{})
	const interval = 50 * time.Millisecond
	cfg := outbox.Config{TakeoverInterval: interval, MaxPartitions: 8, Workers: 1}
	first, second, third := newRelay(t, db, js, cfg), newRelay(t, db, js, cfg), newRelay(t, db, js, cfg)
	for _, r := range []*outbox.Relay{first, second, third} {
		relayAll(t, r) // the third finds none free: it stands by, with room
	}
	stop(first)
	for range 4 { // free on several looks in a row
		time.Sleep(interval)
		relayAll(t, second)
	}
	if n := second.Stats().Partitions; n != 8 {
		t.Fatalf("the relay at its cap owns %d partitions after the freed ones stayed free for %s; want its 8", n, 4*interval)
	}
	relayAll(t, third)
	if n := third.Stats().Partitions; n != 8 {
		t.Fatalf("the relay with room owns %d partitions; want the 8 the first relay freed", n)
	}
}

// A relay with room that has run nothing for two of its looks (its process
// frozen while its connection lives on) would never take what it wants: a
// relay at its cap takes the partitions a stopped relay freed instead, and
// gives them back once the frozen one runs again.
func TestARelayAtItsCapCoversForAFrozenRelayWithRoomUntilItWakes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, js, _ := newPipeline(t, stream.Settings{})
	cfg := outbox.Config{TakeoverInterval: 50 * time.Millisecond, PollInterval: 50 * time.Millisecond, MaxPartitions: 8, Workers: 1}
	first, second, frozen := newRelay(t, db, js, cfg), newRelay(t, db, js, cfg), newRelay(t, db, js, cfg)
	for _, r := range []*outbox.Relay{first, second, frozen} {
		relayAll(t, r)
	}
	stop(first)
	createOrders(t, db, 20, "a")
	testenv.Eventually(t, 10*time.Second, "the relay at its cap took over and published", func() bool {
		if _, err := second.RelayBatch(ctx); err != nil {
			t.Fatal(err)
		}
		return unpublished(t, db) == 0
	})
	if n := second.Stats().Partitions; n != outbox.Partitions {
		t.Fatalf("the relay at its cap owns %d partitions; want all %d", n, outbox.Partitions)
	}

	createOrders(t, db, 20, "b")
	testenv.Eventually(t, 10*time.Second, "the woken relay got its 8 partitions back and all was published", func() bool {
		for _, r := range []*outbox.Relay{frozen, second} {
			if _, err := r.RelayBatch(ctx); err != nil {
				t.Fatal(err)
			}
		}
		return frozen.Stats().Partitions == 8 && second.Stats().Partitions == 8 && unpublished(t, db) == 0
	})
}

// A relay that took partitions beyond its cap keeps them while no relay
// with room wants them, and gives them back when one starts: the two end up
// with their 8 each, each partition owned by one of them, and every event
// published. Both run as in production (Run), each with two workers.
func TestARelayOverItsCapGivesItsExtrasBackToARelayWithRoom(t *testing.T) {
	t.Parallel()
	db, js, _ := newPipeline(t, stream.Settings{})
	const interval = 50 * time.Millisecond
	cfg := outbox.Config{TakeoverInterval: interval, PollInterval: 20 * time.Millisecond, MaxPartitions: 8, Workers: 2}
	first, second, third := newRelay(t, db, js, cfg), newRelay(t, db, js, cfg), newRelay(t, db, js, cfg)
	createOrders(t, db, 10, "a")
	relayAll(t, first)
	relayAll(t, second)
	stop(first)
	run(t, second)
	testenv.Eventually(t, 10*time.Second, "the second relay took over the first one's partitions", func() bool {
		return second.Stats().Partitions == outbox.Partitions
	})
	time.Sleep(10 * interval)
	if n := second.Stats().Partitions; n != outbox.Partitions {
		t.Fatalf("the relay over its cap owns %d partitions while no relay wants them; want all %d", n, outbox.Partitions)
	}

	createOrders(t, db, 40, "b")
	run(t, third)
	createOrders(t, db, 40, "c")
	testenv.Eventually(t, 10*time.Second, "the relays own 8 partitions each and published every event", func() bool {
		return second.Stats().Partitions == 8 && third.Stats().Partitions == 8 && unpublished(t, db) == 0
	})
	if locked, holders := partitionLocks(t, db); locked != outbox.Partitions || holders != 4 {
		t.Fatalf("%d partitions locked by %d sessions; want all %d, by the relays' 4 workers", locked, holders, outbox.Partitions)
	}
	if published := first.Stats().Published + second.Stats().Published + third.Stats().Published; published != 90 {
		t.Fatalf("the relays published %d events; want the 90 created", published)
	}
}

// stop stops relay, whose lease connections RelayBatch opened: Run with an
// ended context closes them and returns.
func stop(relay *outbox.Relay) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	relay.Run(ctx)
}

// run runs relay until the test ends.
func run(t *testing.T, relay *outbox.Relay) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { relay.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

// partitionLocks returns how many partitions' locks are held in db's
// database, and by how many sessions.
func partitionLocks(t *testing.T, db *pgxpool.Pool) (partitions, sessions int) {
	t.Helper()
	err := db.QueryRow(context.Background(), `
SELECT count(DISTINCT objid), count(DISTINCT pid) FROM pg_locks
WHERE locktype = 'advisory' AND classid = $1 AND objsubid = 2 AND granted
  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`, outbox.AdvisoryClass).Scan(&partitions, &sessions)
	if err != nil {
		t.Fatal(err)
	}
	return partitions, sessions
}
