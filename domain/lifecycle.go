package domain

import (
	"fmt"
	"time"
)

// The lifecycle of an order:
//
//	pending ──pay──▶ payment_pending ──charged──▶ paid ──ship──▶ shipped
//	   │              ▲          │                  │
//	   │              └──pay── payment_failed ◀──declined
//	   │                         │                  │
//	   └──────cancel─────────────┴──────cancel──────┴──▶ cancelled (+ refund.requested if paid)
//
// Each event adds one to the version; a step raises one event, except the
// cancellation of a paid order, which raises order.cancelled and
// refund.requested (two versions). Asking for a step that already happened
// or is under way (paying a payment_pending or paid order, shipping a
// shipped one, cancelling a cancelled one) changes nothing and raises no
// event: the caller gets the order as it is. A step that can no longer happen
// is a KindConflict error that names the current status; so is cancelling a
// payment_pending order, whose charge may be in flight at the provider.

// StatusChange is one entry of an order's status history.
type StatusChange struct {
	Status Status
	At     time.Time
	Reason string // why it was cancelled, or why its payment was declined
}

// History lists the statuses the order went through, oldest first. It is
// derived from the order's timestamps, so the write and read sides agree.
// Of the payment attempts it shows the latest one's request (and decline).
func (o Order) History() []StatusChange {
	h := []StatusChange{{Status: StatusPending, At: o.CreatedAt}}
	if p := o.Payment; p.RequestedAt != nil {
		h = append(h, StatusChange{Status: StatusPaymentPending, At: *p.RequestedAt})
		// A decline is always of the latest attempt (Pay starts each
		// attempt with no decline), so it comes after its request, whatever
		// the two times say: they are two hosts' clocks (the api's and the
		// worker's), and a decline within milliseconds of its request
		// could read as older by a little skew.
		if p.FailedAt != nil {
			h = append(h, StatusChange{Status: StatusPaymentFailed, At: *p.FailedAt, Reason: p.FailureReason})
		}
	}
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

// Ship records the shipping of a paid order. It returns a nil event when the
// order was shipped before, and a KindConflict error when it is not paid;
// for a payment_pending order one with RetryAfter, as Cancel's: the payment
// settles by itself, so the refusal holds only for now (not stored under
// the request's key, whose retry then ships a paid order).
func (o *Order) Ship(now time.Time) (Event, error) {
	switch o.Status {
	case StatusShipped:
		return nil, nil
	case StatusPaymentPending:
		return nil, &Error{
			Kind:       KindConflict,
			Message:    "cannot ship an order that is payment_pending: its payment is in progress; retry after it settles",
			State:      string(o.Status),
			RetryAfter: PaymentSettleRetryAfter,
		}
	case StatusPaid:
		o.ShippedAt = &now
		return OrderShipped{o.transition(StatusShipped, now)}, nil
	}
	return nil, o.refuse("ship")
}

// MaxReasonLen bounds a cancellation reason.
const MaxReasonLen = 500

// PaymentSettleRetryAfter is how long a command refused because a payment is
// in progress tells its caller to wait (Retry-After): a charge settles in
// well under a second when the provider answers.
const PaymentSettleRetryAfter = time.Second

// Cancel cancels a pending, payment_failed or paid order for reason (1 to
// 500 characters) and returns its events: OrderCancelled, and for a paid
// order also RefundRequested (refund attempt 1 of the full total, with its
// derived RefundKey), one version later. An order paid before payments went
// through the provider (migration 009 left it no charge to refund) is
// refunded at the cancellation, as then: OrderCancelled carries its total
// as Refunded, and no RefundRequested follows. It returns no events when the
// order was cancelled before, a KindInvalid error for a bad reason, and a
// KindConflict error when it is shipped or payment_pending (a charge may be
// in flight: retry once the payment settled).
func (o *Order) Cancel(reason string, now time.Time) ([]Event, error) {
	if err := ValidateReason(reason); err != nil {
		return nil, err
	}
	switch o.Status {
	case StatusCancelled:
		return nil, nil
	case StatusPaymentPending:
		return nil, &Error{
			Kind:       KindConflict,
			Message:    "cannot cancel an order that is payment_pending: its payment is in progress; retry after it settles",
			State:      string(o.Status),
			RetryAfter: PaymentSettleRetryAfter,
		}
	case StatusPending, StatusPaymentFailed, StatusPaid:
		paid := o.Status == StatusPaid
		// No charge to refund: paid before the provider (RetryRefund reads
		// such an order, once cancelled, as refunded).
		local := paid && o.Payment.ChargeID == ""
		o.CancelledAt, o.CancelReason = &now, reason
		cancelled := OrderCancelled{Transition: o.transition(StatusCancelled, now), Reason: reason}
		if local {
			cancelled.Refunded = o.Total
		}
		evs := []Event{cancelled}
		if paid && !local {
			evs = append(evs, o.requestRefund(now))
		}
		return evs, nil
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

// CheckVersion refuses a change made on another version of the order than
// its current one (If-Match): a KindPreconditionFailed *Error.
func (o *Order) CheckVersion(expectedVersion int64) error {
	if o.Version == expectedVersion {
		return nil
	}
	return &Error{
		Kind:    KindPreconditionFailed,
		Message: fmt.Sprintf("the order is at version %d, not %d: read it again and reapply the change", o.Version, expectedVersion),
		State:   string(o.Status),
	}
}

// Update applies p to an order that is not yet shipped or cancelled whose version is
// expectedVersion. It returns a KindPreconditionFailed error when the order
// has another version, a KindConflict error when it is shipped or cancelled,
// and a nil event when p changes nothing.
func (o *Order) Update(p Patch, expectedVersion int64, now time.Time) (Event, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	if err := o.CheckVersion(expectedVersion); err != nil {
		return nil, err
	}
	if o.Status == StatusShipped || o.Status == StatusCancelled {
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
