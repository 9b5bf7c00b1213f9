package command

import (
	"context"
	"time"

	"github.com/google/uuid"

	"github.com/acme/orders/domain"
	"github.com/acme/orders/postgres"
)

// RefundOutcome is the provider's answer to a refund, as the refund worker
// hands it over.
type RefundOutcome = domain.RefundOutcome

// RecordRefundOutcome records the provider's outcome of refund attempt
// Attempt of a cancelled order, asked for by the refund.requested event
// EventID and consumed by Consumer.
type RecordRefundOutcome struct {
	TenantID string
	OrderID  uuid.UUID
	Attempt  int
	Consumer string
	EventID  uuid.UUID
	Refund   RefundOutcome
}

// Validate checks the command's own fields before any database work.
func (c RecordRefundOutcome) Validate() error {
	return validateOutcome(c.TenantID, c.OrderID, c.Attempt, c.Consumer, c.EventID, c.Refund.Currency, c.Refund.Amount)
}

// RecordRefundOutcomeHandler handles RecordRefundOutcome. It owns its
// transaction.
type RecordRefundOutcomeHandler struct {
	db  postgres.DB
	now func() time.Time
}

// NewRecordRefundOutcomeHandler returns a handler that records outcomes in db
// (a *pgxpool.Pool) on the wall clock.
func NewRecordRefundOutcomeHandler(db postgres.DB) RecordRefundOutcomeHandler {
	return RecordRefundOutcomeHandler{db: db, now: now}
}

// Handle records the outcome in one transaction: the inbox row, the refund
// row in payments, the order's refund state (succeeded or failed) and its
// event (order.refunded or order.refund_failed). Like
// RecordChargeOutcomeHandler.Handle it is safe to call again (a no-op once
// the inbox row exists), records a stale outcome's row without moving the
// order, and returns KindConflict (nothing written) for a succeeded refund
// that does not match the order's total and currency.
// HandleRecorded does the same and also tells whether this call recorded.
func (h RecordRefundOutcomeHandler) Handle(ctx context.Context, cmd RecordRefundOutcome) (domain.Order, error) {
	o, _, err := h.HandleRecorded(ctx, cmd)
	return o, err
}

// HandleRecorded is Handle, and reports whether this call recorded the
// outcome (false: an earlier delivery or a racing copy recorded it, and
// this call wrote nothing).
func (h RecordRefundOutcomeHandler) HandleRecorded(ctx context.Context, cmd RecordRefundOutcome) (o domain.Order, recorded bool, err error) {
	if err := cmd.Validate(); err != nil {
		return domain.Order{}, false, err
	}
	status := "succeeded"
	if !cmd.Refund.Succeeded {
		status = "failed"
	}
	key := domain.RefundKey(cmd.TenantID, cmd.OrderID, cmd.Attempt)
	return recordOutcome(ctx, h.db, cmd.Consumer, cmd.EventID, cmd.TenantID, cmd.OrderID,
		[]any{"refund", cmd.Attempt, key, cmd.Refund.RefundID, cmd.Refund.Amount, cmd.Refund.Currency, status, cmd.Refund.Reason},
		func(o *domain.Order) (domain.Event, error) { return o.RecordRefund(cmd.Attempt, cmd.Refund, h.now()) })
}
