package command

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/acme/orders/domain"
)

const outboxInsertSQL = `
INSERT INTO outbox (id, tenant_id, aggregate_id, aggregate_version, event_type, payload)
VALUES ($1, $2, $3, $4, $5, $6)`

// outboxAppend records event e of order o (at o's current version) in tx, to
// be published by the relay once tx commits.
func outboxAppend(ctx context.Context, tx pgx.Tx, o domain.Order, e domain.Event) error {
	return outboxAppendAt(ctx, tx, o, o.Version, e)
}

// outboxAppendAt is outboxAppend for an event raised at version.
func outboxAppendAt(ctx context.Context, tx pgx.Tx, o domain.Order, version int64, e domain.Event) error {
	env, err := domain.NewEnvelopeAt(newID(), o, version, e, o.UpdatedAt)
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, outboxInsertSQL, env.ID, env.TenantID, env.AggregateID, env.AggregateVersion, env.Type, env); err != nil {
		return fmt.Errorf("insert outbox event %s: %w", env.Type, err)
	}
	return nil
}
