package projection

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/acme/orders/domain"
	"github.com/acme/orders/internal/testenv"
)

// pipelinedFixture is a runner of proj on a fresh database whose round trips
// are counted.
func pipelinedFixture(t *testing.T, proj Projection) (fixture, *testenv.RoundTrips) {
	t.Helper()
	trips := &testenv.RoundTrips{}
	f := fixture{db: tracedDB(t, trips)}
	f.runner = mustRunner(t, f.db, nil, proj, slog.New(slog.NewTextHandler(io.Discard, nil)), Config{})
	return f, trips
}

// events wraps envs as delivered events, at stream sequences from seq on.
func events(envs []domain.Envelope, seq uint64) []*event {
	out := make([]*event, len(envs))
	for i, env := range envs {
		out[i] = &event{env: env, seq: seq + uint64(i), deliveries: 1}
	}
	slices.SortStableFunc(out, compareEvents) // as decode does
	return out
}

// The batch the stream usually brings, every event new and next in line
// (an order's three events and another order's first), commits in two
// round trips in every projection, with the same effect as the careful way.
func TestABatchOfNewEventsCommitsInTwoRoundTrips(t *testing.T) {
	t.Parallel()
	for _, proj := range []Projection{OrderViews{}, CustomerSummaries{}, DailySales{}} {
		t.Run(proj.Name(), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			f, trips := pipelinedFixture(t, proj)
			life := lifecycleEvents(t, "c-pipelined")
			other := createdEvent(t, uuid.Must(uuid.NewV7()))
			batch := events(append(life, other), 1)

			before := trips.Count()
			if err := f.runner.commit(ctx, batch); err != nil {
				t.Fatal(err)
			}
			if got := trips.Count() - before; got != 2 {
				t.Errorf("round trips = %d; want 2", got)
			}
			for _, e := range batch {
				if e.outcome != Applied {
					t.Errorf("event v%d of %s: %v; want applied", e.env.AggregateVersion, e.env.AggregateID, e.outcome)
				}
			}
			if s := f.runner.Stats(); s.Pipelined != 1 {
				t.Errorf("Pipelined = %d; want 1", s.Pipelined)
			}
			if n := f.count(t, `SELECT count(*) FROM inbox WHERE projection = $1`, proj.Name()); n != 4 {
				t.Errorf("inbox rows = %d; want 4", n)
			}
			for id, want := range map[uuid.UUID]int64{life[0].AggregateID: 3, other.AggregateID: 1} {
				if v := f.count(t, `SELECT version FROM projection_positions WHERE projection = $1 AND aggregate_id = $2`, proj.Name(), id); int64(v) != want {
					t.Errorf("position of %s = %d; want %d", id, v, want)
				}
			}
			if proj.Name() == "order_views" {
				if v, _ := f.view(t, life[0].AggregateID); v != 3 {
					t.Errorf("order view version = %d; want 3", v)
				}
			}
			if proj.Name() == "customer_summaries" {
				if n := f.count(t, `SELECT orders_shipped FROM customer_summaries WHERE customer_id = 'c-pipelined'`); n != 1 {
					t.Errorf("orders shipped = %d; want 1", n)
				}
			}
		})
	}
}

// A batch off the premise (an event seen before, a missing predecessor, a
// hole inside the batch) writes nothing in its pipeline, which is rolled
// back whole, and the careful way sorts each event out exactly as it
// always did. Customer summaries count, so an event applied twice would
// show.
func TestABatchOffItsPremiseIsAppliedTheCarefulWay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	life := lifecycleEvents(t, "c-careful") // v1 created, v2 paid, v3 shipped
	cases := []struct {
		name  string
		setup func(t *testing.T, f fixture)
		batch []domain.Envelope
		want  []Outcome // in (aggregate, version) order
		// version of the order's position afterwards, and its inbox rows
		position, inbox int
	}{
		{name: "a copy of an applied event and its successor",
			setup: func(t *testing.T, f fixture) { mustCommit(t, f, events(life[:1], 1)) },
			batch: life[:2], want: []Outcome{Duplicate, Applied}, position: 2, inbox: 2},
		{name: "an event in the inbox whose position is behind",
			setup: func(t *testing.T, f fixture) {
				if _, err := f.db.Exec(ctx, `INSERT INTO inbox (projection, event_id, tenant_id, aggregate_id, aggregate_version, stream_seq)
VALUES ('customer_summaries', $1, 't1', $2, 1, 1)`, life[0].ID, life[0].AggregateID); err != nil {
					t.Fatal(err)
				}
			},
			batch: life[:1], want: []Outcome{Duplicate}, position: 0, inbox: 1},
		{name: "a missing predecessor",
			setup: func(t *testing.T, f fixture) { mustCommit(t, f, events(life[:1], 1)) },
			batch: life[2:], want: []Outcome{Gap}, position: 1, inbox: 1},
		{name: "an order's v2 with no position",
			batch: life[1:2], want: []Outcome{Gap}, position: 0, inbox: 0},
		{name: "a hole inside the batch",
			batch: []domain.Envelope{life[0], life[2]}, want: []Outcome{Applied, Gap}, position: 1, inbox: 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f, trips := pipelinedFixture(t, CustomerSummaries{})
			if c.setup != nil {
				c.setup(t, f)
			}
			pipelined := f.runner.Stats().Pipelined
			before := trips.Count()
			batch := events(c.batch, 10)
			if err := f.runner.commit(ctx, batch); err != nil {
				t.Fatal(err)
			}
			if got := trips.Count() - before; got < 3 {
				t.Errorf("round trips = %d; want the careful way's (BEGIN, …, COMMIT)", got)
			}
			if got := f.runner.Stats().Pipelined; got != pipelined {
				t.Errorf("Pipelined went %d → %d; want unchanged", pipelined, got)
			}
			for i, e := range batch {
				if e.outcome != c.want[i] {
					t.Errorf("v%d: %v; want %v", e.env.AggregateVersion, e.outcome, c.want[i])
				}
			}
			if n := f.count(t, `SELECT coalesce(max(version), 0) FROM projection_positions WHERE aggregate_id = $1`, life[0].AggregateID); n != c.position {
				t.Errorf("position = %d; want %d", n, c.position)
			}
			if n := f.count(t, `SELECT count(*) FROM inbox WHERE aggregate_id = $1`, life[0].AggregateID); n != c.inbox {
				t.Errorf("inbox rows = %d; want %d", n, c.inbox)
			}
			// The summary holds what the applied events say, once.
			var created, paid int
			applied := c.position
			err := f.db.QueryRow(ctx, `SELECT orders_pending + orders_paid + orders_shipped, orders_paid FROM customer_summaries WHERE customer_id = 'c-careful'`).Scan(&created, &paid)
			switch {
			case applied == 0 && err == pgx.ErrNoRows:
			case applied == 0 && err == nil:
				t.Errorf("summary: %d orders, %d paid; want none (nothing applied)", created, paid)
			case err != nil:
				t.Fatalf("read summary: %v", err)
			case created != 1 || paid != min(applied-1, 1):
				t.Errorf("summary: %d orders, %d paid; want 1 and %d", created, paid, min(applied-1, 1))
			}
		})
	}
}

func mustCommit(t *testing.T, f fixture, batch []*event) {
	t.Helper()
	if err := f.runner.commit(context.Background(), batch); err != nil {
		t.Fatal(err)
	}
}

// A write's own check refuses the pipelined batch before its COMMIT, as it
// refuses the careful one: an order.paid whose order has no view (v1
// discarded from dead letters, say) is an error, and nothing is written,
// neither the inbox row nor the position. (Sent as one implicit
// transaction, the batch had committed before the check ran, and the
// careful way then took the event for a duplicate: it was lost.)
func TestAWriteThatFailsItsCheckWritesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f, _ := pipelinedFixture(t, OrderViews{})
	life := lifecycleEvents(t, "c-no-view")
	mustCommit(t, f, events(life[:1], 1))
	if _, err := f.db.Exec(ctx, `DELETE FROM order_views WHERE order_id = $1`, life[0].AggregateID); err != nil {
		t.Fatal(err)
	}
	batch := events(life[1:2], 2)
	if err := f.runner.commit(ctx, batch); err == nil {
		t.Fatalf("order.paid of an order without a view: no error (outcome %v); want one", batch[0].outcome)
	}
	if n := f.count(t, `SELECT count(*) FROM inbox WHERE event_id = $1`, life[1].ID); n != 0 {
		t.Errorf("inbox rows of the refused event = %d; want 0", n)
	}
	if n := f.count(t, `SELECT version FROM projection_positions WHERE aggregate_id = $1`, life[0].AggregateID); n != 1 {
		t.Errorf("position = %d; want 1", n)
	}
	if s := f.runner.Stats(); s.Pipelined != 1 {
		t.Errorf("Pipelined = %d; want 1 (v1 only)", s.Pipelined)
	}
}

// A statement that fails in PostgreSQL after the projection's writes (here
// the positions' advance, made to fail by a trigger) rolls the pipeline
// back whole: no inbox row, no view, no position; the careful way then
// reports the failure.
func TestAPipelineThatFailsLateWritesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f, _ := pipelinedFixture(t, OrderViews{})
	if _, err := f.db.Exec(ctx, `
CREATE FUNCTION refuse_positions() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'positions refused'; END $$;
CREATE TRIGGER refuse_positions BEFORE INSERT OR UPDATE ON projection_positions FOR EACH ROW EXECUTE FUNCTION refuse_positions()`); err != nil {
		t.Fatal(err)
	}
	e := createdEvent(t, uuid.Must(uuid.NewV7()))
	if err := f.runner.commit(ctx, events([]domain.Envelope{e}, 1)); err == nil || !strings.Contains(err.Error(), "positions refused") {
		t.Fatalf("commit: %v; want the trigger's error", err)
	}
	for _, q := range []string{`SELECT count(*) FROM inbox`, `SELECT count(*) FROM order_views`, `SELECT count(*) FROM projection_positions`} {
		if n := f.count(t, q); n != 0 {
			t.Errorf("%s = %d; want 0", q, n)
		}
	}
	if n := f.count(t, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND state LIKE 'idle in transaction%'`); n != 0 {
		t.Errorf("%d connections left in a transaction; want 0", n)
	}
}

// A refused batch leaves its connection as it was: rolled back (not closed:
// the pool opens no new connection) and with its prepared statements (pgx
// drops those of a batch that returns an error, so neither a premise that
// fails nor a write's failed check may surface as one). An order_views
// batch holding an order's v2 alone is the case: no position (v1 is still
// in flight elsewhere), and its view update finds no row.
func TestARefusedBatchKeepsItsConnectionAndStatements(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	db, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	f := fixture{db: db, runner: mustRunner(t, db, nil, OrderViews{}, slog.New(slog.NewTextHandler(io.Discard, nil)), Config{})}

	warm := lifecycleEvents(t, "c-warm") // prepares every statement of both ways
	mustCommit(t, f, events(warm[:1], 1))
	mustCommit(t, f, events(warm[1:2], 2))
	prepared := func() int {
		var n int
		if err := db.QueryRow(ctx, `SELECT count(*) FROM pg_prepared_statements`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	statements, conns := prepared(), db.Stat().NewConnsCount()

	life := lifecycleEvents(t, "c-refused")
	batch := events(life[1:2], 3) // v2, with no v1 applied
	if err := f.runner.commit(ctx, batch); err != nil {
		t.Fatal(err)
	}
	if batch[0].outcome != Gap {
		t.Fatalf("v2 without v1: %v; want gap", batch[0].outcome)
	}
	if got := prepared(); got < statements {
		t.Errorf("prepared statements %d → %d; want none dropped", statements, got)
	}
	if got := db.Stat().NewConnsCount(); got != conns {
		t.Errorf("connections opened %d → %d; want the same connection, rolled back", conns, got)
	}
	if s := f.runner.Stats(); s.Pipelined != 2 {
		t.Errorf("Pipelined = %d; want 2 (the warm-up's)", s.Pipelined)
	}
}

// Two different events that both claim to be version 1 of a new order (a
// forged stream: the outbox makes one per version), applied by two batches
// at once: the second waits for the first, finds the position made under
// it, and comes out stale. Before, a new order had no position to lock, so
// the second batch never saw the first's: both applied (customer
// summaries counted two pending orders).
func TestTwoFirstVersionsOfANewOrderInFlightAtOnceApplyOnce(t *testing.T) {
	t.Parallel()
	for _, proj := range []Projection{OrderViews{}, CustomerSummaries{}, DailySales{}} {
		t.Run(proj.Name(), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			f, _ := pipelinedFixture(t, proj)
			first := orderEvents(t, "tA", "c-a")[0]
			second := first
			second.ID = uuid.Must(uuid.NewV7())

			tx, err := f.db.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx) //nolint:errcheck // committed below
			one := events([]domain.Envelope{first}, 1)
			if err := f.runner.commitTx(ctx, tx, one); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			two := events([]domain.Envelope{second}, 2)
			go func() { done <- f.runner.commit(ctx, two) }()
			eventually(t, "the second batch waiting for the first's rows", func() bool {
				return f.count(t, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`) > 0
			})
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if one[0].outcome != Applied || two[0].outcome != Stale {
				t.Errorf("outcomes %s and %s, want applied and stale", one[0].outcome, two[0].outcome)
			}
			counted := map[string]string{
				"order_views":        `SELECT count(*) FROM order_views WHERE tenant_id = 'tA'`,
				"customer_summaries": `SELECT orders_pending FROM customer_summaries WHERE tenant_id = 'tA'`,
				"daily_sales":        `SELECT orders FROM daily_sales WHERE tenant_id = 'tA'`,
			}[proj.Name()]
			if n := f.count(t, counted); n != 1 {
				t.Errorf("%s counts %d orders, want 1", proj.Name(), n)
			}
		})
	}
}

// A gap names no owner of an order: another tenant's forged event that
// sorts first in a batch, before the order's first version came, leaves
// the order's own later event a gap too (it made it foreign before, and
// dead-lettered it open). Once the order's first version is applied, the
// forged one is foreign.
func TestAGapNamesNoOwnerOfAnOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f, _ := pipelinedFixture(t, CustomerSummaries{})
	a := orderEvents(t, "tA", "c-a")
	forged := forgeFor(a[1], "tB")
	gaps := events([]domain.Envelope{forged, a[2]}, 1)
	if err := f.runner.commit(ctx, gaps); err != nil {
		t.Fatal(err)
	}
	for _, e := range gaps {
		if e.outcome != Gap {
			t.Errorf("tenant %s's v%d before the order's first version: %s %v, want a gap", e.env.TenantID, e.env.AggregateVersion, e.outcome, e.err)
		}
	}
	batch := events([]domain.Envelope{a[0], forged}, 3)
	if err := f.runner.commit(ctx, batch); err != nil {
		t.Fatal(err)
	}
	for _, e := range batch {
		want := map[string]Outcome{"tA": Applied, "tB": Malformed}[e.env.TenantID]
		if e.outcome != want {
			t.Errorf("tenant %s's v%d after the order's first version: %s %v, want %s", e.env.TenantID, e.env.AggregateVersion, e.outcome, e.err, want)
		}
	}
}
