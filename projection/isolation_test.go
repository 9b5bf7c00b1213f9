package projection

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/acme/orders/domain"
	"github.com/acme/orders/internal/testenv"
)

// One tenant's events keep failing: tenant "flaky" with a transient error
// (until it is cured), tenant "poison" with a real range error (SQLSTATE
// 22003). Together they are three times the consumer's window. Another
// tenant's events, published behind them, are still applied within a few
// seconds; and once "flaky" is cured, every one of its events is applied,
// once and in version order.
func TestFailingTenantDoesNotHoldOtherTenantsBack(t *testing.T) {
	t.Parallel()
	cfg := Config{Workers: 1, BatchSize: 10, MaxAckPending: 40, TenantShare: 0.25,
		RetryDelay: 300 * time.Millisecond, GapDelay: 100 * time.Millisecond, RedriveInterval: 100 * time.Millisecond}
	f := newFixture(t, cfg)
	ctx := context.Background()
	if _, err := f.db.Exec(ctx, poisonTrigger); err != nil {
		t.Fatal(err)
	}
	var flaky atomic.Bool
	flaky.Store(true)
	f.runner = mustRunner(t, f.db, f.js, failingProjection{OrderViews{}, func(e domain.Envelope) error {
		if e.TenantID == "flaky" && flaky.Load() {
			return errors.New("downstream hiccup")
		}
		return nil
	}}, slog.New(slog.NewTextHandler(testLogOutput(), nil)), cfg)

	const orders = 20 // per failing tenant, 3 events each: 120 events, 3 × MaxAckPending
	for range orders {
		for _, e := range append(orderEvents(t, "flaky", "c-f"), orderEvents(t, "poison", "c-p")...) {
			f.publish(t, e, e.ID.String())
		}
	}
	f.run(t)
	eventually(t, "the poison tenant's orders are dead-lettered", func() bool {
		return f.count(t, `SELECT count(*) FROM dead_letters WHERE tenant_id = 'poison' AND status = 'open'`) == orders
	})
	time.Sleep(500 * time.Millisecond) // the flaky tenant's events are failing and backing off

	var healthy []domain.Envelope
	for range orders {
		healthy = append(healthy, orderEvents(t, "healthy", "c-h")[0])
	}
	start := time.Now()
	for _, e := range healthy {
		f.publish(t, e, e.ID.String())
	}
	testenv.Eventually(t, 5*time.Second, "the healthy tenant's orders are applied", func() bool {
		return f.count(t, `SELECT count(*) FROM order_views WHERE tenant_id = 'healthy'`) == orders
	})
	t.Logf("healthy tenant applied in %s", time.Since(start).Round(time.Millisecond))
	if n := f.count(t, `SELECT count(*) FROM order_views WHERE tenant_id = 'flaky'`); n != 0 {
		t.Fatalf("%d flaky orders applied while failing", n)
	}

	flaky.Store(false)
	testenv.Eventually(t, 30*time.Second, "every flaky order is applied to its last version", func() bool {
		return f.count(t, `SELECT count(*) FROM order_views WHERE tenant_id = 'flaky' AND version = 3 AND status = 'shipped'`) == orders
	})
	if n := f.count(t, `SELECT count(*) FROM inbox WHERE tenant_id = 'flaky'`); n != 3*orders {
		t.Fatalf("inbox rows of the flaky tenant = %d, want %d (each event once)", n, 3*orders)
	}
	if n := f.count(t, `SELECT count(*) FROM dead_letters WHERE tenant_id IN ('flaky', 'healthy') AND status IN ('open', 'parked')`); n != 0 {
		t.Fatalf("%d events of the flaky or healthy tenant still unresolved", n)
	}
	t.Logf("stats %+v", f.runner.Stats())
}

// Events that wait for a predecessor (gaps) hold slots of the consumer's
// window while they are redelivered. One tenant's stream of gaps whose
// predecessors never come (forged, or lost upstream) counts against its
// share like its failures do, so another tenant's event published behind
// them is still delivered and applied at once.
func TestGapsOfOneTenantDoNotFillTheWindow(t *testing.T) {
	t.Parallel()
	cfg := Config{Workers: 1, BatchSize: 5, MaxAckPending: 20, TenantShare: 0.1}
	f := newFixture(t, cfg)
	for range cfg.MaxAckPending {
		e := orderEvents(t, "evil", "c-e")[1] // v2 of an order whose v1 never comes
		f.publish(t, e, e.ID.String())
	}
	good := orderEvents(t, "healthy", "c-h")[0]
	f.publish(t, good, good.ID.String())
	start := time.Now()
	f.run(t)
	testenv.Eventually(t, 5*time.Second, "the healthy tenant's order is applied", func() bool {
		return f.count(t, `SELECT count(*) FROM order_views WHERE order_id = $1`, good.AggregateID) == 1
	})
	t.Logf("applied after %s; stats %+v", time.Since(start).Round(time.Millisecond), f.runner.Stats())
}

// Young gaps (waiting under a second, whose predecessor is most likely in
// another batch) do not count against the tenant's share of the window,
// but have a larger one of their own: a flood of gaps holds at most the
// two from its first delivery on, and the rest is parked at once, not
// after a second of redeliveries that kept the window full.
func TestAFloodOfYoungGapsHoldsAtMostTheirShares(t *testing.T) {
	t.Parallel()
	// A re-drive would deliver the parked gaps again (deliveries 2): not
	// within this test.
	cfg := Config{Workers: 1, BatchSize: 20, MaxAckPending: 20, TenantShare: 0.1, GapDelay: 100 * time.Millisecond, RedriveInterval: time.Hour}
	f := newFixture(t, cfg)
	for range cfg.MaxAckPending {
		e := orderEvents(t, "evil", "c-e")[1] // v2 of an order whose v1 never comes
		f.publish(t, e, e.ID.String())
	}
	f.run(t)
	c := cfg.withDefaults()
	limit := c.tenantLimit() + c.youngGapLimit() // 2 + 8
	want := cfg.MaxAckPending - limit
	testenv.Eventually(t, 10*time.Second, "the gaps past the shares are parked", func() bool {
		return f.count(t, `SELECT count(*) FROM dead_letters WHERE tenant_id = 'evil' AND status = 'parked'`) >= want
	})
	// Parked on their first delivery, not after a second of redeliveries
	// (the fifth, with this GapDelay) that kept the window full.
	if n := f.count(t, `SELECT count(*) FROM dead_letters WHERE tenant_id = 'evil' AND status = 'parked' AND deliveries = 1`); n < want {
		t.Errorf("%d gaps parked on their first delivery, want at least %d (all but the shares, %d)", n, want, limit)
	}
	t.Logf("stats %+v", f.runner.Stats())
}

// A batch that fails because of one event's data is applied in halves, not
// one event at a time: one tenant's bad event costs the batch a few more
// transactions, not one per event, so publishing bad events cannot slow
// every other tenant's batches to single events. The bad event is
// dead-lettered on its first delivery. Two kinds: data that does not
// decode, and an event that decodes but whose write misses its order's
// view (an order.paid that claims to be version 1 of an order nobody
// created, so the gate lets it through as next in line; as a transient
// failure it made the batch go one event per transaction, 51 here, on each
// of its deliveries).
func TestOneBadEventCostsItsBatchAFewTransactionsNotOnePerEvent(t *testing.T) {
	t.Parallel()
	undecodable := orderEvents(t, "evil", "c-e")[0]
	undecodable.Data = json.RawMessage(`{"status": 5}`)
	viewless := orderEvents(t, "evil", "c-e")[1]
	viewless.AggregateVersion = 1
	for name, poison := range map[string]domain.Envelope{"undecodable": undecodable, "no view": viewless} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, Config{Workers: 1, BatchSize: 100, BatchWait: 200 * time.Millisecond})
			f.publish(t, poison, poison.ID.String())
			const healthy = 50
			for range healthy {
				e := orderEvents(t, "healthy", "c-h")[0]
				f.publish(t, e, e.ID.String())
			}
			f.run(t)
			eventually(t, "the healthy events are applied and the bad one dead-lettered", func() bool {
				return f.runner.Stats().Applied == healthy && f.count(t, `SELECT count(*) FROM dead_letters WHERE event_id = $1`, poison.ID) == 1
			})
			// Halving 51 events to find one: at most two commits per level.
			if s := f.runner.Stats(); s.Pipelined > 12 {
				t.Errorf("%d transactions applied %d healthy events beside one bad one, want at most 12 (stats %+v)", s.Pipelined, healthy, s)
			}
			if n := f.count(t, `SELECT count(*) FROM dead_letters WHERE event_id = $1 AND status = 'open' AND deliveries = 1`, poison.ID); n != 1 {
				t.Errorf("the bad event has %d open dead letters after its first delivery, want 1", n)
			}
		})
	}
}

// forgeFor copies env as another event of tenant: same order, same
// version, a new id, as a tenant that learnt another's order id could
// publish it.
func forgeFor(env domain.Envelope, tenant string) domain.Envelope {
	env.ID = uuid.Must(uuid.NewV7())
	env.TenantID = tenant
	return env
}

// An event of one tenant that names another tenant's order is malformed:
// it is dead-lettered under its own tenant, and the order's own events
// apply as if it had never come. Before, it took the order's next version
// (the positions are per order, not per tenant): it moved tenant B's
// summary (a paid order B never had, its money too), tenant A's own v2
// was dropped as stale, and A's summary went negative.
func TestAnEventNamingAnotherTenantsOrderChangesNothingOfIt(t *testing.T) {
	t.Parallel()
	cfg := Config{Workers: 1}
	f := newFixture(t, cfg)
	f.runner = mustRunner(t, f.db, f.js, CustomerSummaries{}, slog.New(slog.NewTextHandler(testLogOutput(), nil)), cfg)
	f.run(t)

	a := orderEvents(t, "tA", "c-a") // created v1, paid v2, shipped v3
	f.publish(t, a[0], a[0].ID.String())
	eventually(t, "tenant A's v1 applied", func() bool { return f.runner.Stats().Applied == 1 })
	forged := forgeFor(a[1], "tB")
	f.publish(t, forged, forged.ID.String())
	eventually(t, "the forged event dead-lettered", func() bool { return f.runner.Stats().Malformed == 1 })
	f.publish(t, a[1], a[1].ID.String())
	f.publish(t, a[2], a[2].ID.String())
	eventually(t, "tenant A's v2 and v3 applied", func() bool { return f.runner.Stats().Applied == 3 })

	type summary struct {
		Tenant                        string
		Pending, Paid, Shipped, Total int64
	}
	rows, _ := f.db.Query(context.Background(), `SELECT tenant_id, orders_pending, orders_paid, orders_shipped, total_paid FROM customer_summaries ORDER BY tenant_id`)
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[summary])
	if err != nil {
		t.Fatal(err)
	}
	want := []summary{{Tenant: "tA", Shipped: 1, Total: 1000}}
	if !slices.Equal(got, want) {
		t.Errorf("customer summaries %+v, want %+v", got, want)
	}
	if n := f.count(t, `SELECT count(*) FROM dead_letters WHERE event_id = $1 AND tenant_id = 'tB' AND status = 'open' AND error LIKE '%names order%'`, forged.ID); n != 1 {
		t.Errorf("%d open dead letters of tenant tB name the forged event as another tenant's, want 1", n)
	}
}

// Another tenant's dead letter naming an order holds none of the order's
// own events back: tenant A's v3, on its last delivery before its v2
// came, waits for v2 and is applied after it. Before, it was parked behind
// tenant B's open dead letter until an operator resolved B's.
func TestAnotherTenantsDeadLetterHoldsNothingOfTheOrderBack(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Config{Workers: 1, MaxDeliver: 2, GapDelay: 10 * time.Millisecond, RedriveInterval: 50 * time.Millisecond})
	f.run(t)
	a := orderEvents(t, "tA", "c-a")
	f.publish(t, a[0], a[0].ID.String())
	eventually(t, "tenant A's v1 applied", func() bool { return f.runner.Stats().Applied == 1 })
	forged := forgeFor(a[1], "tB")
	f.publish(t, forged, forged.ID.String())
	eventually(t, "the forged event dead-lettered", func() bool {
		return f.count(t, `SELECT count(*) FROM dead_letters WHERE tenant_id = 'tB' AND status = 'open'`) == 1
	})
	f.publish(t, a[2], a[2].ID.String())
	eventually(t, "tenant A's v3 parked on its last delivery", func() bool {
		return f.count(t, `SELECT count(*) FROM dead_letters WHERE event_id = $1 AND status = 'parked'`, a[2].ID) == 1
	})
	f.publish(t, a[1], a[1].ID.String())
	eventually(t, "tenant A's order at v3", func() bool { v, _ := f.view(t, a[0].AggregateID); return v == 3 })
}
