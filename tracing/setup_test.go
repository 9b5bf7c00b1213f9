package tracing_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/acme/orders/tracing"
)

// On, Setup installs a provider that exports over OTLP/HTTP to the
// endpoint, and its shutdown flushes the spans still buffered (the batcher
// would otherwise wait up to 5 s).
func TestSetupExportsToTheEndpointAndShutdownFlushes(t *testing.T) {
	var posts, bytes atomic.Int64
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/v1/traces" {
			t.Errorf("collector got %s %s, want POST /v1/traces", r.Method, r.URL.Path)
		}
		b, _ := io.ReadAll(r.Body)
		posts.Add(1)
		bytes.Add(int64(len(b)))
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	defer collector.Close()
	t.Cleanup(func() { otel.SetTracerProvider(noop.NewTracerProvider()) })

	shutdown, err := tracing.Setup(context.Background(), tracing.Config{ServiceName: "orders-test", Endpoint: collector.URL})
	if err != nil {
		t.Fatal(err)
	}
	if !tracing.Active() {
		t.Fatal("tracing on, but no recording provider is installed")
	}
	_, span := tracing.Tracer().Start(context.Background(), "work")
	span.End()
	if posts.Load() != 0 {
		t.Fatal("exported before the batch was due: the test cannot tell a flush")
	}
	if err := shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if posts.Load() != 1 || bytes.Load() == 0 {
		t.Fatalf("collector got %d posts (%d bytes) after shutdown, want the one span flushed", posts.Load(), bytes.Load())
	}
}
