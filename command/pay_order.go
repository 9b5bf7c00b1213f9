package command

import (
	"context"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/acme/orders/domain"
)

// PayOrder records the payment of a pending order. Its JSON encoding is its
// canonical form for the idempotency fingerprint.
type PayOrder struct {
	TenantID string    `json:"-"`
	OrderID  uuid.UUID `json:"order_id"`
}

// PayOrderHandler handles PayOrder.
type PayOrderHandler struct{ now func() time.Time }

// NewPayOrderHandler returns a PayOrderHandler on the wall clock.
func NewPayOrderHandler() PayOrderHandler { return PayOrderHandler{now: now} }

// Handle pays the order in tx and returns it. Paying a paid or shipped order
// changes nothing; paying a cancelled one is a KindConflict *domain.Error.
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
	return changeOrder(ctx, tx, cmd.TenantID, cmd.OrderID, func(o *domain.Order) (domain.Event, error) {
		return o.Pay(h.now())
	})
}
