package command_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/acme/orders/command"
	"github.com/acme/orders/domain"
	"github.com/acme/orders/internal/testenv"
	"github.com/acme/orders/postgres"
)

// plainRender renders a refusal as a stored 409, as any Render may: it
// knows nothing of ErrKeyRanBefore.
func plainRender(out command.Outcome) (command.Response, error) {
	if out.Refusal != nil {
		return command.Response{Status: http.StatusConflict, Body: []byte(out.Refusal.Error())}, nil
	}
	return command.Response{Status: http.StatusAccepted, Body: []byte(out.Order.ID.String())}, nil
}

// A late retry of a pay (its key row gone) whose attempt was declined is
// refused, and what the step wrote before it found its key kept (the
// order's new attempt, its payment.requested) rolls back and nothing is
// stored under the key, whatever the Render: the refusal is never stored.
func TestALatePayRetryRollsBackWhateverTheRender(t *testing.T) {
	t.Parallel()
	db := testenv.DB(t)
	ctx := context.Background()
	idem := newIdem(t, db, command.IdempotencyConfig{})
	var o domain.Order
	if err := postgres.InTx(ctx, db, func(tx pgx.Tx) (err error) {
		o, err = command.NewCreateOrderHandler().Handle(ctx, tx, command.CreateOrder{TenantID: "t1", Key: uuid.NewString(), NewOrder: newOrder("c")})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	pay := func() (command.Result, error) {
		return command.NewPayOrderHandler().Run(ctx, idem, command.OrderRequest[command.PayOrder]{TenantID: "t1", Scope: "POST /v1/orders/{id}/pay", Key: "kp",
			Command: command.PayOrder{TenantID: "t1", Key: "kp", OrderID: o.ID, PaymentMethod: domain.DefaultPaymentMethod}}, plainRender)
	}
	if r, err := pay(); err != nil || r.Status != http.StatusAccepted {
		t.Fatalf("pay: %+v, %v", r, err)
	}
	testenv.SettlePayment(t, db, o.ID, false)
	if _, err := db.Exec(ctx, `DELETE FROM idempotency_keys`); err != nil {
		t.Fatal(err)
	}
	r, err := pay()
	if err != nil || r.Status != http.StatusConflict {
		t.Fatalf("late retry: %+v, %v; want the 409", r, err)
	}
	var status string
	var requests, keys int
	if err := db.QueryRow(ctx, `SELECT status, (SELECT count(*) FROM outbox WHERE event_type = 'payment.requested'),
		(SELECT count(*) FROM idempotency_keys) FROM orders WHERE id = $1`, o.ID).Scan(&status, &requests, &keys); err != nil {
		t.Fatal(err)
	}
	if status != string(domain.StatusPaymentFailed) || requests != 1 || keys != 0 {
		t.Fatalf("after the late retry: order %s, %d payment requests, %d key rows; want payment_failed, 1, 0", status, requests, keys)
	}
}
