package settle

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/acme/orders/tracing"
)

// traceIntent starts the span "settle <consumer>" of one delivered intent,
// linked to its publish span (the message's traceparent header), so the
// trace of the request that asked for a charge or refund leads to the
// provider call. It starts nothing, and returns ctx and a span that records
// nothing, when the message is not traced or no tracer provider records.
func traceIntent(ctx context.Context, consumer string, m jetstream.Msg) (context.Context, trace.Span) {
	h := m.Headers()
	if h == nil || !tracing.Active() {
		return ctx, trace.SpanFromContext(ctx)
	}
	sc := tracing.SpanContext(h.Get(tracing.TraceparentHeader), h.Get(tracing.TracestateHeader))
	if !sc.IsValid() {
		return ctx, trace.SpanFromContext(ctx)
	}
	return tracing.Tracer().Start(ctx, "settle "+consumer,
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithLinks(trace.Link{SpanContext: sc}),
		trace.WithAttributes(attribute.String("messaging.system", "nats"), attribute.String("messaging.destination.name", m.Subject())))
}
