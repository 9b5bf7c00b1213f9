package outbox_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/acme/orders/internal/testenv"
	"github.com/acme/orders/outbox"
	"github.com/acme/orders/postgres"
	"github.com/acme/orders/stream"
)

// runRelay runs relay until the test ends and waits until it owns every
// partition.
func runRelay(t *testing.T, relay *outbox.Relay) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); relay.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	testenv.Eventually(t, 10*time.Second, "the relay owns every partition", func() bool {
		return relay.Stats().Partitions == outbox.Partitions
	})
}

// A create transaction sends no NOTIFY (migration 010 dropped the
// outbox_notify trigger): a NOTIFY inside a write transaction serialises
// every commit of the cluster.
func TestCreateTransactionSendsNoNotify(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.DB(t)
	pconn, err := db.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	conn := pconn.Hijack()
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "LISTEN outbox"); err != nil {
		t.Fatal(err)
	}
	createOrders(t, db, 3, "quiet")
	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	n, err := conn.WaitForNotification(wctx)
	if err == nil {
		t.Fatalf("got NOTIFY %s %q from a create transaction; want none", n.Channel, n.Payload)
	}
	if !errors.Is(err, context.DeadlineExceeded) && wctx.Err() == nil {
		t.Fatal(err)
	}
}

// A lost wake-up costs at most PollInterval: a relay that nobody wakes
// still publishes what commits, by polling.
func TestRelayWithoutWakeUpPublishesByPolling(t *testing.T) {
	t.Parallel()
	db, js, _ := newPipeline(t, stream.Settings{})
	relay := newRelay(t, db, js, outbox.Config{Workers: 1, PollInterval: 200 * time.Millisecond})
	runRelay(t, relay)
	createOrders(t, db, 5, "unwoken") // and no Wake, no NOTIFY
	testenv.Eventually(t, 10*time.Second, "the relay publishes the 5 events by polling", func() bool {
		return relay.Stats().Published == 5
	})
}

// Events committed by another process wake the relay through a Notifier's
// coalesced NOTIFY outbox, sent after the commit; without it (PollInterval
// an hour) they would wait.
func TestNotifierWakesARelayInAnotherProcess(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	db, js, _ := newPipeline(t, stream.Settings{})
	relay := newRelay(t, db, js, outbox.Config{Workers: 1, PollInterval: time.Hour})
	runRelay(t, relay)
	// The relay's listener wakes it once when it connects: that wake-up
	// must be over before the events commit, or it (not the notifier)
	// would publish them and the test pass for the wrong reason.
	testenv.Eventually(t, 10*time.Second, "the relay listens", func() bool {
		var n int
		err := db.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND query LIKE 'LISTEN %outbox%'`).Scan(&n)
		return err == nil && n > 0
	})
	time.Sleep(50 * time.Millisecond) // its empty claim, right after

	notifier, err := postgres.NewNotifier(db, slog.New(slog.NewTextHandler(io.Discard, nil)), postgres.NotifierConfig{Channel: "outbox"})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); notifier.Run(ctx) }()
	defer func() { cancel(); <-done }()

	createOrders(t, db, 2, "remote")
	notifier.Notify()
	testenv.Eventually(t, 10*time.Second, "the notified relay publishes both events", func() bool {
		return relay.Stats().Published == 2
	})
}

// Events that commit within Linger of a wake-up, while the relay is busy,
// go out in one atomic batch (one sync on a sync_interval: always server);
// an event alone goes out as one message.
func TestRelayLingerCoalescesCommitsIntoOneBatch(t *testing.T) {
	t.Parallel()
	db, js, _ := newPipeline(t, stream.Settings{})
	relay := newRelay(t, db, js, outbox.Config{Workers: 1, PollInterval: time.Hour, Linger: time.Second, MinAtomicBatch: 2})
	runRelay(t, relay)

	// Idle: the first event goes out alone. (The relay's listener wakes it
	// once more when it connects, which may come after this event and then
	// counts as a busy wake-up: only the batches are asserted here.)
	createOrders(t, db, 1, "first")
	relay.Wake()
	testenv.Eventually(t, 10*time.Second, "the first event is published", func() bool { return relay.Stats().Published == 1 })
	first := relay.Stats()
	if first.AtomicBatches != 0 {
		t.Fatalf("after the first event: %+v; want it published as one message, not as an atomic batch (a staging file for nats-server)", first)
	}

	// Busy now: a wake-up lingers, and the next commit joins the batch.
	createOrders(t, db, 1, "second")
	relay.Wake()
	createOrders(t, db, 1, "third")
	relay.Wake()
	testenv.Eventually(t, 10*time.Second, "both events are published", func() bool { return relay.Stats().Published == 3 })
	// The linger that gathered them may be one that began before them (the
	// listener's late wake-up, see above): at least one linger, not one more.
	if st := relay.Stats(); st.AtomicBatches != first.AtomicBatches+1 || st.Lingers < 1 {
		t.Fatalf("after two events within the linger: %+v (after the first: %+v); want one more atomic batch (the two in one) and a linger", st, first)
	}
}
