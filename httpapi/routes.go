package httpapi

import (
	"net/http"
	"strings"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"

	"github.com/acme/orders/api"
	"github.com/acme/orders/health"
	"github.com/acme/orders/tracing"
)

func (s *Server) routes() http.Handler {
	r := chi.NewRouter()
	// Every body, read or not, arrives within BodyTimeout (or its
	// connection is closed); /v1's readBody then reads it.
	r.Use(s.bodyDeadline)
	if tracing.Active() {
		r.Use(s.traceRequests)
	}
	// HEAD is served by each GET route, without the body (RFC 9110, 9.3.2).
	r.Use(s.measure, withRequestID, s.recoverer, s.logRequests, middleware.GetHead)
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		writeProblem(w, r, s.Logger, problem(http.StatusNotFound, "not-found", "Not found", "No such endpoint."), nil)
	})
	root := r
	r.MethodNotAllowed(func(w http.ResponseWriter, req *http.Request) {
		allowed := allowedMethods(root, req)
		if len(allowed) == 0 { // an unknown method on no path of ours
			writeProblem(w, req, s.Logger, problem(http.StatusNotFound, "not-found", "Not found", "No such endpoint."), nil)
			return
		}
		p := problem(http.StatusMethodNotAllowed, "method-not-allowed", "Method not allowed",
			"This endpoint does not support "+req.Method+"; it supports "+strings.Join(allowed, ", ")+".")
		p.header = http.Header{"Allow": {strings.Join(allowed, ", ")}}
		writeProblem(w, req, s.Logger, p, nil)
	})

	health.Register(r, s.Health)
	r.Method(http.MethodGet, "/metrics", s.Metrics)
	r.Get("/openapi.json", s.openAPI)

	r.Route("/v1", func(r chi.Router) {
		// Authenticate first (a forged token takes no slot), then the
		// tenant's own limits, then the global net; then the request's own
		// checks, so that a flood of bad requests is shed like any other
		// (before them, a refused query string cost no token and took no
		// slot); bodies are read last, under their deadline, so a slow
		// body holds a slot only that long.
		// The deadline starts once the body is in (which has its own,
		// and its 408), so that whatever then waits for the database (a
		// connection share, a locked table) is answered 503 while the
		// client still listens.
		r.Use(s.authenticate, s.limitTenant, s.limitInFlight, s.singleQueryValues, s.readBody, s.deadline)
		r.Post("/orders", s.createOrder)
		r.Get("/orders", s.listOrders)
		r.Get("/orders/{id}", s.getOrder)
		r.Patch("/orders/{id}", s.updateOrder)
		r.Post("/orders/{id}/pay", s.payOrder)
		r.Post("/orders/{id}/ship", s.shipOrder)
		r.Post("/orders/{id}/cancel", s.cancelOrder)
		r.Post("/orders/{id}/refund", s.refundOrder)
		r.Get("/customers/{id}/summary", s.customerSummary)
		r.Get("/reports/daily-sales", s.dailySales)
		r.Get("/idempotency-keys/{key}", s.getIdempotencyKey)
	})
	return r
}

// allowedMethods lists the methods router serves req's path with, for the
// Allow header a 405 must carry (RFC 9110, 15.5.6).
func allowedMethods(router chi.Routes, req *http.Request) []string {
	path := req.URL.RawPath
	if path == "" {
		path = req.URL.Path
	}
	var allowed []string
	for _, m := range []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
		probe := m
		if m == http.MethodHead {
			probe = http.MethodGet // served by middleware.GetHead
		}
		if router.Match(chi.NewRouteContext(), probe, path) {
			allowed = append(allowed, m)
		}
	}
	return allowed
}

// openAPI handles GET /openapi.json: the API's OpenAPI 3.1 document
// (api/openapi.yaml) as JSON, to anyone (it holds no data).
func (s *Server) openAPI(w http.ResponseWriter, r *http.Request) {
	b, err := api.JSON()
	if err != nil {
		writeProblem(w, r, s.Logger, problemFor(err), err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "public, max-age=300")
	_, _ = w.Write(b)
}
