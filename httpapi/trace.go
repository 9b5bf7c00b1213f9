package httpapi

import (
	"net/http"
	"strings"

	"github.com/go-chi/chi/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/acme/orders/tracing"
)

// traceRequests starts a server span per request, named by its method and
// route template ("POST /v1/orders") once chi has routed it, continuing the
// caller's trace when the request carries a traceparent. It is only put in
// front of the routes when a tracer provider records (tracing.Active): off,
// requests pay nothing for it.
func (s *Server) traceRequests(next http.Handler) http.Handler {
	tracer := tracing.Tracer()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		if sc := tracing.SpanContext(r.Header.Get(tracing.TraceparentHeader), r.Header.Get(tracing.TracestateHeader)); sc.IsValid() {
			ctx = trace.ContextWithRemoteSpanContext(ctx, sc)
		}
		ctx, span := tracer.Start(ctx, r.Method, trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(attribute.String("http.request.method", r.Method), attribute.String("url.path", r.URL.Path)))
		defer span.End()
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		next.ServeHTTP(sw, r.WithContext(ctx))
		route := UnmatchedRoute
		if rc := chi.RouteContext(ctx); rc != nil {
			if p := rc.RoutePattern(); p != "" && !strings.HasSuffix(p, "*") {
				route = p
			}
		}
		span.SetName(r.Method + " " + route)
		span.SetAttributes(attribute.String("http.route", route), attribute.Int("http.response.status_code", sw.status))
		if sw.status >= 500 {
			span.SetStatus(codes.Error, http.StatusText(sw.status))
		}
	})
}
