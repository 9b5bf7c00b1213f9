package domain

import (
	"time"

	"github.com/google/uuid"
)

// Status is where an order stands in its lifecycle.
type Status string

// The order statuses. A new order is pending.
const (
	StatusPending        Status = "pending"
	StatusPaymentPending Status = "payment_pending"
	StatusPaymentFailed  Status = "payment_failed"
	StatusPaid           Status = "paid"
	StatusShipped        Status = "shipped"
	StatusCancelled      Status = "cancelled"
)

// Limits of an order, checked by NewOrder.Validate.
const (
	MaxCustomerIDLen = 64
	MaxSKULen        = 64
	MinItems         = 1
	MaxItems         = 100
	MaxQuantity      = 10_000
)

// Line is one line of an order as a client asks for it.
type Line struct {
	SKU       string `json:"sku"`
	Quantity  int64  `json:"quantity"`
	UnitPrice int64  `json:"unit_price"`
}

// Item is one priced line of an order: LineTotal = Quantity × UnitPrice.
type Item struct {
	SKU       string `json:"sku"`
	Quantity  int64  `json:"quantity"`
	UnitPrice int64  `json:"unit_price"`
	LineTotal int64  `json:"line_total"`
}

// Order is the order aggregate. Version starts at 1 and grows by exactly one
// with every change, which is what orders its events.
type Order struct {
	ID         uuid.UUID
	TenantID   string
	CustomerID string
	Status     Status
	Currency   string
	Items      []Item
	Total      int64
	Version    int64
	CreatedAt  time.Time
	UpdatedAt  time.Time

	// Set by the lifecycle; nil until the step happened.
	PaidAt, ShippedAt, CancelledAt *time.Time
	CancelReason                   string
	// Set by Update; nil and "" until then.
	ShippingAddress *Address
	Note            string
	// Payment is the latest charge attempt; Refund the refund of a
	// cancelled paid order.
	Payment Payment
	Refund  Refund
}

// NewOrder is what it takes to place an order. Its zero value is invalid.
type NewOrder struct {
	CustomerID string `json:"customer_id"`
	Currency   string `json:"currency"`
	Lines      []Line `json:"items"`
}

// Validate checks every rule of a new order and reports all violations at
// once as a KindInvalid *Error. Amounts are bounded by MaxAmount: a unit
// price above it is reported as "items[i].unit_price", a line total above it
// as "items[i].line_total", an order total above it as "total" (once).
func (n NewOrder) Validate() error {
	_, _, err := n.price()
	return err
}

// price validates n and computes its items and total.
func (n NewOrder) price() ([]Item, int64, error) {
	var fe fieldErrors
	if msg := checkVisible(n.CustomerID, MaxCustomerIDLen); msg != "" {
		fe.add("customer_id", "%s", msg)
	}
	if !ValidCurrency(n.Currency) {
		fe.add("currency", "must be an active ISO 4217 code in upper case, such as EUR")
	}
	if len(n.Lines) < MinItems || len(n.Lines) > MaxItems {
		fe.add("items", "must hold %d to %d items, got %d", MinItems, MaxItems, len(n.Lines))
	}
	items := make([]Item, 0, min(len(n.Lines), MaxItems))
	var total int64
	totalOK := true
	for i, l := range n.Lines {
		if i >= MaxItems {
			break
		}
		path := "items[" + itoa(i) + "]"
		lineOK := true
		if msg := checkVisible(l.SKU, MaxSKULen); msg != "" {
			fe.add(path+".sku", "%s", msg)
		}
		if l.Quantity < 1 || l.Quantity > MaxQuantity {
			fe.add(path+".quantity", "must be between 1 and %d", MaxQuantity)
			lineOK = false
		}
		if l.UnitPrice < 0 || l.UnitPrice > MaxAmount {
			fe.add(path+".unit_price", "must be between 0 and %d (integer minor units)", MaxAmount)
			lineOK = false
		}
		if !lineOK {
			totalOK = false
			continue
		}
		lineTotal, ok := mulAmount(l.Quantity, l.UnitPrice)
		if !ok || lineTotal > MaxAmount {
			fe.add(path+".line_total", "quantity × unit_price must be at most %d (integer minor units)", MaxAmount)
			totalOK = false
			continue
		}
		if totalOK {
			if total, ok = addAmount(total, lineTotal); !ok || total > MaxAmount {
				fe.add("total", "the sum of the line totals must be at most %d (integer minor units)", MaxAmount)
				totalOK = false
			}
		}
		items = append(items, Item{SKU: l.SKU, Quantity: l.Quantity, UnitPrice: l.UnitPrice, LineTotal: lineTotal})
	}
	if err := fe.err("the order is invalid"); err != nil {
		return nil, 0, err
	}
	return items, total, nil
}

// checkVisible returns "" if s is 1..maxLen visible ASCII characters (RFC 5234
// VCHAR: '!' to '~', no spaces or controls), else what is wrong with it.
func checkVisible(s string, maxLen int) string {
	switch {
	case s == "":
		return "is required"
	case len(s) > maxLen:
		return "must be at most " + itoa(maxLen) + " characters"
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '!' || s[i] > '~' {
			return "must be visible ASCII characters ('!' to '~'): no spaces, controls or non-ASCII"
		}
	}
	return ""
}

// CreateOrder validates n and returns the new pending order at version 1 with
// its OrderCreated event. It returns a KindInvalid *Error if n breaks a rule.
// The caller supplies the id and the time so that this stays pure.
func CreateOrder(id uuid.UUID, tenantID string, n NewOrder, now time.Time) (Order, OrderCreated, error) {
	items, total, err := n.price()
	if err != nil {
		return Order{}, OrderCreated{}, err
	}
	o := Order{
		ID:         id,
		TenantID:   tenantID,
		CustomerID: n.CustomerID,
		Status:     StatusPending,
		Currency:   n.Currency,
		Items:      items,
		Total:      total,
		Version:    1,
		CreatedAt:  now,
		UpdatedAt:  now,
	}
	return o, OrderCreated{
		CustomerID: o.CustomerID,
		Status:     o.Status,
		Currency:   o.Currency,
		Items:      o.Items,
		Total:      o.Total,
		CreatedAt:  now,
	}, nil
}

func itoa(i int) string {
	if i == 0 {
		return "0"
	}
	var b [20]byte
	n := len(b)
	for ; i > 0; i /= 10 {
		n--
		b[n] = byte('0' + i%10)
	}
	return string(b[n:])
}

// UTC returns o with every instant in UTC, as the service presents them.
func (o Order) UTC() Order {
	o.CreatedAt, o.UpdatedAt = o.CreatedAt.UTC(), o.UpdatedAt.UTC()
	for _, t := range []**time.Time{&o.PaidAt, &o.ShippedAt, &o.CancelledAt,
		&o.Payment.RequestedAt, &o.Payment.FailedAt, &o.Refund.RequestedAt, &o.Refund.SettledAt} {
		if *t != nil {
			u := (*t).UTC()
			*t = &u
		}
	}
	return o
}
