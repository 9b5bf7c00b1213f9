package projection

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/acme/orders/stream"
)

// Lag is how far a projection is behind the stream, and what is stuck. Reading
// it is cheap whatever the table sizes: one primary-key lookup, two counts
// capped at DeadLetterCountCap on the partial index of unresolved dead
// letters, and a few JetStream API calls. It never reads the inbox.
type Lag struct {
	Projection string
	// Pending: events in the stream not yet delivered to any worker. With
	// the consumer missing, the events past the checkpoint (all of them if
	// the stream was created anew and holds fewer): what no one applies.
	Pending uint64
	// AckPending: delivered, not yet acked (being applied, or waiting for
	// a predecessor).
	AckPending uint64
	// OldestUnapplied is the age of the oldest event not yet acked (0 when
	// there is none).
	OldestUnapplied time.Duration
	// Checkpoint is the highest stream sequence applied.
	Checkpoint int64
	// DeadLetters: open (blocking their order) and parked behind them, each
	// counted up to DeadLetterCountCap.
	DeadOpen, DeadParked int64
	// DeletedUnapplied: events the stream deleted before the projection
	// applied them (see deletedUnapplied), lost to the read model until it
	// is rebuilt. 0 unless the stream has limits, and only while the
	// consumer is behind the deleted events.
	DeletedUnapplied uint64
	// ConsumerMissing: the projection's durable consumer (or the stream)
	// does not exist, so nothing is applying the stream: the projector has
	// never run, or the consumer was lost (deleted, or gone with NATS's
	// JetStream state) and no running projector has created it again yet
	// (one does within seconds). Pending and OldestUnapplied then count
	// from the checkpoint instead of from the consumer.
	ConsumerMissing bool
}

// DeadLetterCountCap is the most dead letters of one status Lag counts: a
// flood of parked events must not make every scrape read all of them. A
// count at the cap means "at least this many".
const DeadLetterCountCap = 10_000

// lagSQL reads a projection's checkpoint (primary key) and its unresolved
// dead letters (the partial index dead_letters_unresolved), counting each
// status only up to $2 rows.
const lagSQL = `
SELECT
    coalesce((SELECT stream_seq FROM projection_checkpoints WHERE projection = $1), 0),
    (SELECT count(*) FROM (SELECT 1 FROM dead_letters WHERE projection = $1 AND status = 'open' LIMIT $2) AS d),
    (SELECT count(*) FROM (SELECT 1 FROM dead_letters WHERE projection = $1 AND status = 'parked' LIMIT $2) AS d)`

// Lag reads the projection's lag from its consumer and the database.
func (r *Runner) Lag(ctx context.Context) (Lag, error) {
	l := Lag{Projection: r.proj.Name()}
	if err := r.db.QueryRow(ctx, lagSQL, l.Projection, DeadLetterCountCap).Scan(&l.Checkpoint, &l.DeadOpen, &l.DeadParked); err != nil {
		return l, fmt.Errorf("read lag of %s: %w", l.Projection, err)
	}
	cons, err := r.js.Consumer(ctx, stream.Name, l.Projection)
	if errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
		return r.lagWithoutConsumer(ctx, l)
	}
	if err != nil {
		return l, fmt.Errorf("read consumer %s: %w", l.Projection, err)
	}
	info := cons.CachedInfo() // fetched just now by Consumer
	l.Pending, l.AckPending = info.NumPending, uint64(info.NumAckPending)
	s, err := r.js.Stream(ctx, stream.Name)
	if err != nil {
		return l, fmt.Errorf("read stream %s: %w", stream.Name, err)
	}
	first := s.CachedInfo().State.FirstSeq
	if l.DeletedUnapplied = deletedUnapplied(first, info.AckFloor.Stream); l.DeletedUnapplied > 0 {
		r.reportDeleted(ctx, first, info.AckFloor.Stream)
	}
	if l.Pending+l.AckPending > 0 {
		if m, err := s.GetMsg(ctx, max(info.AckFloor.Stream+1, first)); err == nil {
			l.OldestUnapplied = max(0, time.Since(m.Time)) // NATS's clock, not ours
		}
	}
	return l, nil
}

// lagWithoutConsumer fills in l for a projection whose consumer (or the
// stream) is missing. It used to report no lag at all, so `projector
// status` and projection_pending_events showed nothing pending while no
// event was applied; it counts the stream's events past the checkpoint
// instead. (A checkpoint past the stream's last sequence means the stream
// was created anew, its sequences starting again: all of it is counted.)
func (r *Runner) lagWithoutConsumer(ctx context.Context, l Lag) (Lag, error) {
	l.ConsumerMissing = true
	s, err := r.js.Stream(ctx, stream.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return l, nil // nothing to apply, and nothing applying it
	}
	if err != nil {
		return l, fmt.Errorf("read stream %s: %w", stream.Name, err)
	}
	state := s.CachedInfo().State
	if state.Msgs == 0 {
		return l, nil
	}
	from := max(uint64(l.Checkpoint)+1, state.FirstSeq)
	if from > state.LastSeq+1 {
		from = state.FirstSeq
	}
	l.Pending = min(state.LastSeq+1-from, state.Msgs)
	if l.Pending > 0 {
		if m, err := s.GetMsg(ctx, from); err == nil {
			l.OldestUnapplied = max(0, time.Since(m.Time)) // NATS's clock, not ours
		}
	}
	return l, nil
}
