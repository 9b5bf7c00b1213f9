package command

import (
	"context"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/acme/orders/domain"
)

// PayOrder asks for the payment of an order: a new charge attempt of a
// pending or payment_failed order, with PaymentMethod (the caller fills in
// domain.DefaultPaymentMethod when the client named none, before the
// fingerprint is taken). Its JSON encoding is its canonical form for the
// idempotency fingerprint.
type PayOrder struct {
	TenantID string `json:"-"`
	// Key is the request's Idempotency-Key: the order keeps it with the
	// attempt it starts (order_requests), so that no retry after the key's
	// record expired starts another.
	Key           string    `json:"-"`
	OrderID       uuid.UUID `json:"order_id"`
	PaymentMethod string    `json:"payment_method"`
	// ExpectedVersion, if not 0, is the version the change was made on
	// (If-Match): another is refused (KindPreconditionFailed).
	ExpectedVersion int64 `json:"expected_version,omitempty"`
}

// Validate checks the command's own fields before any database work.
func (c PayOrder) Validate() error { return domain.ValidatePaymentMethod(c.PaymentMethod) }

// PayOrderHandler handles PayOrder.
type PayOrderHandler struct{ now func() time.Time }

// NewPayOrderHandler returns a PayOrderHandler on the wall clock.
func NewPayOrderHandler() PayOrderHandler { return PayOrderHandler{now: now} }

// Handle records the payment intent in tx (the order becomes
// payment_pending, payment.requested carries the attempt and its derived
// provider key) and returns the order. Paying a payment_pending or paid order
// changes nothing (changed is false: no second attempt); paying a shipped or
// cancelled one is a KindConflict *domain.Error.
func (h PayOrderHandler) Handle(ctx context.Context, tx pgx.Tx, cmd PayOrder) (domain.Order, error) {
	o, _, err := h.handle(ctx, tx, cmd)
	return o, err
}

// Run runs cmd under its Idempotency-Key with idem, in one transaction with
// the key row, and returns the response render made of the outcome (or the
// stored one, for a retry). See Idempotency.Do for the errors.
func (h PayOrderHandler) Run(ctx context.Context, idem *Idempotency, req OrderRequest[PayOrder], render Render) (Result, error) {
	return runKeyed(ctx, idem, h, req, render)
}

func (h PayOrderHandler) handle(ctx context.Context, tx pgx.Tx, cmd PayOrder) (domain.Order, bool, error) {
	return changeKept(ctx, tx, cmd.TenantID, cmd.OrderID, requestPay, cmd.Key, cmd.ExpectedVersion != 0, func(o *domain.Order) (domain.Event, error) {
		if err := checkExpected(o, cmd.ExpectedVersion); err != nil {
			return nil, err
		}
		return o.Pay(cmd.PaymentMethod, h.now())
	})
}
