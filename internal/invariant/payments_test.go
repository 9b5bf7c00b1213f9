package invariant_test

import (
	"context"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/acme/orders/command"
	"github.com/acme/orders/domain"
	"github.com/acme/orders/internal/invariant"
	"github.com/acme/orders/internal/testenv"
	"github.com/acme/orders/projection"
)

// project applies every outbox event to the read models, in version order,
// as the projector would.
func project(t *testing.T, db *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	rows, _ := db.Query(ctx, `SELECT payload FROM outbox ORDER BY aggregate_id, aggregate_version`)
	envs, err := pgx.CollectRows(rows, pgx.RowTo[domain.Envelope])
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []projection.Projection{projection.OrderViews{}, projection.CustomerSummaries{}, projection.DailySales{}} {
		b := &pgx.Batch{}
		if err := p.Queue(b, envs); err != nil {
			t.Fatal(err)
		}
		if err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error { return tx.SendBatch(ctx, b).Close() }); err != nil {
			t.Fatal(err)
		}
	}
}

// readModelViolations are the violations of the read-model and payment
// checks (the delivery bookkeeping is not run here).
func readModelViolations(t *testing.T, db *pgxpool.Pool) []string {
	t.Helper()
	v, err := invariant.Check(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, x := range v {
		if !strings.Contains(x.Invariant, "projection") && !strings.Contains(x.Invariant, "published") {
			out = append(out, x.String())
		}
	}
	return out
}

// Orders in every payment state: the read models count money paid only for
// confirmed charges and refunded only for confirmed refunds, and the checker
// agrees; a charge row that goes missing is a violation.
func TestPaymentInvariants(t *testing.T) {
	t.Parallel()
	db := testenv.DB(t)
	ctx := context.Background()
	inTx := func(fn func(tx pgx.Tx) error) {
		t.Helper()
		if err := pgx.BeginFunc(ctx, db, fn); err != nil {
			t.Fatal(err)
		}
	}
	newOrder := func() domain.Order {
		var o domain.Order
		inTx(func(tx pgx.Tx) (err error) {
			o, err = command.NewCreateOrderHandler().Handle(ctx, tx, command.CreateOrder{TenantID: "t1", Key: uuid.NewString(),
				NewOrder: domain.NewOrder{CustomerID: "c-1", Currency: "EUR", Lines: []domain.Line{{SKU: "s", Quantity: 1, UnitPrice: 700}}}})
			return err
		})
		return o
	}
	pay := func(o domain.Order) uuid.UUID {
		inTx(func(tx pgx.Tx) error {
			_, err := command.NewPayOrderHandler().Handle(ctx, tx, command.PayOrder{TenantID: "t1", OrderID: o.ID, PaymentMethod: domain.DefaultPaymentMethod})
			return err
		})
		var ev uuid.UUID
		if err := db.QueryRow(ctx, `SELECT id FROM outbox WHERE aggregate_id = $1 AND event_type = 'payment.requested' ORDER BY aggregate_version DESC LIMIT 1`, o.ID).Scan(&ev); err != nil {
			t.Fatal(err)
		}
		return ev
	}
	charge := func(o domain.Order, ok bool) {
		ev := pay(o)
		c := command.ChargeOutcome{ChargeID: "pi_" + o.ID.String()[:8], Amount: o.Total, Currency: o.Currency, Succeeded: ok, DeclineCode: "card_declined"}
		if _, err := command.NewRecordChargeOutcomeHandler(db).Handle(ctx, command.RecordChargeOutcome{TenantID: "t1", OrderID: o.ID, Attempt: 1, Consumer: "payments", EventID: ev, Charge: c}); err != nil {
			t.Fatal(err)
		}
	}
	cancel := func(o domain.Order) {
		inTx(func(tx pgx.Tx) error {
			_, err := command.NewCancelOrderHandler().Handle(ctx, tx, command.CancelOrder{TenantID: "t1", OrderID: o.ID, Reason: "test"})
			return err
		})
	}
	pending := newOrder()       // pending
	pay(newOrder())             // payment_pending
	charge(newOrder(), false)   // payment_failed
	paid := newOrder()          // paid
	charge(paid, true)          //
	refundPending := newOrder() // cancelled, refund pending: nothing refunded yet
	charge(refundPending, true)
	cancel(refundPending)
	refunded := newOrder() // cancelled and refunded
	charge(refunded, true)
	cancel(refunded)
	var refundEvent uuid.UUID
	if err := db.QueryRow(ctx, `SELECT id FROM outbox WHERE aggregate_id = $1 AND event_type = 'refund.requested'`, refunded.ID).Scan(&refundEvent); err != nil {
		t.Fatal(err)
	}
	if _, err := command.NewRecordRefundOutcomeHandler(db).Handle(ctx, command.RecordRefundOutcome{TenantID: "t1", OrderID: refunded.ID, Attempt: 1, Consumer: "refunds", EventID: refundEvent,
		Refund: command.RefundOutcome{RefundID: "re_1", Amount: refunded.Total, Currency: "EUR", Succeeded: true}}); err != nil {
		t.Fatal(err)
	}
	project(t, db)

	if v := readModelViolations(t, db); len(v) != 0 {
		t.Fatalf("violations in a consistent database:\n%s", strings.Join(v, "\n"))
	}
	var totalPaid, totalRefunded int64
	if err := db.QueryRow(ctx, `SELECT total_paid, total_refunded FROM customer_summaries`).Scan(&totalPaid, &totalRefunded); err != nil {
		t.Fatal(err)
	}
	if totalPaid != 3*700 || totalRefunded != 700 {
		t.Fatalf("summary paid %d refunded %d, want 2100 and 700", totalPaid, totalRefunded)
	}

	if _, err := db.Exec(ctx, `DELETE FROM payments WHERE order_id = $1`, paid.ID); err != nil {
		t.Fatal(err)
	}
	if v := readModelViolations(t, db); len(v) != 1 || !strings.Contains(v[0], paid.ID.String()) {
		t.Fatalf("a paid order without its charge row: violations %v, want one naming it", v)
	}
	// A succeeded charge and refund recorded for an order that never asked
	// for either (what an intent no order awaited once left).
	for _, kind := range []string{"charge", "refund"} {
		if _, err := db.Exec(ctx, `INSERT INTO payments (tenant_id, order_id, kind, attempt, idempotency_key, provider_id, amount, currency, status)
SELECT tenant_id, id, $2, 1, 'stray-' || $2, 'x_stray', 700, 'EUR', 'succeeded' FROM orders WHERE id = $1`, pending.ID, kind); err != nil {
			t.Fatal(err)
		}
	}
	if v := readModelViolations(t, db); len(v) != 3 || strings.Count(strings.Join(v, "\n"), pending.ID.String()) != 2 {
		t.Fatalf("besides the paid order's, a pending order with a succeeded charge and refund: violations %v, want two more naming it", v)
	}
}
