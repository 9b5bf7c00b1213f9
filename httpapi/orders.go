package httpapi

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/acme/orders/command"
	"github.com/acme/orders/domain"
	"github.com/acme/orders/query"
)

// orderJSON is an order as every endpoint shows it. Amounts are integer
// minor units of the currency.
type orderJSON struct {
	ID         uuid.UUID  `json:"id"`
	CustomerID string     `json:"customer_id"`
	Status     string     `json:"status"`
	Currency   string     `json:"currency"`
	Items      []itemJSON `json:"items"`
	Total      int64      `json:"total"`
	Version    int64      `json:"version"`
	CreatedAt  time.Time  `json:"created_at"`
	UpdatedAt  time.Time  `json:"updated_at"`
}

type itemJSON struct {
	SKU       string `json:"sku"`
	Quantity  int64  `json:"quantity"`
	UnitPrice int64  `json:"unit_price"`
	LineTotal int64  `json:"line_total"`
}

func toOrderJSON(o domain.Order) orderJSON {
	items := make([]itemJSON, len(o.Items))
	for i, it := range o.Items {
		items[i] = itemJSON{SKU: it.SKU, Quantity: it.Quantity, UnitPrice: it.UnitPrice, LineTotal: it.LineTotal}
	}
	return orderJSON{
		ID: o.ID, CustomerID: o.CustomerID, Status: string(o.Status), Currency: o.Currency,
		Items: items, Total: o.Total, Version: o.Version,
		CreatedAt: o.CreatedAt.UTC(), UpdatedAt: o.UpdatedAt.UTC(),
	}
}

func orderLocation(id string) string { return "/v1/orders/" + id }

// etag is an order's entity tag: its version.
func etag(version int64) string { return `"` + strconv.FormatInt(version, 10) + `"` }

type createOrderRequest struct {
	CustomerID string `json:"customer_id"`
	Currency   string `json:"currency"`
	Items      []struct {
		SKU       string `json:"sku"`
		Quantity  int64  `json:"quantity"`
		UnitPrice int64  `json:"unit_price"`
	} `json:"items"`
}

// createOrder handles POST /v1/orders.
func (s *Server) createOrder(w http.ResponseWriter, r *http.Request) {
	key, p := idempotencyKey(r)
	if p != nil {
		writeProblem(w, r, s.Logger, p, nil)
		return
	}
	var req createOrderRequest
	if p := decodeJSON(w, r, &req); p != nil {
		writeProblem(w, r, s.Logger, p, nil)
		return
	}
	cmd := command.CreateOrder{
		TenantID: tenantOf(r),
		Key:      key,
		NewOrder: domain.NewOrder{CustomerID: req.CustomerID, Currency: req.Currency, Lines: make([]domain.Line, len(req.Items))},
	}
	for i, it := range req.Items {
		cmd.Lines[i] = domain.Line{SKU: it.SKU, Quantity: it.Quantity, UnitPrice: it.UnitPrice}
	}
	if err := cmd.Validate(); err != nil {
		writeProblem(w, r, s.Logger, problemFor(err), err)
		return
	}
	s.keyed(w, r, key, scopeCreateOrder, cmd, func(ctx context.Context, tx pgx.Tx) (command.Response, error) {
		o, err := s.CreateOrder.Handle(ctx, tx, cmd)
		if err != nil {
			return refusal(r, err)
		}
		return jsonResponse(http.StatusCreated, toOrderJSON(o), map[string]string{
			"Location": orderLocation(o.ID.String()),
			"ETag":     etag(o.Version),
		})
	})
}

// getOrder handles GET /v1/orders/{id}: the order from the read model.
func (s *Server) getOrder(w http.ResponseWriter, r *http.Request) {
	id, p := parseID(r, "id")
	if p != nil {
		writeProblem(w, r, s.Logger, p, nil)
		return
	}
	o, err := s.GetOrder.Handle(r.Context(), query.GetOrder{TenantID: tenantOf(r), ID: id})
	if err != nil {
		writeProblem(w, r, s.Logger, problemFor(err), err)
		return
	}
	tag := etag(o.Version)
	w.Header().Set("ETag", tag)
	w.Header().Set("Cache-Control", "no-cache")
	if r.Header.Get("If-None-Match") == tag {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	writeJSON(w, http.StatusOK, toOrderJSON(o))
}
