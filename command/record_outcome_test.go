package command_test

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/acme/orders/command"
	"github.com/acme/orders/domain"
	"github.com/acme/orders/internal/testenv"
)

// inTx runs fn in one committed transaction.
func inTx(t *testing.T, db *pgxpool.Pool, fn func(tx pgx.Tx) error) {
	t.Helper()
	if err := pgx.BeginFunc(context.Background(), db, fn); err != nil {
		t.Fatal(err)
	}
}

// pendingPayment creates an order and asks for its payment; it returns the
// order as payment_pending and the id of its payment.requested event.
func pendingPayment(t *testing.T, db *pgxpool.Pool, method string) (domain.Order, uuid.UUID) {
	t.Helper()
	ctx := context.Background()
	var o domain.Order
	inTx(t, db, func(tx pgx.Tx) (err error) {
		o, err = command.NewCreateOrderHandler().Handle(ctx, tx, command.CreateOrder{TenantID: "t1", Key: uuid.NewString(), NewOrder: newOrder("c1")})
		return err
	})
	return pay(t, db, o.ID, method)
}

// pay asks for a payment of order id and returns the order and the id of
// its newest payment.requested event.
func pay(t *testing.T, db *pgxpool.Pool, id uuid.UUID, method string) (domain.Order, uuid.UUID) {
	t.Helper()
	ctx := context.Background()
	var o domain.Order
	inTx(t, db, func(tx pgx.Tx) (err error) {
		o, err = command.NewPayOrderHandler().Handle(ctx, tx, command.PayOrder{TenantID: "t1", OrderID: id, PaymentMethod: method})
		return err
	})
	var ev uuid.UUID
	if err := db.QueryRow(ctx, `SELECT id FROM outbox WHERE aggregate_id = $1 AND event_type = 'payment.requested' ORDER BY aggregate_version DESC LIMIT 1`, id).Scan(&ev); err != nil {
		t.Fatal(err)
	}
	return o, ev
}

func succeeded(o domain.Order, chargeID string) command.ChargeOutcome {
	return command.ChargeOutcome{ChargeID: chargeID, Amount: o.Total, Currency: o.Currency, Succeeded: true}
}

func TestRecordChargeOutcomeOncePerEvent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.DB(t)
	o, ev := pendingPayment(t, db, domain.DefaultPaymentMethod)
	h := command.NewRecordChargeOutcomeHandler(db)
	cmd := command.RecordChargeOutcome{TenantID: "t1", OrderID: o.ID, Attempt: 1, Consumer: "payments", EventID: ev, Charge: succeeded(o, "pi_1")}
	for i := range 3 {
		got, err := h.Handle(ctx, cmd)
		if err != nil {
			t.Fatalf("delivery %d: %v", i+1, err)
		}
		if got.Status != domain.StatusPaid || got.Version != o.Version+1 || got.Payment.ChargeID != "pi_1" {
			t.Fatalf("delivery %d: %s v%d %+v; want paid at v%d", i+1, got.Status, got.Version, got.Payment, o.Version+1)
		}
	}
	if n := count(t, db, `SELECT count(*) FROM payments WHERE kind = 'charge'`); n != 1 {
		t.Fatalf("%d charge rows, want 1", n)
	}
	if n := count(t, db, `SELECT count(*) FROM outbox WHERE event_type = 'order.paid'`); n != 1 {
		t.Fatalf("%d order.paid events, want 1", n)
	}
	if n := count(t, db, `SELECT count(*) FROM payment_inbox WHERE consumer = 'payments'`); n != 1 {
		t.Fatalf("%d inbox rows, want 1", n)
	}
	var key, provider, status string
	var amount int64
	if err := db.QueryRow(ctx, `SELECT idempotency_key, provider_id, status, amount FROM payments`).Scan(&key, &provider, &status, &amount); err != nil {
		t.Fatal(err)
	}
	if key != domain.ChargeKey("t1", o.ID, 1) || provider != "pi_1" || status != "succeeded" || amount != o.Total {
		t.Fatalf("charge row: %s %s %s %d", key, provider, status, amount)
	}
}

func TestRecordChargeOutcomeDeclinedThenPaidAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.DB(t)
	o, ev1 := pendingPayment(t, db, "pm_card_chargeDeclined")
	h := command.NewRecordChargeOutcomeHandler(db)
	got, err := h.Handle(ctx, command.RecordChargeOutcome{TenantID: "t1", OrderID: o.ID, Attempt: 1, Consumer: "payments", EventID: ev1,
		Charge: command.ChargeOutcome{ChargeID: "pi_d", Amount: o.Total, Currency: o.Currency, DeclineCode: "card_declined", Reason: "Your card was declined."}})
	if err != nil || got.Status != domain.StatusPaymentFailed || got.Payment.DeclineCode != "card_declined" {
		t.Fatalf("decline: %v %s %+v", err, got.Status, got.Payment)
	}
	o2, ev2 := pay(t, db, o.ID, domain.DefaultPaymentMethod)
	if o2.Status != domain.StatusPaymentPending || o2.Payment.Attempt != 2 || o2.Payment.Key != domain.ChargeKey("t1", o.ID, 2) || ev2 == ev1 {
		t.Fatalf("second attempt: %s %+v", o2.Status, o2.Payment)
	}
	var data struct {
		Attempt    int    `json:"attempt"`
		PaymentKey string `json:"payment_key"`
	}
	var env domain.Envelope
	if err := db.QueryRow(ctx, `SELECT payload FROM outbox WHERE id = $1`, ev2).Scan(&env); err != nil {
		t.Fatal(err)
	}
	if err := env.Decode(&data); err != nil || data.Attempt != 2 || data.PaymentKey != o2.Payment.Key {
		t.Fatalf("payment.requested data %+v %v", data, err)
	}
	got, err = h.Handle(ctx, command.RecordChargeOutcome{TenantID: "t1", OrderID: o.ID, Attempt: 2, Consumer: "payments", EventID: ev2, Charge: succeeded(o, "pi_2")})
	if err != nil || got.Status != domain.StatusPaid {
		t.Fatalf("second attempt charged: %v %s", err, got.Status)
	}
	if n := count(t, db, `SELECT count(*) FROM payments WHERE kind = 'charge'`); n != 2 {
		t.Fatalf("%d charge rows, want 2 (one declined, one succeeded)", n)
	}
}

func TestRecordChargeOutcomeStale(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.DB(t)
	o, ev1 := pendingPayment(t, db, "pm_card_chargeDeclined")
	h := command.NewRecordChargeOutcomeHandler(db)
	// Attempt 1 declined, attempt 2 asked for; then a late success of
	// attempt 1 (a different event id, e.g. after a reconciliation) arrives.
	if _, err := h.Handle(ctx, command.RecordChargeOutcome{TenantID: "t1", OrderID: o.ID, Attempt: 1, Consumer: "payments", EventID: ev1,
		Charge: command.ChargeOutcome{Amount: o.Total, Currency: o.Currency, DeclineCode: "card_declined"}}); err != nil {
		t.Fatal(err)
	}
	o2, _ := pay(t, db, o.ID, domain.DefaultPaymentMethod)
	got, err := h.Handle(ctx, command.RecordChargeOutcome{TenantID: "t1", OrderID: o.ID, Attempt: 1, Consumer: "reconciler", EventID: ev1, Charge: succeeded(o, "pi_late")})
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != domain.StatusPaymentPending || got.Version != o2.Version {
		t.Fatalf("a stale outcome moved the order: %s v%d", got.Status, got.Version)
	}
	if n := count(t, db, `SELECT count(*) FROM payments WHERE kind = 'charge'`); n != 1 {
		t.Fatalf("%d charge rows; the stale outcome's key was recorded before (declined), want 1", n)
	}
}

func TestRecordChargeOutcomeWrongAmountWritesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.DB(t)
	o, ev := pendingPayment(t, db, domain.DefaultPaymentMethod)
	c := succeeded(o, "pi_1")
	c.Amount++
	_, err := command.NewRecordChargeOutcomeHandler(db).Handle(ctx, command.RecordChargeOutcome{TenantID: "t1", OrderID: o.ID, Attempt: 1, Consumer: "payments", EventID: ev, Charge: c})
	if domain.KindOf(err) != domain.KindConflict {
		t.Fatalf("err %v, want KindConflict", err)
	}
	if n := count(t, db, `SELECT (SELECT count(*) FROM payments) + (SELECT count(*) FROM payment_inbox)`); n != 0 {
		t.Fatalf("%d rows written", n)
	}
}

func TestCancelPaidOrderRequestsRefundAndRecordRefundOutcome(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.DB(t)
	o, ev := pendingPayment(t, db, domain.DefaultPaymentMethod)
	paid, err := command.NewRecordChargeOutcomeHandler(db).Handle(ctx, command.RecordChargeOutcome{TenantID: "t1", OrderID: o.ID, Attempt: 1, Consumer: "payments", EventID: ev, Charge: succeeded(o, "pi_1")})
	if err != nil {
		t.Fatal(err)
	}
	var cancelled domain.Order
	inTx(t, db, func(tx pgx.Tx) (err error) {
		cancelled, err = command.NewCancelOrderHandler().Handle(ctx, tx, command.CancelOrder{TenantID: "t1", OrderID: o.ID, Reason: "changed my mind"})
		return err
	})
	if cancelled.Status != domain.StatusCancelled || cancelled.Version != paid.Version+2 || cancelled.Refund.Status != domain.RefundPending {
		t.Fatalf("cancelled: %s v%d %+v", cancelled.Status, cancelled.Version, cancelled.Refund)
	}
	rows, err := db.Query(ctx, `SELECT event_type, aggregate_version FROM outbox WHERE aggregate_id = $1 AND aggregate_version > $2 ORDER BY aggregate_version`, o.ID, paid.Version)
	if err != nil {
		t.Fatal(err)
	}
	type ev2 struct {
		Type    string
		Version int64
	}
	evs, err := pgx.CollectRows(rows, pgx.RowToStructByPos[ev2])
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 2 || evs[0] != (ev2{"order.cancelled", paid.Version + 1}) || evs[1] != (ev2{"refund.requested", paid.Version + 2}) {
		t.Fatalf("events after cancel: %+v", evs)
	}
	var refundEvent uuid.UUID
	if err := db.QueryRow(ctx, `SELECT id FROM outbox WHERE aggregate_id = $1 AND event_type = 'refund.requested'`, o.ID).Scan(&refundEvent); err != nil {
		t.Fatal(err)
	}
	h := command.NewRecordRefundOutcomeHandler(db)
	cmd := command.RecordRefundOutcome{TenantID: "t1", OrderID: o.ID, Attempt: 1, Consumer: "refunds", EventID: refundEvent,
		Refund: command.RefundOutcome{RefundID: "re_1", Amount: o.Total, Currency: o.Currency, Succeeded: true}}
	for range 2 {
		got, err := h.Handle(ctx, cmd)
		if err != nil || got.Refund.Status != domain.RefundSucceeded || got.Refund.ID != "re_1" || got.Version != cancelled.Version+1 {
			t.Fatalf("refund outcome: %v %+v v%d", err, got.Refund, got.Version)
		}
	}
	if n := count(t, db, `SELECT count(*) FROM payments WHERE kind = 'refund' AND status = 'succeeded' AND provider_id = 're_1'`); n != 1 {
		t.Fatalf("%d refund rows, want 1", n)
	}
	if n := count(t, db, `SELECT count(*) FROM outbox WHERE event_type = 'order.refunded'`); n != 1 {
		t.Fatalf("%d order.refunded events, want 1", n)
	}
}

func TestCancelPaymentPendingIsAConflict(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.DB(t)
	o, _ := pendingPayment(t, db, domain.DefaultPaymentMethod)
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		_, err := command.NewCancelOrderHandler().Handle(ctx, tx, command.CancelOrder{TenantID: "t1", OrderID: o.ID, Reason: "too slow"})
		return err
	})
	if de, ok := err.(*domain.Error); !ok || de.Kind != domain.KindConflict || de.State != "payment_pending" {
		t.Fatalf("err %v, want a conflict in payment_pending", err)
	}
}

// An outcome for an order the tenant does not have is refused as not found
// (the worker dead-letters it), and nothing of it is written: no inbox row,
// so a later delivery is not taken for recorded.
func TestRecordChargeOutcomeUnknownOrderWritesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.DB(t)
	o, ev := pendingPayment(t, db, domain.DefaultPaymentMethod)
	_, recorded, err := command.NewRecordChargeOutcomeHandler(db).HandleRecorded(ctx, command.RecordChargeOutcome{
		TenantID: "t2", OrderID: o.ID, Attempt: 1, Consumer: "payments", EventID: ev, Charge: succeeded(o, "pi_1")})
	if domain.KindOf(err) != domain.KindNotFound || recorded {
		t.Fatalf("HandleRecorded for another tenant's order = recorded %v, %v; want a not-found refusal", recorded, err)
	}
	if n := count(t, db, `SELECT count(*) FROM payment_inbox`) + count(t, db, `SELECT count(*) FROM payments`); n != 0 {
		t.Fatalf("%d inbox and payment rows written for an unknown order; want none", n)
	}
}
