package outbox

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/acme/orders/stream"
	"github.com/acme/orders/tracing"
)

// tracePublish starts, for each traced event of a batch, a producer span
// "publish <subject>" continuing the trace of the request that wrote it,
// and puts that span's context in the event for setTraceHeaders. It returns
// nil when no event is traced (tracing off: nothing is done), else a
// function that ends the spans once the first acked events are published
// and the rest failed with err.
func tracePublish(ctx context.Context, events []outboxRow) (end func(acked int, err error)) {
	var spans []trace.Span
	var index []int
	for i := range events {
		e := &events[i]
		if e.Traceparent == nil {
			continue
		}
		parent := tracing.SpanContext(*e.Traceparent, deref(e.Tracestate))
		if !parent.IsValid() {
			e.Traceparent, e.Tracestate = nil, nil // malformed: send none
			continue
		}
		subject := stream.Subject(e.EventType)
		_, span := tracing.Tracer().Start(trace.ContextWithRemoteSpanContext(ctx, parent), "publish "+subject,
			trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithAttributes(
				attribute.String("messaging.system", "nats"),
				attribute.String("messaging.destination.name", subject),
				attribute.String("messaging.message.id", e.ID.String())))
		// Forward the producer span's context; a process that does not
		// export (non-recording span) forwards the request's as it came.
		if span.SpanContext().IsValid() {
			tp, ts := tracing.Inject(trace.ContextWithSpan(ctx, span))
			e.Traceparent, e.Tracestate = &tp, nilIfEmpty(ts)
		}
		spans, index = append(spans, span), append(index, i)
	}
	if len(spans) == 0 {
		return nil
	}
	return func(acked int, err error) {
		for k, span := range spans {
			if index[k] >= acked {
				if err == nil {
					err = fmt.Errorf("not acknowledged")
				}
				tracing.Fail(span, err)
			}
			span.End()
		}
	}
}

// setTraceHeaders puts e's trace context, if any, in msg's headers.
func setTraceHeaders(msg *nats.Msg, e outboxRow) {
	if e.Traceparent == nil {
		return
	}
	msg.Header.Set(tracing.TraceparentHeader, *e.Traceparent)
	if e.Tracestate != nil {
		msg.Header.Set(tracing.TracestateHeader, *e.Tracestate)
	}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func nilIfEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
