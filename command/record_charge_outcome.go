package command

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/acme/orders/domain"
	"github.com/acme/orders/postgres"
)

// ChargeOutcome is the provider's answer to a charge, as the payment worker
// hands it over: a succeeded charge, or a decline (not an error).
type ChargeOutcome = domain.ChargeOutcome

// RecordChargeOutcome records the provider's outcome of charge attempt
// Attempt of an order, asked for by the payment.requested event EventID and
// consumed by Consumer (the worker's durable consumer name).
type RecordChargeOutcome struct {
	TenantID string
	OrderID  uuid.UUID
	Attempt  int
	Consumer string
	EventID  uuid.UUID
	Charge   ChargeOutcome
}

// Validate checks the command's own fields before any database work.
func (c RecordChargeOutcome) Validate() error {
	return validateOutcome(c.TenantID, c.OrderID, c.Attempt, c.Consumer, c.EventID, c.Charge.Currency, c.Charge.Amount)
}

// validateOutcome checks what every outcome command needs.
func validateOutcome(tenant string, order uuid.UUID, attempt int, consumer string, event uuid.UUID, currency string, amount int64) error {
	switch {
	case tenant == "" || order == uuid.Nil || event == uuid.Nil || consumer == "":
		return domain.Errorf(domain.KindInvalid, "an outcome needs the tenant, order, consumer and intent event id")
	case attempt < 1:
		return domain.Errorf(domain.KindInvalid, "attempt %d: attempts count from 1", attempt)
	case !domain.ValidCurrency(currency) || amount < 0:
		return domain.Errorf(domain.KindInvalid, "amount %d %q: want minor units ≥ 0 of an ISO 4217 currency in upper case", amount, currency)
	}
	return nil
}

// RecordChargeOutcomeHandler handles RecordChargeOutcome. It owns its
// transaction.
type RecordChargeOutcomeHandler struct {
	db  postgres.DB
	now func() time.Time
}

// NewRecordChargeOutcomeHandler returns a handler that records outcomes in db
// (a *pgxpool.Pool) on the wall clock.
func NewRecordChargeOutcomeHandler(db postgres.DB) RecordChargeOutcomeHandler {
	return RecordChargeOutcomeHandler{db: db, now: now}
}

const (
	// paymentInboxInsertSQL claims an intent event for a consumer; 0 rows:
	// its outcome was recorded before.
	paymentInboxInsertSQL = `
INSERT INTO payment_inbox (consumer, event_id, tenant_id, order_id) VALUES ($1, $2, $3, $4)
ON CONFLICT (consumer, event_id) DO NOTHING`

	// paymentInsertSQL records one provider outcome under its derived key.
	// The key was recorded before only if another consumer or event
	// recorded the same attempt: the first record stands.
	paymentInsertSQL = `
INSERT INTO payments (tenant_id, order_id, kind, attempt, idempotency_key, provider_id, amount, currency, status, reason)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
ON CONFLICT (idempotency_key) DO NOTHING`
)

// Handle records the outcome in one transaction: the inbox row (consumer,
// event id), the charge row in payments, the order's transition (paid or
// payment_failed) and its event (order.paid or order.payment_failed) in the
// outbox; it returns the order as it is afterwards. It is safe to call any
// number of times: if the inbox row exists, it writes nothing and returns the
// order as it is. A stale outcome (attempt is not the order's current
// attempt, or the order is no longer payment_pending) records the charge row
// but moves nothing, so our records still hold every charge the provider
// made. Errors: KindInvalid for a malformed command, KindNotFound for an
// unknown order, KindConflict for a succeeded charge that does not match the
// order's total and currency (nothing written: a bug to look into, to be
// dead-lettered); anything else is transient and the caller retries.
// HandleRecorded does the same and also tells whether this call recorded.
func (h RecordChargeOutcomeHandler) Handle(ctx context.Context, cmd RecordChargeOutcome) (domain.Order, error) {
	o, _, err := h.HandleRecorded(ctx, cmd)
	return o, err
}

// HandleRecorded is Handle, and reports whether this call recorded the
// outcome (false: an earlier delivery or a racing copy recorded it, and
// this call wrote nothing).
func (h RecordChargeOutcomeHandler) HandleRecorded(ctx context.Context, cmd RecordChargeOutcome) (o domain.Order, recorded bool, err error) {
	if err := cmd.Validate(); err != nil {
		return domain.Order{}, false, err
	}
	status := "succeeded"
	if !cmd.Charge.Succeeded {
		status = "declined"
	}
	key := domain.ChargeKey(cmd.TenantID, cmd.OrderID, cmd.Attempt)
	return recordOutcome(ctx, h.db, cmd.Consumer, cmd.EventID, cmd.TenantID, cmd.OrderID,
		[]any{"charge", cmd.Attempt, key, cmd.Charge.ChargeID, cmd.Charge.Amount, cmd.Charge.Currency, status, joinReason(cmd.Charge.DeclineCode, cmd.Charge.Reason)},
		func(o *domain.Order) (domain.Event, error) { return o.RecordCharge(cmd.Attempt, cmd.Charge, h.now()) })
}

func joinReason(code, reason string) string {
	switch {
	case code == "":
		return reason
	case reason == "":
		return code
	}
	return code + ": " + reason
}

// recordOutcome is the transaction of every outcome command: the inbox row,
// the order's change (decided first, so a refusal writes nothing), the
// payments row and the outbox event, in three round trips: the inbox row
// with the order's lock, then the order, its event and the payments row,
// then the commit.
func recordOutcome(ctx context.Context, db postgres.DB, consumer string, eventID uuid.UUID, tenantID string, orderID uuid.UUID,
	payment []any, change func(*domain.Order) (domain.Event, error)) (o domain.Order, recorded bool, err error) {
	err = postgres.InTx(ctx, db, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		b.Queue(paymentInboxInsertSQL, consumer, eventID, tenantID, orderID).Exec(func(tag pgconn.CommandTag) error {
			recorded = tag.RowsAffected() == 1
			return nil
		})
		queueOrderGetForUpdate(b, tenantID, orderID, &o)
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			if domain.KindOf(err) != "" {
				return err
			}
			return fmt.Errorf("insert payment inbox row and lock the order: %w", err)
		}
		if !recorded {
			return nil
		}
		paymentRow := append([]any{tenantID, orderID}, payment...)
		var changed bool
		o, changed, err = changeLoaded(ctx, tx, o, oneEvent(change),
			func(b *pgx.Batch, _ domain.Order) { b.Queue(paymentInsertSQL, paymentRow...) })
		if err != nil || changed {
			return err
		}
		// A stale outcome moves nothing but is recorded all the same.
		if _, err := tx.Exec(ctx, paymentInsertSQL, paymentRow...); err != nil {
			return fmt.Errorf("insert payment row: %w", err)
		}
		return nil
	})
	if err != nil {
		return domain.Order{}, false, err
	}
	return o, recorded, nil
}
