package testenv

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/acme/orders/command"
	"github.com/acme/orders/domain"
	"github.com/acme/orders/postgres"
)

// SettlePayment records the payment worker's outcome of order orderID's
// current payment attempt, as the worker does: through
// command.RecordChargeOutcome, for the newest payment.requested event of
// the order, with a succeeded charge of its total (ok) or a card_declined
// decline. Tests that need a paid order use it where no worker runs.
func SettlePayment(tb testing.TB, db postgres.DB, orderID uuid.UUID, ok bool) domain.Order {
	tb.Helper()
	ctx := context.Background()
	var (
		ev       uuid.UUID
		tenant   string
		attempt  int
		total    int64
		currency string
	)
	err := db.QueryRow(ctx, `
SELECT e.id, o.tenant_id, (o.payment->>'attempt')::int, o.total, o.currency
FROM orders o JOIN outbox e ON e.aggregate_id = o.id AND e.event_type = 'payment.requested'
WHERE o.id = $1 ORDER BY e.aggregate_version DESC LIMIT 1`, orderID).Scan(&ev, &tenant, &attempt, &total, &currency)
	if err != nil {
		tb.Fatalf("find the payment request of order %s: %v", orderID, err)
	}
	c := command.ChargeOutcome{ChargeID: "pi_" + strings.ReplaceAll(ev.String(), "-", "")[:24], Amount: total, Currency: currency, Succeeded: ok}
	if !ok {
		c.DeclineCode, c.Reason = "card_declined", "Your card was declined."
	}
	o, err := command.NewRecordChargeOutcomeHandler(db).Handle(ctx, command.RecordChargeOutcome{
		TenantID: tenant, OrderID: orderID, Attempt: attempt, Consumer: "test", EventID: ev, Charge: c,
	})
	if err != nil {
		tb.Fatalf("record the charge of order %s: %v", orderID, err)
	}
	return o
}

// SettleRefund records the payment worker's outcome of the order's current
// refund attempt (succeeded, or failed), as the worker will, and returns
// the order.
func SettleRefund(tb testing.TB, db postgres.DB, orderID uuid.UUID, ok bool) domain.Order {
	tb.Helper()
	ctx := context.Background()
	var (
		ev       uuid.UUID
		tenant   string
		attempt  int
		total    int64
		currency string
	)
	err := db.QueryRow(ctx, `
SELECT e.id, o.tenant_id, (o.refund->>'attempt')::int, o.total, o.currency
FROM orders o JOIN outbox e ON e.aggregate_id = o.id AND e.event_type = 'refund.requested'
WHERE o.id = $1 ORDER BY e.aggregate_version DESC LIMIT 1`, orderID).Scan(&ev, &tenant, &attempt, &total, &currency)
	if err != nil {
		tb.Fatalf("find the refund request of order %s: %v", orderID, err)
	}
	out := command.RefundOutcome{Amount: total, Currency: currency, Succeeded: ok}
	if ok {
		out.RefundID = "re_" + strings.ReplaceAll(ev.String(), "-", "")[:24]
	} else {
		out.Reason = "declined"
	}
	o, err := command.NewRecordRefundOutcomeHandler(db).Handle(ctx, command.RecordRefundOutcome{
		TenantID: tenant, OrderID: orderID, Attempt: attempt, Consumer: "test", EventID: ev, Refund: out,
	})
	if err != nil {
		tb.Fatalf("record the refund of order %s: %v", orderID, err)
	}
	return o
}

// Pool opens a pool on the database at url (for example one DatabaseURL
// made), closed when the test ends.
func Pool(tb testing.TB, url string) postgres.DB {
	tb.Helper()
	pool, err := postgres.Open(context.Background(), url, 0, 10*time.Second, slog.New(slog.DiscardHandler))
	if err != nil {
		tb.Fatalf("open database: %v", err)
	}
	tb.Cleanup(pool.Close)
	return pool
}
