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
	// Pending: events in the stream not yet delivered to any worker.
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
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		return l, nil // never started
	}
	if err != nil {
		return l, fmt.Errorf("read consumer %s: %w", l.Projection, err)
	}
	info := cons.CachedInfo() // fetched just now by Consumer
	l.Pending, l.AckPending = info.NumPending, uint64(info.NumAckPending)
	if l.Pending+l.AckPending > 0 {
		s, err := r.js.Stream(ctx, stream.Name)
		if err != nil {
			return l, fmt.Errorf("read stream %s: %w", stream.Name, err)
		}
		if m, err := s.GetMsg(ctx, info.AckFloor.Stream+1); err == nil {
			l.OldestUnapplied = time.Since(m.Time)
		}
	}
	return l, nil
}
