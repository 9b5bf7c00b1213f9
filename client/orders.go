package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// Order is an order as the API shows it. Amounts are integer minor units
// of Currency.
type Order struct {
	ID              string         `json:"id"`
	CustomerID      string         `json:"customer_id"`
	Status          string         `json:"status"`
	Currency        string         `json:"currency"`
	Items           []Item         `json:"items"`
	Total           int64          `json:"total"`
	Version         int64          `json:"version"`
	CreatedAt       time.Time      `json:"created_at"`
	UpdatedAt       time.Time      `json:"updated_at"`
	ShippingAddress *Address       `json:"shipping_address"`
	Note            string         `json:"note"`
	StatusHistory   []StatusChange `json:"status_history"`
	Payment         *Payment       `json:"payment"`
	Refund          string         `json:"refund"`
	RefundDetails   *RefundDetails `json:"refund_details,omitempty"`
}

// Item is one line of an order.
type Item struct {
	SKU       string `json:"sku"`
	Quantity  int64  `json:"quantity"`
	UnitPrice int64  `json:"unit_price"`
	LineTotal int64  `json:"line_total"`
}

// Address is a shipping address; Country is ISO 3166-1 alpha-2.
type Address struct {
	Name       string `json:"name"`
	Line1      string `json:"line1"`
	Line2      string `json:"line2,omitempty"`
	City       string `json:"city"`
	PostalCode string `json:"postal_code"`
	Country    string `json:"country"`
}

// StatusChange is one entry of an order's status history.
type StatusChange struct {
	Status string    `json:"status"`
	At     time.Time `json:"at"`
	Reason string    `json:"reason,omitempty"`
}

// Payment is an order's latest charge attempt.
type Payment struct {
	Attempt       int    `json:"attempt"`
	Method        string `json:"payment_method"`
	ChargeID      string `json:"charge_id,omitempty"`
	DeclineCode   string `json:"decline_code,omitempty"`
	FailureReason string `json:"failure_reason,omitempty"`
}

// RefundDetails is an order's latest refund attempt.
type RefundDetails struct {
	Attempt       int    `json:"attempt"`
	RefundID      string `json:"refund_id,omitempty"`
	FailureReason string `json:"failure_reason,omitempty"`
}

// NewOrder is what CreateOrder sends.
type NewOrder struct {
	CustomerID string    `json:"customer_id"`
	Currency   string    `json:"currency"`
	Items      []NewItem `json:"items,omitempty"` // nil is sent as no items (422), never as null (400)
}

// NewItem is one line of a NewOrder.
type NewItem struct {
	SKU       string `json:"sku"`
	Quantity  int64  `json:"quantity"`
	UnitPrice int64  `json:"unit_price"`
}

// OrderUpdate is what UpdateOrder changes: a field left nil stays as it is;
// ClearShippingAddress and ClearNote clear theirs.
type OrderUpdate struct {
	ShippingAddress      *Address
	ClearShippingAddress bool
	Note                 *string
	ClearNote            bool
}

// MarshalJSON renders the merge patch.
func (u OrderUpdate) MarshalJSON() ([]byte, error) {
	m := map[string]any{}
	switch {
	case u.ClearShippingAddress:
		m["shipping_address"] = nil
	case u.ShippingAddress != nil:
		m["shipping_address"] = u.ShippingAddress
	}
	switch {
	case u.ClearNote:
		m["note"] = nil
	case u.Note != nil:
		m["note"] = *u.Note
	}
	return json.Marshal(m)
}

// order runs a call whose answer is an order.
func (c *Client) order(ctx context.Context, r request, opts []CallOption) (*Order, error) {
	var out Order
	r.out = &out
	if err := c.do(ctx, r, opts); err != nil {
		return nil, err
	}
	return &out, nil
}

func orderPath(id string) string { return "/v1/orders/" + url.PathEscape(id) }

// CreateOrder creates an order: 201 with the order at version 1. Retried
// safely (see the package doc): one order per call, however many attempts.
// A late retry of an expired key gets a conflict naming the existing order
// (ConflictLocation).
func (c *Client) CreateOrder(ctx context.Context, o NewOrder, opts ...CallOption) (*Order, error) {
	return c.order(ctx, request{method: http.MethodPost, path: "/v1/orders", body: o, keyed: true}, opts)
}

// PayOrder records a payment attempt with paymentMethod ("" for the
// server's default): 202 when it started one (the charge happens later;
// wait for version Version+1 to see its outcome), 200 with the order as it
// is when a payment is under way or done (WithMeta's Status tells them
// apart). A shipped or cancelled order is a conflict; so is a late retry
// of an expired key whose pay started an attempt that was declined since
// (ConflictLocation names the order: read it; no attempt is started again).
func (c *Client) PayOrder(ctx context.Context, id, paymentMethod string, opts ...CallOption) (*Order, error) {
	var body any = struct{}{}
	if paymentMethod != "" {
		body = struct {
			PaymentMethod string `json:"payment_method"`
		}{paymentMethod}
	}
	return c.order(ctx, request{method: http.MethodPost, path: orderPath(id) + "/pay", body: body, keyed: true, ifMatch: true}, opts)
}

// ShipOrder ships a paid order (a conflict for any other but shipped).
// WithIfMatch ships it only at that version (so for pay, cancel and
// refund).
func (c *Client) ShipOrder(ctx context.Context, id string, opts ...CallOption) (*Order, error) {
	return c.order(ctx, request{method: http.MethodPost, path: orderPath(id) + "/ship", body: struct{}{}, keyed: true, ifMatch: true}, opts)
}

// CancelOrder cancels an order with a reason (1–500 characters); a paid
// order's refund is requested with it. A payment_pending order is a
// conflict with Retry-After (its charge may be in flight), which the call
// sends again until the charge settles or its attempts run out; then it
// returns the conflict, not definitive (Meta): cancel again later.
func (c *Client) CancelOrder(ctx context.Context, id, reason string, opts ...CallOption) (*Order, error) {
	body := struct {
		Reason string `json:"reason"`
	}{reason}
	return c.order(ctx, request{method: http.MethodPost, path: orderPath(id) + "/cancel", body: body, keyed: true, ifMatch: true}, opts)
}

// RefundOrder asks again for the refund of a cancelled order whose refund
// failed: 202 when it started a new refund attempt (the refund happens
// later; wait for version Version+1 to see its outcome), 200 with the
// order as it is when its refund is pending or succeeded. An order not
// cancelled, or cancelled without having been paid, is a conflict; so is a
// late retry of an expired key whose refund attempt failed since
// (ConflictLocation names the order: read it; no attempt is started again).
func (c *Client) RefundOrder(ctx context.Context, id string, opts ...CallOption) (*Order, error) {
	return c.order(ctx, request{method: http.MethodPost, path: orderPath(id) + "/refund", body: struct{}{}, keyed: true, ifMatch: true}, opts)
}

// UpdateOrder changes the shipping address and/or note of the order at
// version (If-Match). Another current version is a precondition-failed
// *Problem (IsPreconditionFailed): read the order again and decide anew.
// A late retry of an expired key whose update ran gets a conflict naming
// the order (ConflictLocation), not a precondition-failed.
func (c *Client) UpdateOrder(ctx context.Context, id string, version int64, u OrderUpdate, opts ...CallOption) (*Order, error) {
	h := http.Header{
		"If-Match":     {`"` + strconv.FormatInt(version, 10) + `"`},
		"Content-Type": {"application/merge-patch+json"},
	}
	return c.order(ctx, request{method: http.MethodPatch, path: orderPath(id), body: u, keyed: true, header: h}, opts)
}

// GetOrder reads an order from the read model. With WithMinVersion it
// waits (bounded by the server, or WithWait up to its cap) for that
// version; past the bound it fails with a view-behind *Problem.
func (c *Client) GetOrder(ctx context.Context, id string, opts ...CallOption) (*Order, error) {
	var cc callConfig
	for _, o := range opts {
		o(&cc)
	}
	q := url.Values{}
	if cc.minVersion > 0 {
		q.Set("min_version", strconv.FormatInt(cc.minVersion, 10))
	}
	return c.order(ctx, request{method: http.MethodGet, path: orderPath(id), query: q}, opts)
}

// WaitForVersion reads your own write: it returns the order once the read
// model has it at version or later. Each GET waits on the server (2 s by
// default; WithWait asks for up to its cap); after a view-behind answer it
// asks again, after a full-jitter backoff, until ctx ends: give ctx a
// deadline. Any other error is returned at once.
func (c *Client) WaitForVersion(ctx context.Context, id string, version int64, opts ...CallOption) (*Order, error) {
	opts = append(opts[:len(opts):len(opts)], WithMinVersion(version))
	return readYourWrite(ctx, c, fmt.Sprintf("order %s version %d", id, version), func() (*Order, error) {
		return c.GetOrder(ctx, id, opts...)
	})
}

// readYourWrite calls read until its answer is not view-behind, or ctx
// ends (an error naming what it waited for). Each read already waited on
// the server (its read wait, or WithWait), so it asks again after a
// jittered backoff, not the full Retry-After.
func readYourWrite[T any](ctx context.Context, c *Client, what string, read func() (*T, error)) (*T, error) {
	for n := 1; ; n++ {
		v, err := read()
		if !IsViewBehind(err) {
			return v, err
		}
		t := time.NewTimer(c.backoff(n))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("wait for %s: %w (last answer: %w)", what, ctx.Err(), err)
		case <-t.C:
		}
	}
}

// ListOptions filters and pages ListOrders; zero fields are left out.
type ListOptions struct {
	CustomerID   string
	Status       string
	CreatedAfter time.Time
	// Limit is the page size (1–100; 0: the server's default, 20).
	Limit int
	// Cursor is the NextCursor of the previous page.
	Cursor string
}

// OrderPage is one page of ListOrders; NextCursor is "" on the last. A
// page filtered by status may hold fewer orders than the limit, even none,
// and still not be the last: the server examines a bounded number of
// orders per page. Walk until NextCursor is "", not until a short page.
type OrderPage struct {
	Orders     []Order `json:"orders"`
	NextCursor string  `json:"next_cursor"`
}

// ListOrders lists the tenant's orders, oldest first, one page at a time.
func (c *Client) ListOrders(ctx context.Context, lo ListOptions, opts ...CallOption) (*OrderPage, error) {
	q := url.Values{}
	if lo.CustomerID != "" {
		q.Set("customer_id", lo.CustomerID)
	}
	if lo.Status != "" {
		q.Set("status", lo.Status)
	}
	if !lo.CreatedAfter.IsZero() {
		q.Set("created_after", lo.CreatedAfter.UTC().Format(time.RFC3339Nano))
	}
	if lo.Limit != 0 {
		q.Set("limit", strconv.Itoa(lo.Limit))
	}
	if lo.Cursor != "" {
		q.Set("cursor", lo.Cursor)
	}
	var page struct {
		Orders     []Order `json:"orders"`
		NextCursor *string `json:"next_cursor"`
	}
	if err := c.do(ctx, request{method: http.MethodGet, path: "/v1/orders", query: q, out: &page}, opts); err != nil {
		return nil, err
	}
	out := &OrderPage{Orders: page.Orders}
	if page.NextCursor != nil {
		out.NextCursor = *page.NextCursor
	}
	return out, nil
}

// CustomerSummary is a customer's orders by status (and "total") and money
// per currency. The sums can pass 2^63, hence big integers.
type CustomerSummary struct {
	CustomerID  string           `json:"customer_id"`
	Orders      map[string]int64 `json:"orders"`
	Totals      []CurrencyTotal  `json:"totals"`
	LastOrderAt time.Time        `json:"last_order_at"`
}

// CurrencyTotal is money paid and refunded in one currency, in minor units.
type CurrencyTotal struct {
	Currency string   `json:"currency"`
	Paid     *big.Int `json:"paid"`
	Refunded *big.Int `json:"refunded"`
}

// Position names an order version, for CustomerSummary's read-your-writes.
type Position struct {
	OrderID string
	Version int64
}

// CustomerSummary reads a customer's summary. With a non-nil minPosition
// it waits (bounded) until the summary includes that order version, or
// fails with a view-behind *Problem.
func (c *Client) CustomerSummary(ctx context.Context, customerID string, minPosition *Position, opts ...CallOption) (*CustomerSummary, error) {
	q := url.Values{}
	if minPosition != nil {
		q.Set("min_position", minPosition.OrderID+":"+strconv.FormatInt(minPosition.Version, 10))
	}
	var out CustomerSummary
	if err := c.do(ctx, request{method: http.MethodGet, path: "/v1/customers/" + url.PathEscape(customerID) + "/summary", query: q, out: &out}, opts); err != nil {
		return nil, err
	}
	return &out, nil
}

// WaitForSummary reads your own write in a customer's summary: it returns
// the summary once it includes the order at pos's version or later (an
// order the customer created, paid, cancelled…). Like WaitForVersion, each
// GET waits on the server, and after a view-behind answer it asks again
// after a full-jitter backoff until ctx ends: give ctx a deadline.
func (c *Client) WaitForSummary(ctx context.Context, customerID string, pos Position, opts ...CallOption) (*CustomerSummary, error) {
	what := fmt.Sprintf("customer %s's summary to include order %s version %d", customerID, pos.OrderID, pos.Version)
	return readYourWrite(ctx, c, what, func() (*CustomerSummary, error) {
		return c.CustomerSummary(ctx, customerID, &pos, opts...)
	})
}

// DailySalesOptions bounds DailySales: From and To are instants whose UTC
// dates bound the report, both inclusive (zero: the server's default, the
// last 30 days); time.Now() is today's UTC day wherever the caller is. To
// name a date, build it in time.UTC. Currency filters.
type DailySalesOptions struct {
	From, To time.Time
	Currency string
}

// DailySales is the daily sales report.
type DailySales struct {
	From     string     `json:"from"`
	To       string     `json:"to"`
	Currency string     `json:"currency,omitempty"`
	Days     []DaySales `json:"days"`
}

// DaySales is one UTC day and currency of DailySales; Day is YYYY-MM-DD.
type DaySales struct {
	Day            string   `json:"day"`
	Currency       string   `json:"currency"`
	Orders         int64    `json:"orders"`
	PaidAmount     *big.Int `json:"paid_amount"`
	RefundedAmount *big.Int `json:"refunded_amount"`
}

// DailySales reads the daily sales report.
func (c *Client) DailySales(ctx context.Context, ds DailySalesOptions, opts ...CallOption) (*DailySales, error) {
	q := url.Values{}
	if !ds.From.IsZero() {
		q.Set("from", ds.From.UTC().Format(time.DateOnly))
	}
	if !ds.To.IsZero() {
		q.Set("to", ds.To.UTC().Format(time.DateOnly))
	}
	if ds.Currency != "" {
		q.Set("currency", ds.Currency)
	}
	var out DailySales
	if err := c.do(ctx, request{method: http.MethodGet, path: "/v1/reports/daily-sales", query: q, out: &out}, opts); err != nil {
		return nil, err
	}
	return &out, nil
}

// KeyInfo is what the tenant stored under an Idempotency-Key, per scope
// ("POST /v1/orders", …).
type KeyInfo struct {
	Key     string      `json:"key"`
	Records []KeyRecord `json:"records"`
}

// KeyRecord is one scope's stored answer: State is completed or expired.
type KeyRecord struct {
	Scope    string `json:"scope"`
	State    string `json:"state"`
	Response struct {
		Status      int    `json:"status"`
		ContentType string `json:"content_type,omitempty"`
		Location    string `json:"location,omitempty"`
		ETag        string `json:"etag,omitempty"`
	} `json:"response"`
	CreatedAt time.Time `json:"created_at"`
	ExpiresAt time.Time `json:"expires_at"`
}

// IdempotencyKey looks up what a key stored, to reconcile a call whose
// outcome is unknown. An unknown key (or one whose first request is still
// running) is a not-found *Problem.
func (c *Client) IdempotencyKey(ctx context.Context, key string, opts ...CallOption) (*KeyInfo, error) {
	if key == "" {
		return nil, errors.New("idempotency key lookup: empty key")
	}
	var out KeyInfo
	if err := c.do(ctx, request{method: http.MethodGet, path: "/v1/idempotency-keys/" + url.PathEscape(key), out: &out}, opts); err != nil {
		return nil, err
	}
	return &out, nil
}
