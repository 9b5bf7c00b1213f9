package outbox_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/acme/orders/command"
	"github.com/acme/orders/domain"
	"github.com/acme/orders/internal/invariant"
	"github.com/acme/orders/internal/testenv"
	"github.com/acme/orders/outbox"
	"github.com/acme/orders/postgres"
	"github.com/acme/orders/projection"
	"github.com/acme/orders/stream"
)

func TestRelayPublishesOnceAndRepublishIsAbsorbed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, js, s := newPipeline(t, stream.Settings{})

	const n = 25
	create := command.NewCreateOrderHandler()
	for i := range n {
		err := postgres.InTx(ctx, db, func(tx pgx.Tx) error {
			_, err := create.Handle(ctx, tx, command.CreateOrder{
				TenantID: "t1", Key: "k" + string(rune('a'+i)),
				NewOrder: domain.NewOrder{CustomerID: "c", Currency: "EUR", Lines: []domain.Line{{SKU: "s", Quantity: 1, UnitPrice: 1}}},
			})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}

	relay := newRelay(t, db, js, outbox.Config{BatchSize: 10, Workers: 1, MinAtomicBatch: 2})
	for {
		claimed, err := relay.RelayBatch(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if claimed == 0 {
			break
		}
	}
	var unpublished int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE published_at IS NULL`).Scan(&unpublished); err != nil {
		t.Fatal(err)
	}
	if unpublished != 0 || relay.Stats().Published != n {
		t.Fatalf("unpublished = %d, stats = %+v; want 0 and %d published", unpublished, relay.Stats(), n)
	}
	if st := relay.Stats(); st.AtomicBatches != 3 || st.Fallbacks != 0 {
		t.Fatalf("stats = %+v; want 3 atomic batches (10 + 10 + 5 rows), no fallback", st)
	}

	// Every message carries its event id as Nats-Msg-Id, in outbox order.
	rows, _ := db.Query(ctx, `SELECT id::text FROM outbox ORDER BY seq`)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	for i, id := range ids {
		msg, err := s.GetMsg(ctx, uint64(i+1))
		if err != nil {
			t.Fatal(err)
		}
		if got := msg.Header.Get(jetstream.MsgIDHeader); got != id {
			t.Fatalf("message %d: Nats-Msg-Id %q, want %q", i+1, got, id)
		}
		env, err := domain.DecodeEnvelope(msg.Data)
		if err != nil || env.ID.String() != id {
			t.Fatalf("message %d: envelope %+v, err %v", i+1, env, err)
		}
	}

	// A relay that crashed after publishing and before marking publishes
	// the rows again: JetStream refuses each atomic batch, as it holds
	// duplicates, and the relay falls back to publishing message by message,
	// where the stream's duplicate window drops every copy.
	if _, err := db.Exec(ctx, `UPDATE outbox SET published_at = NULL`); err != nil {
		t.Fatal(err)
	}
	for {
		claimed, err := relay.RelayBatch(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if claimed == 0 {
			break
		}
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != n || relay.Stats().Duplicates != n {
		t.Fatalf("stream holds %d messages, %d duplicates reported; want %d and %d", info.State.Msgs, relay.Stats().Duplicates, n, n)
	}
	if st := relay.Stats(); st.AtomicBatches != 3 || st.Fallbacks != 3 {
		t.Fatalf("stats = %+v; want the 3 batches of the republish to fall back", st)
	}
}

// Two relays: one owns every partition, the other stands by; when the
// owner goes, the standby takes its partitions over and publishes.
func TestStandbyRelayTakesOver(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, js, _ := newPipeline(t, stream.Settings{})
	cfg := outbox.Config{TakeoverInterval: 50 * time.Millisecond}
	first, second := newRelay(t, db, js, cfg), newRelay(t, db, js, cfg)

	createOrders(t, db, 10, "a")
	if _, err := first.RelayBatch(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := second.RelayBatch(ctx); err != nil {
		t.Fatal(err)
	}
	if first.Stats().Partitions != outbox.Partitions || second.Stats().Partitions != 0 {
		t.Fatalf("partitions: first %d, second %d; want all and none", first.Stats().Partitions, second.Stats().Partitions)
	}

	// The owner stops (Run returns, or its process dies: either way its
	// connection closes and its locks go).
	ctxFirst, stopFirst := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { first.Run(ctxFirst); close(done) }()
	stopFirst()
	<-done

	createOrders(t, db, 10, "b")
	testenv.Eventually(t, 10*time.Second, "the standby took over and published", func() bool {
		if _, err := second.RelayBatch(ctx); err != nil {
			t.Fatal(err)
		}
		return unpublished(t, db) == 0
	})
	if second.Stats().Partitions != outbox.Partitions || second.Stats().Published != 10 {
		t.Fatalf("standby stats %+v: want all partitions and the 10 new events", second.Stats())
	}
}

// newRelay returns a relay with cfg that logs nowhere.
func newRelay(t *testing.T, db *pgxpool.Pool, js jetstream.JetStream, cfg outbox.Config) *outbox.Relay {
	t.Helper()
	relay, err := outbox.NewRelay(db, js, slog.New(slog.NewTextHandler(io.Discard, nil)), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return relay
}

// newPipeline returns a fresh database, a JetStream server and the stream
// on it with settings.
func newPipeline(t *testing.T, settings stream.Settings) (*pgxpool.Pool, jetstream.JetStream, jetstream.Stream) {
	t.Helper()
	db, js := testenv.DB(t), testenv.JetStream(t)
	s, err := stream.Ensure(context.Background(), js, settings)
	if err != nil {
		t.Fatal(err)
	}
	return db, js, s
}

func createOrders(t testing.TB, db *pgxpool.Pool, n int, prefix string) {
	t.Helper()
	ctx := context.Background()
	create := command.NewCreateOrderHandler()
	for i := range n {
		err := postgres.InTx(ctx, db, func(tx pgx.Tx) error {
			_, err := create.Handle(ctx, tx, command.CreateOrder{
				TenantID: "t1", Key: fmt.Sprintf("%s-%d", prefix, i),
				NewOrder: domain.NewOrder{CustomerID: "c", Currency: "EUR", Lines: []domain.Line{{SKU: "s", Quantity: 1, UnitPrice: 1}}},
			})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

func unpublished(t *testing.T, db *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := db.QueryRow(context.Background(), `SELECT count(*) FROM outbox WHERE published_at IS NULL`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A relay that was down longer than the stream's duplicate window publishes
// its claimed rows again and the stream takes them as new messages: the
// projectors' inbox absorbs them, so every read model still counts each
// event once.
func TestRepublishBeyondTheDuplicateWindowIsAbsorbedByTheInbox(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const window = time.Second
	db, js, s := newPipeline(t, stream.Settings{DuplicateWindow: window})
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	relay := newRelay(t, db, js, outbox.Config{DuplicateWindow: window})
	createOrders(t, db, 20, "w")
	relayAll(t, relay)

	// Crash after publish, before mark; back after the window.
	if _, err := db.Exec(ctx, `UPDATE outbox SET published_at = NULL`); err != nil {
		t.Fatal(err)
	}
	time.Sleep(window + 500*time.Millisecond)
	relayAll(t, relay)
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 40 || relay.Stats().Duplicates != 0 {
		t.Fatalf("stream holds %d messages (%d reported duplicate); want 40 and 0: the window had passed", info.State.Msgs, relay.Stats().Duplicates)
	}

	var runners []*projection.Runner
	for _, p := range []projection.Projection{projection.OrderViews{}, projection.CustomerSummaries{}, projection.DailySales{}} {
		r, err := projection.NewRunner(db, js, p, logger, projection.Config{})
		if err != nil {
			t.Fatal(err)
		}
		runners = append(runners, r)
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { _ = r.Run(rctx); close(done) }()
		t.Cleanup(func() { cancel(); <-done })
	}
	for _, r := range runners {
		testenv.Eventually(t, 20*time.Second, r.Name()+" settled all 40 messages", func() bool {
			return r.Stats().Applied+r.Stats().Duplicates >= 40
		})
		if s := r.Stats(); s.Applied != 20 || s.Duplicates != 20 {
			t.Fatalf("%s: %+v; want 20 applied, 20 duplicates skipped", r.Name(), s)
		}
	}
	violations, err := invariant.Check(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range violations {
		t.Error(v)
	}
}

func relayAll(t *testing.T, relay *outbox.Relay) {
	t.Helper()
	for {
		n, err := relay.RelayBatch(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return
		}
	}
}

// A claim smaller than MinAtomicBatch goes out message by message (an
// atomic batch's staging would cost nats-server more than the syncs it
// saves); one of MinAtomicBatch events or more goes out as one atomic batch.
func TestOnlyLargeBatchesGoOutAtomically(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, js, s := newPipeline(t, stream.Settings{})
	relay := newRelay(t, db, js, outbox.Config{Workers: 1, MinAtomicBatch: 4})
	createOrders(t, db, 3, "small")
	if _, err := relay.RelayBatch(ctx); err != nil {
		t.Fatal(err)
	}
	if st := relay.Stats(); st.Published != 3 || st.AtomicBatches != 0 {
		t.Fatalf("after a claim of 3: %+v; want 3 published, no atomic batch", st)
	}
	createOrders(t, db, 4, "large")
	if _, err := relay.RelayBatch(ctx); err != nil {
		t.Fatal(err)
	}
	if st := relay.Stats(); st.Published != 7 || st.AtomicBatches != 1 || st.Fallbacks != 0 {
		t.Fatalf("after a claim of 4: %+v; want 7 published, in 1 atomic batch", st)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n := unpublished(t, db); n != 0 || info.State.Msgs != 7 {
		t.Fatalf("%d rows unpublished, stream holds %d messages; want 0 and 7", n, info.State.Msgs)
	}
}

// A stream that does not take atomic batches (created before they were
// allowed, or on a server too old for them) still gets every event once:
// the relay learns it from JetStream's refusal and publishes message by
// message from then on.
func TestRelayWithoutAtomicBatchesPublishesEachMessage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, js, s := newPipeline(t, stream.Settings{})
	relay := newRelay(t, db, js, outbox.Config{BatchSize: 5, Workers: 1, MinAtomicBatch: 2})
	createOrders(t, db, 5, "a")
	if _, err := relay.RelayBatch(ctx); err != nil {
		t.Fatal(err)
	}

	cfg := s.CachedInfo().Config
	cfg.AllowAtomicPublish = false
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	createOrders(t, db, 10, "b")
	for range 2 {
		if _, err := relay.RelayBatch(ctx); err != nil {
			t.Fatal(err)
		}
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n := unpublished(t, db); n != 0 || info.State.Msgs != 15 {
		t.Fatalf("%d rows unpublished, stream holds %d messages; want 0 and 15", n, info.State.Msgs)
	}
	if st := relay.Stats(); st.AtomicBatches != 1 || st.Fallbacks != 1 || st.Duplicates != 0 {
		t.Fatalf("stats = %+v; want 1 atomic batch, then 1 refusal and no atomic batch after it", st)
	}
}

// Run returns only after every goroutine it started has ended, and while it
// runs it keeps outside the pool one connection per worker (the partition
// leases) plus one listener the workers share.
func TestRelayRunJoinsItsGoroutinesAndSharesOneListener(t *testing.T) {
	// Not parallel: it looks for relay goroutines in the whole process,
	// where another test's relay would be one.
	db, js, _ := newPipeline(t, stream.Settings{})
	const workers = 2
	relays := []*outbox.Relay{newRelay(t, db, js, outbox.Config{Workers: workers, PollInterval: 50 * time.Millisecond})}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		var wg sync.WaitGroup
		for _, r := range relays {
			wg.Go(func() { r.Run(ctx) })
		}
		wg.Wait()
	}()
	owned := func() (n int64) {
		for _, r := range relays {
			n += r.Stats().Partitions
		}
		return n
	}
	testenv.Eventually(t, 10*time.Second, "the relay owns every partition and listens", func() bool {
		return owned() == outbox.Partitions && outsidePool(t, db) >= workers+1
	})
	time.Sleep(200 * time.Millisecond) // a second listener would be connected by now
	if n := outsidePool(t, db); n != workers+1 {
		t.Fatalf("%d connections outside the pool; want %d (one lease per worker, one shared listener)", n, workers+1)
	}

	cancel()
	<-done
	buf := make([]byte, 1<<20)
	stacks := string(buf[:runtime.Stack(buf, true)])
	for _, frame := range []string{"postgres.Listen", "outbox.(*worker)", "outbox.(*Relay).Run"} {
		if strings.Contains(stacks, frame) {
			t.Fatalf("a goroutine in %s is still running after Run returned:\n%s", frame, stacks)
		}
	}
	testenv.Eventually(t, 5*time.Second, "the relay's connections are closed", func() bool { return outsidePool(t, db) == 0 })
}

// outsidePool counts the connections to the test's database that its pool
// does not hold (hijacked ones, like the relay's leases and listener).
func outsidePool(t *testing.T, db *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := db.QueryRow(context.Background(),
		`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n - int(db.Stat().TotalConns())
}

// A relay whose stream is lost (an operator deleted it, or NATS came back
// on an empty store) creates it again, with the settings it started with,
// and publishes on: before, it ensured the stream only at start, and every
// batch failed with "no response from stream" until it was restarted.
func TestRelayCreatesALostStreamAgainAndPublishesOn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const window = 2 * time.Minute // not the default: the stream created again must have it
	db, js, _ := newPipeline(t, stream.Settings{DuplicateWindow: window})
	relay := newRelay(t, db, js, outbox.Config{PollInterval: 100 * time.Millisecond, DuplicateWindow: window})
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { relay.Run(rctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })

	createOrders(t, db, 3, "before")
	testenv.Eventually(t, 10*time.Second, "the events before the loss are published", func() bool { return unpublished(t, db) == 0 })
	if err := js.DeleteStream(ctx, stream.Name); err != nil {
		t.Fatal(err)
	}

	createOrders(t, db, 3, "after")        // published message by message
	createOrders(t, db, 20, "after-batch") // and, claimed together, as an atomic batch
	testenv.Eventually(t, 30*time.Second, "the events after the loss are published", func() bool { return unpublished(t, db) == 0 })
	s, err := js.Stream(ctx, stream.Name)
	if err != nil {
		t.Fatal(err)
	}
	if info := s.CachedInfo(); info.State.Msgs != 23 || info.Config.Duplicates != window {
		t.Fatalf("the stream created again holds %d messages with a duplicate window of %s; want the 23 published after the loss, and %s",
			info.State.Msgs, info.Config.Duplicates, window)
	}
}
