package projection

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/semaphore"

	"github.com/acme/orders/domain"
	"github.com/acme/orders/postgres"
	"github.com/acme/orders/stream"
)

// batchTimeout bounds a batch's work, at least (AckWait, if longer): a
// batch held up by a lock (a rebuild's swap holds its projection's batches
// for seconds, more as the log grows) finishes rather than failing at a
// 10 s ack wait; it is kept in progress meanwhile, so it is not delivered
// again.
const batchTimeout = 30 * time.Second

// Defaults of Config, taken for zero values.
const (
	DefaultBatchSize  = 250
	DefaultBatchWait  = 3 * time.Millisecond
	DefaultWorkers    = 2
	DefaultAckWait    = 10 * time.Second
	DefaultMaxDeliver = 10
	// MaxAckWait and MaxMaxDeliver bound Config.AckWait and
	// Config.MaxDeliver: the redelivery horizons (RedeliveryHorizon,
	// predecessorHorizon) multiply and add them, and past these they would
	// wrap time.Duration, turning a horizon negative (an inbox retention
	// check that passes anything; a waiting event called missing at once).
	MaxAckWait        = time.Hour
	MaxMaxDeliver     = 10_000
	DefaultGapDelay   = 20 * time.Millisecond
	DefaultRetryDelay = time.Second
	// DefaultAckPendingBatches is the consumer's MaxAckPending by default,
	// in batches per worker: 10 × 250 × 2 = 5,000 messages.
	DefaultAckPendingBatches = 10
	// DefaultTenantShare is the most of the consumer's window (MaxAckPending)
	// that one tenant's delayed messages may hold in a runner.
	DefaultTenantShare = 0.1
	// DefaultRedriveInterval is how often a runner looks for parked events
	// that no open dead letter holds back and are due for another attempt.
	DefaultRedriveInterval = time.Second
	// DefaultCheckpointInterval is how often a runner writes its checkpoint.
	DefaultCheckpointInterval = time.Second
	// DefaultBufferBytes bounds the bytes of the events a runner holds,
	// handed to its workers and in their batches; its consumer's pull
	// buffer holds up to half as much again (or two of the largest
	// messages NATS takes, if more).
	DefaultBufferBytes = 16 << 20
)

// Config tunes a Runner. Zero values take the defaults; the README's
// "Operating it" explains each choice.
type Config struct {
	// BatchSize is the most events applied in one transaction; default
	// DefaultBatchSize.
	BatchSize int
	// Workers is how many batches this runner applies at once (each in its
	// own transaction), so that decoding one overlaps the database work of
	// another; default DefaultWorkers. Like workers in other processes, they
	// share the consumer, and the version gate keeps them exact.
	Workers int
	// BatchWait is how long a batch lingers, after its first event, for
	// more to fill it while the stream is busy: when this worker's previous
	// batch ended less than 20 × BatchWait before. Busy, a few milliseconds
	// buy bigger batches (fewer transactions) under a steady stream; idle, a
	// batch is whatever is buffered already, for the lowest latency; full,
	// it goes at once. Default DefaultBatchWait; negative: never linger.
	BatchWait time.Duration
	// AckWait is how long JetStream waits for an ack before it redelivers
	// (after a worker died mid-batch); default DefaultAckWait. Every event
	// the runner holds, in a batch or waiting behind one, is sent InProgress
	// every AckWait/3 (inHand), so it is never redelivered while the
	// projector lives.
	AckWait time.Duration
	// MaxDeliver is how many deliveries an event gets before it is
	// dead-lettered (a transient failure that outlasts the backoff, or a
	// predecessor that never comes); default DefaultMaxDeliver. A permanent
	// failure (see Permanent) is dead-lettered on its first delivery.
	MaxDeliver int
	// GapDelay is how long an event whose predecessor is missing waits
	// before it is delivered again (doubling with each delivery, up to
	// 30s); default DefaultGapDelay. Keep it short: the usual gap is a
	// predecessor in a batch another worker (or process) has in flight,
	// applied milliseconds later. At 500 ms, every such race (payment.requested
	// and order.paid of one order, tens of ms apart, taken by two workers)
	// cost the later event half a second: commit → applied p99 ≈ 1 s at a
	// light load. Ten deliveries wait about 20 s in all; a gap still
	// waiting then is parked (see settle) out of the window.
	GapDelay time.Duration
	// RetryDelay is how long a failed event waits before its next delivery
	// (doubling with each, up to a minute); default DefaultRetryDelay.
	RetryDelay time.Duration
	// StreamReplicas is the stream's replication (3 on a cluster); default 1.
	StreamReplicas int
	// BufferBytes bounds the bytes of events held in the runner at once
	// (DefaultBufferBytes); one event larger than it is still taken, alone.
	// The counts (BatchSize, Workers) bound small events; this bounds large
	// ones: 1,000 events of 800 KB, published straight to the stream, took
	// a projector to 2.6 GB when only counts bounded them.
	BufferBytes int64
	// MaxAckPending is the consumer's in-flight window: the most messages
	// delivered and not yet acked, across every process sharing it;
	// default DefaultAckPendingBatches × BatchSize × Workers.
	MaxAckPending int
	// TenantShare is the most of MaxAckPending that one tenant's delayed
	// messages (nak'ed with a delay after a transient failure or while
	// waiting for a predecessor) may hold in this runner, in (0, 1]. Each
	// runner counts its own: P processes let a tenant hold up to
	// P × TenantShare, so divide the intended share by P;
	// default DefaultTenantShare. Past it, the runner parks the tenant's
	// further delayed events in dead_letters and acks them, and re-drives
	// them itself (RedriveInterval), so one tenant's failures cannot fill
	// the window and hold the other tenants' events back.
	TenantShare float64
	// RedriveInterval is how often the runner re-drives parked events that
	// no open dead letter holds back; default DefaultRedriveInterval.
	RedriveInterval time.Duration
	// CheckpointInterval is how often the runner writes the projection's
	// checkpoint (the highest stream sequence applied, for `projector
	// status`) while it advanced; default DefaultCheckpointInterval.
	CheckpointInterval time.Duration
	// Applied, if set, is called after each batch transaction committed,
	// outside it, with the projection's name and the orders (aggregates)
	// it applied, each with the version it reached: the projector sends the
	// read-your-writes wake-up with it (a coalesced NOTIFY
	// projection_applied, postgres.Notifier), so that only the readers
	// waiting for that version wake. It must not block. Events applied by
	// a re-drive or a dead-letter retry are not reported; their readers'
	// poll fallback finds them.
	Applied func(projection string, reached []Reached)
	// Observers, if set, is called once per runner with its projection's
	// name and returns where the runner reports its batches and the events
	// it applies (for metrics).
	Observers func(projection string) Observers
}

// Observers receive a runner's measurements; a nil one is skipped.
type Observers struct {
	// BatchEvents observes the number of messages of each batch.
	BatchEvents Observer
	// BatchSeconds observes how long each batch took, from its decoding to
	// its last ack, in seconds.
	BatchSeconds Observer
	// CommitToAppliedSeconds observes, for every event applied from the
	// stream, the time from its occurred_at (its command's commit) to the
	// ack of its batch, in seconds.
	CommitToAppliedSeconds Observer
}

// Observer takes one observation, such as a prometheus.Histogram.
type Observer interface{ Observe(float64) }

func (c Config) withDefaults() Config {
	if c.BatchSize <= 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.BatchWait == 0 {
		c.BatchWait = DefaultBatchWait
	}
	if c.AckWait <= 0 {
		c.AckWait = DefaultAckWait
	}
	if c.Workers <= 0 {
		c.Workers = DefaultWorkers
	}
	if c.BufferBytes <= 0 {
		c.BufferBytes = DefaultBufferBytes
	}
	if c.MaxDeliver <= 0 {
		c.MaxDeliver = DefaultMaxDeliver
	}
	if c.GapDelay <= 0 {
		c.GapDelay = DefaultGapDelay
	}
	if c.RetryDelay <= 0 {
		c.RetryDelay = DefaultRetryDelay
	}
	if c.MaxAckPending == 0 {
		c.MaxAckPending = DefaultAckPendingBatches * c.BatchSize * c.Workers
	}
	if c.TenantShare == 0 {
		c.TenantShare = DefaultTenantShare
	}
	if c.RedriveInterval <= 0 {
		c.RedriveInterval = DefaultRedriveInterval
	}
	if c.CheckpointInterval <= 0 {
		c.CheckpointInterval = DefaultCheckpointInterval
	}
	return c
}

// Validate reports the first setting of c (with defaults filled in) that is
// out of range, naming the field.
func (c Config) Validate() error {
	c = c.withDefaults()
	switch {
	case c.AckWait > MaxAckWait:
		return fmt.Errorf("projection config: AckWait must be at most %s, got %s", MaxAckWait, c.AckWait)
	case c.MaxDeliver > MaxMaxDeliver:
		return fmt.Errorf("projection config: MaxDeliver must be at most %d, got %d", MaxMaxDeliver, c.MaxDeliver)
	case c.MaxAckPending < 1:
		return fmt.Errorf("projection config: MaxAckPending must be at least 1, got %d", c.MaxAckPending)
	case !(c.TenantShare > 0 && c.TenantShare <= 1):
		return fmt.Errorf("projection config: TenantShare must be in (0, 1], got %v", c.TenantShare)
	}
	return nil
}

// tenantLimit is the most delayed messages one tenant may hold in this
// runner: TenantShare of MaxAckPending, at least one.
func (c Config) tenantLimit() int {
	return max(1, int(c.TenantShare*float64(c.MaxAckPending)))
}

// youngGapLimit is the most young gaps (waiting under gapCountsFrom) one
// tenant may hold in this runner besides its tenantLimit: four times that,
// at most half the window. A busy tenant's ordinary gaps (its predecessors
// in other batches, many of them with several projector processes) stay
// well under it; a flood of gaps whose predecessors never come leaves at
// least half the window to the other tenants.
func (c Config) youngGapLimit() int {
	return max(1, min(4*c.tenantLimit(), c.MaxAckPending/2))
}

// Runner feeds one projection from its durable consumer. Any number of
// runners of the same projection (in one process or many) share the
// consumer's work; the per-aggregate version gate keeps them correct.
type Runner struct {
	db     *pgxpool.Pool
	js     jetstream.JetStream
	proj   Projection
	logger *slog.Logger
	cfg    Config

	stats      [outcomeCount]atomic.Int64 // per Outcome
	checkpoint atomic.Uint64              // highest stream sequence committed (checkpointLoop writes it)
	deferred   atomic.Int64               // delayed events parked past their tenant's share
	lingers    atomic.Int64               // batches that lingered (BatchWait)
	pipelined  atomic.Int64               // batches committed in two round trips (commitPipelined)
	held       atomic.Int64               // bytes of events held now (Config.BufferBytes)
	heldPeak   atomic.Int64
	inHand     inHand         // the messages held, kept in progress
	window     *delayedWindow // a tenant's delayed events: failures' backoffs, gaps past gapCountsFrom
	young      *delayedWindow // a tenant's young gaps (before gapCountsFrom), up to youngGapLimit
	obs        Observers
}

// NewRunner returns a Runner applying the stream on js to proj in db, or an
// error naming the field of cfg that is invalid. js may be nil for the
// operations that need only the database (dead letters, rebuild).
func NewRunner(db *pgxpool.Pool, js jetstream.JetStream, proj Projection, logger *slog.Logger, cfg Config) (*Runner, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("projection %s: %w", proj.Name(), err)
	}
	cfg = cfg.withDefaults()
	r := &Runner{db: db, js: js, proj: proj, logger: logger.With("projection", proj.Name()), cfg: cfg,
		window: newDelayedWindow(cfg.tenantLimit()), young: newDelayedWindow(cfg.youngGapLimit())}
	if cfg.Observers != nil {
		r.obs = cfg.Observers(proj.Name())
	}
	return r, nil
}

// Name is the projection's name.
func (r *Runner) Name() string { return r.proj.Name() }

// Stats counts events by outcome since start.
type Stats struct {
	Applied, Duplicates, Stale, Gaps, Malformed, Parked, DeadLettered int64
	// Deferred counts delayed events parked (and acked) because their
	// tenant held its share of the consumer's window; the runner re-drives
	// them from dead_letters.
	Deferred int64
	// Lingers counts batches that waited BatchWait for more events.
	Lingers int64
	// Pipelined counts batches committed in two round trips, every event
	// new and next in line; the others were applied the careful way.
	Pipelined int64
	// HeldBytesPeak is the most bytes of events held at once, handed to
	// workers or in their batches (bounded by Config.BufferBytes).
	HeldBytesPeak int64
}

// Stats returns the runner's counters.
func (r *Runner) Stats() Stats {
	return Stats{
		Applied:       r.stats[Applied].Load(),
		Duplicates:    r.stats[Duplicate].Load(),
		Stale:         r.stats[Stale].Load(),
		Gaps:          r.stats[Gap].Load(),
		Malformed:     r.stats[Malformed].Load(),
		Parked:        r.stats[Parked].Load(),
		DeadLettered:  r.stats[DeadLettered].Load(),
		Deferred:      r.deferred.Load(),
		Lingers:       r.lingers.Load(),
		Pipelined:     r.pipelined.Load(),
		HeldBytesPeak: r.heldPeak.Load(),
	}
}

// Consumer creates or updates the projection's durable consumer.
//
// The server's MaxDeliver is unlimited on purpose: the runner itself
// dead-letters an event at Config.MaxDeliver, with its error and raw message,
// so nothing is ever silently dropped by the server. No BackOff is set: the
// runner chooses each redelivery's delay itself (NakWithDelay), and a
// consumer BackOff would override those delays; a worker that dies
// mid-batch gets its messages redelivered after AckWait. DeliverAllPolicy:
// a new consumer, or one created again after it was lost, starts at the
// stream's first message (see Run for why that is safe).
func (r *Runner) Consumer(ctx context.Context) (jetstream.Consumer, error) {
	st, err := stream.Open(ctx, r.js, stream.Settings{Replicas: r.cfg.StreamReplicas})
	if err != nil {
		return nil, err
	}
	c, err := r.js.CreateOrUpdateConsumer(ctx, stream.Name, jetstream.ConsumerConfig{
		Durable:       r.proj.Name(),
		Description:   "projection " + r.proj.Name(),
		FilterSubject: stream.Subjects,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       r.cfg.AckWait,
		MaxDeliver:    -1,
		MaxAckPending: r.cfg.MaxAckPending,
		Replicas:      r.cfg.StreamReplicas,
	})
	if err != nil {
		return nil, fmt.Errorf("create or update consumer %s: %w", r.proj.Name(), err)
	}
	r.reportDeleted(ctx, st.CachedInfo().State.FirstSeq, c.CachedInfo().AckFloor.Stream)
	return c, nil
}

// deletedUnapplied is how many events the stream deleted before this
// projection acked them, at most: those between its ack floor and the
// stream's first message. Only a limit set on the stream (max_age,
// max_bytes, max_msgs: JetStream deletes by them whether or not a consumer
// has the events) does that. The consumer takes every subject of the
// stream, so the count is exact but for events acked above the floor, out
// of order. It is seen only while the consumer is behind the deleted
// events: once it fetches past them (or after a purge, at once) the
// server moves its floor past them and the count is 0 again.
func deletedUnapplied(firstSeq, ackFloor uint64) uint64 {
	if firstSeq > ackFloor+1 {
		return firstSeq - 1 - ackFloor
	}
	return 0
}

// reportDeleted logs events the stream deleted before this projection
// applied them: lost to its read model (G6) until it is rebuilt from the
// outbox, which still holds them.
func (r *Runner) reportDeleted(ctx context.Context, firstSeq, ackFloor uint64) {
	if n := deletedUnapplied(firstSeq, ackFloor); n > 0 {
		r.logger.ErrorContext(ctx, "events were deleted from the stream before this projection applied them (a limit set on the stream); rebuild the projection to apply them from the outbox",
			"projection", r.proj.Name(), "events", n, "ack_floor", ackFloor, "stream_first_seq", firstSeq,
			"fix", "projector rebuild "+r.proj.Name())
	}
}

// Run consumes and applies events until ctx ends. It retries its set-up
// while NATS is unreachable, and creates the consumer (and the stream) again
// whenever it is lost (stream.Consume): deleted, or gone with NATS's
// JetStream state. On shutdown it finishes the batch in hand (and acks it)
// and hands the buffered, unapplied messages back for redelivery.
//
// A consumer created again (DeliverAllPolicy, see Consumer) delivers the
// whole stream again, from its first message. That is safe, only slower:
// each event delivered again is handled as a copy republished past the
// duplicate window is (G5). One applied already is a no-op: the version
// gate finds its order past it (stale) and the inbox already holds it; one
// held back by a dead letter of its order waits behind it again. The
// lost consumer's messages still in hand are applied too, but not acked
// (stream.ErrConsumerLost): their copies from the new consumer are no-ops.
func (r *Runner) Run(ctx context.Context) (err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Room for the whole window (MaxAckPending): the consume callback
	// never waits for a worker, only for BufferBytes, so what JetStream
	// delivered is here, kept in progress (inHand), and not in nats.go's
	// buffer, where nothing could keep it in progress.
	msgs := make(chan jetstream.Msg, max(r.cfg.BatchSize*r.cfg.Workers, r.cfg.MaxAckPending))
	budget := semaphore.NewWeighted(r.cfg.BufferBytes)
	consumed := make(chan error, 1)
	go func() { consumed <- r.consume(ctx, cancel, msgs, budget) }()
	defer func() {
		cancel()
		if cerr := <-consumed; cerr != nil {
			err = fmt.Errorf("consume %s: %w", r.proj.Name(), cerr)
		}
		for {
			select {
			case m := <-msgs:
				r.inHand.remove(m)
				_ = m.Nak()
			default:
				return
			}
		}
	}()

	var wg sync.WaitGroup
	wg.Go(func() { r.redriveLoop(ctx) })
	wg.Go(func() { r.inHand.keep(ctx, r.cfg.AckWait/3) })
	workersDone, checkpointed := make(chan struct{}), make(chan struct{})
	go func() { defer close(checkpointed); r.checkpointLoop(ctx, workersDone) }()
	defer func() { close(workersDone); <-checkpointed }() // after wg.Wait: the last batches' checkpoint too
	for range r.cfg.Workers {
		wg.Go(func() {
			var lastEnd time.Time // of this worker's previous batch
			for {
				batch, lingered := collect(ctx, msgs, r.cfg.BatchSize, r.cfg.BatchWait, lastEnd)
				if batch == nil {
					return
				}
				if lingered {
					r.lingers.Add(1)
				}
				// The batch in hand is finished even if shutdown has begun,
				// within batchTimeout (it is kept in progress meanwhile).
				bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), max(r.cfg.AckWait, batchTimeout))
				r.Process(bctx, batch)
				cancel()
				r.release(budget, batch)
				lastEnd = time.Now()
			}
		})
	}
	wg.Wait()
	return nil
}

// consume feeds msgs from the projection's consumer until ctx ends (see
// Run). If it cannot consume at all (an invalid option), it ends the run
// with cancel and returns why.
func (r *Runner) consume(ctx context.Context, cancel func(), msgs chan<- jetstream.Msg, budget *semaphore.Weighted) error {
	err := stream.ConsumeWith(ctx, r.Consumer, func(m jetstream.Msg) {
		n := r.size(m)
		if budget.Acquire(ctx, n) != nil {
			_ = m.Nak()
			return
		}
		r.hold(n)
		r.inHand.add(m)
		select {
		case msgs <- m:
		case <-ctx.Done():
			r.inHand.remove(m)
			r.hold(-n)
			budget.Release(n)
			_ = m.Nak()
		}
	}, r.logger, func() []jetstream.PullConsumeOpt {
		return []jetstream.PullConsumeOpt{jetstream.PullMaxMessagesWithBytesLimit(r.cfg.BatchSize*r.cfg.Workers, r.pullBytes())}
	})
	if err != nil {
		cancel()
	}
	return err
}

// size is what message m takes of Config.BufferBytes: its payload's
// length, or all of it for one larger, which is then held alone.
func (r *Runner) size(m jetstream.Msg) int64 {
	return min(int64(len(m.Data())), r.cfg.BufferBytes)
}

// hold counts n bytes more (or fewer) held, and the peak.
func (r *Runner) hold(n int64) {
	now := r.held.Add(n)
	for peak := r.heldPeak.Load(); now > peak && !r.heldPeak.CompareAndSwap(peak, now); peak = r.heldPeak.Load() {
	}
}

// release gives the bytes of a processed batch back to budget, and stops
// keeping its messages in progress.
func (r *Runner) release(budget *semaphore.Weighted, batch []jetstream.Msg) {
	var n int64
	for _, m := range batch {
		n += r.size(m)
	}
	r.inHand.remove(batch...)
	r.hold(-n)
	budget.Release(n)
}

// pullBytes bounds the consumer's pull buffer: half of BufferBytes, or two
// of the largest messages the server takes if more (a limit under one
// message would stall the consumer); 64 MiB, NATS's largest, if no server
// has said its limit (it is read when a consume starts, after the
// consumer was opened on a connected server).
func (r *Runner) pullBytes() int {
	maxPayload := int64(64 << 20)
	if nc := r.js.Conn(); nc != nil && nc.MaxPayload() > 0 {
		maxPayload = nc.MaxPayload()
	}
	return int(max(r.cfg.BufferBytes/2, 2*maxPayload))
}

// collect blocks for one message, then takes whatever else is already
// buffered, up to max; and, when the stream is busy (the previous batch
// ended, at lastEnd, less than 20 × wait before the first message came),
// what arrives within wait too (lingered is true then). It returns nil when
// ctx ends.
func collect(ctx context.Context, msgs <-chan jetstream.Msg, max int, wait time.Duration, lastEnd time.Time) (batch []jetstream.Msg, lingered bool) {
	select {
	case <-ctx.Done():
		return nil, false
	case m := <-msgs:
		batch = append(batch, m)
	}
	var deadline <-chan time.Time
	if wait > 0 && time.Since(lastEnd) < 20*wait {
		lingered = true
		t := time.NewTimer(wait)
		defer t.Stop()
		deadline = t.C
	}
	for len(batch) < max {
		select {
		case m := <-msgs:
			batch = append(batch, m)
			continue
		default:
		}
		if deadline == nil {
			return batch, lingered
		}
		select {
		case m := <-msgs:
			batch = append(batch, m)
		case <-deadline:
			return batch, lingered
		case <-ctx.Done():
			return batch, lingered
		}
	}
	return batch, lingered
}

// event is one delivered (or stored) event on its way through a batch.
type event struct {
	msg         jetstream.Msg // nil for an event retried from dead_letters
	subject     string
	data        []byte
	seq         uint64
	deliveries  uint64
	env         domain.Envelope
	undecodable bool          // not an envelope at all
	deadID      int64         // its dead_letters row, for an event read from there
	parkedFor   time.Duration // how long ago that row was written, by the database's clock
	permanent   bool          // err is a failure no retry can fix (Permanent)
	outcome     Outcome
	err         error
}

// orderKey names an order as its events do: the tenant and the aggregate.
// An unresolved dead letter holds back the later events of its own
// tenant's order only, so that an event naming another tenant's order (a
// forged one) parks nothing of that tenant's.
type orderKey struct {
	tenant string
	id     uuid.UUID
}

func keyOf(env domain.Envelope) orderKey { return orderKey{env.TenantID, env.AggregateID} }

func fromMessage(m jetstream.Msg) *event {
	e := &event{msg: m, subject: m.Subject(), data: m.Data(), deliveries: 1}
	if meta, err := m.Metadata(); err == nil {
		e.seq, e.deliveries = meta.Sequence.Stream, meta.NumDelivered
	}
	return e
}

// decode parses each event's envelope and sorts the batch: an aggregate's
// events in version order (so a batch holding v1 and v2 applies both), and
// every transaction touching the same rows locks them in the same order (so
// parallel workers cannot deadlock).
func decode(events []*event) []*event {
	for _, e := range events {
		e.env, e.err = domain.DecodeEnvelope(e.data)
		if e.err != nil {
			e.outcome, e.undecodable = Malformed, true
		}
	}
	slices.SortStableFunc(events, compareEvents)
	return events
}

// compareEvents orders events by aggregate id, then version: the order in
// which every batch locks positions and writes shared rows. The ids compare
// as bytes, which is the order of their text form and PostgreSQL's uuid
// order, without allocating a string per comparison.
func compareEvents(a, b *event) int {
	if c := bytes.Compare(a.env.AggregateID[:], b.env.AggregateID[:]); c != 0 {
		return c
	}
	return cmp.Compare(a.env.AggregateVersion, b.env.AggregateVersion)
}

func decodeMessages(msgs []jetstream.Msg) []*event {
	events := make([]*event, len(msgs))
	for i, m := range msgs {
		events[i] = fromMessage(m)
	}
	return decode(events)
}

// Process applies msgs in one transaction and then settles each message:
// ack when applied, duplicate, stale or parked; a delayed nak on a gap or a
// transient failure; dead letter and term when malformed, on a permanent
// failure (see Permanent), or when its deliveries are used up. If the batch
// transaction fails, its events are tried apart (commitApart), so one bad
// event cannot hold up the others. Run keeps msgs in progress meanwhile
// (inHand, from delivery to the end of their batch); a caller of its own
// that may outlast the ack wait does that itself.
func (r *Runner) Process(ctx context.Context, msgs []jetstream.Msg) {
	start := time.Now()
	ctx, endSpan := traceBatch(ctx, r.proj.Name(), msgs)
	defer endSpan()
	if o := r.obs.BatchEvents; o != nil {
		o.Observe(float64(len(msgs)))
	}
	if o := r.obs.BatchSeconds; o != nil {
		defer func() { o.Observe(time.Since(start).Seconds()) }()
	}

	events := decodeMessages(msgs)
	for _, e := range events {
		r.window.received(e.seq)
		r.young.received(e.seq)
	}
	if err := r.commit(ctx, events); err != nil {
		r.logger.WarnContext(ctx, "batch failed; applying its events apart", "events", len(events), "err", err)
		r.commitApart(ctx, events, err)
	}
	r.settle(ctx, events)
}

// commitApart applies events, whose transaction failed with err, apart, so
// that the events that caused the failure are found and the others applied:
// in halves, one after the other, while the failure is the data's (Permanent:
// one bad event then costs about 2·log2(n) transactions, not n, so a tenant
// that publishes bad events cannot make every batch go one event at a time;
// a batch of nothing but bad events costs 2n, not n); one by one otherwise. Each event that fails alone gets its error.
func (r *Runner) commitApart(ctx context.Context, events []*event, err error) {
	if len(events) == 1 || !Permanent(err) {
		for _, e := range events {
			if e.undecodable {
				continue
			}
			if len(events) > 1 {
				err = r.commit(ctx, []*event{e})
			}
			switch {
			case errors.Is(err, domain.ErrMalformedEvent):
				e.outcome, e.err = Malformed, err
			case err != nil:
				e.err, e.permanent = err, Permanent(err)
			}
		}
		return
	}
	half := len(events) / 2
	for _, part := range [][]*event{events[:half], events[half:]} {
		if err := r.commit(ctx, part); err != nil {
			r.commitApart(ctx, part, err)
		}
	}
}

// settle acks, naks or terminates each message after the transaction.
func (r *Runner) settle(ctx context.Context, events []*event) {
	dead := map[orderKey]bool{}        // orders dead-lettered in this pass
	deferredAgg := map[orderKey]bool{} // orders with an event deferred in this pass
	var deferred []deferral
	defer func() { r.deferAll(ctx, deferred) }()
	for _, e := range events { // in (aggregate, version) order
		final := e.deliveries >= uint64(r.cfg.MaxDeliver)
		switch {
		case e.outcome == Malformed:
			if r.deadLetterAndTerm(ctx, e, e.err.Error()) {
				r.stats[Malformed].Add(1) // once, not per redelivery of one it could not record
			}
			dead[keyOf(e.env)] = !e.undecodable
			continue
		case e.err != nil && e.permanent:
			r.deadLetterAndTerm(ctx, e, fmt.Sprintf("permanent failure (no retry can fix it): %v", e.err))
			dead[keyOf(e.env)] = true
			continue
		case e.err != nil && final:
			r.deadLetterAndTerm(ctx, e, fmt.Sprintf("failed %d times; last error: %v", e.deliveries, e.err))
			dead[keyOf(e.env)] = true
			continue
		case e.outcome == Gap && final && deferredAgg[keyOf(e.env)]:
			// Its predecessor is deferred in this pass: park it behind it,
			// in the same statement.
			deferred = append(deferred, deferral{e: e, retryIn: r.retryDelay(e.deliveries), reason: reasonBehindParked})
			continue
		case e.outcome == Gap && final && !dead[keyOf(e.env)]:
			held, err := r.heldBack(ctx, e)
			if err != nil {
				// Unknown: neither park nor dead-letter on a guess; ask
				// again on the next delivery.
				r.logger.ErrorContext(ctx, "cannot tell whether the event's order is dead-lettered; will retry", "event_id", e.env.ID, "err", err)
				if err := e.msg.NakWithDelay(r.gapDelay(e.deliveries)); err != nil {
					r.logger.WarnContext(ctx, "settle message", "event_id", e.env.ID, "outcome", e.outcome.String(), "err", err)
				}
				continue
			}
			switch held {
			case reasonBehindOpen:
				r.parkAndAck(ctx, e, held, noAttempt) // until the open one is resolved
			case reasonBehindParked:
				// The re-drive that applies the predecessor makes it due;
				// the backoff is a fallback.
				r.parkAndAck(ctx, e, held, r.retryDelay(e.deliveries))
			default:
				// Its predecessor may still be retrying (the retry backoff
				// outlasts the gap backoff): wait for it out of the
				// window; the re-drive opens it only past the horizon.
				r.parkAndAck(ctx, e, waitingFor(e), r.gapDelay(e.deliveries))
			}
			continue
		case e.outcome == Gap && dead[keyOf(e.env)]:
			r.parkAndAck(ctx, e, reasonBehindOpen, noAttempt)
			continue
		}
		var err error
		switch {
		case e.err != nil:
			r.logger.ErrorContext(ctx, "event failed; will be redelivered", "event_id", e.env.ID, "deliveries", e.deliveries, "err", e.err)
			if d, ok := r.delay(ctx, e, r.retryDelay(e.deliveries), fmt.Sprintf("failed %d times; last error: %v", e.deliveries, e.err)); !ok {
				deferred, deferredAgg[keyOf(e.env)] = append(deferred, d), true
			}
		case e.outcome == Gap && r.gapDelay(e.deliveries) < gapCountsFrom && r.admitYoung(e):
			// Not counted against the tenant's share yet: its predecessor
			// is most likely in flight (in another worker's or process's
			// batch) and applied within moments. Counting these would park
			// the ordinary gaps of a busy tenant, and each parked event
			// makes its order's later ones gaps too. They have a larger
			// share of their own (youngGapLimit): a flood of gaps (a forged
			// stream) holds at most that much more of the window, not all.
			r.countGap(e)
			err = e.msg.NakWithDelay(r.gapDelay(e.deliveries))
		case e.outcome == Gap:
			// It has waited long enough that its predecessor may never
			// come (a forged or broken stream), or its tenant holds its
			// young gaps' share: counted against the tenant's share like a
			// failure's delay, so such events cannot fill the window. Past
			// the share it is parked, and re-driven.
			r.countGap(e)
			if d, ok := r.delay(ctx, e, r.gapDelay(e.deliveries), fmt.Sprintf("waiting for version %d of its order", e.env.AggregateVersion-1)); !ok {
				deferred, deferredAgg[keyOf(e.env)] = append(deferred, d), true
			}
		default:
			err = e.msg.Ack()
			r.stats[e.outcome].Add(1)
			if o := r.obs.CommitToAppliedSeconds; o != nil && e.outcome == Applied && !e.env.OccurredAt.IsZero() {
				o.Observe(max(0, time.Since(e.env.OccurredAt).Seconds())) // no time (an old event), or another clock's
			}
		}
		if err != nil {
			r.logger.WarnContext(ctx, "settle message", "event_id", e.env.ID, "outcome", e.outcome.String(), "err", err)
		}
	}
}

// Reasons of events parked behind an unresolved dead letter of their order.
const (
	reasonBehindOpen   = "parked behind an open dead letter of the same order"
	reasonBehindParked = "parked behind a parked earlier version of the same order"
)

// heldBack reports why the gap event e, on its last delivery, is to be
// parked instead of dead-lettered: its order has an open dead letter of an
// earlier version (reasonBehindOpen), or a parked earlier version that the runner re-drives
// (reasonBehindParked; v2 must not go open and lock out a deferred v1). It
// reports "" when nothing holds e back. An error means the answer is
// unknown (never "no").
func (r *Runner) heldBack(ctx context.Context, e *event) (string, error) {
	var open, parked bool
	if err := r.db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM dead_letters WHERE projection = $1 AND aggregate_id = $2 AND tenant_id = $4 AND status = 'open' AND aggregate_version < $3),
       EXISTS (SELECT 1 FROM dead_letters WHERE projection = $1 AND aggregate_id = $2 AND tenant_id = $4 AND status = 'parked' AND aggregate_version < $3)`,
		r.proj.Name(), e.env.AggregateID, e.env.AggregateVersion, e.env.TenantID).Scan(&open, &parked); err != nil {
		return "", fmt.Errorf("look up unresolved dead letters of aggregate %s: %w", e.env.AggregateID, err)
	}
	switch {
	case open:
		return reasonBehindOpen, nil
	case parked:
		return reasonBehindParked, nil
	}
	return "", nil
}

// deferral is a delayed event to be parked (and then acked) with the other
// deferrals of its settle pass, in one statement.
type deferral struct {
	e       *event
	retryIn time.Duration // its delay: of the nak if it cannot be parked, and of its next attempt
	reason  string
}

// delay hands e back to JetStream for redelivery after d, if its tenant
// holds fewer delayed messages than its share of the window, and reports
// true. Past it, it reports false and the deferral to write: e is to be
// parked in dead_letters (deferred: no open dead letter holds it back) and
// acked, out of the window; redriveLoop tries it again from there.
func (r *Runner) delay(ctx context.Context, e *event, d time.Duration, why string) (deferral, bool) {
	now := time.Now()
	if !r.window.admit(e.seq, e.env.TenantID, now.Add(d+r.cfg.AckWait), now) {
		reason := fmt.Sprintf("deferred: tenant %s holds its share of the consumer's window (%d delayed events); %s",
			e.env.TenantID, r.window.held(e.env.TenantID), why)
		return deferral{e: e, retryIn: d, reason: reason}, false
	}
	if err := e.msg.NakWithDelay(d); err != nil {
		r.logger.WarnContext(ctx, "nak message with delay", "event_id", e.env.ID, "err", err)
	}
	return deferral{}, true
}

// deferralsInsertSQL parks a settle pass's deferrals in one statement.
const deferralsInsertSQL = `
INSERT INTO dead_letters (projection, tenant_id, event_id, aggregate_id, aggregate_version, stream_seq,
                          subject, payload, error, deliveries, status, next_attempt_at)
SELECT $1, tenant_id, event_id, aggregate_id, aggregate_version, stream_seq,
       subject, payload, error, deliveries, 'parked', now() + retry_in * interval '1 microsecond'
FROM unnest($2::text[], $3::uuid[], $4::uuid[], $5::bigint[], $6::bigint[],
            $7::text[], $8::bytea[], $9::text[], $10::integer[], $11::bigint[])
     AS d(tenant_id, event_id, aggregate_id, aggregate_version, stream_seq,
          subject, payload, error, deliveries, retry_in)`

// deferAll parks deferred in one statement (one round trip, one commit)
// and then acks each of their messages. If they cannot be parked, each is
// nak'ed with its delay instead: never lost, never acked before the commit.
func (r *Runner) deferAll(ctx context.Context, deferred []deferral) {
	if len(deferred) == 0 {
		return
	}
	n := len(deferred)
	tenants, ids, aggs := make([]string, n), make([]uuid.UUID, n), make([]uuid.UUID, n)
	versions, seqs, deliveries, retryIn := make([]int64, n), make([]int64, n), make([]int32, n), make([]int64, n)
	subjects, payloads, reasons := make([]string, n), make([][]byte, n), make([]string, n)
	for i, d := range deferred {
		e := d.e
		tenants[i], ids[i], aggs[i], versions[i] = e.env.TenantID, e.env.ID, e.env.AggregateID, e.env.AggregateVersion
		seqs[i], subjects[i], payloads[i], reasons[i] = int64(e.seq), postgres.Text(e.subject), e.data, postgres.Text(d.reason)
		deliveries[i], retryIn[i] = int32(min(e.deliveries, math.MaxInt32)), d.retryIn.Microseconds()
	}
	if _, err := r.db.Exec(ctx, deferralsInsertSQL, r.proj.Name(), tenants, ids, aggs, versions, seqs,
		subjects, payloads, reasons, deliveries, retryIn); err != nil {
		r.logger.ErrorContext(ctx, "cannot park deferred events; nak'ing them", "events", n, "err", err)
		for _, d := range deferred {
			if err := d.e.msg.NakWithDelay(d.retryIn); err != nil {
				r.logger.WarnContext(ctx, "nak message with delay", "event_id", d.e.env.ID, "err", err)
			}
		}
		return
	}
	for _, d := range deferred {
		if d.reason == reasonBehindParked {
			r.stats[Parked].Add(1)
		} else {
			r.deferred.Add(1)
		}
		if err := d.e.msg.Ack(); err != nil {
			r.logger.WarnContext(ctx, "ack deferred message", "event_id", d.e.env.ID, "err", err)
		}
	}
}

// waitingFor is the reason of a gap event parked on its last delivery while
// its predecessor may still come.
func waitingFor(e *event) string {
	return fmt.Sprintf("waiting for version %d (it may still be redelivered)", e.env.AggregateVersion-1)
}

// parkAndAck parks e (reason says why) to be re-driven in retryIn
// (noAttempt: not on a clock): it waits in dead_letters, not in
// redeliveries. If it cannot be parked, it is nak'ed.
func (r *Runner) parkAndAck(ctx context.Context, e *event, reason string, retryIn time.Duration) {
	if err := r.deadLetter(ctx, r.db, e, statusParked, reason, retryIn); err != nil {
		r.logger.ErrorContext(ctx, "cannot park event; will retry", "event_id", e.env.ID, "err", err)
		if err := e.msg.NakWithDelay(r.gapDelay(e.deliveries)); err != nil {
			r.logger.WarnContext(ctx, "nak unparked message", "event_id", e.env.ID, "err", err)
		}
		return
	}
	r.stats[Parked].Add(1)
	if err := e.msg.Ack(); err != nil {
		r.logger.WarnContext(ctx, "ack parked message", "event_id", e.env.ID, "err", err)
	}
}

// countGap counts an event that arrived before its predecessor, once: on
// its first delivery, not on each redelivery while it waits.
func (r *Runner) countGap(e *event) {
	if e.deliveries <= 1 {
		r.stats[Gap].Add(1)
	}
}

// deadLetterAndTerm records e in dead_letters and terminates its message,
// and reports whether it did. If the record cannot be written, the message
// is nak'ed instead, so it is never lost.
func (r *Runner) deadLetterAndTerm(ctx context.Context, e *event, reason string) bool {
	if err := r.deadLetter(ctx, r.db, e, statusOpen, reason, noAttempt); err != nil {
		r.logger.ErrorContext(ctx, "cannot record dead letter; will retry", "event_id", e.env.ID, "err", err)
		if err := e.msg.NakWithDelay(r.retryDelay(e.deliveries)); err != nil {
			r.logger.WarnContext(ctx, "nak message that could not be dead-lettered", "event_id", e.env.ID, "err", err)
		}
		return false
	}
	r.logger.ErrorContext(ctx, "event dead-lettered", "stream_seq", e.seq, "event_id", e.env.ID,
		"aggregate_id", e.env.AggregateID, "aggregate_version", e.env.AggregateVersion, "reason", reason)
	r.stats[DeadLettered].Add(1)
	if err := e.msg.Term(); err != nil {
		r.logger.WarnContext(ctx, "term dead-lettered message", "event_id", e.env.ID, "err", err)
	}
	return true
}

// gapCountsFrom is the delay from which a gap's redelivery counts against
// its tenant's share of the window: with the default GapDelay (20 ms,
// doubling), from its seventh delivery, after about 1.3 s of waiting.
// Younger gaps count against a share of their own (admitYoung).
const gapCountsFrom = time.Second

// admitYoung counts the young gap e against its tenant's share of young
// gaps, or reports false (counting nothing) if the tenant holds it all.
// It is counted until it comes back, or gapCountsFrom after its delay: it
// is redelivered then, to this process or (with several) another one,
// which counts it itself; counting it for AckWait, as a failure's delay
// is, would keep every gap another process took for half a minute, and
// fill a busy tenant's share with them.
func (r *Runner) admitYoung(e *event) bool {
	now := time.Now()
	return r.young.admit(e.seq, e.env.TenantID, now.Add(r.gapDelay(e.deliveries)+gapCountsFrom), now)
}

// gapDelay is how long an event waits for its predecessor: GapDelay, doubling
// with each delivery up to 30s, so an event stuck behind a lost predecessor
// costs little while it waits.
func (r *Runner) gapDelay(deliveries uint64) time.Duration {
	return min(r.cfg.GapDelay<<min(max(deliveries, 1)-1, 10), 30*time.Second)
}

// retryDelay backs off with the number of deliveries: RetryDelay, doubling,
// up to a minute.
func (r *Runner) retryDelay(deliveries uint64) time.Duration {
	return min(r.cfg.RetryDelay<<min(max(deliveries, 1)-1, 10), time.Minute)
}

// predecessorHorizon is the longest an event can still be redelivered after
// its first delivery before the runner dead-letters it: each of its
// MaxDeliver deliveries after at most AckWait (a worker that died) plus its
// retry backoff. A successor waiting for it waits this long, counted from
// when the successor was parked (after its own first delivery, so after the
// predecessor's), before it calls the predecessor missing.
func (r *Runner) predecessorHorizon() time.Duration {
	var h time.Duration
	for d := uint64(1); d <= uint64(r.cfg.MaxDeliver); d++ {
		h += r.cfg.AckWait + r.retryDelay(d)
	}
	return h
}
