package outbox_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/acme/orders/internal/testenv"
	"github.com/acme/orders/outbox"
	"github.com/acme/orders/stream"
)

// A relay round is one transaction in two round trips, its BEGIN sent with
// the claim and its COMMIT with the mark; an empty round takes two as well.
// A round whose publish fails marks nothing, keeps its partitions and
// leaves its connection ready for the next round, which publishes the rows.
func TestARelayRoundTakesTwoRoundTrips(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	trips := &testenv.RoundTrips{}
	cfg, err := pgxpool.ParseConfig(testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Tracer = trips
	db, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	js := testenv.JetStream(t)
	if _, err := stream.Ensure(ctx, js, stream.Settings{}); err != nil {
		t.Fatal(err)
	}
	relay := newRelay(t, db, js, outbox.Config{Workers: 1})
	relayRound := func() (int, int64, error) {
		before := trips.Count()
		claimed, err := relay.RelayBatch(ctx)
		return claimed, trips.Count() - before, err
	}

	// The first round sets up the lease (its settings, its partitions).
	if _, _, err := relayRound(); err != nil {
		t.Fatal(err)
	}
	if claimed, n, err := relayRound(); err != nil || claimed != 0 || n != 2 {
		t.Fatalf("empty round: claimed %d in %d round trips, err %v; want 0 in 2", claimed, n, err)
	}
	createOrders(t, db, 3, "rt")
	if claimed, n, err := relayRound(); err != nil || claimed != 3 || n != 2 {
		t.Fatalf("round of 3 events: claimed %d in %d round trips, err %v; want 3 in 2", claimed, n, err)
	}
	if got := relay.Stats().Published; got != 3 {
		t.Fatalf("published %d; want 3", got)
	}

	// No stream: the publish fails, nothing is marked, the lease stays.
	createOrders(t, db, 2, "rt-failed")
	if err := js.DeleteStream(ctx, stream.Name); err != nil {
		t.Fatal(err)
	}
	owned := relay.Stats().Partitions
	if claimed, _, err := relayRound(); err == nil || claimed != 2 {
		t.Fatalf("round without a stream: claimed %d, err %v; want 2 claimed and the publish's error", claimed, err)
	}
	if st := relay.Stats(); st.Published != 3 || st.Partitions != owned {
		t.Fatalf("after the failed round: %+v; want 3 published and %d partitions still owned", st, owned)
	}
	if _, err := stream.Ensure(ctx, js, stream.Settings{}); err != nil {
		t.Fatal(err)
	}
	if claimed, n, err := relayRound(); err != nil || claimed != 2 || n != 2 {
		t.Fatalf("round after the stream is back: claimed %d in %d round trips, err %v; want 2 in 2", claimed, n, err)
	}
	var unpublished int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE published_at IS NULL`).Scan(&unpublished); err != nil {
		t.Fatal(err)
	}
	if unpublished != 0 {
		t.Fatalf("%d rows unpublished; want 0", unpublished)
	}
}

// BenchmarkRelayRound measures one relay round (claim, publish, mark) of n
// events, the batch size of a relay under light load (3) and under a drain
// (100); ns/op is per round.
func BenchmarkRelayRound(b *testing.B) {
	ctx := context.Background()
	db, js := testenv.DB(b), testenv.JetStream(b)
	if _, err := stream.Ensure(ctx, js, stream.Settings{}); err != nil {
		b.Fatal(err)
	}
	relay, err := outbox.NewRelay(db, js, slog.New(slog.NewTextHandler(io.Discard, nil)), outbox.Config{Workers: 1})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := relay.RelayBatch(ctx); err != nil { // the lease
		b.Fatal(err)
	}
	for _, n := range []int{3, 100} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			for i := 0; b.Loop(); i++ {
				b.StopTimer()
				createOrders(b, db, n, fmt.Sprintf("bench-%d-%d", n, i))
				b.StartTimer()
				if claimed, err := relay.RelayBatch(ctx); err != nil || claimed != n {
					b.Fatalf("claimed %d, err %v; want %d", claimed, err, n)
				}
			}
		})
	}
}

// A round whose mark fails in PostgreSQL (a trigger refuses it here) rolls
// back on its own connection: nothing is marked, no connection is left in a
// transaction (holding the claimed rows' locks), the lease and its
// partitions stay, and the next round republishes and marks the rows.
func TestARelayRoundWhoseMarkFailsRollsBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, js, _ := newPipeline(t, stream.Settings{})
	relay := newRelay(t, db, js, outbox.Config{Workers: 1})
	if _, err := relay.RelayBatch(ctx); err != nil { // the lease
		t.Fatal(err)
	}
	owned := relay.Stats().Partitions
	createOrders(t, db, 2, "mark-fails")
	if _, err := db.Exec(ctx, `
CREATE FUNCTION refuse_mark() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'mark refused'; END $$;
CREATE TRIGGER refuse_mark BEFORE UPDATE ON outbox FOR EACH ROW EXECUTE FUNCTION refuse_mark()`); err != nil {
		t.Fatal(err)
	}
	if claimed, err := relay.RelayBatch(ctx); err == nil || claimed != 2 || !strings.Contains(err.Error(), "mark refused") {
		t.Fatalf("round with a refused mark: claimed %d, err %v; want 2 and the trigger's error", claimed, err)
	}
	var inTx int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND state LIKE 'idle in transaction%'`).Scan(&inTx); err != nil {
		t.Fatal(err)
	}
	if st := relay.Stats(); inTx != 0 || st.Published != 0 || st.Partitions != owned {
		t.Fatalf("after the refused mark: %d connections in a transaction, %+v; want 0, 0 published, %d partitions", inTx, st, owned)
	}
	if _, err := db.Exec(ctx, `DROP TRIGGER refuse_mark ON outbox`); err != nil {
		t.Fatal(err)
	}
	if claimed, err := relay.RelayBatch(ctx); err != nil || claimed != 2 {
		t.Fatalf("next round: claimed %d, err %v; want 2", claimed, err)
	}
	if st := relay.Stats(); st.Published != 2 || st.Duplicates != 2 {
		t.Fatalf("after the next round: %+v; want 2 published, both duplicates of the first publish", st)
	}
}
