package projection

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/acme/orders/domain"
)

// OrderViews keeps order_views: each order as clients read it. It applies an
// order's events strictly in version order: an event for version v changes
// the view only when the view is at v-1.
type OrderViews struct{}

var _ Projection = OrderViews{}

// Name implements Projection.
func (OrderViews) Name() string { return "order_views" }

const (
	orderViewVersionSQL = `
SELECT version FROM order_views WHERE tenant_id = $1 AND order_id = $2 FOR UPDATE`

	orderViewInsertSQL = `
INSERT INTO order_views (tenant_id, order_id, customer_id, status, currency, items, total, version, created_at, updated_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $9)`

	orderViewBumpSQL = `
UPDATE order_views SET version = $3, updated_at = $4 WHERE tenant_id = $1 AND order_id = $2`
)

// Apply implements Projection.
func (OrderViews) Apply(ctx context.Context, tx pgx.Tx, env domain.Envelope) (Outcome, error) {
	var created domain.OrderCreated
	if env.Type == domain.TypeOrderCreated {
		if err := env.Decode(&created); err != nil {
			return Malformed, err
		}
	}

	var version int64
	err := tx.QueryRow(ctx, orderViewVersionSQL, env.TenantID, env.AggregateID).Scan(&version)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("read order view version: %w", err)
	}
	switch {
	case version >= env.AggregateVersion:
		return Stale, nil
	case version < env.AggregateVersion-1:
		return Gap, nil
	}

	switch env.Type {
	case domain.TypeOrderCreated:
		_, err = tx.Exec(ctx, orderViewInsertSQL, env.TenantID, env.AggregateID, created.CustomerID, created.Status,
			created.Currency, created.Items, created.Total, env.AggregateVersion, created.CreatedAt)
	default:
		// An event this projection does not know still moves the version on,
		// so that the aggregate's later events are not stuck behind it.
		_, err = tx.Exec(ctx, orderViewBumpSQL, env.TenantID, env.AggregateID, env.AggregateVersion, env.OccurredAt)
	}
	if err != nil {
		return 0, fmt.Errorf("apply %s to order view: %w", env.Type, err)
	}
	return Applied, nil
}
