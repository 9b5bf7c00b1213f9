package command

import (
	"context"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/acme/orders/domain"
)

// UpdateOrder changes the details of a pending or paid order that the
// caller saw at ExpectedVersion.
type UpdateOrder struct {
	TenantID string `json:"-"`
	// Key is the request's Idempotency-Key: the order keeps it with the
	// version it makes (order_requests), so that a retry after the key's
	// record expired is told it ran (409), not that it did not (412).
	Key             string    `json:"-"`
	OrderID         uuid.UUID `json:"order_id"`
	ExpectedVersion int64     `json:"expected_version"`
	domain.Patch
}

// UpdateOrderHandler handles UpdateOrder.
type UpdateOrderHandler struct{ now func() time.Time }

// NewUpdateOrderHandler returns an UpdateOrderHandler on the wall clock.
func NewUpdateOrderHandler() UpdateOrderHandler { return UpdateOrderHandler{now: now} }

// Handle applies the patch in tx and returns the order. A stale
// ExpectedVersion is a KindPreconditionFailed *domain.Error, a shipped or
// cancelled order a KindConflict one; a patch that changes nothing is a no-op.
func (h UpdateOrderHandler) Handle(ctx context.Context, tx pgx.Tx, cmd UpdateOrder) (domain.Order, error) {
	o, _, err := h.handle(ctx, tx, cmd)
	return o, err
}

// Run runs cmd under its Idempotency-Key with idem, in one transaction with
// the key row, and returns the response render made of the outcome (or the
// stored one, for a retry). See Idempotency.Do for the errors.
func (h UpdateOrderHandler) Run(ctx context.Context, idem *Idempotency, req OrderRequest[UpdateOrder], render Render) (Result, error) {
	return runKeyed(ctx, idem, h, req, render)
}

func (h UpdateOrderHandler) handle(ctx context.Context, tx pgx.Tx, cmd UpdateOrder) (domain.Order, bool, error) {
	return changeKept(ctx, tx, cmd.TenantID, cmd.OrderID, requestUpdate, cmd.Key, cmd.ExpectedVersion != 0, func(o *domain.Order) (domain.Event, error) {
		return o.Update(cmd.Patch, cmd.ExpectedVersion, h.now())
	})
}
