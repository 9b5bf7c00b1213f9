// Package tracing is the service's OpenTelemetry tracing: the set-up of an
// OTLP exporter (off unless configured), the W3C trace context carried from
// a request through the outbox and JetStream to the consumers, and a slog
// handler that puts trace_id and span_id in log records.
//
// Off, nothing is installed: the global tracer provider stays OpenTelemetry's
// no-op, spans are only started under a recording parent (so none is), and
// no trace context is stored or sent.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// InstrumentationName names the tracer of every span this service starts.
const InstrumentationName = "github.com/acme/orders"

// The W3C trace context headers, as HTTP and NATS headers.
const (
	TraceparentHeader = "traceparent"
	TracestateHeader  = "tracestate"
)

// Config says whether and where to export spans; internal/app fills it from
// the standard OTEL_* variables.
type Config struct {
	// ServiceName is the service.name resource attribute (required when on).
	ServiceName string
	// Exporter is OTEL_TRACES_EXPORTER: "otlp" turns tracing on, "none" or
	// "" leaves it off unless Endpoint is set.
	Exporter string
	// Endpoint is OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, else
	// OTEL_EXPORTER_OTLP_ENDPOINT: the collector's base URL (OTLP over
	// HTTP/protobuf). Set, it turns tracing on.
	Endpoint string
	// TracesEndpoint is true when Endpoint is the traces signal's own URL
	// (used as is), false when it is the base URL (/v1/traces is appended).
	TracesEndpoint bool
}

// On says whether cfg turns tracing on.
func (c Config) On() bool {
	switch strings.ToLower(c.Exporter) {
	case "none":
		return false
	case "otlp":
		return true
	}
	return c.Endpoint != ""
}

// Validate reports a setting Setup cannot use.
func (c Config) Validate() error {
	switch strings.ToLower(c.Exporter) {
	case "", "none", "otlp":
	default:
		return fmt.Errorf("tracing: OTEL_TRACES_EXPORTER %q: only otlp and none are supported", c.Exporter)
	}
	if c.On() && c.ServiceName == "" {
		return errors.New("tracing: ServiceName is required")
	}
	return nil
}

// Setup installs, when cfg turns tracing on, a global tracer provider that
// batches spans to an OTLP/HTTP exporter (which reads the other
// OTEL_EXPORTER_OTLP_* settings: headers, timeout, compression, TLS) and
// the W3C trace context propagator. Off, it installs nothing. The returned
// shutdown flushes the spans still buffered and stops the exporter; call it
// once the process's work is done.
func Setup(ctx context.Context, cfg Config) (shutdown func(context.Context) error, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if !cfg.On() {
		return func(context.Context) error { return nil }, nil
	}
	var opts []otlptracehttp.Option
	if cfg.Endpoint != "" {
		url := cfg.Endpoint
		if !cfg.TracesEndpoint {
			url = strings.TrimSuffix(url, "/") + "/v1/traces"
		}
		opts = append(opts, otlptracehttp.WithEndpointURL(url))
	}
	exp, err := otlptracehttp.New(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("tracing: OTLP exporter: %w", err)
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(attribute.String("service.name", cfg.ServiceName)))
	if err != nil {
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	return func(ctx context.Context) error {
		if err := tp.Shutdown(ctx); err != nil {
			return fmt.Errorf("tracing: flush and stop the exporter: %w", err)
		}
		return nil
	}, nil
}

// Active says whether a recording tracer provider is installed (by Setup,
// or by a test): the HTTP middleware is only put in front of the routes
// then.
func Active() bool {
	_, ok := otel.GetTracerProvider().(*sdktrace.TracerProvider)
	return ok
}

// Tracer is the service's tracer, from the global provider at the time of
// the call.
func Tracer() trace.Tracer { return otel.GetTracerProvider().Tracer(InstrumentationName) }

// StartChild starts a span named name under the span in ctx, if that one is
// recording; otherwise it starts nothing and returns ctx and that span, at
// the cost of one context look-up. Code under a traced request calls it for
// its own steps (the command's transaction).
func StartChild(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	parent := trace.SpanFromContext(ctx)
	if !parent.IsRecording() {
		return ctx, parent
	}
	return parent.TracerProvider().Tracer(InstrumentationName).Start(ctx, name, opts...)
}

// Fail marks span failed with err, if err is not nil.
func Fail(span trace.Span, err error) {
	if err != nil && span.IsRecording() {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
}

// w3c is the W3C trace context format, used directly rather than through
// the global propagator (a no-op until Setup), so that a context stored or
// received is forwarded even by a process that does not export.
var w3c propagation.TraceContext

// Inject returns the traceparent and tracestate of the span in ctx, or
// empty strings when ctx holds no valid span context (tracing off).
func Inject(ctx context.Context) (traceparent, tracestate string) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return "", ""
	}
	c := propagation.MapCarrier{}
	w3c.Inject(ctx, c)
	return c[TraceparentHeader], c[TracestateHeader]
}

// SpanContext parses a traceparent and tracestate; the result is invalid
// (IsValid false) when traceparent is empty or malformed.
func SpanContext(traceparent, tracestate string) trace.SpanContext {
	if traceparent == "" {
		return trace.SpanContext{}
	}
	c := propagation.MapCarrier{TraceparentHeader: traceparent}
	if tracestate != "" {
		c[TracestateHeader] = tracestate
	}
	return trace.SpanContextFromContext(w3c.Extract(context.Background(), c))
}
