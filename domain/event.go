package domain

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
)

// Event is a fact about an aggregate, in the past tense. Its JSON form is the
// "data" of an Envelope; consumers ignore fields they do not know.
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

// OrderPaid records that a pending order was paid in full.
type OrderPaid struct {
	Transition
}

// EventType implements Event.
func (OrderPaid) EventType() string { return TypeOrderPaid }

// OrderShipped records that a paid order was shipped.
type OrderShipped struct {
	Transition
}

// EventType implements Event.
func (OrderShipped) EventType() string { return TypeOrderShipped }

// OrderCancelled records that a pending or paid order was cancelled; a paid
// one was refunded in full (Refunded is its total, else 0).
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
		AggregateVersion: o.Version,
		OccurredAt:       occurredAt,
		Data:             data,
	}, nil
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
	switch {
	case env.ID == uuid.Nil:
		return env, fmt.Errorf("%w: no id", ErrMalformedEvent)
	case env.Type == "":
		return env, fmt.Errorf("%w: no type", ErrMalformedEvent)
	case env.TenantID == "":
		return env, fmt.Errorf("%w: no tenant_id", ErrMalformedEvent)
	case env.AggregateID == uuid.Nil:
		return env, fmt.Errorf("%w: no aggregate_id", ErrMalformedEvent)
	case env.AggregateVersion < 1:
		return env, fmt.Errorf("%w: aggregate_version %d < 1", ErrMalformedEvent, env.AggregateVersion)
	case len(env.Data) == 0 || bytes.Equal(env.Data, []byte("null")):
		return env, fmt.Errorf("%w: no data", ErrMalformedEvent)
	}
	return env, nil
}

// Decode unmarshals the envelope's data into v. It returns an error wrapping
// ErrMalformedEvent if the data does not fit v.
func (e Envelope) Decode(v any) error {
	if err := json.Unmarshal(e.Data, v); err != nil {
		return fmt.Errorf("%w: %s data: %v", ErrMalformedEvent, e.Type, err)
	}
	return nil
}
