package fakepsp

import (
	"crypto/rand"
	"encoding/json"
	"net/http"
	"time"
)

// paymentIntent is the Stripe-shaped JSON of a PaymentIntent (the fields
// stripe-go reads and the adapter uses).
type paymentIntent struct {
	ID                 string            `json:"id"`
	Object             string            `json:"object"`
	Amount             int64             `json:"amount"`
	AmountReceived     int64             `json:"amount_received"`
	CaptureMethod      string            `json:"capture_method"`
	ConfirmationMethod string            `json:"confirmation_method"`
	Created            int64             `json:"created"`
	Currency           string            `json:"currency"`
	LastPaymentError   *stripeError      `json:"last_payment_error"`
	LatestCharge       *string           `json:"latest_charge"`
	Livemode           bool              `json:"livemode"`
	Metadata           map[string]string `json:"metadata"`
	PaymentMethod      *string           `json:"payment_method"`
	PaymentMethodTypes []string          `json:"payment_method_types"`
	Status             string            `json:"status"`
}

// refund is the Stripe-shaped JSON of a Refund.
type refund struct {
	ID            string            `json:"id"`
	Object        string            `json:"object"`
	Amount        int64             `json:"amount"`
	Charge        string            `json:"charge"`
	Created       int64             `json:"created"`
	Currency      string            `json:"currency"`
	FailureReason string            `json:"failure_reason,omitempty"`
	Metadata      map[string]string `json:"metadata"`
	PaymentIntent string            `json:"payment_intent"`
	Status        string            `json:"status"`
}

// searchResult is Stripe's envelope of a search answer.
type searchResult struct {
	Object   string           `json:"object"`
	Data     []*paymentIntent `json:"data"`
	HasMore  bool             `json:"has_more"`
	NextPage *string          `json:"next_page"`
	URL      string           `json:"url"`
}

// refundList is Stripe's envelope of a list of Refunds.
type refundList struct {
	Object  string    `json:"object"`
	Data    []*refund `json:"data"`
	HasMore bool      `json:"has_more"`
	URL     string    `json:"url"`
}

// stripeError is the body of Stripe's {"error": {...}} and of a
// PaymentIntent's last_payment_error.
type stripeError struct {
	Type          string         `json:"type"`
	Code          string         `json:"code,omitempty"`
	DeclineCode   string         `json:"decline_code,omitempty"`
	Message       string         `json:"message"`
	Param         string         `json:"param,omitempty"`
	Charge        string         `json:"charge,omitempty"`
	DocURL        string         `json:"doc_url,omitempty"`
	PaymentIntent *paymentIntent `json:"payment_intent,omitempty"`
}

// Stripe's error types.
const (
	errTypeAPI            = "api_error"
	errTypeCard           = "card_error"
	errTypeIdempotency    = "idempotency_error"
	errTypeInvalidRequest = "invalid_request_error"
)

// response is what one API call answers: stored under its idempotency key
// when the endpoint executed, so a retry replays it byte for byte.
type response struct {
	status int
	body   []byte
}

func jsonResponse(status int, v any) response {
	b, err := json.Marshal(v)
	if err != nil { // only plain structs are marshalled: cannot happen
		panic("fakepsp: marshal response: " + err.Error())
	}
	return response{status: status, body: append(b, '\n')}
}

func errorResponse(status int, e stripeError) response {
	return jsonResponse(status, struct {
		Error stripeError `json:"error"`
	}{e})
}

func invalidRequest(status int, code, param, message string) response {
	return errorResponse(status, stripeError{Type: errTypeInvalidRequest, Code: code, Param: param, Message: message})
}

// write sends r with the headers Stripe sends on every answer.
func (r response) write(w http.ResponseWriter, requestID string) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Request-Id", requestID)
	h.Set("Cache-Control", "no-cache, no-store")
	w.WriteHeader(r.status)
	_, _ = w.Write(r.body) // the client went away: nothing to do
}

const idAlphabet = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

// newID returns prefix + "_" + 24 random base62 characters, like Stripe's ids.
func newID(prefix string) string {
	b := make([]byte, 24)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	for i := range b {
		b[i] = idAlphabet[int(b[i])%len(idAlphabet)]
	}
	return prefix + "_" + string(b)
}

func unix(t time.Time) int64 { return t.Unix() }
