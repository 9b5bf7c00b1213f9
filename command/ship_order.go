package command

import (
	"context"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/acme/orders/domain"
)

// ShipOrder records that a paid order was shipped.
type ShipOrder struct {
	TenantID string    `json:"-"`
	OrderID  uuid.UUID `json:"order_id"`
	// ExpectedVersion, if not 0, is the version the change was made on
	// (If-Match): another is refused (KindPreconditionFailed), unless the
	// order is shipped already (checkExpectedUnlessDone).
	ExpectedVersion int64 `json:"expected_version,omitempty"`
}

// ShipOrderHandler handles ShipOrder.
type ShipOrderHandler struct{ now func() time.Time }

// NewShipOrderHandler returns a ShipOrderHandler on the wall clock.
func NewShipOrderHandler() ShipOrderHandler { return ShipOrderHandler{now: now} }

// Handle ships the order in tx and returns it. Shipping a shipped order
// changes nothing; shipping a pending or cancelled one is a KindConflict
// *domain.Error.
func (h ShipOrderHandler) Handle(ctx context.Context, tx pgx.Tx, cmd ShipOrder) (domain.Order, error) {
	o, _, err := h.handle(ctx, tx, cmd)
	return o, err
}

// Run runs cmd under its Idempotency-Key with idem, in one transaction with
// the key row, and returns the response render made of the outcome (or the
// stored one, for a retry). See Idempotency.Do for the errors.
func (h ShipOrderHandler) Run(ctx context.Context, idem *Idempotency, req OrderRequest[ShipOrder], render Render) (Result, error) {
	return runKeyed(ctx, idem, h, req, render)
}

func (h ShipOrderHandler) handle(ctx context.Context, tx pgx.Tx, cmd ShipOrder) (domain.Order, bool, error) {
	return changeOrder(ctx, tx, cmd.TenantID, cmd.OrderID, func(o *domain.Order) (domain.Event, error) {
		if err := checkExpectedUnlessDone(o, cmd.ExpectedVersion, o.Status == domain.StatusShipped); err != nil {
			return nil, err
		}
		return o.Ship(h.now())
	})
}
