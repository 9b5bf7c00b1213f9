// Package query answers reads from the read models that the projector keeps.
// What it returns is eventually consistent with the write model: a command's
// effect shows up here once its events have been projected. A reader that
// must see its own write names the version it wrote (min_version) and waits,
// bounded, until the view has caught up (see Changes).
package query

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/acme/orders/domain"
)

// Querier runs read queries; *pgxpool.Pool is one.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// GetOrder asks for one order of a tenant, at MinVersion or later if set,
// waiting up to Wait for the view to get there.
type GetOrder struct {
	TenantID   string
	ID         uuid.UUID
	MinVersion int64
	Wait       time.Duration
}

// GetOrderHandler handles GetOrder.
type GetOrderHandler struct {
	db      Querier
	changes *Changes
}

// NewGetOrderHandler returns a GetOrderHandler reading from db; changes
// (may be nil: no waiting) wakes it when the projector applied something.
func NewGetOrderHandler(db Querier, changes *Changes) GetOrderHandler {
	return GetOrderHandler{db: db, changes: changes}
}

const orderViewColumns = `order_id, tenant_id, customer_id, status, currency, items, total, version, created_at, updated_at,
       paid_at, shipped_at, cancelled_at, cancel_reason, shipping_address, note, payment, refund`

const orderViewGetSQL = `SELECT ` + orderViewColumns + ` FROM order_views WHERE tenant_id = $1 AND order_id = $2`

// orderVersionSQL reads the write model's version of the tenant's order.
// Reads ask it only when a wait for a version ended without it, to tell an
// order not projected yet from one that does not exist, and a version on
// its way from one nobody wrote.
const orderVersionSQL = `SELECT version FROM orders WHERE tenant_id = $1 AND id = $2`

// Handle returns the order as the read model has it. It returns a
// KindNotFound *domain.Error if the read model has no such order for the
// tenant (with q.MinVersion: if, when the wait ends, neither the read model
// nor the write model has it), a *NotWrittenError if the write model is
// short of q.MinVersion by more than one when the wait ends (explainBehind),
// and a *BehindError if the view did not reach q.MinVersion within q.Wait.
func (h GetOrderHandler) Handle(ctx context.Context, q GetOrder) (domain.Order, error) {
	var o domain.Order
	err := awaitVersion(ctx, h.changes, "order_views", q.TenantID, q.ID, q.MinVersion, q.Wait, func() (int64, error) {
		var err error
		o, err = h.get(ctx, q)
		if domain.KindOf(err) == domain.KindNotFound && q.MinVersion > 0 {
			return 0, nil // not projected yet: wait for it like for any version
		}
		return o.Version, err
	})
	return o, explainBehind(ctx, h.db, q.TenantID, q.ID, err)
}

// explainBehind turns err, a *BehindError of a wait that ended without the
// version, into a KindNotFound *domain.Error if the write model has no such
// order of the tenant, or a *NotWrittenError if the write model is short of
// that version by more than one: a client told to retry would wait for it
// for ever, since only the client's own commands could write it. One
// version ahead stays a *BehindError: the service writes that one itself
// (a payment or refund settling after the command that asked for it). Any
// other err is returned as it is.
func explainBehind(ctx context.Context, db Querier, tenant string, id uuid.UUID, err error) error {
	var behind *BehindError
	if !errors.As(err, &behind) {
		return err
	}
	var written int64
	switch qerr := db.QueryRow(ctx, orderVersionSQL, tenant, id).Scan(&written); {
	case errors.Is(qerr, pgx.ErrNoRows):
		return domain.Errorf(domain.KindNotFound, "order %s not found", id)
	case qerr != nil:
		return fmt.Errorf("look up order %s: %w", id, qerr)
	case behind.Want-1 > written:
		return &NotWrittenError{Want: behind.Want, Written: written}
	}
	return err
}

func (h GetOrderHandler) get(ctx context.Context, q GetOrder) (domain.Order, error) {
	o, err := scanOrder(h.db.QueryRow(ctx, orderViewGetSQL, q.TenantID, q.ID))
	if errors.Is(err, pgx.ErrNoRows) {
		return domain.Order{}, domain.Errorf(domain.KindNotFound, "order %s not found", q.ID)
	}
	if err != nil {
		return domain.Order{}, fmt.Errorf("get order view: %w", err)
	}
	return o, nil
}

// scanOrder scans orderViewColumns, and then extra, of row.
func scanOrder(row pgx.Row, extra ...any) (domain.Order, error) {
	var o domain.Order
	err := row.Scan(append([]any{&o.ID, &o.TenantID, &o.CustomerID, &o.Status, &o.Currency, &o.Items, &o.Total, &o.Version,
		&o.CreatedAt, &o.UpdatedAt, &o.PaidAt, &o.ShippedAt, &o.CancelledAt, &o.CancelReason, &o.ShippingAddress, &o.Note, &o.Payment, &o.Refund},
		extra...)...)
	return o.UTC(), err
}
