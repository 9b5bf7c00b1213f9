package projection

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/acme/orders/domain"
	"github.com/acme/orders/postgres"
	"github.com/acme/orders/stream"
)

// Config tunes a Runner. Zero values take the defaults.
type Config struct {
	// BatchSize is the most events applied in one transaction; default 100.
	BatchSize int
	// AckWait is how long JetStream waits for an ack before redelivering;
	// default 30s. A batch is far shorter than that.
	AckWait time.Duration
	// GapDelay is how long an event whose predecessor is missing waits
	// before it is delivered again; default 500ms.
	GapDelay time.Duration
}

func (c Config) withDefaults() Config {
	if c.BatchSize <= 0 {
		c.BatchSize = 100
	}
	if c.AckWait <= 0 {
		c.AckWait = 30 * time.Second
	}
	if c.GapDelay <= 0 {
		c.GapDelay = 500 * time.Millisecond
	}
	return c
}

// Runner feeds one projection from its durable consumer.
type Runner struct {
	db     *pgxpool.Pool
	js     jetstream.JetStream
	proj   Projection
	logger *slog.Logger
	cfg    Config

	stats [Malformed + 1]atomic.Int64 // per Outcome
}

// NewRunner returns a Runner applying the stream on js to proj in db.
func NewRunner(db *pgxpool.Pool, js jetstream.JetStream, proj Projection, logger *slog.Logger, cfg Config) *Runner {
	return &Runner{db: db, js: js, proj: proj, logger: logger.With("projection", proj.Name()), cfg: cfg.withDefaults()}
}

// Stats counts events by outcome since start.
type Stats struct {
	Applied, Duplicates, Stale, Gaps, Malformed int64
}

// Stats returns the runner's counters.
func (r *Runner) Stats() Stats {
	return Stats{
		Applied:    r.stats[Applied].Load(),
		Duplicates: r.stats[Duplicate].Load(),
		Stale:      r.stats[Stale].Load(),
		Gaps:       r.stats[Gap].Load(),
		Malformed:  r.stats[Malformed].Load(),
	}
}

// Consumer creates or updates the projection's durable consumer.
func (r *Runner) Consumer(ctx context.Context) (jetstream.Consumer, error) {
	if _, err := stream.Ensure(ctx, r.js, 1); err != nil {
		return nil, err
	}
	c, err := r.js.CreateOrUpdateConsumer(ctx, stream.Name, jetstream.ConsumerConfig{
		Durable:       r.proj.Name(),
		Description:   "projection " + r.proj.Name(),
		FilterSubject: stream.Subjects,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       r.cfg.AckWait,
		MaxAckPending: 10 * r.cfg.BatchSize,
	})
	if err != nil {
		return nil, fmt.Errorf("create or update consumer %s: %w", r.proj.Name(), err)
	}
	return c, nil
}

// Run consumes and applies events until ctx ends. It retries its set-up
// while NATS is unreachable. On shutdown it finishes the batch in hand (and
// acks it) and hands the buffered, unapplied messages back for redelivery.
func (r *Runner) Run(ctx context.Context) error {
	var cons jetstream.Consumer
	for {
		var err error
		if cons, err = r.Consumer(ctx); err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		r.logger.ErrorContext(ctx, "projector set-up failed; retrying", "err", err)
		sleep(ctx, 2*time.Second)
	}

	msgs := make(chan jetstream.Msg, r.cfg.BatchSize)
	cc, err := cons.Consume(func(m jetstream.Msg) {
		select {
		case msgs <- m:
		case <-ctx.Done():
			_ = m.Nak()
		}
	},
		jetstream.PullMaxMessages(r.cfg.BatchSize),
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			r.logger.WarnContext(ctx, "consume", "err", err)
		}))
	if err != nil {
		return fmt.Errorf("consume %s: %w", r.proj.Name(), err)
	}
	defer func() {
		cc.Stop()
		for {
			select {
			case m := <-msgs:
				_ = m.Nak()
			default:
				return
			}
		}
	}()

	for {
		batch := collect(ctx, msgs, r.cfg.BatchSize)
		if batch == nil {
			return nil
		}
		// The batch in hand is finished even if shutdown has begun.
		bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.AckWait)
		r.Process(bctx, batch)
		cancel()
	}
}

// collect blocks for one message, then takes whatever else is already
// buffered, up to max. It returns nil when ctx ends.
func collect(ctx context.Context, msgs <-chan jetstream.Msg, max int) []jetstream.Msg {
	var batch []jetstream.Msg
	select {
	case <-ctx.Done():
		return nil
	case m := <-msgs:
		batch = append(batch, m)
	}
	for len(batch) < max {
		select {
		case m := <-msgs:
			batch = append(batch, m)
		default:
			return batch
		}
	}
	return batch
}

// event is one delivered message on its way through a batch.
type event struct {
	msg     jetstream.Msg
	env     domain.Envelope
	seq     uint64
	outcome Outcome
	err     error
}

// Process applies msgs in one transaction and then settles each message:
// ack when applied, duplicate or stale; a delayed nak on a gap; term when
// malformed. If the batch transaction fails, each event is tried in a
// transaction of its own, so one bad event cannot hold up the others.
func (r *Runner) Process(ctx context.Context, msgs []jetstream.Msg) {
	events := decode(msgs)
	if err := r.commit(ctx, events); err != nil {
		r.logger.WarnContext(ctx, "batch failed; applying its events one by one", "events", len(events), "err", err)
		for _, e := range events {
			if e.outcome == Malformed {
				continue
			}
			if err := r.commit(ctx, []*event{e}); err != nil {
				e.err = err
			}
		}
	}
	r.settle(ctx, events)
}

func decode(msgs []jetstream.Msg) []*event {
	events := make([]*event, len(msgs))
	for i, m := range msgs {
		e := &event{msg: m}
		if meta, err := m.Metadata(); err == nil {
			e.seq = meta.Sequence.Stream
		}
		e.env, e.err = domain.DecodeEnvelope(m.Data())
		if e.err != nil {
			e.outcome = Malformed
		}
		events[i] = e
	}
	// Deterministic order: an aggregate's events in version order (so a batch
	// holding v1 and v2 applies both), and every transaction touching the
	// same rows locks them in the same order (so parallel workers cannot
	// deadlock).
	slices.SortStableFunc(events, func(a, b *event) int {
		if c := cmp.Compare(a.env.AggregateID.String(), b.env.AggregateID.String()); c != 0 {
			return c
		}
		return cmp.Compare(a.env.AggregateVersion, b.env.AggregateVersion)
	})
	return events
}

const (
	inboxInsertSQL = `
INSERT INTO inbox (projection, event_id, tenant_id, aggregate_id, aggregate_version, stream_seq)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (projection, event_id) DO NOTHING`

	inboxDeleteSQL = `DELETE FROM inbox WHERE projection = $1 AND event_id = $2`

	checkpointAdvanceSQL = `
INSERT INTO projection_checkpoints (projection, stream_seq, updated_at)
VALUES ($1, $2, now())
ON CONFLICT (projection) DO UPDATE
SET stream_seq = GREATEST(projection_checkpoints.stream_seq, EXCLUDED.stream_seq), updated_at = now()`
)

// commit applies the well-formed events in one transaction: for each, an
// inbox insert and, if the event is new, the projection's Apply. An event
// that turns out to be a gap or malformed has its inbox row removed again, so
// its redelivery (or a corrected copy) is not mistaken for a duplicate.
func (r *Runner) commit(ctx context.Context, events []*event) error {
	name := r.proj.Name()
	return postgres.InTx(ctx, r.db, func(tx pgx.Tx) error {
		var maxSeq uint64
		for _, e := range events {
			if e.err != nil && e.outcome == Malformed {
				continue
			}
			e.outcome, e.err = 0, nil // a retried transaction starts afresh
			env := e.env
			tag, err := tx.Exec(ctx, inboxInsertSQL, name, env.ID, env.TenantID, env.AggregateID, env.AggregateVersion, int64(e.seq))
			if err != nil {
				return fmt.Errorf("insert inbox row: %w", err)
			}
			if tag.RowsAffected() == 0 {
				e.outcome = Duplicate
				continue
			}
			e.outcome, err = r.proj.Apply(ctx, tx, env)
			switch {
			case errors.Is(err, domain.ErrMalformedEvent):
				e.outcome, e.err = Malformed, err
			case err != nil:
				return fmt.Errorf("event %s: %w", env.ID, err)
			}
			if e.outcome == Gap || e.outcome == Malformed {
				if _, err := tx.Exec(ctx, inboxDeleteSQL, name, env.ID); err != nil {
					return fmt.Errorf("delete inbox row: %w", err)
				}
				continue
			}
			maxSeq = max(maxSeq, e.seq)
		}
		if maxSeq > 0 {
			if _, err := tx.Exec(ctx, checkpointAdvanceSQL, name, int64(maxSeq)); err != nil {
				return fmt.Errorf("advance checkpoint: %w", err)
			}
		}
		return nil
	})
}

// settle acks, naks or terminates each message after the transaction.
func (r *Runner) settle(ctx context.Context, events []*event) {
	for _, e := range events {
		var err error
		switch {
		case e.outcome == Malformed:
			r.logger.ErrorContext(ctx, "malformed event terminated", "stream_seq", e.seq, "event_id", idOrNil(e.env.ID), "err", e.err)
			err = e.msg.Term()
		case e.err != nil:
			r.logger.ErrorContext(ctx, "event failed; will be redelivered", "event_id", e.env.ID, "err", e.err)
			err = e.msg.NakWithDelay(redeliveryDelay(e.msg))
		case e.outcome == Gap:
			err = e.msg.NakWithDelay(r.cfg.GapDelay)
		default:
			err = e.msg.Ack()
		}
		if err != nil {
			r.logger.WarnContext(ctx, "settle message", "event_id", e.env.ID, "outcome", e.outcome.String(), "err", err)
		}
		if e.outcome != 0 && e.err == nil || e.outcome == Malformed {
			r.stats[e.outcome].Add(1)
		}
	}
}

// redeliveryDelay backs off with the number of deliveries: 1s, 2s, 4s … 1m.
func redeliveryDelay(m jetstream.Msg) time.Duration {
	n := uint64(1)
	if meta, err := m.Metadata(); err == nil {
		n = meta.NumDelivered
	}
	return min(time.Second<<min(n-1, 6), time.Minute)
}

func idOrNil(id uuid.UUID) any {
	if id == uuid.Nil {
		return nil
	}
	return id
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
