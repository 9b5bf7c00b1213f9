package domain

import (
	"fmt"
	"strconv"
	"time"

	"github.com/google/uuid"
)

// DefaultPaymentMethod is the payment method of a pay request that names
// none: the provider's test card that succeeds.
const DefaultPaymentMethod = "pm_card_visa"

// MaxPaymentMethodLen bounds what follows "pm_" in a payment method.
const MaxPaymentMethodLen = 64

// ValidatePaymentMethod checks a payment method: "pm_" followed by 1 to
// MaxPaymentMethodLen of [A-Za-z0-9_]. It returns a KindInvalid *Error
// naming the field payment_method.
func ValidatePaymentMethod(m string) error {
	var fe fieldErrors
	rest, ok := cutPrefix(m, "pm_")
	valid := ok && len(rest) >= 1 && len(rest) <= MaxPaymentMethodLen
	for i := 0; valid && i < len(rest); i++ {
		c := rest[i]
		valid = c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_'
	}
	if !valid {
		fe.add("payment_method", "must be pm_ followed by 1 to %d letters, digits or underscores, such as %s", MaxPaymentMethodLen, DefaultPaymentMethod)
	}
	return fe.err("the payment is invalid")
}

func cutPrefix(s, prefix string) (string, bool) {
	if len(s) < len(prefix) || s[:len(prefix)] != prefix {
		return s, false
	}
	return s[len(prefix):], true
}

// ChargeKey is the provider idempotency key of charge attempt attempt of an
// order: "<tenant>:order:<order id>:charge:<attempt>". It is derived, never
// random, so every retry of the same attempt, after any crash, sends it again.
func ChargeKey(tenantID string, orderID uuid.UUID, attempt int) string {
	return tenantID + ":order:" + orderID.String() + ":charge:" + strconv.Itoa(attempt)
}

// RefundKey is the provider idempotency key of refund attempt attempt of an
// order: "<tenant>:order:<order id>:refund:<attempt>".
func RefundKey(tenantID string, orderID uuid.UUID, attempt int) string {
	return tenantID + ":order:" + orderID.String() + ":refund:" + strconv.Itoa(attempt)
}

// Payment is the state of an order's payment: its latest charge attempt.
// Attempt counts from 1 with every payment request; 0 means never asked.
// Its JSON form (every field omitted when empty: the zero value is {}) is
// what orders and order_views store; the projection writes the same form.
type Payment struct {
	Attempt int    `json:"attempt,omitempty"`
	Key     string `json:"key,omitempty"`    // the derived provider key of Attempt
	Method  string `json:"method,omitempty"` // the payment method of Attempt
	// ChargeID is the provider's id of the succeeded charge ("pi_…").
	ChargeID string `json:"charge_id,omitempty"`
	// DeclineCode and FailureReason explain the decline of Attempt.
	DeclineCode   string     `json:"decline_code,omitempty"`
	FailureReason string     `json:"failure_reason,omitempty"`
	RequestedAt   *time.Time `json:"requested_at,omitempty"`
	FailedAt      *time.Time `json:"failed_at,omitempty"`
}

// RefundStatus is where an order's refund stands: RefundNone until a paid
// order is cancelled.
type RefundStatus string

// The refund statuses.
const (
	RefundNone      RefundStatus = ""
	RefundPending   RefundStatus = "pending"
	RefundSucceeded RefundStatus = "succeeded"
	RefundFailed    RefundStatus = "failed"
)

// Refund is the state of an order's refund.
type Refund struct {
	Status        RefundStatus `json:"status,omitempty"`
	Attempt       int          `json:"attempt,omitempty"`
	Key           string       `json:"key,omitempty"`
	ID            string       `json:"id,omitempty"` // the provider's refund id ("re_…")
	FailureReason string       `json:"failure_reason,omitempty"`
	RequestedAt   *time.Time   `json:"requested_at,omitempty"`
	SettledAt     *time.Time   `json:"settled_at,omitempty"` // when it succeeded or failed
}

// ChargeOutcome is what the payment provider answered to a charge: a
// succeeded charge (with its id), or a decline (a business outcome, not an
// error) with the provider's code and reason.
type ChargeOutcome struct {
	ChargeID    string `json:"charge_id"`
	Amount      int64  `json:"amount"`
	Currency    string `json:"currency"`
	Succeeded   bool   `json:"succeeded"`
	DeclineCode string `json:"decline_code"`
	Reason      string `json:"reason"`
}

// RefundOutcome is what the payment provider answered to a refund.
type RefundOutcome struct {
	RefundID  string `json:"refund_id"`
	Amount    int64  `json:"amount"`
	Currency  string `json:"currency"`
	Succeeded bool   `json:"succeeded"`
	Reason    string `json:"reason"`
}

// Pay asks for a payment of a pending order, or a new attempt after a
// declined one, with payment method method (see ValidatePaymentMethod): the
// order becomes payment_pending with attempt+1 and its derived ChargeKey,
// and PaymentRequested carries the intent to the payment worker. Paying an
// order whose payment is under way or done (payment_pending, paid) changes
// nothing and returns a nil event; paying a shipped or cancelled order is a
// KindConflict error. Paying a pending or payment_failed order whose total
// is not Chargeable is a KindInvalid error wrapping ErrAmountNotChargeable,
// and changes nothing.
func (o *Order) Pay(method string, now time.Time) (Event, error) {
	if err := ValidatePaymentMethod(method); err != nil {
		return nil, err
	}
	switch o.Status {
	case StatusPaymentPending, StatusPaid:
		return nil, nil
	case StatusPending, StatusPaymentFailed:
		if !Chargeable(o.Currency, o.Total) {
			return nil, &Error{
				Kind:    KindInvalid,
				Message: fmt.Sprintf("order %s totals %d %s: %s", o.ID, o.Total, o.Currency, ChargeableRule(o.Currency)),
				State:   string(o.Status),
				Err:     ErrAmountNotChargeable,
			}
		}
		attempt := o.Payment.Attempt + 1
		o.Payment = Payment{Attempt: attempt, Key: ChargeKey(o.TenantID, o.ID, attempt), Method: method, RequestedAt: &now}
		return PaymentRequested{
			Transition: o.transition(StatusPaymentPending, now),
			Attempt:    attempt, PaymentKey: o.Payment.Key, Amount: o.Total, PaymentMethod: method,
		}, nil
	}
	return nil, o.refuse("pay")
}

// Chargeable reports whether amount (minor units of currency) can be one
// provider charge: 1 to MaxChargeAmount in the provider's units of the
// currency (see ChargeUnits).
func Chargeable(currency string, amount int64) bool {
	_, ok := ChargeUnits(currency, amount)
	return ok
}

// ChargeableRule says, for a refusal, which amounts of currency one charge
// can be (see ChargeUnits).
func ChargeableRule(currency string) string {
	rule := fmt.Sprintf("a payment must be 1 to %d minor units, the most one provider charge can be", MaxChargeAmount)
	switch scale := chargeScale[currency]; {
	case scale > 0:
		rule = fmt.Sprintf("a payment must be 1 to %d minor units (the provider counts %s in 1/%d of them, at most %d), the most one provider charge can be",
			MaxChargeAmount/scale, currency, scale, MaxChargeAmount)
	case scale < 0:
		rule = fmt.Sprintf("a payment must be a multiple of %d minor units (the provider counts %s in whole units), up to %d of those", -scale, currency, MaxChargeAmount)
	}
	if tenths[currency] {
		rule += fmt.Sprintf(", and a multiple of 10 minor units in %s", currency)
	}
	return rule
}

// AwaitsCharge returns nil if o awaits the charge that req asks for: it is
// payment_pending on req's attempt, with req's method, and req's amount and
// currency are its total's. Any other intent is a KindConflict *Error: no
// command of ours asked for it (only a message published straight to the
// stream does, or a copy of an intent whose outcome is recorded), and the
// provider must not be asked for it, since RecordCharge would not record
// what it made: a charge our orders do not show (G8).
func (o *Order) AwaitsCharge(req PaymentRequested) error {
	if o.Status == StatusPaymentPending && req.Attempt == o.Payment.Attempt && req.PaymentMethod == o.Payment.Method &&
		req.Amount == o.Total && req.Currency == o.Currency {
		return nil
	}
	return &Error{
		Kind: KindConflict,
		Message: fmt.Sprintf("order %s does not await charge attempt %d of %d %s by %q: it is %s on attempt %d of %d %s by %q",
			o.ID, req.Attempt, req.Amount, req.Currency, req.PaymentMethod, o.Status, o.Payment.Attempt, o.Total, o.Currency, o.Payment.Method),
		State: string(o.Status),
	}
}

// AwaitsRefund returns nil if o awaits the refund that req asks for: it is
// cancelled with refund attempt req.Attempt pending, of the charge that
// paid it, for its total. Any other intent is a KindConflict *Error, as
// for AwaitsCharge: the provider must not refund what our orders would not
// show refunded (or another order's charge).
func (o *Order) AwaitsRefund(req RefundRequested) error {
	if o.Status == StatusCancelled && o.Refund.Status == RefundPending && req.Attempt == o.Refund.Attempt &&
		req.ChargeID == o.Payment.ChargeID && req.Amount == o.Total && req.Currency == o.Currency {
		return nil
	}
	return &Error{
		Kind: KindConflict,
		Message: fmt.Sprintf("order %s does not await refund attempt %d of charge %q for %d %s: it is %s, refund %q on attempt %d of charge %q for %d %s",
			o.ID, req.Attempt, req.ChargeID, req.Amount, req.Currency, o.Status, o.Refund.Status, o.Refund.Attempt, o.Payment.ChargeID, o.Total, o.Currency),
		State: string(o.Status),
	}
}

// RecordCharge records the provider's outcome of charge attempt attempt: a
// succeeded charge makes the order paid (OrderPaid), a decline makes it
// payment_failed (OrderPaymentFailed). A stale outcome (the order is not
// payment_pending, or attempt is not its current attempt) changes nothing
// and returns a nil event. A succeeded charge of another amount or currency
// than the order's, or without a charge id, is a KindConflict error: it is
// never recorded as paying the order.
func (o *Order) RecordCharge(attempt int, c ChargeOutcome, now time.Time) (Event, error) {
	if o.Status != StatusPaymentPending || attempt != o.Payment.Attempt {
		return nil, nil
	}
	if !c.Succeeded {
		o.Payment.DeclineCode, o.Payment.FailureReason, o.Payment.FailedAt = c.DeclineCode, c.Reason, &now
		return OrderPaymentFailed{
			Transition: o.transition(StatusPaymentFailed, now),
			Attempt:    attempt, DeclineCode: c.DeclineCode, Reason: c.Reason,
		}, nil
	}
	if c.ChargeID == "" || c.Amount != o.Total || c.Currency != o.Currency {
		return nil, &Error{
			Kind: KindConflict,
			Message: fmt.Sprintf("charge %q of %d %s does not pay order %s of %d %s",
				c.ChargeID, c.Amount, c.Currency, o.ID, o.Total, o.Currency),
			State: string(o.Status),
		}
	}
	o.Payment.ChargeID, o.PaidAt = c.ChargeID, &now
	return OrderPaid{
		Transition: o.transition(StatusPaid, now),
		Attempt:    attempt, ChargeID: c.ChargeID, Amount: c.Amount, PaidAt: now,
	}, nil
}

// RecordRefund records the provider's outcome of refund attempt attempt:
// OrderRefunded or OrderRefundFailed. A stale outcome (no refund pending,
// or another attempt) changes nothing and returns a nil event. A succeeded
// refund of another amount or currency than the order's, or without a
// refund id, is a KindConflict error.
func (o *Order) RecordRefund(attempt int, r RefundOutcome, now time.Time) (Event, error) {
	if o.Refund.Status != RefundPending || attempt != o.Refund.Attempt {
		return nil, nil
	}
	if !r.Succeeded {
		o.Refund.Status, o.Refund.FailureReason, o.Refund.SettledAt = RefundFailed, r.Reason, &now
		o.touch(now)
		return OrderRefundFailed{CustomerID: o.CustomerID, Attempt: attempt, Reason: r.Reason, At: now}, nil
	}
	if r.RefundID == "" || r.Amount != o.Total || r.Currency != o.Currency {
		return nil, &Error{
			Kind: KindConflict,
			Message: fmt.Sprintf("refund %q of %d %s does not refund order %s of %d %s",
				r.RefundID, r.Amount, r.Currency, o.ID, o.Total, o.Currency),
			State: string(o.Status),
		}
	}
	o.Refund.Status, o.Refund.ID, o.Refund.SettledAt = RefundSucceeded, r.RefundID, &now
	o.touch(now)
	return OrderRefunded{
		CustomerID: o.CustomerID, Attempt: attempt, RefundID: r.RefundID,
		Amount: r.Amount, Currency: r.Currency, RefundedAt: now,
	}, nil
}

// RetryRefund asks for the refund of a cancelled order again after its
// refund failed: refund attempt+1 of the full total, with its derived
// RefundKey (RefundRequested, as at the cancellation). An order whose
// refund is pending or succeeded changes nothing and returns a nil event
// (under way or done); any other order is a KindConflict error: one not
// cancelled (cancel a paid order to refund it), or cancelled without ever
// being paid (nothing to refund).
func (o *Order) RetryRefund(now time.Time) (Event, error) {
	if o.Status != StatusCancelled {
		return nil, &Error{
			Kind:    KindConflict,
			Message: fmt.Sprintf("cannot refund an order that is %s: only a cancelled order is refunded (cancelling a paid order refunds it)", o.Status),
			State:   string(o.Status),
		}
	}
	switch {
	case o.Refund.Status == RefundPending, o.Refund.Status == RefundSucceeded:
		return nil, nil
	case o.Refund.Status == RefundFailed:
		return o.requestRefund(now), nil
	case o.PaidAt != nil:
		// Paid and cancelled before refunds went through the provider:
		// refunded at the cancellation, nothing left to do.
		return nil, nil
	}
	return nil, &Error{
		Kind:    KindConflict,
		Message: "cannot refund this cancelled order: it was never paid, so there is nothing to refund",
		State:   string(o.Status),
	}
}

// requestRefund starts the next refund attempt (1 at the cancellation of a
// paid order; one more at each RetryRefund).
func (o *Order) requestRefund(now time.Time) RefundRequested {
	attempt := o.Refund.Attempt + 1
	o.Refund = Refund{Status: RefundPending, Attempt: attempt, Key: RefundKey(o.TenantID, o.ID, attempt), RequestedAt: &now}
	o.touch(now)
	return RefundRequested{
		CustomerID: o.CustomerID, Attempt: attempt, RefundKey: o.Refund.Key,
		ChargeID: o.Payment.ChargeID, Amount: o.Total, Currency: o.Currency, At: now,
	}
}
