package projection

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/acme/orders/domain"
	"github.com/acme/orders/internal/testenv"
	"github.com/acme/orders/stream"
)

type fixture struct {
	db     *pgxpool.Pool
	js     jetstream.JetStream
	runner *Runner
}

func newFixture(t *testing.T, cfg Config) fixture {
	t.Helper()
	return newFixtureFor(t, OrderViews{}, cfg)
}

// newFixtureFor is newFixture with a runner of proj.
func newFixtureFor(t *testing.T, proj Projection, cfg Config) fixture {
	t.Helper()
	db := testenv.DB(t)
	js := testenv.JetStream(t)
	if _, err := stream.Ensure(context.Background(), js, stream.Settings{}); err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.NewTextHandler(testLogOutput(), nil))
	return fixture{db: db, js: js, runner: mustRunner(t, db, js, proj, logger, cfg)}
}

// run runs the runner until the test ends.
func (f fixture) run(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.runner.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}

// eventually polls cond until it holds or 10s pass.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, what, cond)
}

func createdEvent(t *testing.T, orderID uuid.UUID) domain.Envelope {
	t.Helper()
	now := time.Now().UTC().Truncate(time.Microsecond)
	o, ev, err := domain.CreateOrder(orderID, "t1", domain.NewOrder{
		CustomerID: "c-1", Currency: "EUR",
		Lines: []domain.Line{{SKU: "s-1", Quantity: 3, UnitPrice: 700}},
	}, now)
	if err != nil {
		t.Fatal(err)
	}
	env, err := domain.NewEnvelope(uuid.Must(uuid.NewV7()), o, ev, now)
	if err != nil {
		t.Fatal(err)
	}
	return env
}

// publish puts env on the stream under msgID (a new id bypasses the
// stream's duplicate window, as a late republish would).
func (f fixture) publish(t *testing.T, env any, msgID string) {
	t.Helper()
	b, err := json.Marshal(env)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.js.Publish(context.Background(), stream.Subject(domain.TypeOrderCreated), b, jetstream.WithMsgID(msgID)); err != nil {
		t.Fatal(err)
	}
}

func (f fixture) view(t *testing.T, id uuid.UUID) (version, total int64) {
	t.Helper()
	err := f.db.QueryRow(context.Background(), `SELECT version, total FROM order_views WHERE order_id = $1`, id).Scan(&version, &total)
	if err != nil {
		t.Fatalf("read view: %v", err)
	}
	return version, total
}

func (f fixture) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := f.db.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestDuplicateDeliveryIsANoOp(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Config{})
	orderID := uuid.Must(uuid.NewV7())
	env := createdEvent(t, orderID)
	f.publish(t, env, env.ID.String())
	f.publish(t, env, "copy-"+env.ID.String()) // a copy the broker cannot dedupe
	f.run(t)

	eventually(t, "both deliveries are settled", func() bool {
		s := f.runner.Stats()
		return s.Applied+s.Duplicates == 2
	})
	if s := f.runner.Stats(); s.Applied != 1 || s.Duplicates != 1 {
		t.Fatalf("stats = %+v, want 1 applied and 1 duplicate", s)
	}
	if n := f.count(t, `SELECT count(*) FROM inbox WHERE event_id = $1`, env.ID); n != 1 {
		t.Fatalf("inbox rows for the event = %d, want 1", n)
	}
	if v, total := f.view(t, orderID); v != 1 || total != 2100 {
		t.Fatalf("view version %d total %d, want 1 and 2100", v, total)
	}
}

func TestCommitThenCrashBeforeAckIsANoOpOnRedelivery(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Config{AckWait: time.Second})
	orderID := uuid.Must(uuid.NewV7())
	env := createdEvent(t, orderID)
	f.publish(t, env, env.ID.String())

	// A worker fetches the event, commits its transaction and dies before
	// the ack.
	ctx := context.Background()
	cons, err := f.runner.Consumer(ctx)
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var msgs []jetstream.Msg
	for m := range batch.Messages() {
		msgs = append(msgs, m)
	}
	if len(msgs) != 1 {
		t.Fatalf("fetched %d messages, want 1", len(msgs))
	}
	if err := f.runner.commit(ctx, decodeMessages(msgs)); err != nil {
		t.Fatal(err)
	}

	// After AckWait JetStream redelivers it to the next worker.
	f.run(t)
	eventually(t, "the redelivery is settled", func() bool { return f.runner.Stats().Duplicates == 1 })
	if s := f.runner.Stats(); s.Applied != 0 {
		t.Fatalf("stats = %+v: the redelivery was applied again", s)
	}
	if n := f.count(t, `SELECT count(*) FROM inbox`); n != 1 {
		t.Fatalf("inbox rows = %d, want 1", n)
	}
	if v, _ := f.view(t, orderID); v != 1 {
		t.Fatalf("view version = %d, want 1", v)
	}
	eventually(t, "nothing is pending", func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumAckPending == 0 && info.NumPending == 0
	})
}

func TestMalformedEventIsTerminated(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Config{AckWait: time.Second})
	ctx := context.Background()
	if _, err := f.js.Publish(ctx, stream.Subject(domain.TypeOrderCreated), []byte(`{"id":"nope"`)); err != nil {
		t.Fatal(err)
	}
	// Well-formed envelope, data of the wrong shape.
	env := createdEvent(t, uuid.Must(uuid.NewV7()))
	env.Data = json.RawMessage(`{"total":"lots"}`)
	f.publish(t, env, env.ID.String())
	good := createdEvent(t, uuid.Must(uuid.NewV7()))
	f.publish(t, good, good.ID.String())
	f.run(t)

	eventually(t, "all three are settled", func() bool {
		s := f.runner.Stats()
		return s.Malformed == 2 && s.Applied == 1
	})
	cons, err := f.runner.Consumer(ctx)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "nothing is pending or awaiting an ack", func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumAckPending == 0 && info.NumPending == 0
	})
	// Well past AckWait: a terminated message is not redelivered.
	time.Sleep(1500 * time.Millisecond)
	if s := f.runner.Stats(); s.Malformed != 2 || s.DeadLettered != 2 {
		t.Fatalf("stats = %+v: a malformed event came back, or was counted twice (2 dead letters)", s)
	}
	if n := f.count(t, `SELECT count(*) FROM inbox`); n != 1 {
		t.Fatalf("inbox rows = %d, want 1 (only the good event)", n)
	}
}

// Events that no command writes are dead-lettered at once by every
// projection, and another tenant's event behind them is applied: a NUL in
// the tenant (no text column holds one: its dead letter, too, once failed
// to be written, and the event came back for ever), a negative total (it
// would have made sums negative), a time JSON cannot hold (the order could
// then never be read: a 500 for every page holding it), an event of a newer
// schema (this build does not know what it means), an order.paid as an
// order's version 1 (the aggregates counted an order nobody created: a paid
// amount, and a status count below zero that made the customer's summary
// a 500). All but the NUL tenant's name their order, so its later events
// wait behind them.
func TestEventsNoCommandWritesAreDeadLetteredByEveryProjection(t *testing.T) {
	t.Parallel()
	withData := func(env domain.Envelope, key string, value any) domain.Envelope {
		m := map[string]any{}
		if err := json.Unmarshal(env.Data, &m); err != nil {
			t.Fatal(err)
		}
		m[key] = value
		b, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		env.Data = b
		return env
	}
	for _, proj := range []Projection{OrderViews{}, CustomerSummaries{}, DailySales{}} {
		t.Run(proj.Name(), func(t *testing.T) {
			t.Parallel()
			f := newFixtureFor(t, proj, Config{AckWait: time.Second})
			nulTenant := createdEvent(t, uuid.Must(uuid.NewV7()))
			nulTenant.TenantID = "t\x00evil"
			newer := createdEvent(t, uuid.Must(uuid.NewV7()))
			newer.SchemaVersion = domain.SchemaVersion + 1
			late := createdEvent(t, uuid.Must(uuid.NewV7()))
			late.OccurredAt = time.Date(9999, 12, 31, 23, 0, 0, 0, time.FixedZone("", -5*3600))
			paidFirst := createdEvent(t, uuid.Must(uuid.NewV7()))
			paidFirst.Type = domain.TypeOrderPaid
			paidFirst.Data = json.RawMessage(`{"customer_id":"c-1","currency":"EUR","total":1000,"from_status":"payment_pending","status":"paid","at":"2026-01-01T00:00:00Z","attempt":1,"charge_id":"pi_x","amount":1000}`)
			poison := []domain.Envelope{
				paidFirst,
				nulTenant,
				withData(createdEvent(t, uuid.Must(uuid.NewV7())), "total", -4990),
				withData(createdEvent(t, uuid.Must(uuid.NewV7())), "created_at", "0000-01-01T00:00:00+01:00"),
				newer,
				late,
			}
			for _, e := range poison {
				f.publish(t, e, e.ID.String())
			}
			good := createdEvent(t, uuid.Must(uuid.NewV7()))
			good.TenantID = "t2"
			f.publish(t, good, good.ID.String())
			f.run(t)

			ctx := context.Background()
			cons, err := f.runner.Consumer(ctx)
			if err != nil {
				t.Fatal(err)
			}
			eventually(t, "every event settled, none awaiting an ack", func() bool {
				info, err := cons.Info(ctx)
				s := f.runner.Stats()
				return s.Malformed == int64(len(poison)) && s.Applied == 1 && err == nil && info.NumAckPending == 0 && info.NumPending == 0
			})
			if n := f.count(t, `SELECT count(*) FROM dead_letters WHERE projection = $1 AND status = 'open'`, proj.Name()); n != len(poison) {
				t.Fatalf("%d open dead letters, want %d", n, len(poison))
			}
			if n := f.count(t, `SELECT count(*) FROM dead_letters WHERE projection = $1 AND tenant_id = 't1' AND aggregate_id IS NOT NULL`, proj.Name()); n != len(poison)-1 {
				t.Fatalf("%d dead letters name their order, want %d", n, len(poison)-1)
			}
			if n := f.count(t, `SELECT count(*) FROM inbox WHERE projection = $1`, proj.Name()); n != 1 {
				t.Fatalf("inbox rows = %d, want 1 (only the good event)", n)
			}
		})
	}
}

// No projection consumes an event of a newer schema, or one whose time
// JSON cannot hold, even of a type it does not use (order_views keeps an
// unknown type's time as the view's; the others skip such a type, and a
// newer build might count it): each is dead-lettered naming its order, so
// that it holds back its later events and can be retried after the upgrade
// or discarded. The view stays readable.
func TestAnUnknownEventOfANewerSchemaOrAnUnrepresentableTimeIsDeadLetteredForItsOrder(t *testing.T) {
	t.Parallel()
	for _, proj := range []Projection{OrderViews{}, CustomerSummaries{}, DailySales{}} {
		t.Run(proj.Name(), func(t *testing.T) {
			t.Parallel()
			f := newFixtureFor(t, proj, Config{AckWait: time.Second})
			var bad []domain.Envelope
			for _, newer := range []bool{false, true} {
				v1 := createdEvent(t, uuid.Must(uuid.NewV7()))
				v2 := v1
				v2.ID, v2.Type, v2.AggregateVersion, v2.Data = uuid.Must(uuid.NewV7()), "order.noted", 2, json.RawMessage(`{}`)
				if newer {
					v2.SchemaVersion = domain.SchemaVersion + 1
				} else {
					v2.OccurredAt = time.Date(9999, 12, 31, 23, 0, 0, 0, time.FixedZone("", -5*3600))
				}
				f.publish(t, v1, v1.ID.String())
				f.publish(t, v2, v2.ID.String())
				bad = append(bad, v2)
			}
			f.run(t)
			for _, v2 := range bad {
				eventually(t, "v2 dead-lettered for its order", func() bool {
					return f.count(t, `SELECT count(*) FROM dead_letters WHERE event_id = $1 AND aggregate_id = $2 AND status = 'open'`, v2.ID, v2.AggregateID) == 1
				})
				if n := f.count(t, `SELECT count(*) FROM projection_positions WHERE projection = $1 AND aggregate_id = $2 AND version = 1`, proj.Name(), v2.AggregateID); n != 1 {
					t.Fatalf("the order's position is not at v1 (%d rows)", n)
				}
			}
		})
	}
}

func TestOutOfOrderEventWaitsForItsPredecessor(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Config{GapDelay: 50 * time.Millisecond})
	orderID := uuid.Must(uuid.NewV7())
	v1 := createdEvent(t, orderID)
	v2 := v1
	v2.ID, v2.Type, v2.AggregateVersion = uuid.Must(uuid.NewV7()), "order.noted", 2
	v2.OccurredAt = v1.OccurredAt.Add(time.Second)
	v2.Data = json.RawMessage(`{"note":"fragile"}`)

	f.publish(t, v2, v2.ID.String())
	f.run(t)
	eventually(t, "v2 is seen as a gap", func() bool { return f.runner.Stats().Gaps >= 1 })
	cons, err := f.runner.Consumer(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "v2 delivered three times", func() bool {
		info, err := cons.Info(context.Background())
		return err == nil && info.Delivered.Consumer >= 3
	})
	if n := f.count(t, `SELECT count(*) FROM order_views`); n != 0 {
		t.Fatal("v2 was applied without v1")
	}
	if g := f.runner.Stats().Gaps; g != 1 {
		t.Fatalf("%d gaps counted for one event that waited; want 1", g)
	}

	f.publish(t, v1, v1.ID.String())
	eventually(t, "both are applied", func() bool { return f.runner.Stats().Applied == 2 })
	if v, total := f.view(t, orderID); v != 2 || total != 2100 {
		t.Fatalf("view version %d total %d, want 2 and 2100", v, total)
	}
	if n := f.count(t, `SELECT count(*) FROM inbox`); n != 2 {
		t.Fatalf("inbox rows = %d, want 2", n)
	}
}

// testLogOutput is where runners log in tests: nowhere, unless
// PROJECTION_TEST_LOG is set.
func testLogOutput() io.Writer {
	if os.Getenv("PROJECTION_TEST_LOG") != "" {
		return os.Stderr
	}
	return io.Discard
}

// Large events are bounded by bytes, not only by count: 40 events of
// 100 KB, all buffered before the runner starts, are applied while it holds
// at most BufferBytes of them at once (with only counts, it took in all 4 MB).
func TestLargeEventsAreHeldWithinBufferBytes(t *testing.T) {
	const budget, n, pad = 1 << 20, 40, 100 << 10
	f := newFixture(t, Config{BufferBytes: budget})
	ids := make([]uuid.UUID, n)
	for i := range ids {
		ids[i] = uuid.Must(uuid.NewV7())
		env := createdEvent(t, ids[i])
		f.publish(t, struct {
			domain.Envelope
			Padding string `json:"padding"`
		}{env, strings.Repeat("x", pad)}, env.ID.String())
	}
	f.run(t)
	eventually(t, "every large event applied", func() bool { return f.runner.Stats().Applied == n })
	for _, id := range ids {
		if v, total := f.view(t, id); v != 1 || total != 2100 {
			t.Fatalf("view of %s: version %d total %d, want 1 and 2100", id, v, total)
		}
	}
	if peak := f.runner.Stats().HeldBytesPeak; peak > budget || peak < pad {
		t.Fatalf("held at most %d bytes of events at once, want between one event (%d) and BufferBytes (%d)", peak, pad, budget)
	}
}

// Events waiting behind a batch held up (here by a lock on the read model,
// as a rebuild's swap takes one) for several ack waits are kept in
// progress, not delivered again while the projector lives.
func TestEventsWaitingBehindALongBatchAreNotDeliveredAgain(t *testing.T) {
	const n = 60
	f := newFixture(t, Config{AckWait: 2 * time.Second, BatchSize: 5, Workers: 1})
	ctx := context.Background()
	lock, err := f.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Rollback(ctx)
	if _, err := lock.Exec(ctx, `LOCK TABLE order_views IN EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	for range n {
		env := createdEvent(t, uuid.Must(uuid.NewV7()))
		f.publish(t, env, env.ID.String())
	}
	f.run(t)
	time.Sleep(7 * time.Second) // three and a half ack waits, the first batch stuck on the lock
	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, "every event applied", func() bool { return f.runner.Stats().Applied == n })
	if s := f.runner.Stats(); s.Duplicates != 0 || s.Stale != 0 {
		t.Fatalf("stats %+v: events were delivered again while they waited behind the stuck batch", s)
	}
}
