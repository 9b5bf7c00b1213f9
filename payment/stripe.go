package payment

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/stripe/stripe-go/v84"

	"github.com/acme/orders/domain"
)

// Defaults of Config.
const (
	// DefaultBaseURL is Stripe's API.
	DefaultBaseURL = "https://api.stripe.com"
	// DefaultTimeout bounds one HTTP attempt (when Config.HTTPClient is nil).
	// An answer lost by the provider surfaces after this long and is then
	// retried with the same key.
	DefaultTimeout = 10 * time.Second
	// DefaultMaxNetworkRetries is how often stripe-go itself retries one call
	// after a connection error or timeout, with the same Idempotency-Key
	// (backoff 0.5 s, 1 s, … capped at 5 s). Stripe's own error answers
	// (4xx, 5xx with an error body) are never retried by stripe-go: they come
	// back as ErrTransient or ErrPermanent for the caller's backoff.
	DefaultMaxNetworkRetries = 2
	// MetadataIdempotencyKey is the metadata entry in which Charge stores
	// the idempotency key, so FindCharge can search for it.
	MetadataIdempotencyKey = "idempotency_key"
)

// maxIdleConnsPerHost is the idle connections the default client keeps to
// the provider: more than a worker's concurrent calls.
const maxIdleConnsPerHost = 512

// Config configures a Stripe adapter.
type Config struct {
	// BaseURL is the API's base URL, without /v1 (DefaultBaseURL when empty),
	// e.g. http://127.0.0.1:12111 for cmd/fakepsp.
	BaseURL string
	// SecretKey is the API key, sk_test_… or sk_live_…. Required.
	SecretKey string
	// HTTPClient makes the requests; when nil, a client with Timeout.
	HTTPClient *http.Client
	// Timeout bounds one attempt when HTTPClient is nil (DefaultTimeout when 0).
	Timeout time.Duration
	// MaxNetworkRetries is how often stripe-go retries a call that got no
	// answer, always with the same key (DefaultMaxNetworkRetries when 0; -1
	// for none).
	MaxNetworkRetries int
	// Logger receives stripe-go's warnings and errors (discarded when nil).
	Logger *slog.Logger
}

// Stripe charges and refunds through Stripe's API (PaymentIntents created
// and confirmed in one call, Refunds) with the official client. It is safe
// for concurrent use.
type Stripe struct {
	client *stripe.Client
}

// NewStripe returns an adapter for cfg. It returns an error naming the field
// when cfg is invalid.
func NewStripe(cfg Config) (*Stripe, error) {
	if cfg.SecretKey == "" {
		return nil, errors.New("payment: Config.SecretKey is required")
	}
	if cfg.BaseURL == "" {
		cfg.BaseURL = DefaultBaseURL
	}
	if !strings.HasPrefix(cfg.BaseURL, "http://") && !strings.HasPrefix(cfg.BaseURL, "https://") {
		return nil, fmt.Errorf("payment: Config.BaseURL must be an http(s) URL, got %q", cfg.BaseURL)
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Timeout < 0 {
		return nil, fmt.Errorf("payment: Config.Timeout must not be negative, got %s", cfg.Timeout)
	}
	switch {
	case cfg.MaxNetworkRetries == 0:
		cfg.MaxNetworkRetries = DefaultMaxNetworkRetries
	case cfg.MaxNetworkRetries == -1:
		cfg.MaxNetworkRetries = 0
	case cfg.MaxNetworkRetries < -1 || cfg.MaxNetworkRetries > 10:
		return nil, fmt.Errorf("payment: Config.MaxNetworkRetries must be -1 to 10, got %d", cfg.MaxNetworkRetries)
	}
	if cfg.HTTPClient == nil {
		// Keep a connection per concurrent call: the default transport
		// keeps 2 per host and would open (and close) one per call beyond.
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConnsPerHost = maxIdleConnsPerHost
		cfg.HTTPClient = &http.Client{Timeout: cfg.Timeout, Transport: t}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	backend := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL:               stripe.String(strings.TrimSuffix(cfg.BaseURL, "/")),
		HTTPClient:        cfg.HTTPClient,
		MaxNetworkRetries: stripe.Int64(int64(cfg.MaxNetworkRetries)),
		LeveledLogger:     stripeLogger{cfg.Logger},
		EnableTelemetry:   stripe.Bool(false),
	})
	client := stripe.NewClient(cfg.SecretKey, stripe.WithBackends(&stripe.Backends{
		API: backend, Connect: backend, Uploads: backend, MeterEvents: backend,
	}))
	return &Stripe{client: client}, nil
}

// Charge creates and confirms a PaymentIntent for r with r.IdempotencyKey
// (also stored in its metadata as MetadataIdempotencyKey). A declined card
// is a Charge with Status ChargeDeclined, not an error, and so is a payment
// method the provider refuses (400 on payment_method: unknown, unusable;
// the Charge then has no ID). Errors wrap
// ErrTransient or ErrPermanent. Calling it again with the same request is
// safe: the provider replays its first answer.
func (s *Stripe) Charge(ctx context.Context, r ChargeRequest) (Charge, error) {
	if err := validKey(r.IdempotencyKey); err != nil {
		return Charge{}, err
	}
	if r.Amount <= 0 || len(r.Currency) != 3 || r.PaymentMethod == "" {
		return Charge{}, fmt.Errorf("%w: charge needs a positive amount, a 3-letter currency and a payment method (got %d %q %q)",
			ErrPermanent, r.Amount, r.Currency, r.PaymentMethod)
	}
	units, ok := domain.ChargeUnits(strings.ToUpper(r.Currency), r.Amount)
	if !ok {
		return Charge{}, fmt.Errorf("%w: %d %s cannot be charged: %s", ErrPermanent, r.Amount, r.Currency, domain.ChargeableRule(strings.ToUpper(r.Currency)))
	}
	params := &stripe.PaymentIntentCreateParams{
		Amount:             stripe.Int64(units),
		Currency:           stripe.String(strings.ToLower(r.Currency)),
		PaymentMethod:      stripe.String(r.PaymentMethod),
		PaymentMethodTypes: []*string{stripe.String("card")},
		Confirm:            stripe.Bool(true),
	}
	params.IdempotencyKey = stripe.String(r.IdempotencyKey)
	for k, v := range r.Metadata {
		params.AddMetadata(k, v)
	}
	params.AddMetadata(MetadataIdempotencyKey, r.IdempotencyKey)
	pi, err := s.client.V1PaymentIntents.Create(ctx, params)
	if err != nil {
		var se *stripe.Error
		if errors.As(err, &se) && se.Type == stripe.ErrorTypeCard && se.PaymentIntent != nil {
			return chargeOf(se.PaymentIntent, se) // declined: an outcome
		}
		if errors.As(err, &se) && se.HTTPStatusCode == http.StatusBadRequest &&
			se.Type == stripe.ErrorTypeInvalidRequest && se.Param == "payment_method" && customerMethodCodes[se.Code] {
			// An unknown or unusable payment method: only the customer can
			// fix it (another method, in a new attempt). An outcome too;
			// dead-lettering it would leave the order payment_pending for
			// good. If the provider made an intent anyway, it says which.
			if se.PaymentIntent != nil {
				return chargeOf(se.PaymentIntent, se)
			}
			return Charge{Amount: r.Amount, Currency: r.Currency, Status: ChargeDeclined,
				DeclineCode: string(se.Code), DeclineReason: se.Msg}, nil
		}
		if errors.As(err, &se) && se.HTTPStatusCode == http.StatusBadRequest &&
			se.Type == stripe.ErrorTypeInvalidRequest && se.Param == "amount" && amountCodes[se.Code] {
			// An amount the provider will not charge in this currency (under
			// its minimum, say, which depends on the account's settlement
			// currency): no retry changes it, and the order's total is
			// fixed. A decline the order can leave (cancel), where a dead
			// letter would keep it payment_pending for good.
			return Charge{Amount: r.Amount, Currency: r.Currency, Status: ChargeDeclined,
				DeclineCode: string(se.Code), DeclineReason: se.Msg}, nil
		}
		if errors.As(err, &se) && se.HTTPStatusCode == http.StatusBadRequest &&
			se.Type == stripe.ErrorTypeInvalidRequest && se.Param == "currency" && se.Code == "" {
			// A currency the provider does not take, or not for this
			// account (Stripe's "Invalid currency", without a code; a
			// malformed one has a code, and is a bug of ours): the order's
			// currency is fixed, so no retry and no other method changes
			// it. A decline the order can leave (cancel), where a dead
			// letter would keep it payment_pending for good.
			return Charge{Amount: r.Amount, Currency: r.Currency, Status: ChargeDeclined,
				DeclineCode: CurrencyNotSupported, DeclineReason: se.Msg}, nil
		}
		return Charge{}, classify("create payment intent", err)
	}
	return s.outcome(ctx, pi)
}

// outcome maps the PaymentIntent pi (as created, replayed or found) to a
// Charge. One left waiting for the customer (requires_action: 3D Secure;
// requires_confirmation) is no charge yet, but could become one if the
// customer authenticated it later, after its decline let them pay again
// with a new attempt: two charges. So it is cancelled first, and declined
// only once cancelled. If it moved on meanwhile (authenticated, say), the
// Charge is what it became.
func (s *Stripe) outcome(ctx context.Context, pi *stripe.PaymentIntent) (Charge, error) {
	if !waitsForCustomer(pi.Status) {
		return chargeOf(pi, nil)
	}
	declined, err := chargeOf(pi, nil) // its decline code says what it waited for
	if err != nil {
		return Charge{}, err
	}
	live, err := s.client.V1PaymentIntents.Cancel(ctx, pi.ID, &stripe.PaymentIntentCancelParams{
		CancellationReason: stripe.String(string(stripe.PaymentIntentCancellationReasonAbandoned)),
	})
	var se *stripe.Error
	if errors.As(err, &se) && se.Code == stripe.ErrorCodePaymentIntentUnexpectedState {
		// Not cancellable: cancelled before (an answer lost, a replayed
		// create), or charged meanwhile. Its live state says which.
		live, err = s.client.V1PaymentIntents.Retrieve(ctx, pi.ID, nil)
		if err != nil {
			return Charge{}, classify("retrieve payment intent "+pi.ID, err)
		}
	} else if err != nil {
		return Charge{}, classify("cancel payment intent "+pi.ID, err)
	}
	switch {
	case live.Status == stripe.PaymentIntentStatusCanceled:
		return declined, nil
	case waitsForCustomer(live.Status):
		return Charge{}, fmt.Errorf("%w: payment intent %s is still %q after its cancel", ErrTransient, pi.ID, live.Status)
	default:
		return chargeOf(live, nil)
	}
}

// waitsForCustomer says a PaymentIntent waits for the customer to act: it
// has not charged, and could still.
func waitsForCustomer(status stripe.PaymentIntentStatus) bool {
	return status == stripe.PaymentIntentStatusRequiresAction || status == stripe.PaymentIntentStatusRequiresConfirmation
}

// CurrencyNotSupported is the decline code of a charge whose currency the
// provider does not take.
const CurrencyNotSupported = "currency_not_supported"

// amountCodes are the error codes of a refused amount: declines.
var amountCodes = map[stripe.ErrorCode]bool{
	stripe.ErrorCodeAmountTooSmall:                true,
	stripe.ErrorCodeAmountTooLarge:                true,
	stripe.ErrorCodeInvalidChargeAmount:           true,
	"invalid_charge_amount_no_decimal_compatible": true,
}

// Refund refunds r.Amount of charge r.ChargeID with r.IdempotencyKey. A
// refund the provider marks failed is a Refund with Status RefundFailed,
// not an error. Errors wrap ErrTransient or ErrPermanent (e.g. more than
// the charge has left). Calling it again with the same request is safe.
func (s *Stripe) Refund(ctx context.Context, r RefundRequest) (Refund, error) {
	if err := validKey(r.IdempotencyKey); err != nil {
		return Refund{}, err
	}
	if r.Amount <= 0 || r.ChargeID == "" {
		return Refund{}, fmt.Errorf("%w: refund needs a charge id and a positive amount (got %q %d)", ErrPermanent, r.ChargeID, r.Amount)
	}
	units, ok := domain.ChargeUnits(strings.ToUpper(r.Currency), r.Amount)
	if !ok {
		return Refund{}, fmt.Errorf("%w: %d %s cannot be refunded: %s", ErrPermanent, r.Amount, r.Currency, domain.ChargeableRule(strings.ToUpper(r.Currency)))
	}
	params := &stripe.RefundCreateParams{
		PaymentIntent: stripe.String(r.ChargeID),
		Amount:        stripe.Int64(units),
	}
	params.IdempotencyKey = stripe.String(r.IdempotencyKey)
	params.AddMetadata(MetadataIdempotencyKey, r.IdempotencyKey)
	re, err := s.client.V1Refunds.Create(ctx, params)
	if err != nil {
		return Refund{}, classify("create refund", err)
	}
	return refundOf(re, r.ChargeID)
}

// FindRefund looks up the refund of charge chargeID made with
// idempotencyKey (through the metadata Refund stores: it lists the
// refunds of the PaymentIntent), for reconciliation after the provider
// forgot the key: found is false when there is none. A refund not settled
// yet is an ErrTransient error, like Refund's; errors wrap ErrTransient or
// ErrPermanent.
func (s *Stripe) FindRefund(ctx context.Context, chargeID, idempotencyKey string) (Refund, bool, error) {
	if err := validKey(idempotencyKey); err != nil {
		return Refund{}, false, err
	}
	if chargeID == "" {
		return Refund{}, false, fmt.Errorf("%w: find refund needs a charge id", ErrPermanent)
	}
	params := &stripe.RefundListParams{PaymentIntent: stripe.String(chargeID)}
	params.Limit = stripe.Int64(100)
	var (
		best  *stripe.Refund
		found bool
	)
	for re, err := range s.client.V1Refunds.List(ctx, params) {
		if err != nil {
			return Refund{}, false, classify("list refunds", err)
		}
		if re.Metadata[MetadataIdempotencyKey] != idempotencyKey {
			continue
		}
		// One key makes one refund within 24 h; if it was reused after
		// that, a succeeded one is what matters.
		if !found || re.Status == stripe.RefundStatusSucceeded && best.Status != stripe.RefundStatusSucceeded {
			best, found = re, true
		}
	}
	if !found {
		return Refund{}, false, nil
	}
	out, err := refundOf(best, chargeID)
	return out, err == nil, err
}

// refundOf maps a Refund of charge chargeID; one not settled yet is an
// ErrTransient error.
func refundOf(re *stripe.Refund, chargeID string) (Refund, error) {
	if re.ID == "" {
		// No Refund at all (see chargeOf): the provider may have refunded.
		return Refund{}, fmt.Errorf("%w: the provider's answer holds no refund (status %q)", ErrTransient, re.Status)
	}
	out := Refund{ID: re.ID, ChargeID: chargeID, Currency: strings.ToUpper(string(re.Currency)),
		Status: RefundSucceeded, FailureReason: string(re.FailureReason)}
	var err error
	if out.Amount, err = minorUnits(out.Currency, re.Amount); err != nil {
		return Refund{}, fmt.Errorf("refund %s: %w", re.ID, err)
	}
	if re.PaymentIntent != nil && re.PaymentIntent.ID != "" {
		out.ChargeID = re.PaymentIntent.ID
	}
	switch re.Status {
	case stripe.RefundStatusSucceeded:
	case stripe.RefundStatusFailed, stripe.RefundStatusCanceled:
		out.Status = RefundFailed
		if out.FailureReason == "" {
			out.FailureReason = string(re.Status)
		}
	default: // pending, requires_action: not settled yet
		return Refund{}, fmt.Errorf("%w: refund %s is %s, not settled yet", ErrTransient, re.ID, re.Status)
	}
	return out, nil
}

// FindCharge looks up the charge made with idempotencyKey (through the
// metadata Charge stores), for reconciliation: found is false when there
// is none. On Stripe itself, search lags writes by up to a minute; the
// local provider sees every committed charge at once. Errors wrap
// ErrTransient or ErrPermanent.
func (s *Stripe) FindCharge(ctx context.Context, idempotencyKey string) (Charge, bool, error) {
	if err := validKey(idempotencyKey); err != nil {
		return Charge{}, false, err
	}
	params := &stripe.PaymentIntentSearchParams{}
	params.Query = "metadata['" + MetadataIdempotencyKey + "']:'" + idempotencyKey + "'"
	params.Limit = stripe.Int64(10)
	params.Single = true
	var (
		best  Charge
		found bool
	)
	for pi, err := range s.client.V1PaymentIntents.Search(ctx, params) {
		if err != nil {
			return Charge{}, false, classify("search payment intents", err)
		}
		switch key, ok := pi.Metadata[MetadataIdempotencyKey]; {
		case pi.ID == "":
			// No PaymentIntent at all: chargeOf says so.
		case !ok:
			// The search matched on it, so an answer without it is
			// mangled: it may be ours, and only asking again tells.
			return Charge{}, false, fmt.Errorf("%w: payment intent %s found by key has no key in its metadata", ErrTransient, pi.ID)
		case key != idempotencyKey:
			// Not made with this key, whatever the search matched on:
			// taking it (or cancelling it) would settle another intent.
			continue
		}
		c, err := s.outcome(ctx, pi)
		if err != nil {
			return Charge{}, false, err
		}
		// One key makes one PaymentIntent within 24 h; if it was reused
		// after that, a succeeded one is what matters.
		if !found || c.Status == ChargeSucceeded && best.Status != ChargeSucceeded {
			best, found = c, true
		}
	}
	return best, found, nil
}

// minorUnits converts an amount of currency as the provider counts it to
// minor units (see domain.ChargeUnits). One that is no whole number of them
// is an ErrPermanent error: never taken for a neighbouring amount.
func minorUnits(currency string, units int64) (int64, error) {
	amount, ok := domain.FromChargeUnits(currency, units)
	if !ok {
		return 0, fmt.Errorf("%w: the provider's amount %d %s is no whole number of minor units", ErrPermanent, units, currency)
	}
	return amount, nil
}

// chargeOf maps a PaymentIntent (and the card error that declined it),
// its amount in minor units. One still processing is an ErrTransient
// error: no outcome yet.
func chargeOf(pi *stripe.PaymentIntent, declined *stripe.Error) (Charge, error) {
	if pi.ID == "" {
		// No PaymentIntent at all: a 200 whose body is not one (a proxy's
		// page, a body cut or mangled on the way). The provider may have
		// charged; only asking again with the key tells.
		return Charge{}, fmt.Errorf("%w: the provider's answer holds no payment intent (status %q)", ErrTransient, pi.Status)
	}
	c := Charge{ID: pi.ID, Currency: strings.ToUpper(string(pi.Currency)), Status: ChargeSucceeded}
	var err error
	if c.Amount, err = minorUnits(c.Currency, pi.Amount); err != nil {
		return Charge{}, fmt.Errorf("payment intent %s: %w", pi.ID, err)
	}
	switch pi.Status {
	case stripe.PaymentIntentStatusSucceeded:
		return c, nil
	case stripe.PaymentIntentStatusProcessing:
		// Not settled yet: it may still succeed, so it is no decline (a
		// decline lets the customer pay again, and both could succeed).
		// Looked up again by key later (FindCharge reads its live state).
		return Charge{}, fmt.Errorf("%w: payment intent %s is still processing", ErrTransient, pi.ID)
	case stripe.PaymentIntentStatusRequiresPaymentMethod, stripe.PaymentIntentStatusCanceled,
		stripe.PaymentIntentStatusRequiresAction, stripe.PaymentIntentStatusRequiresConfirmation:
		// Not charged: a decline (the customer may pay again). One waiting
		// for the customer is cancelled before it is taken as one (outcome).
	default:
		if declined == nil {
			// requires_capture (money held: we never ask for it), or a
			// status we do not know: no decline, which would let the
			// customer pay again while this one may still charge.
			return Charge{}, fmt.Errorf("%w: payment intent %s is %q, neither charged nor declined", ErrTransient, pi.ID, pi.Status)
		}
	}
	c.Status = ChargeDeclined
	e := declined
	if e == nil {
		e = pi.LastPaymentError
	}
	if e != nil {
		c.DeclineCode, c.DeclineReason = string(e.DeclineCode), e.Msg
		if c.DeclineCode == "" {
			c.DeclineCode = string(e.Code)
		}
	}
	if c.DeclineCode == "" {
		c.DeclineCode = string(pi.Status)
	}
	return c, nil
}

// customerMethodCodes are the error codes of a refused payment_method the
// customer causes (a method that does not exist, or cannot be used now):
// a decline. Any other refusal of it (parameter_missing, _invalid,
// _unknown) is a bug of ours, permanent, dead-lettered for an operator.
var customerMethodCodes = map[stripe.ErrorCode]bool{
	stripe.ErrorCodeResourceMissing:              true,
	stripe.ErrorCodePaymentMethodUnactivated:     true,
	stripe.ErrorCodePaymentMethodUnexpectedState: true,
	stripe.ErrorCodePaymentMethodNotAvailable:    true,
	stripe.ErrorCodePaymentMethodProviderDecline: true,
	stripe.ErrorCodePaymentMethodCustomerDecline: true,
}

// classify wraps err in ErrTransient or ErrPermanent.
func classify(op string, err error) error {
	var se *stripe.Error
	if !errors.As(err, &se) {
		// No answer from the provider (after stripe-go's own retries), or one
		// we could not parse: the call may have happened; retry with the key.
		return fmt.Errorf("%w: %s: %w", ErrTransient, op, err)
	}
	switch code := se.HTTPStatusCode; {
	case code >= 500 && se.LastResponse != nil && se.LastResponse.Header.Get("Idempotent-Replayed") == "true":
		return fmt.Errorf("%w: %w: %s: %d %s %s: %s", ErrTransient, ErrKeySpent, op, code, se.Type, se.Code, se.Msg)
	case code == http.StatusConflict, code == http.StatusTooManyRequests, code >= 500:
		return fmt.Errorf("%w: %s: %d %s %s: %s", ErrTransient, op, code, se.Type, se.Code, se.Msg)
	default:
		return fmt.Errorf("%w: %s: %d %s %s: %s", ErrPermanent, op, code, se.Type, se.Code, se.Msg)
	}
}

func validKey(key string) error {
	if key == "" || len(key) > 255 || strings.ContainsAny(key, `'\`) {
		return fmt.Errorf("%w: idempotency key must be 1 to 255 characters without ' or \\, got %q", ErrPermanent, key)
	}
	return nil
}

// stripeLogger passes stripe-go's log lines to slog; its info and debug
// lines (one per request) are dropped.
type stripeLogger struct{ l *slog.Logger }

func (s stripeLogger) Debugf(string, ...any) {}
func (s stripeLogger) Infof(string, ...any)  {}
func (s stripeLogger) Warnf(format string, v ...any) {
	s.l.Warn("stripe: " + fmt.Sprintf(format, v...))
}
func (s stripeLogger) Errorf(format string, v ...any) {
	s.l.Error("stripe: " + fmt.Sprintf(format, v...))
}
