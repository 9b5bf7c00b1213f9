package app_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/acme/orders/fakepsp"
	"github.com/acme/orders/fakepsp/fakepsptest"
	"github.com/acme/orders/internal/app"
	"github.com/acme/orders/internal/testenv"
	"github.com/acme/orders/stream"
)

// traced installs a tracer provider that keeps every span in memory, for
// the rest of the test. Not parallel: the provider is global.
func traced(t *testing.T) *tracetest.InMemoryExporter {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	otel.SetTracerProvider(tp)
	t.Cleanup(func() {
		_ = tp.Shutdown(t.Context())
		otel.SetTracerProvider(noop.NewTracerProvider())
	})
	return exp
}

// A create over HTTP is one trace from the request to the publish, and
// every projection's apply span links to that publish: request → command
// transaction → publish (relay, JetStream headers) → apply (projector).
func TestTraceFollowsACreateFromRequestToApply(t *testing.T) {
	exp := traced(t)
	env := newEnv(t)
	api := start(t, "api", app.RunAPI, env)
	start(t, "projector", app.RunProjector, env)
	token := newToken(t, env, "acme")

	created := call(t, http.MethodPost, api+"/v1/orders", token, "trace-1", orderBody("c-1"))
	if created.status != http.StatusCreated {
		t.Fatalf("POST: status %d, body %s", created.status, created.body)
	}

	find := func(spans tracetest.SpanStubs, f func(tracetest.SpanStub) bool) []tracetest.SpanStub {
		var out []tracetest.SpanStub
		for _, s := range spans {
			if f(s) {
				out = append(out, s)
			}
		}
		return out
	}
	var request, command, publish tracetest.SpanStub
	var applies []tracetest.SpanStub
	defer func() {
		if t.Failed() {
			for _, s := range exp.GetSpans() {
				t.Logf("span %q trace %s span %s parent %s links %d", s.Name, s.SpanContext.TraceID(), s.SpanContext.SpanID(), s.Parent.SpanID(), len(s.Links))
			}
		}
	}()
	testenv.Eventually(t, 15*time.Second, "request, command, publish and apply spans", func() bool {
		spans := exp.GetSpans()
		reqs := find(spans, func(s tracetest.SpanStub) bool { return s.Name == "POST /v1/orders" })
		if len(reqs) != 1 {
			return false
		}
		request = reqs[0]
		tid := request.SpanContext.TraceID()
		cmds := find(spans, func(s tracetest.SpanStub) bool {
			return strings.HasPrefix(s.Name, "command ") && s.SpanContext.TraceID() == tid
		})
		pubs := find(spans, func(s tracetest.SpanStub) bool {
			return strings.HasPrefix(s.Name, "publish ") && s.SpanContext.TraceID() == tid
		})
		if len(cmds) != 1 || len(pubs) != 1 {
			return false
		}
		command, publish = cmds[0], pubs[0]
		applies = find(spans, func(s tracetest.SpanStub) bool {
			return strings.HasPrefix(s.Name, "apply ") && slices.ContainsFunc(s.Links, func(l sdktrace.Link) bool {
				return l.SpanContext.SpanID() == publish.SpanContext.SpanID()
			})
		})
		return len(applies) >= 3 // order_views, customer_summaries, daily_sales
	})

	if request.SpanKind != trace.SpanKindServer {
		t.Errorf("request span kind %v, want server", request.SpanKind)
	}
	if command.Parent.SpanID() != request.SpanContext.SpanID() {
		t.Errorf("command span %q is not a child of the request span", command.Name)
	}
	if publish.Parent.SpanID() != command.SpanContext.SpanID() || !publish.Parent.IsRemote() {
		t.Errorf("publish span %q: parent %v, want the command span %v (remote: read from the outbox)",
			publish.Name, publish.Parent.SpanID(), command.SpanContext.SpanID())
	}
	if publish.SpanKind != trace.SpanKindProducer {
		t.Errorf("publish span kind %v, want producer", publish.SpanKind)
	}
	names := map[string]bool{}
	for _, a := range applies {
		names[a.Name] = true
		if a.SpanKind != trace.SpanKindConsumer {
			t.Errorf("%s: span kind %v, want consumer", a.Name, a.SpanKind)
		}
	}
	for _, want := range []string{"apply order_views", "apply customer_summaries", "apply daily_sales"} {
		if !names[want] {
			t.Errorf("no span %q linked to the publish; got %v", want, names)
		}
	}
}

// A pay's trace leads to the worker: the worker's settle span links to the
// publish of the pay request's payment.requested, and the provider call is
// its child.
func TestTraceFollowsAPayToTheCharge(t *testing.T) {
	exp := traced(t)
	env := newEnv(t)
	_, hs := fakepsptest.Start(t, fakepsptest.DatabaseURL(t), fakepsp.Config{})
	env["PAYMENT_PROVIDER_URL"], env["PAYMENT_PROVIDER_KEY"] = hs.URL, fakepsptest.SecretKey
	api := start(t, "api", app.RunAPI, env)
	worker := start(t, "worker", app.RunWorker, env)
	token := newToken(t, env, "acme")
	waitReady(t, worker)

	created := call(t, http.MethodPost, api+"/v1/orders", token, "trace-pay-1", orderBody("c-2"))
	if created.status != http.StatusCreated {
		t.Fatalf("create: %d %s", created.status, created.body)
	}
	if paying := call(t, http.MethodPost, api+created.header.Get("Location")+"/pay", token, "trace-pay-2", ""); paying.status != http.StatusAccepted {
		t.Fatalf("pay: %d %s", paying.status, paying.body)
	}
	testenv.Eventually(t, 15*time.Second, "pay request → publish → settle → charge", func() bool {
		spans := exp.GetSpans()
		byID := map[trace.SpanID]tracetest.SpanStub{}
		for _, s := range spans {
			byID[s.SpanContext.SpanID()] = s
		}
		for _, settle := range spans {
			if !strings.HasPrefix(settle.Name, "settle ") || len(settle.Links) != 1 {
				continue
			}
			publish, ok := byID[settle.Links[0].SpanContext.SpanID()]
			if !ok || !strings.HasPrefix(publish.Name, "publish ") {
				continue
			}
			command, ok := byID[publish.Parent.SpanID()]
			if !ok {
				continue
			}
			request, ok := byID[command.Parent.SpanID()]
			if !ok || request.Name != "POST /v1/orders/{id}/pay" {
				continue
			}
			for _, charge := range spans {
				if charge.Name == "charge" && charge.Parent.SpanID() == settle.SpanContext.SpanID() {
					return true
				}
			}
		}
		return false
	})
}

// Every process's logger puts the trace_id of the span in the context into
// the record.
func TestLoggerCarriesTraceID(t *testing.T) {
	var buf bytes.Buffer
	logger := app.NewLogger(&buf, "json", "info").With("process", "api")
	tp := sdktrace.NewTracerProvider()
	defer tp.Shutdown(context.Background())
	ctx, span := tp.Tracer("test").Start(context.Background(), "request")
	defer span.End()
	logger.InfoContext(ctx, "handled")
	var line map[string]any
	if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
		t.Fatal(err)
	}
	if line["trace_id"] != span.SpanContext().TraceID().String() {
		t.Fatalf("log line %v has no trace_id %s", line, span.SpanContext().TraceID())
	}
}

// Tracing off (the default), a traced caller's request stores no trace
// context with its event and the relay sends none: nothing is installed,
// nothing continues the caller's trace.
func TestTracingOffStoresAndSendsNoTraceContext(t *testing.T) {
	env, api, token := startStack(t)
	req, _ := http.NewRequest(http.MethodPost, api+"/v1/orders", strings.NewReader(orderBody("c-3")))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Idempotency-Key", "untraced-1")
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	if created := do(t, req); created.status != http.StatusCreated {
		t.Fatalf("create: %d %s", created.status, created.body)
	}
	testenv.Eventually(t, 10*time.Second, "the event is published", func() bool {
		return countRows(t, env, `SELECT count(*) FROM outbox WHERE published_at IS NOT NULL`) == 1
	})
	if n := countRows(t, env, `SELECT count(*) FROM outbox WHERE traceparent IS NOT NULL OR tracestate IS NOT NULL`); n != 0 {
		t.Fatalf("%d outbox rows store a trace context with tracing off", n)
	}
	nc, err := nats.Connect(env["NATS_URL"])
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(t.Context(), stream.Name)
	if err != nil {
		t.Fatal(err)
	}
	msg, err := s.GetMsg(t.Context(), 1)
	if err != nil {
		t.Fatal(err)
	}
	if tp := msg.Header.Get("traceparent"); tp != "" {
		t.Fatalf("the published event carries traceparent %q with tracing off", tp)
	}
}
