package projection

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/acme/orders/domain"
	"github.com/acme/orders/internal/testenv"
)

// Money counts only when the provider confirmed it: a payment request, a
// decline or a cancellation moves the counts by status but no money; the
// charge (order.paid) and the refund (order.refunded) do.
func TestPaymentEventsCountMoneyOnlyWhenConfirmed(t *testing.T) {
	t.Parallel()
	db := testenv.DB(t)
	ctx := context.Background()
	day := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	o, created, err := domain.CreateOrder(uuid.Must(uuid.NewV7()), "t1", domain.NewOrder{
		CustomerID: "c-pay", Currency: "EUR", Lines: []domain.Line{{SKU: "s", Quantity: 2, UnitPrice: 500}},
	}, day)
	if err != nil {
		t.Fatal(err)
	}
	apply := func(version int64, e domain.Event) {
		t.Helper()
		env, err := domain.NewEnvelopeAt(uuid.Must(uuid.NewV7()), o, version, e, o.UpdatedAt)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range []Projection{OrderViews{}, CustomerSummaries{}, DailySales{}} {
			if err := applyBatch(t, db, p, []domain.Envelope{env}); err != nil {
				t.Fatalf("%s: %s: %v", p.Name(), e.EventType(), err)
			}
		}
	}
	step := func(e domain.Event, err error) {
		t.Helper()
		if err != nil || e == nil {
			t.Fatalf("step: %v %v", e, err)
		}
		apply(o.Version, e)
	}
	type state struct {
		status, refund                    string
		pending, paying, failed, paid, cc int64
		totalPaid, totalRefunded          int64
		salesPaid, salesRefunded          int64
	}
	check := func(what string, want state) {
		t.Helper()
		var got state
		if err := db.QueryRow(ctx, `SELECT status, coalesce(refund->>'status', '') FROM order_views WHERE order_id = $1`, o.ID).Scan(&got.status, &got.refund); err != nil {
			t.Fatal(err)
		}
		if err := db.QueryRow(ctx, `SELECT orders_pending, orders_payment_pending, orders_payment_failed, orders_paid, orders_cancelled,
		        total_paid, total_refunded FROM customer_summaries WHERE customer_id = 'c-pay'`).
			Scan(&got.pending, &got.paying, &got.failed, &got.paid, &got.cc, &got.totalPaid, &got.totalRefunded); err != nil {
			t.Fatal(err)
		}
		if err := db.QueryRow(ctx, `SELECT paid_amount, refunded_amount FROM daily_sales`).Scan(&got.salesPaid, &got.salesRefunded); err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Fatalf("%s:\n got %+v\nwant %+v", what, got, want)
		}
	}

	apply(1, created)
	check("created", state{status: "pending", refund: "", pending: 1})
	step(o.Pay("pm_card_chargeDeclined", day))
	check("payment requested", state{status: "payment_pending", paying: 1})
	step(o.RecordCharge(1, domain.ChargeOutcome{Amount: 1000, Currency: "EUR", DeclineCode: "card_declined", Reason: "declined"}, day))
	check("declined", state{status: "payment_failed", failed: 1})
	step(o.Pay(domain.DefaultPaymentMethod, day))
	check("paid again", state{status: "payment_pending", paying: 1})
	step(o.RecordCharge(2, domain.ChargeOutcome{ChargeID: "pi_2", Amount: 1000, Currency: "EUR", Succeeded: true}, day))
	check("charged", state{status: "paid", paid: 1, totalPaid: 1000, salesPaid: 1000})
	var chargeID string
	if err := db.QueryRow(ctx, `SELECT payment->>'charge_id' FROM order_views WHERE order_id = $1`, o.ID).Scan(&chargeID); err != nil || chargeID != "pi_2" {
		t.Fatalf("order view's charge id %q %v", chargeID, err)
	}
	evs, err := o.Cancel("changed my mind", day)
	if err != nil || len(evs) != 2 {
		t.Fatal(evs, err)
	}
	apply(o.Version-1, evs[0])
	apply(o.Version, evs[1])
	check("cancelled, refund requested", state{status: "cancelled", refund: "pending", cc: 1, totalPaid: 1000, salesPaid: 1000})
	step(o.RecordRefund(1, domain.RefundOutcome{RefundID: "re_1", Amount: 1000, Currency: "EUR", Succeeded: true}, day))
	check("refunded", state{status: "cancelled", refund: "succeeded", cc: 1, totalPaid: 1000, totalRefunded: 1000, salesPaid: 1000, salesRefunded: 1000})
	var version int64
	if err := db.QueryRow(ctx, `SELECT version FROM order_views WHERE order_id = $1`, o.ID).Scan(&version); err != nil || version != o.Version {
		t.Fatalf("view version %d, want %d (%v)", version, o.Version, err)
	}
}
