package command

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/acme/orders/domain"
	"github.com/acme/orders/tracing"
)

const outboxInsertSQL = `
INSERT INTO outbox (id, tenant_id, aggregate_id, aggregate_version, event_type, payload, traceparent, tracestate)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`

// outboxAppendAt records event e of order o, raised at version, in tx, to be
// published by the relay once tx commits, with the trace context of ctx's
// span (none when tracing is off) for the consumers to continue.
func outboxAppendAt(ctx context.Context, tx pgx.Tx, o domain.Order, version int64, e domain.Event) error {
	env, err := domain.NewEnvelopeAt(newID(), o, version, e, o.UpdatedAt)
	if err != nil {
		return err
	}
	traceparent, tracestate := tracing.Inject(ctx)
	if _, err := tx.Exec(ctx, outboxInsertSQL, env.ID, env.TenantID, env.AggregateID, env.AggregateVersion, env.Type, env,
		nullIfEmpty(traceparent), nullIfEmpty(tracestate)); err != nil {
		return fmt.Errorf("insert outbox event %s: %w", env.Type, err)
	}
	return nil
}

// nullIfEmpty is s, or SQL NULL when s is empty.
func nullIfEmpty(s string) any {
	if s == "" {
		return nil
	}
	return s
}
