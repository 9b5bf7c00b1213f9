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
	// before it is delivered again (doubling with each delivery); default
	// 500ms.
	GapDelay time.Duration
	// StreamReplicas is the stream's replication (3 on a cluster); default 1.
	StreamReplicas int
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
	if _, err := stream.Ensure(ctx, r.js, r.cfg.StreamReplicas); err != nil {
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
	msg         jetstream.Msg
	env         domain.Envelope
	seq         uint64
	undecodable bool // not an envelope at all
	outcome     Outcome
	err         error
}

// Process applies msgs in one transaction and then settles each message:
// ack when applied, duplicate or stale; a delayed nak on a gap; term when
// malformed. If the batch transaction fails, each event is tried in a
// transaction of its own, so one bad event cannot hold up the others.
func (r *Runner) Process(ctx context.Context, msgs []jetstream.Msg) {
	events := decodeMessages(msgs)
	if err := r.commit(ctx, events); err != nil {
		r.logger.WarnContext(ctx, "batch failed; applying its events one by one", "events", len(events), "err", err)
		for _, e := range events {
			if e.undecodable {
				continue
			}
			switch err := r.commit(ctx, []*event{e}); {
			case errors.Is(err, domain.ErrMalformedEvent):
				e.outcome, e.err = Malformed, err
			case err != nil:
				e.err = err
			}
		}
	}
	r.settle(ctx, events)
}

func decodeMessages(msgs []jetstream.Msg) []*event {
	events := make([]*event, len(msgs))
	for i, m := range msgs {
		e := &event{msg: m}
		if meta, err := m.Metadata(); err == nil {
			e.seq = meta.Sequence.Stream
		}
		e.env, e.err = domain.DecodeEnvelope(m.Data())
		if e.err != nil {
			e.outcome, e.undecodable = Malformed, true
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
	positionsLockSQL = `
SELECT aggregate_id, version FROM projection_positions
WHERE projection = $1 AND aggregate_id = ANY($2)
ORDER BY aggregate_id
FOR UPDATE`

	positionsAdvanceSQL = `
INSERT INTO projection_positions (projection, tenant_id, aggregate_id, version)
SELECT $1, tenant_id, aggregate_id, version FROM unnest($2::text[], $3::uuid[], $4::bigint[]) AS p(tenant_id, aggregate_id, version)
ORDER BY aggregate_id
ON CONFLICT (projection, aggregate_id) DO UPDATE
SET version = GREATEST(projection_positions.version, EXCLUDED.version)`

	inboxInsertSQL = `
INSERT INTO inbox (projection, event_id, tenant_id, aggregate_id, aggregate_version, stream_seq)
SELECT $1, event_id, tenant_id, aggregate_id, aggregate_version, stream_seq
FROM unnest($2::uuid[], $3::text[], $4::uuid[], $5::bigint[], $6::bigint[])
     AS i(event_id, tenant_id, aggregate_id, aggregate_version, stream_seq)
ON CONFLICT (projection, event_id) DO NOTHING
RETURNING event_id`

	checkpointAdvanceSQL = `
INSERT INTO projection_checkpoints (projection, stream_seq, updated_at)
VALUES ($1, $2, now())
ON CONFLICT (projection) DO UPDATE
SET stream_seq = GREATEST(projection_checkpoints.stream_seq, EXCLUDED.stream_seq), updated_at = now()`

	// Wakes readers waiting to read their own writes (query.Changes).
	notifyAppliedSQL = `SELECT pg_notify('projection_applied', $1)`
)

// commit applies the well-formed events in one transaction:
//
//  1. lock the projection's position of every aggregate in the batch and
//     sort each event: next in line (applied), already passed (stale), or
//     ahead of a missing predecessor (gap, left for redelivery);
//  2. record applied and stale events in the inbox; one already there is a
//     duplicate and is not applied again;
//  3. apply the new events, advance the positions and the checkpoint, and
//     notify waiting readers.
func (r *Runner) commit(ctx context.Context, events []*event) error {
	name := r.proj.Name()
	return postgres.InTx(ctx, r.db, func(tx pgx.Tx) error {
		var live []*event
		var aggregates []uuid.UUID
		for _, e := range events {
			if e.undecodable {
				continue
			}
			e.outcome, e.err = 0, nil // a retried transaction starts afresh
			live = append(live, e)
			if len(aggregates) == 0 || aggregates[len(aggregates)-1] != e.env.AggregateID {
				aggregates = append(aggregates, e.env.AggregateID)
			}
		}
		if len(live) == 0 {
			return nil
		}

		rows, _ := tx.Query(ctx, positionsLockSQL, name, aggregates)
		positions := make(map[uuid.UUID]int64, len(aggregates))
		var aggID uuid.UUID
		var version int64
		if _, err := pgx.ForEachRow(rows, []any{&aggID, &version}, func() error {
			positions[aggID] = version
			return nil
		}); err != nil {
			return fmt.Errorf("lock projection positions: %w", err)
		}
		var recorded []*event // applied or stale: they go into the inbox
		seen := make(map[uuid.UUID]bool, len(live))
		for _, e := range live { // in (aggregate, version) order
			if seen[e.env.ID] { // the same event twice in one batch
				e.outcome = Duplicate
				continue
			}
			seen[e.env.ID] = true
			pos := positions[e.env.AggregateID]
			switch v := e.env.AggregateVersion; {
			case v <= pos:
				e.outcome = Stale
			case v == pos+1:
				e.outcome = Applied
				positions[e.env.AggregateID] = v
			default:
				e.outcome = Gap
				continue
			}
			recorded = append(recorded, e)
		}
		if len(recorded) == 0 {
			return nil
		}

		n := len(recorded)
		ids, tenants, aggs := make([]uuid.UUID, n), make([]string, n), make([]uuid.UUID, n)
		versions, seqs := make([]int64, n), make([]int64, n)
		for i, e := range recorded {
			ids[i], tenants[i], aggs[i] = e.env.ID, e.env.TenantID, e.env.AggregateID
			versions[i], seqs[i] = e.env.AggregateVersion, int64(e.seq)
		}
		rows, _ = tx.Query(ctx, inboxInsertSQL, name, ids, tenants, aggs, versions, seqs)
		inserted, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
		if err != nil {
			return fmt.Errorf("insert inbox rows: %w", err)
		}
		isNew := make(map[uuid.UUID]bool, len(inserted))
		for _, id := range inserted {
			isNew[id] = true
		}

		var apply []domain.Envelope
		var maxSeq uint64
		tenants, aggs, versions = tenants[:0], aggs[:0], versions[:0]
		for _, e := range recorded {
			maxSeq = max(maxSeq, e.seq)
			if !isNew[e.env.ID] {
				e.outcome = Duplicate
				continue
			}
			if e.outcome == Applied {
				apply = append(apply, e.env)
				tenants, aggs, versions = append(tenants, e.env.TenantID), append(aggs, e.env.AggregateID), append(versions, e.env.AggregateVersion)
			}
		}
		if len(apply) > 0 {
			if err := r.proj.Apply(ctx, tx, apply); err != nil {
				return fmt.Errorf("apply %d events: %w", len(apply), err)
			}
			if _, err := tx.Exec(ctx, positionsAdvanceSQL, name, tenants, aggs, versions); err != nil {
				return fmt.Errorf("advance projection positions: %w", err)
			}
			if _, err := tx.Exec(ctx, notifyAppliedSQL, name); err != nil {
				return fmt.Errorf("notify: %w", err)
			}
		}
		if _, err := tx.Exec(ctx, checkpointAdvanceSQL, name, int64(maxSeq)); err != nil {
			return fmt.Errorf("advance checkpoint: %w", err)
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
			err = e.msg.NakWithDelay(r.gapDelay(e.msg))
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

// gapDelay is how long an event waits for its predecessor: GapDelay, doubling
// with each delivery up to 30s, so an event stuck behind a lost predecessor
// costs little while it waits.
func (r *Runner) gapDelay(m jetstream.Msg) time.Duration {
	n := uint64(1)
	if meta, err := m.Metadata(); err == nil {
		n = meta.NumDelivered
	}
	return min(r.cfg.GapDelay<<min(n-1, 10), 30*time.Second)
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
