package httpapi

import (
	"net/http"

	"github.com/go-chi/chi/v5"

	"github.com/acme/orders/api"
	"github.com/acme/orders/health"
	"github.com/acme/orders/tracing"
)

func (s *Server) routes() http.Handler {
	r := chi.NewRouter()
	if tracing.Active() {
		r.Use(s.traceRequests)
	}
	r.Use(s.measure, withRequestID, s.recoverer, s.logRequests)
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		writeProblem(w, r, s.Logger, problem(http.StatusNotFound, "not-found", "Not found", "No such endpoint."), nil)
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
		writeProblem(w, r, s.Logger, problem(http.StatusMethodNotAllowed, "method-not-allowed", "Method not allowed",
			"This endpoint does not support "+r.Method+"."), nil)
	})

	health.Register(r, s.Health)
	r.Method(http.MethodGet, "/metrics", s.Metrics)
	r.Get("/openapi.json", s.openAPI)

	r.Route("/v1", func(r chi.Router) {
		// Authenticate first (a forged token takes no slot), then the
		// tenant's own limits, then the global net; bodies are read last,
		// under their deadline, so a slow body holds a slot only that long.
		r.Use(s.authenticate, s.limitTenant, s.limitInFlight, s.readBody)
		r.Post("/orders", s.createOrder)
		r.Get("/orders", s.listOrders)
		r.Get("/orders/{id}", s.getOrder)
		r.Patch("/orders/{id}", s.updateOrder)
		r.Post("/orders/{id}/pay", s.payOrder)
		r.Post("/orders/{id}/ship", s.shipOrder)
		r.Post("/orders/{id}/cancel", s.cancelOrder)
		r.Get("/customers/{id}/summary", s.customerSummary)
		r.Get("/reports/daily-sales", s.dailySales)
		r.Get("/idempotency-keys/{key}", s.getIdempotencyKey)
	})
	return r
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
