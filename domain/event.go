package domain

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
)

// Event is a fact about an aggregate, in the past tense. Its JSON form is the
// "data" of an Envelope; consumers ignore fields they do not know. Every
// number in an event is a count or an amount of money, never negative, and
// every time is one a JSON document can hold in any time zone (see
// Envelope.Decode, which refuses the rest).
type Event interface {
	// EventType is the envelope's "type", such as "order.created".
	EventType() string
}

// Event types.
const (
	TypeOrderCreated   = "order.created"
	TypeOrderPaid      = "order.paid"
	TypeOrderShipped   = "order.shipped"
	TypeOrderCancelled = "order.cancelled"
	TypeOrderUpdated   = "order.updated"

	TypePaymentRequested   = "payment.requested"
	TypeOrderPaymentFailed = "order.payment_failed"
	TypeRefundRequested    = "refund.requested"
	TypeOrderRefunded      = "order.refunded"
	TypeOrderRefundFailed  = "order.refund_failed"
)

// SchemaVersion is the version of the envelope and event data written today.
const SchemaVersion = 1

// OrderCreated records that an order was placed.
type OrderCreated struct {
	CustomerID string    `json:"customer_id"`
	Status     Status    `json:"status"`
	Currency   string    `json:"currency"`
	Items      []Item    `json:"items"`
	Total      int64     `json:"total"`
	CreatedAt  time.Time `json:"created_at"`
}

// EventType implements Event.
func (OrderCreated) EventType() string { return TypeOrderCreated }

// Transition is what every status change records: the order's customer,
// currency and total (so that consumers need no other source to keep
// per-customer or per-day figures), and the status before and after.
type Transition struct {
	CustomerID string    `json:"customer_id"`
	Currency   string    `json:"currency"`
	Total      int64     `json:"total"`
	From       Status    `json:"from_status"`
	Status     Status    `json:"status"`
	At         time.Time `json:"at"`
}

// OrderPaid records that the provider confirmed the charge of a
// payment_pending order (its total, in its currency). Events written before
// payments went through the provider have no attempt, charge_id, amount or
// paid_at, and moved a pending order (from_status "pending").
type OrderPaid struct {
	Transition
	Attempt  int       `json:"attempt,omitempty"`
	ChargeID string    `json:"charge_id,omitempty"`
	Amount   int64     `json:"amount,omitempty"`
	PaidAt   time.Time `json:"paid_at,omitzero"`
}

// PaymentRequested records the intent to charge an order: attempt Attempt,
// to be charged with PaymentKey as the provider's idempotency key (derived,
// see ChargeKey), Amount in the Transition's currency, with PaymentMethod.
// The order is payment_pending until the outcome is recorded.
type PaymentRequested struct {
	Transition
	Attempt       int    `json:"attempt"`
	PaymentKey    string `json:"payment_key"`
	Amount        int64  `json:"amount"`
	PaymentMethod string `json:"payment_method"`
}

// EventType implements Event.
func (PaymentRequested) EventType() string { return TypePaymentRequested }

// OrderPaymentFailed records that the provider declined charge attempt
// Attempt; the order is payment_failed and may be paid again.
type OrderPaymentFailed struct {
	Transition
	Attempt     int    `json:"attempt"`
	DeclineCode string `json:"decline_code"`
	Reason      string `json:"reason"`
}

// EventType implements Event.
func (OrderPaymentFailed) EventType() string { return TypeOrderPaymentFailed }

// RefundRequested records the intent to refund a cancelled paid order in
// full: charge ChargeID, Amount in Currency, with RefundKey (see RefundKey)
// as the provider's idempotency key. It follows the order.cancelled event in
// the same transaction, one version later; the status does not change.
type RefundRequested struct {
	CustomerID string    `json:"customer_id"`
	Attempt    int       `json:"attempt"`
	RefundKey  string    `json:"refund_key"`
	ChargeID   string    `json:"charge_id"`
	Amount     int64     `json:"amount"`
	Currency   string    `json:"currency"`
	At         time.Time `json:"at"`
}

// EventType implements Event.
func (RefundRequested) EventType() string { return TypeRefundRequested }

// OrderRefunded records that the provider confirmed a refund: the money
// counts as refunded from this event on, never from the cancellation.
type OrderRefunded struct {
	CustomerID string    `json:"customer_id"`
	Attempt    int       `json:"attempt"`
	RefundID   string    `json:"refund_id"`
	Amount     int64     `json:"amount"`
	Currency   string    `json:"currency"`
	RefundedAt time.Time `json:"refunded_at"`
}

// EventType implements Event.
func (OrderRefunded) EventType() string { return TypeOrderRefunded }

// OrderRefundFailed records that the provider refused a refund.
type OrderRefundFailed struct {
	CustomerID string    `json:"customer_id"`
	Attempt    int       `json:"attempt"`
	Reason     string    `json:"reason"`
	At         time.Time `json:"at"`
}

// EventType implements Event.
func (OrderRefundFailed) EventType() string { return TypeOrderRefundFailed }

// EventType implements Event.
func (OrderPaid) EventType() string { return TypeOrderPaid }

// OrderShipped records that a paid order was shipped.
type OrderShipped struct {
	Transition
}

// EventType implements Event.
func (OrderShipped) EventType() string { return TypeOrderShipped }

// OrderCancelled records that an order was cancelled. Refunded is 0 since
// payments go through the provider: a paid order's refund is requested by the
// RefundRequested event that follows it and counts only once OrderRefunded
// confirms it. Events written before that, and the cancellation of an order
// paid before then (it has no charge to refund), carry the refunded total of
// a paid order here (and no refund.requested follows them).
type OrderCancelled struct {
	Transition
	Reason   string `json:"reason"`
	Refunded int64  `json:"refunded"`
}

// EventType implements Event.
func (OrderCancelled) EventType() string { return TypeOrderCancelled }

// OrderUpdated records new details of an order: the shipping address and
// note as they are after the change.
type OrderUpdated struct {
	ShippingAddress *Address  `json:"shipping_address"`
	Note            string    `json:"note"`
	At              time.Time `json:"at"`
}

// EventType implements Event.
func (OrderUpdated) EventType() string { return TypeOrderUpdated }

// Envelope carries one event with what every consumer needs to route,
// deduplicate and order it: its id (also the broker's message id), the tenant,
// and the aggregate it belongs to with the aggregate's version after the event.
type Envelope struct {
	ID               uuid.UUID       `json:"id"`
	Type             string          `json:"type"`
	SchemaVersion    int             `json:"schema_version"`
	TenantID         string          `json:"tenant_id"`
	AggregateID      uuid.UUID       `json:"aggregate_id"`
	AggregateVersion int64           `json:"aggregate_version"`
	OccurredAt       time.Time       `json:"occurred_at"`
	Data             json.RawMessage `json:"data"`
}

// NewEnvelope wraps e, raised by order o (at o's current version), as event id.
func NewEnvelope(id uuid.UUID, o Order, e Event, occurredAt time.Time) (Envelope, error) {
	return NewEnvelopeAt(id, o, o.Version, e, occurredAt)
}

// NewEnvelopeAt wraps e, raised by order o at version, as event id: for a
// step that raised several events, each one version after the other.
func NewEnvelopeAt(id uuid.UUID, o Order, version int64, e Event, occurredAt time.Time) (Envelope, error) {
	data, err := json.Marshal(e)
	if err != nil {
		return Envelope{}, fmt.Errorf("encode %s: %w", e.EventType(), err)
	}
	return Envelope{
		ID:               id,
		Type:             e.EventType(),
		SchemaVersion:    SchemaVersion,
		TenantID:         o.TenantID,
		AggregateID:      o.ID,
		AggregateVersion: version,
		OccurredAt:       occurredAt,
		Data:             data,
	}, nil
}

// AppendJSON appends e's JSON encoding to b: json.Marshal's, without its
// reflection, and with Data appended as it is, where json.Marshal would
// compact it again and escape HTML in it (Data from NewEnvelopeAt is
// json.Marshal's already, so the bytes are the same; a decoded envelope's
// is valid JSON, and the database normalises jsonb). The command side
// sends it as the outbox row's payload: pgx would run json.Marshal on
// every event written.
// Given a Data that is nil or valid JSON, it fails where json.Marshal
// fails: on an OccurredAt outside years 0–9999, or an empty (not nil)
// Data.
func (e Envelope) AppendJSON(b []byte) ([]byte, error) {
	b = append(b, `{"id":"`...)
	b = append(b, e.ID.String()...)
	b = append(b, `","type":`...)
	b = appendJSONString(b, e.Type)
	b = append(b, `,"schema_version":`...)
	b = strconv.AppendInt(b, int64(e.SchemaVersion), 10)
	b = append(b, `,"tenant_id":`...)
	b = appendJSONString(b, e.TenantID)
	b = append(b, `,"aggregate_id":"`...)
	b = append(b, e.AggregateID.String()...)
	b = append(b, `","aggregate_version":`...)
	b = strconv.AppendInt(b, e.AggregateVersion, 10)
	b = append(b, `,"occurred_at":`...)
	at, err := e.OccurredAt.MarshalJSON()
	if err != nil {
		return nil, fmt.Errorf("encode %s event %s: %w", e.Type, e.ID, err)
	}
	b = append(b, at...)
	b = append(b, `,"data":`...)
	switch {
	case e.Data == nil:
		b = append(b, `null`...)
	case len(e.Data) == 0:
		return nil, fmt.Errorf("encode %s event %s: empty data", e.Type, e.ID)
	default:
		b = append(b, e.Data...)
	}
	return append(b, '}'), nil
}

// appendJSONString appends s as a JSON string, escaped as json.Marshal
// escapes it: printable ASCII other than ", \, <, > and & as it is, the
// rest by json.Marshal itself.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s) // a string always encodes
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// ErrMalformedEvent is returned by DecodeEnvelope and Envelope.Decode when a
// message is not a well-formed event. Such a message can never be applied, so
// consumers drop it (and keep it for inspection) instead of retrying it.
var ErrMalformedEvent = errors.New("malformed event")

// DecodeEnvelope parses and checks an envelope. It returns an error wrapping
// ErrMalformedEvent if b is not JSON or lacks a required field.
func DecodeEnvelope(b []byte) (Envelope, error) {
	var env Envelope
	if err := json.Unmarshal(b, &env); err != nil {
		return Envelope{}, fmt.Errorf("%w: %v", ErrMalformedEvent, err)
	}
	// The tenant names the order in every table (the inbox, positions, dead
	// letters): 1 to 64 characters, no control characters (PostgreSQL
	// refuses a NUL, so a dead letter naming one could never be written).
	// Everything else an event could hold that no command writes is
	// refused once its order is known (CheckValues), so that its dead
	// letter names the order and holds back its later events.
	const maxTenant = 64
	badTenant := checkText(env.TenantID, 1, maxTenant, singleLine)
	switch {
	case env.ID == uuid.Nil:
		return env, fmt.Errorf("%w: no id", ErrMalformedEvent)
	case env.Type == "":
		return env, fmt.Errorf("%w: no type", ErrMalformedEvent)
	case env.TenantID == "":
		return env, fmt.Errorf("%w: no tenant_id", ErrMalformedEvent)
	case badTenant != "":
		return env, fmt.Errorf("%w: tenant_id %s", ErrMalformedEvent, badTenant)
	case env.AggregateID == uuid.Nil:
		return env, fmt.Errorf("%w: no aggregate_id", ErrMalformedEvent)
	case env.AggregateVersion < 1:
		return env, fmt.Errorf("%w: aggregate_version %d < 1", ErrMalformedEvent, env.AggregateVersion)
	case len(env.Data) == 0 || bytes.Equal(env.Data, []byte("null")):
		return env, fmt.Errorf("%w: no data", ErrMalformedEvent)
	}
	return env, nil
}

// CheckValues returns an error wrapping ErrMalformedEvent if the envelope
// holds what no event of ours holds: a schema_version newer than this
// build's (it cannot know what that one means: consumers are upgraded
// before the api, and after the upgrade its dead letter can be retried), or
// an occurred_at outside what JSON can hold (a read model keeping it could
// never be shown), or an order's first version that is not its
// order.created (or an order.created at another). Decode checks it; a consumer that uses an event without
// decoding its data checks it itself.
func (e Envelope) CheckValues() error {
	switch {
	case e.SchemaVersion > SchemaVersion:
		return fmt.Errorf("%w: %s event of schema_version %d, newer than this build's %d", ErrMalformedEvent, e.Type, e.SchemaVersion, SchemaVersion)
	case !representable(e.OccurredAt):
		return fmt.Errorf("%w: %s event's occurred_at %s", ErrMalformedEvent, e.Type, outOfRange)
	case (e.Type == TypeOrderCreated) != (e.AggregateVersion == 1):
		// An order begins with order.created, at version 1, and with
		// nothing else: another event at version 1 would count an order
		// nobody created in the aggregates (its paid amount, a status
		// count below zero that made the customer's summary unreadable).
		return fmt.Errorf("%w: %s event at aggregate_version %d: an order's version 1, and only it, is %s", ErrMalformedEvent, e.Type, e.AggregateVersion, TypeOrderCreated)
	}
	return nil
}

// Decode unmarshals the envelope's data into v. It returns an error wrapping
// ErrMalformedEvent if the envelope's values are not ours (CheckValues), if
// the data does not fit v, or if it holds a value no event of ours holds: a
// negative number, or a time outside what JSON can hold.
func (e Envelope) Decode(v any) error {
	if err := e.CheckValues(); err != nil {
		return err
	}
	if err := json.Unmarshal(e.Data, v); err != nil {
		return fmt.Errorf("%w: %s data: %v", ErrMalformedEvent, e.Type, err)
	}
	if err := checkValues(reflect.ValueOf(v)); err != nil {
		return fmt.Errorf("%w: %s data: %v", ErrMalformedEvent, e.Type, err)
	}
	return nil
}

// The times an event may hold: from the zero time (events of earlier
// versions leave some out) to the last day of year 9999, in UTC, so that
// the time is in years 0 to 9999, which JSON holds, in every time zone.
var (
	earliestTime = time.Time{}
	latestTime   = time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)
)

const outOfRange = "is outside 0001-01-01 to 9999-12-30 (UTC)"

func representable(t time.Time) bool { return !t.Before(earliestTime) && t.Before(latestTime) }

// checkValues walks v, decoded event data, and names the first field (its
// path, as in JSON) that holds a negative number or a time that is not
// representable. It allocates only to name one.
func checkValues(v reflect.Value) error {
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if !v.IsNil() {
			return checkValues(v.Elem())
		}
	case reflect.Struct:
		if t, ok := reflect.TypeAssert[time.Time](v); ok {
			if !representable(t) {
				return &badValue{what: outOfRange}
			}
			return nil
		}
		for i := range v.NumField() {
			f := v.Type().Field(i)
			if !f.IsExported() {
				continue
			}
			if err := checkValues(v.Field(i)); err != nil {
				if !f.Anonymous { // an embedded struct's fields are the event's own
					err.(*badValue).in(jsonName(f))
				}
				return err
			}
		}
	case reflect.Slice, reflect.Array:
		for i := range v.Len() {
			if err := checkValues(v.Index(i)); err != nil {
				err.(*badValue).in(fmt.Sprintf("[%d]", i))
				return err
			}
		}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		if v.Int() < 0 {
			return &badValue{what: fmt.Sprintf("is negative (%d)", v.Int())}
		}
	}
	return nil
}

// badValue is checkValues' error: what is wrong, and where (path, built
// from the field outwards).
type badValue struct{ path, what string }

func (e *badValue) Error() string { return e.path + " " + e.what }

// in puts the value inside step: a field name or an index.
func (e *badValue) in(step string) {
	switch {
	case e.path == "" || strings.HasPrefix(e.path, "["):
		e.path = step + e.path
	default:
		e.path = step + "." + e.path
	}
}

// jsonName is field f's name in JSON.
func jsonName(f reflect.StructField) string {
	if name, _, _ := strings.Cut(f.Tag.Get("json"), ","); name != "" {
		return name
	}
	return f.Name
}
