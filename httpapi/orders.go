package httpapi

import (
	"encoding/json"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/acme/orders/command"
	"github.com/acme/orders/domain"
	"github.com/acme/orders/query"
)

// orderJSON is an order as every endpoint shows it. Amounts are integer
// minor units of the currency.
type orderJSON struct {
	ID              uuid.UUID       `json:"id"`
	CustomerID      string          `json:"customer_id"`
	Status          string          `json:"status"`
	Currency        string          `json:"currency"`
	Items           []itemJSON      `json:"items"`
	Total           int64           `json:"total"`
	Version         int64           `json:"version"`
	CreatedAt       time.Time       `json:"created_at"`
	UpdatedAt       time.Time       `json:"updated_at"`
	ShippingAddress *domain.Address `json:"shipping_address"`
	Note            string          `json:"note"`
	StatusHistory   []statusJSON    `json:"status_history"`
	// Payment is the latest charge attempt (null before the first pay).
	Payment *paymentJSON `json:"payment"`
	// Refund is "" until a paid order is cancelled, then pending, succeeded
	// or failed; RefundDetails says more.
	Refund        string      `json:"refund"`
	RefundDetails *refundJSON `json:"refund_details,omitempty"`
}

type paymentJSON struct {
	Attempt       int    `json:"attempt"`
	Method        string `json:"payment_method"`
	ChargeID      string `json:"charge_id,omitempty"`
	DeclineCode   string `json:"decline_code,omitempty"`
	FailureReason string `json:"failure_reason,omitempty"`
}

type refundJSON struct {
	Attempt       int    `json:"attempt"`
	RefundID      string `json:"refund_id,omitempty"`
	FailureReason string `json:"failure_reason,omitempty"`
}

type itemJSON struct {
	SKU       string `json:"sku"`
	Quantity  int64  `json:"quantity"`
	UnitPrice int64  `json:"unit_price"`
	LineTotal int64  `json:"line_total"`
}

type statusJSON struct {
	Status string    `json:"status"`
	At     time.Time `json:"at"`
	Reason string    `json:"reason,omitempty"`
}

func toOrderJSON(o domain.Order) orderJSON {
	o = o.UTC()
	items := make([]itemJSON, len(o.Items))
	for i, it := range o.Items {
		items[i] = itemJSON{SKU: it.SKU, Quantity: it.Quantity, UnitPrice: it.UnitPrice, LineTotal: it.LineTotal}
	}
	var history []statusJSON
	for _, h := range o.History() {
		history = append(history, statusJSON{Status: string(h.Status), At: h.At.UTC(), Reason: h.Reason})
	}
	out := orderJSON{
		ID: o.ID, CustomerID: o.CustomerID, Status: string(o.Status), Currency: o.Currency,
		Items: items, Total: o.Total, Version: o.Version, CreatedAt: o.CreatedAt, UpdatedAt: o.UpdatedAt,
		ShippingAddress: o.ShippingAddress, Note: o.Note, StatusHistory: history, Refund: string(o.Refund.Status),
	}
	if p := o.Payment; p.Attempt > 0 {
		out.Payment = &paymentJSON{Attempt: p.Attempt, Method: p.Method, ChargeID: p.ChargeID, DeclineCode: p.DeclineCode, FailureReason: p.FailureReason}
	}
	if rf := o.Refund; rf.Attempt > 0 {
		out.RefundDetails = &refundJSON{Attempt: rf.Attempt, RefundID: rf.ID, FailureReason: rf.FailureReason}
	}
	return out
}

func orderLocation(id string) string { return "/v1/orders/" + id }

// etag is an order's entity tag: its version.
func etag(version int64) string { return `"` + strconv.FormatInt(version, 10) + `"` }

// Scopes of keyed commands: method and route template. An Idempotency-Key
// belongs to one scope.
const (
	scopeCreateOrder = "POST /v1/orders"
	scopePayOrder    = "POST /v1/orders/{id}/pay"
	scopeShipOrder   = "POST /v1/orders/{id}/ship"
	scopeCancelOrder = "POST /v1/orders/{id}/cancel"
	scopeRefundOrder = "POST /v1/orders/{id}/refund"
	scopeUpdateOrder = "PATCH /v1/orders/{id}"
)

// runOrderCommand runs cmd with h under the request's Idempotency-Key (read
// already) and answers with the order and its ETag: status on success; a
// stored problem for a refusal.
func runOrderCommand[C any](s *Server, w http.ResponseWriter, r *http.Request, key, scope string, cmd C, h OrderCommand[C], status int) {
	runOrderCommandFunc(s, w, r, key, scope, cmd, h, func(command.Outcome) int { return status })
}

// runOrderCommandFunc is runOrderCommand with the success status chosen by
// the outcome (e.g. 202 for a payment attempt started, 200 for none).
// 201 and 202 answers carry the order's Location.
func runOrderCommandFunc[C any](s *Server, w http.ResponseWriter, r *http.Request, key, scope string, cmd C, h OrderCommand[C], status func(command.Outcome) int) {
	req := command.OrderRequest[C]{TenantID: tenantOf(r), Scope: scope, Key: key, Wait: s.keyWait(r), Command: cmd}
	res, err := h.Run(r.Context(), s.Idempotency, req, func(out command.Outcome) (command.Response, error) {
		if out.Refusal != nil {
			return refusal(r, out.Refusal)
		}
		o, st := out.Order, status(out)
		header := map[string]string{"ETag": etag(o.Version)}
		if st == http.StatusCreated || st == http.StatusAccepted {
			header["Location"] = orderLocation(o.ID.String())
		}
		return jsonResponse(st, toOrderJSON(o), header)
	})
	s.writeKeyed(w, r, res, err)
}

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
	runOrderCommand(s, w, r, key, scopeCreateOrder, cmd, s.CreateOrder, http.StatusCreated)
}

// keyedOrderRequest reads what every command on an existing order needs: the
// Idempotency-Key and the order id. ok is false when it already answered.
func (s *Server) keyedOrderRequest(w http.ResponseWriter, r *http.Request) (key string, id uuid.UUID, ok bool) {
	key, p := idempotencyKey(r)
	if p == nil {
		id, p = parseID(r, "id")
	}
	if p != nil {
		writeProblem(w, r, s.Logger, p, nil)
		return "", uuid.Nil, false
	}
	return key, id, true
}

// payOrder handles POST /v1/orders/{id}/pay (no body, {}, or
// {"payment_method": "pm_…"}): 202 with the order and its Location when it
// recorded a new payment attempt (the charge happens later, through the
// outbox and the payment worker), 200 with the order as it is when a payment
// is under way or done.
func (s *Server) payOrder(w http.ResponseWriter, r *http.Request) {
	key, id, ok := s.keyedOrderRequest(w, r)
	if !ok {
		return
	}
	var req struct {
		PaymentMethod *string `json:"payment_method"`
	}
	if !s.decodeOptional(w, r, &req) {
		return
	}
	cmd := command.PayOrder{TenantID: tenantOf(r), Key: key, OrderID: id, PaymentMethod: domain.DefaultPaymentMethod}
	if req.PaymentMethod != nil {
		cmd.PaymentMethod = *req.PaymentMethod
	}
	if err := cmd.Validate(); err != nil {
		writeProblem(w, r, s.Logger, problemFor(err), err)
		return
	}
	if cmd.ExpectedVersion, ok = s.optionalIfMatch(w, r); !ok {
		return
	}
	runOrderCommandFunc(s, w, r, key, scopePayOrder, cmd, s.PayOrder, acceptedIfChanged)
}

// acceptedIfChanged is the status of a step whose effect happens later (a
// charge, a refund): 202 when it started one, 200 when one is under way or
// done and nothing changed.
func acceptedIfChanged(out command.Outcome) int {
	if out.Changed {
		return http.StatusAccepted
	}
	return http.StatusOK
}

// shipOrder handles POST /v1/orders/{id}/ship (no body, or {}).
func (s *Server) shipOrder(w http.ResponseWriter, r *http.Request) {
	key, id, ok := s.keyedOrderRequest(w, r)
	if !ok || !s.decodeOptional(w, r, &struct{}{}) {
		return
	}
	cmd := command.ShipOrder{TenantID: tenantOf(r), OrderID: id}
	if cmd.ExpectedVersion, ok = s.optionalIfMatch(w, r); !ok {
		return
	}
	runOrderCommand(s, w, r, key, scopeShipOrder, cmd, s.ShipOrder, http.StatusOK)
}

// cancelOrder handles POST /v1/orders/{id}/cancel with {"reason": "…"}.
func (s *Server) cancelOrder(w http.ResponseWriter, r *http.Request) {
	key, id, ok := s.keyedOrderRequest(w, r)
	if !ok {
		return
	}
	var req struct {
		Reason string `json:"reason"`
	}
	if p := decodeJSON(w, r, &req); p != nil {
		writeProblem(w, r, s.Logger, p, nil)
		return
	}
	cmd := command.CancelOrder{TenantID: tenantOf(r), OrderID: id, Reason: req.Reason}
	if err := cmd.Validate(); err != nil {
		writeProblem(w, r, s.Logger, problemFor(err), err)
		return
	}
	if cmd.ExpectedVersion, ok = s.optionalIfMatch(w, r); !ok {
		return
	}
	runOrderCommand(s, w, r, key, scopeCancelOrder, cmd, s.CancelOrder, http.StatusOK)
}

// refundOrder handles POST /v1/orders/{id}/refund (no body, or {}): the
// refund of a cancelled order asked again after it failed. 202 with the
// order and its Location when it recorded a new refund attempt (the
// refund happens later, through the outbox and the payment worker, as
// the cancellation's did), 200 with the order as it is when its refund is
// pending or succeeded, 409 for an order not cancelled or never paid.
func (s *Server) refundOrder(w http.ResponseWriter, r *http.Request) {
	key, id, ok := s.keyedOrderRequest(w, r)
	if !ok || !s.decodeOptional(w, r, &struct{}{}) {
		return
	}
	cmd := command.RefundOrder{TenantID: tenantOf(r), Key: key, OrderID: id}
	if cmd.ExpectedVersion, ok = s.optionalIfMatch(w, r); !ok {
		return
	}
	runOrderCommandFunc(s, w, r, key, scopeRefundOrder, cmd, s.RefundOrder, acceptedIfChanged)
}

// updateOrder handles PATCH /v1/orders/{id}: a merge patch of
// shipping_address and note (null clears), with If-Match: "<version>".
func (s *Server) updateOrder(w http.ResponseWriter, r *http.Request) {
	key, id, ok := s.keyedOrderRequest(w, r)
	if !ok {
		return
	}
	version, p := ifMatchVersion(r)
	if p != nil {
		writeProblem(w, r, s.Logger, p, nil)
		return
	}
	var req struct {
		ShippingAddress json.RawMessage `json:"shipping_address"`
		Note            json.RawMessage `json:"note"`
	}
	if p := decodeJSON(w, r, &req); p != nil {
		writeProblem(w, r, s.Logger, p, nil)
		return
	}
	cmd := command.UpdateOrder{TenantID: tenantOf(r), Key: key, OrderID: id, ExpectedVersion: version}
	var bad []domain.FieldError
	if req.ShippingAddress != nil {
		cmd.SetShippingAddress = true
		if string(req.ShippingAddress) != "null" {
			if err := strictUnmarshal(req.ShippingAddress, &cmd.ShippingAddress); err != nil {
				bad = append(bad, domain.FieldError{Field: "shipping_address", Detail: "must be an object with name, line1, line2, city, postal_code and country, or null: " + err.Error()})
			} else if p := checkKeys(req.ShippingAddress, reflect.TypeFor[domain.Address](), "shipping_address"); p != nil {
				bad = append(bad, p.Errors...)
			}
		}
	}
	if req.Note != nil {
		cmd.SetNote = true
		if string(req.Note) != "null" {
			if err := json.Unmarshal(req.Note, &cmd.Note); err != nil {
				bad = append(bad, domain.FieldError{Field: "note", Detail: "must be a string or null"})
			}
		}
	}
	if len(bad) > 0 {
		p := problem(http.StatusBadRequest, "malformed-request", "Malformed request body", "A field has the wrong shape.")
		p.Errors = bad
		writeProblem(w, r, s.Logger, p, nil)
		return
	}
	if err := cmd.Validate(); err != nil {
		writeProblem(w, r, s.Logger, problemFor(err), err)
		return
	}
	runOrderCommand(s, w, r, key, scopeUpdateOrder, cmd, s.UpdateOrder, http.StatusOK)
}

// optionalIfMatch reads the If-Match of a change that does not require one
// (pay, ship, cancel): 0 without one (or an empty one), or with "*" (the
// order exists, or the change answers 404 anyway); else as ifMatchVersion, whose problem it
// answers itself (reporting false). The change is then made only on that
// version: another is 412, as for PATCH (RFC 9110, 13.1.1: a server that
// gets If-Match must not perform the method when it fails).
func (s *Server) optionalIfMatch(w http.ResponseWriter, r *http.Request) (int64, bool) {
	if all := strings.TrimSpace(strings.Join(r.Header.Values("If-Match"), "")); all == "" || all == "*" {
		return 0, true
	}
	v, p := ifMatchVersion(r)
	if p != nil {
		writeProblem(w, r, s.Logger, p, nil)
		return 0, false
	}
	return v, true
}

// ifMatchVersion reads If-Match: "<version>" (a strong ETag of an order).
// A missing header is 428: a change must say which version it was made on.
// Its lines are joined as one list (RFC 9110, 5.3), so two lines are
// refused as a list in one line is: a change is made on one version.
func ifMatchVersion(r *http.Request) (int64, *Problem) {
	var tags []string
	for _, line := range r.Header.Values("If-Match") {
		if line = strings.TrimSpace(line); line != "" {
			tags = append(tags, line)
		}
	}
	v := strings.Join(tags, ", ")
	if v == "" || v == "*" {
		// "*" holds for any version (RFC 9110, 13.1.1), which is what a
		// required If-Match exists to rule out: still 428, not a 412 for
		// a condition that is true.
		return 0, problem(http.StatusPreconditionRequired, "if-match-required", "If-Match required",
			`Send If-Match with the ETag of the order version you are changing, e.g. If-Match: "3" (not "*", which names no version).`)
	}
	// Strong comparison (RFC 9110, 8.8.3.2): the tag must be the ETag's
	// exact text, so "01" or "+1" is not "1".
	var n int64
	var err error
	if len(v) >= 3 && v[0] == '"' && v[len(v)-1] == '"' {
		inner := v[1 : len(v)-1]
		if n, err = strconv.ParseInt(inner, 10, 64); err == nil && strconv.FormatInt(n, 10) != inner {
			err = strconv.ErrSyntax
		}
	}
	if err != nil || n < 1 {
		return 0, problem(http.StatusPreconditionFailed, "precondition-failed", "Precondition failed",
			`If-Match must be one strong ETag of this order, such as "3".`)
	}
	return n, nil
}

// getOrder handles GET /v1/orders/{id}[?min_version=N]: the order from the
// read model, waiting (bounded) until it is at version N or later.
func (s *Server) getOrder(w http.ResponseWriter, r *http.Request) {
	id, p := parseID(r, "id")
	if p != nil {
		writeProblem(w, r, s.Logger, p, nil)
		return
	}
	q := query.GetOrder{TenantID: tenantOf(r), ID: id, Wait: s.readWait(r)}
	if v := r.URL.Query().Get("min_version"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 1 {
			writeProblem(w, r, s.Logger, invalidParam("min_version", "must be a positive integer (an order version)"), nil)
			return
		}
		q.MinVersion = n
	}
	o, err := s.GetOrder.Handle(r.Context(), q)
	if err != nil {
		writeProblem(w, r, s.Logger, problemFor(err), err)
		return
	}
	tag := etag(o.Version)
	w.Header().Set("ETag", tag)
	w.Header().Set("Cache-Control", "no-cache")
	if etagMatches(r.Header.Values("If-None-Match"), tag) {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	s.writeJSON(w, r, http.StatusOK, toOrderJSON(o))
}

// etagMatches applies If-None-Match's weak comparison to the lists of tags
// on every line of the header (one list may come as several lines).
func etagMatches(lines []string, tag string) bool {
	for _, line := range lines {
		for t := range strings.SplitSeq(line, ",") {
			t = strings.TrimPrefix(strings.TrimSpace(t), "W/")
			if t == "*" || t == tag {
				return true
			}
		}
	}
	return false
}

// readWait is how long a read-your-writes read may wait: the server default,
// or what the client asks with Prefer: wait=N, at most MaxReadWait.
func (s *Server) readWait(r *http.Request) time.Duration {
	if d, ok := preferWait(r); ok {
		return min(d, MaxReadWait)
	}
	return s.ReadWait
}

func invalidParam(name, detail string) *Problem { return badParam("query", name, detail) }

// invalidPathParam is invalidParam of a parameter in the path.
func invalidPathParam(name, detail string) *Problem { return badParam("path", name, detail) }

// badParam is the 400 invalid-parameter problem of the parameter name in
// where (query or path).
func badParam(where, name, detail string) *Problem {
	p := problem(http.StatusBadRequest, "invalid-parameter", "Invalid "+where+" parameter", "The "+where+" parameter "+name+" "+detail+".")
	p.Errors = []domain.FieldError{{Field: name, Detail: detail}}
	return p
}

type orderPageJSON struct {
	Orders     []orderJSON `json:"orders"`
	NextCursor *string     `json:"next_cursor"`
}

// listOrders handles GET /v1/orders?customer_id=&status=&created_after=&limit=&cursor=.
func (s *Server) listOrders(w http.ResponseWriter, r *http.Request) {
	params := r.URL.Query()
	q := query.ListOrders{TenantID: tenantOf(r), CustomerID: params.Get("customer_id"), Limit: query.DefaultPageSize}
	if q.CustomerID != "" && domain.ValidateCustomerID(q.CustomerID) != nil {
		writeProblem(w, r, s.Logger, invalidParam("customer_id", "must be a customer id: 1 to 64 visible ASCII characters"), nil)
		return
	}
	if st := params.Get("status"); st != "" {
		switch domain.Status(st) {
		case domain.StatusPending, domain.StatusPaymentPending, domain.StatusPaymentFailed, domain.StatusPaid, domain.StatusShipped, domain.StatusCancelled:
			q.Status = domain.Status(st)
		default:
			writeProblem(w, r, s.Logger, invalidParam("status", "must be pending, payment_pending, payment_failed, paid, shipped or cancelled"), nil)
			return
		}
	}
	if v := params.Get("created_after"); v != "" {
		t, err := time.Parse(time.RFC3339Nano, strings.ToUpper(v)) // RFC 3339 allows a lower-case t and z
		if err != nil {
			writeProblem(w, r, s.Logger, invalidParam("created_after", "must be an RFC 3339 time such as 2026-11-21T00:00:00Z"), nil)
			return
		}
		q.CreatedAfter = t
	}
	if v := params.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > query.MaxPageSize {
			writeProblem(w, r, s.Logger, invalidParam("limit", "must be an integer from 1 to 100"), nil)
			return
		}
		q.Limit = n
	}
	if v := params.Get("cursor"); v != "" {
		c, err := query.ParseCursor(v)
		if err != nil {
			writeProblem(w, r, s.Logger, invalidParam("cursor", "must be a next_cursor value from an earlier page"), nil)
			return
		}
		q.After = &c
	}
	page, err := s.ListOrders.Handle(r.Context(), q)
	if err != nil {
		writeProblem(w, r, s.Logger, problemFor(err), err)
		return
	}
	out := orderPageJSON{Orders: make([]orderJSON, len(page.Orders))}
	for i, o := range page.Orders {
		out.Orders[i] = toOrderJSON(o)
	}
	if page.Next != nil {
		c := page.Next.String()
		out.NextCursor = &c
	}
	w.Header().Set("Cache-Control", "no-cache") // as every read of a read model
	s.writeJSON(w, r, http.StatusOK, out)
}
