package httpapi

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/acme/orders/metrics"
)

// RequestMetrics count and time every request by route template (such as
// "/v1/orders/{id}"), method and status: orders_http_requests_total and
// orders_http_request_duration_seconds. A request that matched no route
// counts under the route "unmatched" and an unusual method under "other",
// so hostile input cannot grow the series.
type RequestMetrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

// UnmatchedRoute is the route label of requests that matched no route.
const UnmatchedRoute = "unmatched"

// NewRequestMetrics returns RequestMetrics registered on reg; it fails if
// their names are taken.
func NewRequestMetrics(reg prometheus.Registerer) (*RequestMetrics, error) {
	m := &RequestMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: metrics.Namespace, Name: "http_requests_total",
			Help: "HTTP requests served, by route template, method and status"}, []string{"route", "method", "status"}),
		duration: prometheus.NewHistogramVec(metrics.HistogramOpts("http_request_duration_seconds",
			"time to serve an HTTP request, by route template and method", metrics.LatencyBuckets), []string{"route", "method"}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.duration} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register http metrics: %w", err)
		}
	}
	return m, nil
}

// measure records each request in s.Requests, by the route template chi
// matched (known once the request has been routed).
func (s *Server) measure(next http.Handler) http.Handler {
	if s.Requests == nil {
		return next
	}
	m := s.Requests
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		next.ServeHTTP(sw, r)
		took := time.Since(start).Seconds()
		route := UnmatchedRoute
		// No route of ours ends in a wildcard: one that does is a mount
		// point whose subrouter matched nothing.
		if rc := chi.RouteContext(r.Context()); rc != nil {
			if p := rc.RoutePattern(); p != "" && !strings.HasSuffix(p, "*") {
				route = p
			}
		}
		method := methodLabel(r.Method)
		m.requests.WithLabelValues(route, method, strconv.Itoa(sw.status)).Inc()
		m.duration.WithLabelValues(route, method).Observe(took)
	})
}

// methodLabel bounds the method label to the standard methods.
func methodLabel(m string) string {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodOptions:
		return m
	}
	return "other"
}
