// Package payment talks to the payment provider: the provider-facing
// request and outcome types, the errors that say whether a retry can help,
// and Stripe, an adapter on the official client (stripe-go) that works
// against Stripe itself or the local stand-in cmd/fakepsp.
//
// Every call carries the caller's idempotency key, derived from the intent
// (never random), so a retry after any failure returns the provider's first
// answer instead of charging again.
package payment

import "errors"

// ErrTransient wraps failures a retry with the same idempotency key may
// cure: timeouts, connection errors and lost responses (after the adapter's
// own network retries), 5xx, 409 (the key's first request is still in
// flight) and 429.
var ErrTransient = errors.New("payment provider: transient failure")

// ErrPermanent wraps failures no retry cures: an invalid request, an
// unknown object, an idempotency key reused with other parameters
// (idempotency_error), a rejected API key. Dead-letter the intent.
var ErrPermanent = errors.New("payment provider: permanent failure")

// ErrKeySpent wraps (with ErrTransient) a 5xx the provider replayed for
// the key (Idempotent-Replayed: true): its first request failed once it
// began, and Stripe stores that 500 and answers it to every retry with the
// key until it expires (24 h), so retrying cannot settle the intent. The
// caller looks up what the key made instead; see settle's spentCharge.
var ErrKeySpent = errors.New("payment provider: the idempotency key replays a failure")

// ChargeRequest asks for one charge, created and confirmed in one call.
type ChargeRequest struct {
	// IdempotencyKey is derived from the intent:
	// <tenant_id>:order:<order_id>:charge:<attempt>. Required.
	IdempotencyKey string
	Amount         int64             // minor units, > 0
	Currency       string            // ISO 4217, upper case, e.g. "EUR"
	PaymentMethod  string            // e.g. "pm_card_visa"
	Metadata       map[string]string // tenant_id, order_id, attempt
}

// ChargeStatus is the outcome of a charge.
type ChargeStatus string

// Charge outcomes. A decline is an outcome, not an error.
const (
	ChargeSucceeded ChargeStatus = "succeeded"
	ChargeDeclined  ChargeStatus = "declined"
)

// Charge is the provider's record of a charge.
type Charge struct {
	ID            string // the provider's PaymentIntent id, "pi_…"
	Amount        int64
	Currency      string // upper case
	Status        ChargeStatus
	DeclineCode   string // when declined, e.g. "card_declined" or "insufficient_funds"
	DeclineReason string // when declined, the provider's message
}

// RefundRequest asks to refund (part of) a succeeded charge.
type RefundRequest struct {
	// IdempotencyKey is derived from the intent:
	// <tenant_id>:order:<order_id>:refund:<attempt>. Required.
	IdempotencyKey string
	ChargeID       string // "pi_…"
	Amount         int64  // minor units, > 0
	Currency       string // ISO 4217, the charge's (the provider's units of some differ: domain.ChargeUnits)
}

// RefundStatus is the outcome of a refund.
type RefundStatus string

// Refund outcomes. A failed refund is an outcome, not an error.
const (
	RefundSucceeded RefundStatus = "succeeded"
	RefundFailed    RefundStatus = "failed"
)

// Refund is the provider's record of a refund.
type Refund struct {
	ID            string // "re_…"
	ChargeID      string // "pi_…"
	Amount        int64
	Currency      string // upper case
	Status        RefundStatus
	FailureReason string // when failed
}
