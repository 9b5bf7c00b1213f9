package projection

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/acme/orders/tracing"
)

// traceBatch starts the span "apply <projection>" of a batch, linked to the
// publish span of each traced message in it (its traceparent header), so
// each request's trace leads to the batch that applied its event. It starts
// nothing, and returns ctx and a no-op end, when no message is traced or no
// tracer provider records.
func traceBatch(ctx context.Context, projection string, msgs []jetstream.Msg) (context.Context, func()) {
	if !tracing.Active() {
		return ctx, func() {}
	}
	var links []trace.Link
	for _, m := range msgs {
		h := m.Headers()
		if h == nil {
			continue
		}
		if sc := tracing.SpanContext(h.Get(tracing.TraceparentHeader), h.Get(tracing.TracestateHeader)); sc.IsValid() {
			links = append(links, trace.Link{SpanContext: sc})
		}
	}
	if len(links) == 0 {
		return ctx, func() {}
	}
	ctx, span := tracing.Tracer().Start(ctx, "apply "+projection,
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithLinks(links...),
		trace.WithAttributes(
			attribute.String("messaging.system", "nats"),
			attribute.Int("messaging.batch.message_count", len(msgs))))
	return ctx, func() { span.End() }
}
