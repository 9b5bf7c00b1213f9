package domain

import (
	"fmt"
	"time"
)

// The lifecycle of an order:
//
//	pending ──pay──▶ paid ──ship──▶ shipped
//	   │               │
//	   └────cancel─────┴──▶ cancelled
//
// Each step that happens raises one event and adds one to the version.
// Asking for a step that already happened (paying a paid or shipped order,
// shipping a shipped one, cancelling a cancelled one) changes nothing and
// raises no event: the caller gets the order as it is. A step that can no
// longer happen is a KindConflict error that names the current status.

// StatusChange is one entry of an order's status history.
type StatusChange struct {
	Status Status
	At     time.Time
	Reason string // why it was cancelled
}

// History lists the statuses the order went through, oldest first. It is
// derived from the order's timestamps, so the write and read sides agree.
func (o Order) History() []StatusChange {
	h := []StatusChange{{Status: StatusPending, At: o.CreatedAt}}
	if o.PaidAt != nil {
		h = append(h, StatusChange{Status: StatusPaid, At: *o.PaidAt})
	}
	if o.ShippedAt != nil {
		h = append(h, StatusChange{Status: StatusShipped, At: *o.ShippedAt})
	}
	if o.CancelledAt != nil {
		h = append(h, StatusChange{Status: StatusCancelled, At: *o.CancelledAt, Reason: o.CancelReason})
	}
	return h
}

// Pay records the payment of a pending order. It returns a nil event when
// the order was paid before (it is paid or shipped), and a KindConflict
// error when it is cancelled.
func (o *Order) Pay(now time.Time) (Event, error) {
	switch o.Status {
	case StatusPaid, StatusShipped:
		return nil, nil
	case StatusPending:
		o.PaidAt = &now
		return OrderPaid{o.transition(StatusPaid, now)}, nil
	}
	return nil, o.refuse("pay")
}

// Ship records the shipping of a paid order. It returns a nil event when the
// order was shipped before, and a KindConflict error when it is pending or
// cancelled.
func (o *Order) Ship(now time.Time) (Event, error) {
	switch o.Status {
	case StatusShipped:
		return nil, nil
	case StatusPaid:
		o.ShippedAt = &now
		return OrderShipped{o.transition(StatusShipped, now)}, nil
	}
	return nil, o.refuse("ship")
}

// MaxReasonLen bounds a cancellation reason.
const MaxReasonLen = 500

// Cancel cancels a pending or paid order for reason (1 to 500 characters);
// a paid order is refunded in full. It returns a nil event when the order
// was cancelled before, a KindInvalid error for a bad reason, and a
// KindConflict error when it is shipped.
func (o *Order) Cancel(reason string, now time.Time) (Event, error) {
	if err := ValidateReason(reason); err != nil {
		return nil, err
	}
	switch o.Status {
	case StatusCancelled:
		return nil, nil
	case StatusPending, StatusPaid:
		var refunded int64
		if o.Status == StatusPaid {
			refunded = o.Total
		}
		o.CancelledAt, o.CancelReason = &now, reason
		return OrderCancelled{Transition: o.transition(StatusCancelled, now), Reason: reason, Refunded: refunded}, nil
	}
	return nil, o.refuse("cancel")
}

// ValidateReason checks a cancellation reason: 1 to MaxReasonLen characters
// of one line of text (see checkText for what text may not hold).
func ValidateReason(reason string) error {
	var fe fieldErrors
	if msg := checkText(reason, 1, MaxReasonLen, singleLine); msg != "" {
		fe.add("reason", "%s", msg)
	}
	return fe.err("the cancellation is invalid")
}

// transition moves o to status at now and returns the facts of the move.
func (o *Order) transition(to Status, now time.Time) Transition {
	t := Transition{
		CustomerID: o.CustomerID, Currency: o.Currency, Total: o.Total,
		From: o.Status, Status: to, At: now,
	}
	o.Status = to
	o.touch(now)
	return t
}

func (o *Order) touch(now time.Time) {
	o.Version++
	o.UpdatedAt = now
}

func (o *Order) refuse(action string) error {
	return &Error{
		Kind:    KindConflict,
		Message: fmt.Sprintf("cannot %s an order that is %s", action, o.Status),
		State:   string(o.Status),
	}
}

// Address is where an order is shipped to.
type Address struct {
	Name       string `json:"name"`
	Line1      string `json:"line1"`
	Line2      string `json:"line2,omitempty"`
	City       string `json:"city"`
	PostalCode string `json:"postal_code"`
	Country    string `json:"country"` // ISO 3166-1 alpha-2, upper case
}

// MaxNoteLen bounds an order's note.
const MaxNoteLen = 1000

// Patch changes an order's details. Only the fields marked Set change; a nil
// ShippingAddress or an empty Note clears it.
type Patch struct {
	SetShippingAddress bool     `json:"set_shipping_address"`
	ShippingAddress    *Address `json:"shipping_address"`
	SetNote            bool     `json:"set_note"`
	Note               string   `json:"note"`
}

// Validate checks the patch's values and reports every violation at once.
func (p Patch) Validate() error {
	var fe fieldErrors
	if !p.SetShippingAddress && !p.SetNote {
		fe.add("", "change at least one of shipping_address and note")
	}
	if a := p.ShippingAddress; p.SetShippingAddress && a != nil {
		for _, f := range []struct {
			name, value string
			min, max    int
		}{
			{"name", a.Name, 1, 200}, {"line1", a.Line1, 1, 200}, {"line2", a.Line2, 0, 200},
			{"city", a.City, 1, 100}, {"postal_code", a.PostalCode, 1, 20},
		} {
			if msg := checkText(f.value, f.min, f.max, singleLine); msg != "" {
				fe.add("shipping_address."+f.name, "%s", msg)
			}
		}
		if a.Name == "" || a.Line1 == "" || a.City == "" || a.PostalCode == "" || a.Country == "" {
			// RFC 7396 would merge a nested object; an address is only
			// meaningful whole, so a PATCH replaces it whole.
			fe.add("shipping_address", "is replaced whole, not merged field by field: send name, line1, city, postal_code and country (line2 optional), or null to clear it")
		}
		if !ValidCountry(a.Country) {
			fe.add("shipping_address.country", "must be an assigned ISO 3166-1 alpha-2 code in upper case, such as DE")
		}
	}
	if p.SetNote {
		if msg := checkText(p.Note, 0, MaxNoteLen, multiLine); msg != "" {
			fe.add("note", "%s", msg)
		}
	}
	return fe.err("the change is invalid")
}

// Update applies p to a pending or paid order whose version is
// expectedVersion. It returns a KindPreconditionFailed error when the order
// has another version, a KindConflict error when it is shipped or cancelled,
// and a nil event when p changes nothing.
func (o *Order) Update(p Patch, expectedVersion int64, now time.Time) (Event, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	if o.Version != expectedVersion {
		return nil, &Error{
			Kind:    KindPreconditionFailed,
			Message: fmt.Sprintf("the order is at version %d, not %d: read it again and reapply the change", o.Version, expectedVersion),
			State:   string(o.Status),
		}
	}
	if o.Status != StatusPending && o.Status != StatusPaid {
		return nil, o.refuse("change")
	}
	changed := false
	if p.SetShippingAddress && !sameAddress(o.ShippingAddress, p.ShippingAddress) {
		o.ShippingAddress, changed = p.ShippingAddress, true
	}
	if p.SetNote && o.Note != p.Note {
		o.Note, changed = p.Note, true
	}
	if !changed {
		return nil, nil
	}
	o.touch(now)
	return OrderUpdated{ShippingAddress: o.ShippingAddress, Note: o.Note, At: now}, nil
}

func sameAddress(a, b *Address) bool {
	return a == b || a != nil && b != nil && *a == *b
}
