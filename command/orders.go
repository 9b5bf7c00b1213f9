package command

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/acme/orders/domain"
)

const (
	orderInsertSQL = `
INSERT INTO orders (tenant_id, id, customer_id, status, currency, total, version, creating_key, created_at, updated_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
ON CONFLICT (tenant_id, creating_key) DO NOTHING`

	orderGetIDByKeySQL = `SELECT id FROM orders WHERE tenant_id = $1 AND creating_key = $2`

	orderItemsInsertSQL = `
INSERT INTO order_items (tenant_id, order_id, line_no, sku, quantity, unit_price, line_total)
SELECT $1, $2, line_no, sku, quantity, unit_price, line_total
FROM unnest($3::int[], $4::text[], $5::bigint[], $6::bigint[], $7::bigint[])
     AS i(line_no, sku, quantity, unit_price, line_total)`
)

// orderInsert writes a new order and its items. If an order created with the
// same key exists, it writes nothing and returns that order's id.
func orderInsert(ctx context.Context, tx pgx.Tx, o domain.Order, creatingKey string) (existing uuid.UUID, err error) {
	tag, err := tx.Exec(ctx, orderInsertSQL, o.TenantID, o.ID, o.CustomerID, o.Status, o.Currency, o.Total, o.Version, creatingKey, o.CreatedAt, o.UpdatedAt)
	if err != nil {
		return uuid.Nil, fmt.Errorf("insert order: %w", err)
	}
	if tag.RowsAffected() == 0 {
		if err := tx.QueryRow(ctx, orderGetIDByKeySQL, o.TenantID, creatingKey).Scan(&existing); err != nil {
			return uuid.Nil, fmt.Errorf("find order created by key: %w", err)
		}
		return existing, nil
	}
	n := len(o.Items)
	lineNos, skus := make([]int32, n), make([]string, n)
	quantities, prices, totals := make([]int64, n), make([]int64, n), make([]int64, n)
	for i, it := range o.Items {
		lineNos[i], skus[i] = int32(i+1), it.SKU
		quantities[i], prices[i], totals[i] = it.Quantity, it.UnitPrice, it.LineTotal
	}
	if _, err := tx.Exec(ctx, orderItemsInsertSQL, o.TenantID, o.ID, lineNos, skus, quantities, prices, totals); err != nil {
		return uuid.Nil, fmt.Errorf("insert order items: %w", err)
	}
	return uuid.Nil, nil
}
