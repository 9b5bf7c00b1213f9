package projection

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/acme/orders/stream"
)

// Lag is how far a projection is behind the stream, and what is stuck.
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
	// AppliedLastMinute counts inbox rows written in the last minute, by
	// every worker.
	AppliedLastMinute int64
	// Checkpoint is the highest stream sequence applied.
	Checkpoint int64
	// DeadLetters: open (blocking their order) and parked behind them.
	DeadOpen, DeadParked int64
}

const lagSQL = `
SELECT
    (SELECT count(*) FROM inbox WHERE projection = $1 AND applied_at > now() - interval '1 minute'),
    coalesce((SELECT stream_seq FROM projection_checkpoints WHERE projection = $1), 0),
    (SELECT count(*) FROM dead_letters WHERE projection = $1 AND status = 'open'),
    (SELECT count(*) FROM dead_letters WHERE projection = $1 AND status = 'parked')`

// Lag reads the projection's lag from its consumer and the database.
func (r *Runner) Lag(ctx context.Context) (Lag, error) {
	l := Lag{Projection: r.proj.Name()}
	if err := r.db.QueryRow(ctx, lagSQL, l.Projection).Scan(&l.AppliedLastMinute, &l.Checkpoint, &l.DeadOpen, &l.DeadParked); err != nil {
		return l, fmt.Errorf("read lag of %s: %w", l.Projection, err)
	}
	cons, err := r.js.Consumer(ctx, stream.Name, l.Projection)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		return l, nil // never started
	}
	if err != nil {
		return l, err
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return l, err
	}
	l.Pending, l.AckPending = info.NumPending, uint64(info.NumAckPending)
	if l.Pending+l.AckPending > 0 {
		s, err := r.js.Stream(ctx, stream.Name)
		if err != nil {
			return l, err
		}
		if m, err := s.GetMsg(ctx, info.AckFloor.Stream+1); err == nil {
			l.OldestUnapplied = time.Since(m.Time)
		}
	}
	return l, nil
}
