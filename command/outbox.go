package command

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/acme/orders/domain"
	"github.com/acme/orders/tracing"
)

const outboxInsertSQL = `
INSERT INTO outbox (id, tenant_id, aggregate_id, aggregate_version, event_type, payload, traceparent, tracestate)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`

// queueOutboxAppendAt queues, in b, the record of event e of order o,
// raised at version, to be published by the relay once the transaction
// commits, with the trace context of ctx's span (none when tracing is off)
// for the consumers to continue.
func queueOutboxAppendAt(ctx context.Context, b *pgx.Batch, o domain.Order, version int64, e domain.Event) error {
	env, err := domain.NewEnvelopeAt(newID(), o, version, e, o.UpdatedAt)
	if err != nil {
		return err
	}
	traceparent, tracestate := tracing.Inject(ctx)
	b.Queue(outboxInsertSQL, env.ID, env.TenantID, env.AggregateID, env.AggregateVersion, env.Type, env,
		nullIfEmpty(traceparent), nullIfEmpty(tracestate))
	return nil
}

// nullIfEmpty is s, or SQL NULL when s is empty.
func nullIfEmpty(s string) any {
	if s == "" {
		return nil
	}
	return s
}
