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
	in := newestIntent(tb, db, orderID, domain.TypePaymentRequested, "payment")
	c := command.ChargeOutcome{ChargeID: "pi_" + in.idPart(), Amount: in.total, Currency: in.currency, Succeeded: ok}
	if !ok {
		c.DeclineCode, c.Reason = "card_declined", "Your card was declined."
	}
	o, err := command.NewRecordChargeOutcomeHandler(db).Handle(context.Background(), command.RecordChargeOutcome{
		TenantID: in.tenant, OrderID: orderID, Attempt: in.attempt, Consumer: "test", EventID: in.event, Charge: c,
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
	in := newestIntent(tb, db, orderID, domain.TypeRefundRequested, "refund")
	out := command.RefundOutcome{Amount: in.total, Currency: in.currency, Succeeded: ok}
	if ok {
		out.RefundID = "re_" + in.idPart()
	} else {
		out.Reason = "declined"
	}
	o, err := command.NewRecordRefundOutcomeHandler(db).Handle(context.Background(), command.RecordRefundOutcome{
		TenantID: in.tenant, OrderID: orderID, Attempt: in.attempt, Consumer: "test", EventID: in.event, Refund: out,
	})
	if err != nil {
		tb.Fatalf("record the refund of order %s: %v", orderID, err)
	}
	return o
}

// intent is an order's newest payment or refund intent.
type intent struct {
	event    uuid.UUID
	tenant   string
	attempt  int
	total    int64
	currency string
}

// idPart makes a provider id's tail of the intent's event id.
func (in intent) idPart() string { return strings.ReplaceAll(in.event.String(), "-", "")[:24] }

// newestIntent reads order orderID's newest event of eventType and the
// attempt its column (payment or refund) holds.
func newestIntent(tb testing.TB, db postgres.DB, orderID uuid.UUID, eventType, column string) intent {
	tb.Helper()
	var in intent
	err := db.QueryRow(context.Background(), `
SELECT e.id, o.tenant_id, (o.`+column+`->>'attempt')::int, o.total, o.currency
FROM orders o JOIN outbox e ON e.aggregate_id = o.id AND e.event_type = $2
WHERE o.id = $1 ORDER BY e.aggregate_version DESC LIMIT 1`, orderID, eventType).Scan(&in.event, &in.tenant, &in.attempt, &in.total, &in.currency)
	if err != nil {
		tb.Fatalf("find the %s of order %s: %v", eventType, orderID, err)
	}
	return in
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
