package command

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/acme/orders/domain"
	"github.com/acme/orders/tracing"
)

const outboxInsertSQL = `
INSERT INTO outbox (id, tenant_id, aggregate_id, aggregate_version, event_type, payload, traceparent, tracestate)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`

// outboxEvent is an event in its envelope, with the envelope encoded: the
// outbox row's payload (jsonb, sent as the encoded bytes).
type outboxEvent struct {
	domain.Envelope
	payload []byte
}

// newOutboxEvent envelopes e, raised by order o at version at instant at,
// as a new event, and encodes it.
func newOutboxEvent(o domain.Order, version int64, e domain.Event, at time.Time) (outboxEvent, error) {
	env, err := domain.NewEnvelopeAt(newID(), o, version, e, at)
	if err != nil {
		return outboxEvent{}, err
	}
	payload, err := env.AppendJSON(nil)
	if err != nil {
		return outboxEvent{}, err
	}
	return outboxEvent{Envelope: env, payload: payload}, nil
}

// queueOutboxAppendAt queues, in b, the record of event e of order o,
// raised at version, to be published by the relay once the transaction
// commits, with the trace context of ctx's span (none when tracing is off)
// for the consumers to continue.
func queueOutboxAppendAt(ctx context.Context, b *pgx.Batch, o domain.Order, version int64, e domain.Event) error {
	ev, err := newOutboxEvent(o, version, e, o.UpdatedAt)
	if err != nil {
		return err
	}
	traceparent, tracestate := tracing.Inject(ctx)
	b.Queue(outboxInsertSQL, ev.ID, ev.TenantID, ev.AggregateID, ev.AggregateVersion, ev.Type, ev.payload,
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
