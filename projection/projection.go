// Package projection keeps the read models: a Runner consumes the event
// stream for one Projection and applies each fetched batch in ONE transaction
// that also records every event in the inbox and advances the checkpoint,
// then acks. A redelivered event finds its inbox row and changes nothing.
package projection

import (
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/acme/orders/domain"
)

// Outcome is what applying one event did to a read model.
type Outcome int

// The outcomes.
const (
	// Applied: the event's effect is now in the read model (an event the
	// projection does not care about is "applied" as a no-op).
	Applied Outcome = iota + 1
	// Duplicate: the inbox already had the event; nothing was done.
	Duplicate
	// Stale: the projection is already at or past the event's aggregate
	// version; nothing was done.
	Stale
	// Gap: an earlier event of the aggregate has not been applied yet; the
	// event is retried later.
	Gap
	// Malformed: the event can never be applied; it is dead-lettered.
	Malformed
	// Parked: an earlier event of the aggregate is dead-lettered; this one
	// waits in dead_letters behind it until that is retried or discarded.
	Parked
	// DeadLettered: the event used up its deliveries; it is in dead_letters.
	DeadLettered

	outcomeCount
)

func (o Outcome) String() string {
	switch o {
	case Applied:
		return "applied"
	case Duplicate:
		return "duplicate"
	case Stale:
		return "stale"
	case Gap:
		return "gap"
	case Malformed:
		return "malformed"
	case Parked:
		return "parked"
	case DeadLettered:
		return "dead-lettered"
	}
	return "unknown"
}

// ErrPermanent marks a failure that no retry can fix (an aggregate sum out of
// range, say): the runner dead-letters such an event at once instead of
// redelivering it with backoff. Wrap it: fmt.Errorf("%w: ...", ErrPermanent).
var ErrPermanent = errors.New("permanent projection failure")

// Projection keeps one read model up to date.
type Projection interface {
	// Name identifies the projection: its durable consumer, inbox rows,
	// positions and checkpoint carry it. It must be a valid JetStream
	// consumer name.
	Name() string
	// Tables are the read-model tables the projection owns (and a rebuild
	// replaces).
	Tables() []string
	// Queue queues into b the statements that apply events to the read
	// model; the runner sends them in one round trip with its own
	// bookkeeping, in the batch's transaction. Each event is new (inbox)
	// and next in line for its aggregate (positions) in any transaction
	// that commits: the runner checks that before it sends them (the
	// careful way), or in the same pipeline, and then rolls back if not
	// (the pipelined way; its statements and their callbacks run even when
	// the batch is then rolled back). A statement's own check (a callback
	// returning an error) rolls the batch back either way, and the careful
	// way reports its error. Events come with an
	// aggregate's events in version order. Queue
	// must decode every event first, returning an error that wraps
	// domain.ErrMalformedEvent if one is unusable (nothing is sent then),
	// and must ignore event types it does not know.
	Queue(b *pgx.Batch, events []domain.Envelope) error
}
