package command

import (
	"context"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/acme/orders/domain"
)

// RefundOrder asks again for the refund of a cancelled order whose refund
// failed: a new refund attempt, carried to the payment worker by
// refund.requested, as the cancellation carried the first.
type RefundOrder struct {
	TenantID string `json:"-"`
	// Key is the request's Idempotency-Key: the order keeps it with the
	// attempt it starts (order_requests), so that no retry after the key's
	// record expired starts another.
	Key     string    `json:"-"`
	OrderID uuid.UUID `json:"order_id"`
	// ExpectedVersion, if not 0, is the version the change was made on
	// (If-Match): another is refused (KindPreconditionFailed).
	ExpectedVersion int64 `json:"expected_version,omitempty"`
}

// RefundOrderHandler handles RefundOrder.
type RefundOrderHandler struct{ now func() time.Time }

// NewRefundOrderHandler returns a RefundOrderHandler on the wall clock.
func NewRefundOrderHandler() RefundOrderHandler { return RefundOrderHandler{now: now} }

// Handle records the new refund attempt in tx and returns the order. An
// order whose refund is pending or succeeded changes nothing; one not
// cancelled, or cancelled without having been paid, is a KindConflict
// *domain.Error (see domain.Order.RetryRefund).
func (h RefundOrderHandler) Handle(ctx context.Context, tx pgx.Tx, cmd RefundOrder) (domain.Order, error) {
	o, _, err := h.handle(ctx, tx, cmd)
	return o, err
}

// Run runs cmd under its Idempotency-Key with idem, in one transaction with
// the key row, and returns the response render made of the outcome (or the
// stored one, for a retry). See Idempotency.Do for the errors.
func (h RefundOrderHandler) Run(ctx context.Context, idem *Idempotency, req OrderRequest[RefundOrder], render Render) (Result, error) {
	return runKeyed(ctx, idem, h, req, render)
}

func (h RefundOrderHandler) handle(ctx context.Context, tx pgx.Tx, cmd RefundOrder) (domain.Order, bool, error) {
	return changeKept(ctx, tx, cmd.TenantID, cmd.OrderID, requestRefund, cmd.Key, cmd.ExpectedVersion != 0, func(o *domain.Order) (domain.Event, error) {
		if err := checkExpected(o, cmd.ExpectedVersion); err != nil {
			return nil, err
		}
		return o.RetryRefund(h.now())
	})
}
