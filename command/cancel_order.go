package command

import (
	"context"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/acme/orders/domain"
)

// CancelOrder cancels a pending, payment_failed or paid order; a paid one's
// refund is requested in the same transaction (refund.requested).
type CancelOrder struct {
	TenantID string    `json:"-"`
	OrderID  uuid.UUID `json:"order_id"`
	Reason   string    `json:"reason"`
	// ExpectedVersion, if not 0, is the version the change was made on
	// (If-Match): another is refused (KindPreconditionFailed), unless the
	// order is cancelled already (checkExpectedUnlessDone).
	ExpectedVersion int64 `json:"expected_version,omitempty"`
}

// Validate checks the command's own fields before any database work.
func (c CancelOrder) Validate() error { return domain.ValidateReason(c.Reason) }

// CancelOrderHandler handles CancelOrder.
type CancelOrderHandler struct{ now func() time.Time }

// NewCancelOrderHandler returns a CancelOrderHandler on the wall clock.
func NewCancelOrderHandler() CancelOrderHandler { return CancelOrderHandler{now: now} }

// Handle cancels the order in tx and returns it; for a paid order it also
// writes refund.requested, one version after order.cancelled. Cancelling a
// cancelled order changes nothing; cancelling a shipped or payment_pending
// one is a KindConflict *domain.Error.
func (h CancelOrderHandler) Handle(ctx context.Context, tx pgx.Tx, cmd CancelOrder) (domain.Order, error) {
	o, _, err := h.handle(ctx, tx, cmd)
	return o, err
}

// Run runs cmd under its Idempotency-Key with idem, in one transaction with
// the key row, and returns the response render made of the outcome (or the
// stored one, for a retry). See Idempotency.Do for the errors.
func (h CancelOrderHandler) Run(ctx context.Context, idem *Idempotency, req OrderRequest[CancelOrder], render Render) (Result, error) {
	return runKeyed(ctx, idem, h, req, render)
}

func (h CancelOrderHandler) handle(ctx context.Context, tx pgx.Tx, cmd CancelOrder) (domain.Order, bool, error) {
	return changeOrderMany(ctx, tx, cmd.TenantID, cmd.OrderID, func(o *domain.Order) ([]domain.Event, error) {
		if err := checkExpectedUnlessDone(o, cmd.ExpectedVersion, o.Status == domain.StatusCancelled); err != nil {
			return nil, err
		}
		return o.Cancel(cmd.Reason, h.now())
	})
}
