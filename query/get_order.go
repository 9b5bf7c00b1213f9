// Package query answers reads from the read models that the projector keeps.
// What it returns is eventually consistent with the write model: a command's
// effect shows up here once its events have been projected.
package query

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/acme/orders/domain"
)

// Querier runs read queries; *pgxpool.Pool is one.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// GetOrder asks for one order of a tenant.
type GetOrder struct {
	TenantID string
	ID       uuid.UUID
}

// GetOrderHandler handles GetOrder.
type GetOrderHandler struct {
	db Querier
}

// NewGetOrderHandler returns a GetOrderHandler reading from db.
func NewGetOrderHandler(db Querier) GetOrderHandler { return GetOrderHandler{db: db} }

const orderViewGetSQL = `
SELECT order_id, tenant_id, customer_id, status, currency, items, total, version, created_at, updated_at
FROM order_views
WHERE tenant_id = $1 AND order_id = $2`

// Handle returns the order as the read model has it, or a KindNotFound
// *domain.Error if the read model has no such order for the tenant (not yet,
// or never).
func (h GetOrderHandler) Handle(ctx context.Context, q GetOrder) (domain.Order, error) {
	var o domain.Order
	err := h.db.QueryRow(ctx, orderViewGetSQL, q.TenantID, q.ID).Scan(
		&o.ID, &o.TenantID, &o.CustomerID, &o.Status, &o.Currency, &o.Items, &o.Total, &o.Version, &o.CreatedAt, &o.UpdatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return domain.Order{}, domain.Errorf(domain.KindNotFound, "order %s not found", q.ID)
	}
	if err != nil {
		return domain.Order{}, fmt.Errorf("get order view: %w", err)
	}
	o.CreatedAt, o.UpdatedAt = o.CreatedAt.UTC(), o.UpdatedAt.UTC()
	return o, nil
}
