package tracing_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/acme/orders/tracing"
)

// A record logged under a recording span carries its ids; one without a
// span, or after WithAttrs, is as before (plus the ids when traced).
func TestLogHandlerAddsTraceIDUnderARecordingSpan(t *testing.T) {
	var buf bytes.Buffer
	logger := slog.New(tracing.NewLogHandler(slog.NewJSONHandler(&buf, nil))).With("process", "test")
	tp := sdktrace.NewTracerProvider()
	defer tp.Shutdown(context.Background())
	ctx, span := tp.Tracer("test").Start(context.Background(), "op")
	defer span.End()

	logger.InfoContext(ctx, "traced")
	logger.Info("untraced")
	lines := bytes.Split(bytes.TrimSpace(buf.Bytes()), []byte("\n"))
	if len(lines) != 2 {
		t.Fatalf("got %d lines: %s", len(lines), buf.Bytes())
	}
	var traced, untraced map[string]any
	if err := json.Unmarshal(lines[0], &traced); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(lines[1], &untraced); err != nil {
		t.Fatal(err)
	}
	sc := span.SpanContext()
	if traced["trace_id"] != sc.TraceID().String() || traced["span_id"] != sc.SpanID().String() || traced["process"] != "test" {
		t.Errorf("traced record %v, want trace_id %s span_id %s process test", traced, sc.TraceID(), sc.SpanID())
	}
	if _, ok := untraced["trace_id"]; ok {
		t.Errorf("untraced record has a trace_id: %v", untraced)
	}
}

// Off, Setup installs nothing and its shutdown does nothing.
func TestSetupOffInstallsNothing(t *testing.T) {
	for _, cfg := range []tracing.Config{{}, {Exporter: "none", Endpoint: "http://127.0.0.1:1"}} {
		shutdown, err := tracing.Setup(context.Background(), cfg)
		if err != nil {
			t.Fatalf("%+v: %v", cfg, err)
		}
		if tracing.Active() {
			t.Fatalf("%+v: a recording tracer provider is installed", cfg)
		}
		if err := shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if err := (tracing.Config{Exporter: "zipkin"}).Validate(); err == nil {
		t.Error("an unsupported OTEL_TRACES_EXPORTER was accepted")
	}
}
