// Package outbox relays committed events from the outbox table to JetStream.
//
// The outbox is split into 16 partitions by aggregate. A relay's workers own
// the partitions whose advisory locks they hold, each on its own connection
// (the only connections a relay keeps outside the pool, besides the one
// listener all its workers share); any number
// of relays may run, and the partitions a relay gives up (it stops, crashes
// or loses its connection, which drops its locks) are taken over by the
// others within TakeoverInterval, or two when every other relay is at its
// cap (Config.MaxPartitions), which a relay then exceeds until a relay with
// room wants its extras back. Only the owner publishes a partition, in seq
// order, so an aggregate's events leave in version order.
//
// In one transaction on that connection the relay claims the oldest
// unpublished rows of its partitions, publishes them with Nats-Msg-Id set to
// the event id, waits for JetStream's acknowledgement, and marks the
// acknowledged rows published. A crash between publish and mark republishes
// on the next round: the stream's duplicate window drops the copy, and past
// the window the projectors' inbox does. A row stays unpublished until
// JetStream has acknowledged it.
//
// A large batch (Config.MinAtomicBatch events or more) goes out as one
// JetStream atomic batch when the stream allows it (nats-server 2.12 and
// later): all of it is stored or none, and the server syncs it to disk once,
// where a `sync_interval: always` server syncs each message published alone
// (several times the throughput; BENCHMARKS.md). A small one goes out
// message by message: an atomic batch's staging costs more than the few
// syncs it saves.
// JetStream refuses a whole atomic batch if one of its messages is a
// duplicate, as after a crash between publish and mark; the relay then
// publishes that batch message by message, asynchronously, and the
// duplicate window drops the copies one by one.
package outbox

//
// The files follow the relay's jobs: relay.go (configuration, workers,
// Run), lease.go (partition leases and takeover), claim.go (claim, publish
// and mark in one transaction), publish.go (the atomic-batch protocol and
// its fallback), prune.go (retention and backlog) and sql.go (every
// statement, which internal/bench also renders into its pgbench script).
import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/acme/orders/internal/mono"
	"github.com/acme/orders/postgres"
	"github.com/acme/orders/stream"
)

// Partitions is how many partitions the outbox has (see migration 004).
const Partitions = 16

// The defaults of Config, which a zero field takes.
const (
	DefaultBatchSize        = 500
	DefaultPollInterval     = time.Second
	DefaultLinger           = 3 * time.Millisecond
	DefaultAckTimeout       = 10 * time.Second
	DefaultMaxPartitions    = Partitions
	DefaultWorkers          = 2
	DefaultTakeoverInterval = 5 * time.Second
	DefaultStreamReplicas   = stream.DefaultReplicas
	DefaultMinAtomicBatch   = 16
	// MaxBatchSize is the largest BatchSize: one JetStream atomic batch.
	MaxBatchSize = maxAtomicBatch
)

// Config tunes a Relay. Zero values take the defaults; NewRelay refuses
// negative ones and those past their maximum.
type Config struct {
	// BatchSize is the rows per claim, 1 to MaxBatchSize; default
	// DefaultBatchSize.
	BatchSize int
	// PollInterval is the fallback when no wake-up arrives (Wake, or a
	// NOTIFY outbox from another process): a lost wake-up delays events by
	// at most this much; default DefaultPollInterval.
	PollInterval time.Duration
	// Linger is how long a worker woken while the outbox is busy waits
	// before it claims, so that what commits meanwhile goes out in the same
	// batch and JetStream (sync_interval: always) syncs once for all of it.
	// Busy: its previous claim found rows, fewer than a full batch, and
	// ended less than 20 × Linger ago. After a full batch it claims again at
	// once; after an idle spell, or on a poll, it does not linger. Default
	// DefaultLinger; at most a second.
	Linger time.Duration
	// AckTimeout bounds the wait for all PubAcks of a batch; default
	// DefaultAckTimeout.
	AckTimeout time.Duration
	// MaxPartitions is how many partitions this relay publishes while
	// other relays have room for the rest (to spread them over several
	// relays), 1 to Partitions; default all. It is a share, not a wall: a
	// relay at its cap takes the partitions that stayed free for a whole
	// TakeoverInterval (no relay with room took them, as when all the
	// others are capped and one stops), and gives those extras back as
	// soon as a relay with room wants them (it returns, or another
	// starts). Each of its workers keeps to its share of the cap.
	MaxPartitions int
	// Workers is how many workers share this relay's partitions, each on
	// its own connection, so that one claims and marks in the database
	// while another waits for PubAcks; 1 to MaxPartitions, default
	// DefaultWorkers.
	Workers int
	// TakeoverInterval is how often a relay below its cap tries to take
	// partitions nobody owns, and one at or above it looks whether to take
	// them anyway or give its extras back (MaxPartitions); default
	// DefaultTakeoverInterval.
	TakeoverInterval time.Duration
	// Retention keeps published rows (the event log that rebuilds read)
	// this long before they are pruned; 0 keeps them for good.
	Retention time.Duration
	// StreamReplicas is the stream's replication (3 on a cluster), 1 to 5;
	// default DefaultStreamReplicas.
	StreamReplicas int
	// DuplicateWindow overrides the stream's duplicate window (tests).
	DuplicateWindow time.Duration
	// MinAtomicBatch is the fewest events a batch holds to go out as one
	// JetStream atomic batch; a smaller one goes message by message. An
	// atomic batch costs nats-server a fixed 2.5–6 ms (a staging file
	// store created, synced and deleted), a message published alone about
	// 0.25 ms (its own sync): they break even near 16 events
	// (BenchmarkPublishBatch). At least 2; default DefaultMinAtomicBatch;
	// above BatchSize it turns atomic batches off.
	MinAtomicBatch int
	// PublishSeconds, if set, observes how long each batch took to publish,
	// from its first message sent to its last PubAck, in seconds.
	PublishSeconds Observer
	// CommitToPublishedSeconds, if set, observes for every event marked
	// published how long after its outbox row was written (created_at, the
	// start of its transaction by the database clock) this process marked
	// it, in seconds; the two clocks should agree.
	CommitToPublishedSeconds Observer
}

// Observer takes one observation, such as a prometheus.Histogram.
type Observer interface{ Observe(float64) }

// withDefaults returns c with its zero fields set to the defaults, or an
// error naming the first field out of range.
func (c Config) withDefaults() (Config, error) {
	if c.BatchSize == 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.PollInterval == 0 {
		c.PollInterval = DefaultPollInterval
	}
	if c.AckTimeout == 0 {
		c.AckTimeout = DefaultAckTimeout
	}
	if c.MaxPartitions == 0 {
		c.MaxPartitions = DefaultMaxPartitions
	}
	if c.Workers == 0 {
		c.Workers = min(DefaultWorkers, c.MaxPartitions)
	}
	if c.TakeoverInterval == 0 {
		c.TakeoverInterval = DefaultTakeoverInterval
	}
	if c.Linger == 0 {
		c.Linger = DefaultLinger
	}
	if c.StreamReplicas == 0 {
		c.StreamReplicas = DefaultStreamReplicas
	}
	if c.MinAtomicBatch == 0 {
		c.MinAtomicBatch = DefaultMinAtomicBatch
	}
	switch {
	case c.BatchSize < 1 || c.BatchSize > MaxBatchSize:
		return c, fmt.Errorf("outbox relay: BatchSize must be 1 to %d, got %d", MaxBatchSize, c.BatchSize)
	case c.PollInterval < 0:
		return c, fmt.Errorf("outbox relay: PollInterval must not be negative, got %s", c.PollInterval)
	case c.AckTimeout < 0:
		return c, fmt.Errorf("outbox relay: AckTimeout must not be negative, got %s", c.AckTimeout)
	case c.MaxPartitions < 1 || c.MaxPartitions > Partitions:
		return c, fmt.Errorf("outbox relay: MaxPartitions must be 1 to %d, got %d", Partitions, c.MaxPartitions)
	case c.Workers < 1 || c.Workers > c.MaxPartitions:
		return c, fmt.Errorf("outbox relay: Workers must be 1 to MaxPartitions (%d), got %d", c.MaxPartitions, c.Workers)
	case c.Linger < 0 || c.Linger > time.Second:
		return c, fmt.Errorf("outbox relay: Linger must be 0 to 1s, got %s", c.Linger)
	case c.TakeoverInterval < 0:
		return c, fmt.Errorf("outbox relay: TakeoverInterval must not be negative, got %s", c.TakeoverInterval)
	case c.Retention < 0:
		return c, fmt.Errorf("outbox relay: Retention must not be negative, got %s", c.Retention)
	case c.StreamReplicas < 1 || c.StreamReplicas > stream.MaxReplicas:
		return c, fmt.Errorf("outbox relay: StreamReplicas must be 1 to %d, got %d", stream.MaxReplicas, c.StreamReplicas)
	case c.DuplicateWindow < 0:
		return c, fmt.Errorf("outbox relay: DuplicateWindow must not be negative, got %s", c.DuplicateWindow)
	case c.MinAtomicBatch < 2:
		return c, fmt.Errorf("outbox relay: MinAtomicBatch must be at least 2, got %d", c.MinAtomicBatch)
	}
	return c, nil
}

// Relay moves events from the outbox to the stream with Config.Workers
// workers. Run it in one goroutine.
type Relay struct {
	db      *pgxpool.Pool
	js      jetstream.JetStream
	logger  *slog.Logger
	cfg     Config
	workers []*worker

	published, duplicates, pruned atomic.Int64
	atomicBatches, fallbacks      atomic.Int64
	atomicMode                    atomic.Int32 // atomicUnknown, atomicOn or atomicOff
	atomicChecked                 atomic.Int64 // when atomicMode was last learned (mono.Now)
	streamRestored                atomic.Int64 // when restoreStream last ensured the stream (mono.Now; 0: never)
}

// worker owns a share of the relay's partitions on its lease connection.
// Its fields other than ownedCount belong to the one goroutine that runs it
// (Run's, or RelayBatch's caller), so no lock guards them and no lock is
// ever held across a database call.
type worker struct {
	r             *Relay
	logger        *slog.Logger
	maxPartitions int
	wake          chan struct{}

	conn       *pgx.Conn // holds the partition locks
	owned      []int16   // the first maxPartitions are its share, the rest extras
	lastLook   time.Time // when it last rebalanced its partitions
	wanting    bool      // it holds the shared lock (wantClass, 0): it has room
	seenFree   []int16   // the partitions nobody owned at its last look, when full
	ownedCount atomic.Int64
	lingers    atomic.Int64
}

// NewRelay returns a relay from db to the stream on js. It returns an error
// naming the field when cfg is out of range.
func NewRelay(db *pgxpool.Pool, js jetstream.JetStream, logger *slog.Logger, cfg Config) (*Relay, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	r := &Relay{db: db, js: js, logger: logger, cfg: cfg}
	for i := range cfg.Workers {
		share := cfg.MaxPartitions / cfg.Workers // and one more for the first MaxPartitions % Workers
		if i < cfg.MaxPartitions%cfg.Workers {
			share++
		}
		r.workers = append(r.workers, &worker{
			r: r, logger: logger.With("worker", i), wake: make(chan struct{}, 1), maxPartitions: share,
		})
	}
	return r, nil
}

// Stats are the relay's counters since start.
type Stats struct {
	Published  int64 // rows marked published
	Duplicates int64 // PubAcks that reported a duplicate Nats-Msg-Id
	// AtomicBatches counts batches stored by JetStream as one atomic batch;
	// Fallbacks those it refused (a duplicate inside, most often) and the
	// relay then published message by message.
	AtomicBatches int64
	Fallbacks     int64
	Pruned        int64 // published rows deleted after the retention
	Partitions    int64 // partitions owned now
	Lingers       int64 // wake-ups a worker lingered after (Config.Linger)
}

// Stats returns the relay's counters.
func (r *Relay) Stats() Stats {
	var owned, lingers int64
	for _, w := range r.workers {
		owned += w.ownedCount.Load()
		lingers += w.lingers.Load()
	}
	return Stats{
		Published: r.published.Load(), Duplicates: r.duplicates.Load(), Pruned: r.pruned.Load(), Partitions: owned,
		AtomicBatches: r.atomicBatches.Load(), Fallbacks: r.fallbacks.Load(), Lingers: lingers,
	}
}

// Run relays until ctx ends. It ensures the stream exists first (retrying
// while NATS is unreachable), then runs the workers and one listener they
// share, which wakes them on NOTIFY outbox (sent after their commits by
// writers in other processes, postgres.Notifier); writers in this process
// call Wake. The workers poll as a fallback, and ensure the stream again
// when a publish finds it missing (restoreStream).
// Failures are logged and retried with a backoff. Run returns only when ctx
// ends, after every goroutine it started has ended and every connection it
// took outside the pool is closed (so the partitions are released).
func (r *Relay) Run(ctx context.Context) {
	for ctx.Err() == nil {
		if err := r.ensureStream(ctx); err != nil {
			if ctx.Err() != nil {
				break // stopping, not failing
			}
			r.logger.ErrorContext(ctx, "relay cannot ensure stream; retrying", "err", err)
			sleep(ctx, 2*time.Second)
			continue
		}
		break
	}
	var wg sync.WaitGroup
	wg.Go(func() { postgres.Listen(ctx, r.db, "outbox", r.logger, func(string) { r.Wake() }) })
	for i, w := range r.workers {
		wg.Go(func() { w.run(ctx, i == 0) })
	}
	<-ctx.Done()
	stopping := time.Now()
	wg.Wait()
	r.logger.Info("relay stopped: batches in flight finished, partitions released, connections closed",
		"duration", time.Since(stopping))
}

// ensureStream creates the stream, or updates it to the relay's settings,
// and learns from it whether it takes atomic batches.
func (r *Relay) ensureStream(ctx context.Context) error {
	s, err := stream.Ensure(ctx, r.js, stream.Settings{Replicas: r.cfg.StreamReplicas, DuplicateWindow: r.cfg.DuplicateWindow})
	if err != nil {
		return err
	}
	r.setAtomicMode(s.CachedInfo().Config.AllowAtomicPublish)
	return nil
}

// streamRestoreInterval is the least time between two restoreStream calls
// that ensure the stream: the relay's workers all fail together when it is
// lost, and keep failing while NATS cannot create it.
const streamRestoreInterval = 2 * time.Second

// streamMissing reports whether a publish failed because no stream takes
// the event's subject: nobody answered it (JetStream's no-responders
// status, or nats-server's for the commit of an atomic batch).
func streamMissing(err error) bool {
	return errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, jetstream.ErrStreamNotFound)
}

// restoreStream ensures the stream again, with the settings Run started
// with, after a publish found it missing: NATS came back without its
// JetStream state (a server restarted on an empty store), or an operator
// deleted the stream. Run ensures it only at start, so without this every
// batch failed with "no response from stream" until the relay restarted.
// It runs at most once per streamRestoreInterval across the workers; the
// others retry on their backoff. A stream that exists (no responders for
// another reason, such as a cluster electing its leader) is left as it is
// unless its settings differ, as at start.
func (r *Relay) restoreStream(ctx context.Context) {
	last := r.streamRestored.Load()
	now := mono.Now()
	if last != 0 && now-last < int64(streamRestoreInterval) || !r.streamRestored.CompareAndSwap(last, now) {
		return
	}
	if err := r.ensureStream(ctx); err != nil {
		if ctx.Err() == nil {
			r.logger.ErrorContext(ctx, "relay cannot ensure the missing stream; retrying", "err", err)
		}
		return
	}
	r.logger.WarnContext(ctx, "relay found no stream answering its publishes; ensured it", "stream", stream.Name)
}

// run is the loop of one worker; the first one also prunes.
func (w *worker) run(ctx context.Context, prunes bool) {
	defer w.release()
	r := w.r
	backoff := 100 * time.Millisecond
	lastPrune := time.Time{}
	var lastFound time.Time // when a claim that found rows ended
	for ctx.Err() == nil {
		if prunes && r.cfg.Retention > 0 && time.Since(lastPrune) > time.Minute {
			lastPrune = time.Now()
			if err := r.Prune(ctx); err != nil && ctx.Err() == nil {
				w.logger.WarnContext(ctx, "prune published outbox rows", "err", err)
			}
		}
		n, err := w.relayBatch(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			w.logger.ErrorContext(ctx, "relay batch failed; retrying", "err", err, "backoff", backoff)
			if streamMissing(err) {
				r.restoreStream(ctx)
			}
			sleep(ctx, backoff)
			backoff = min(2*backoff, 10*time.Second)
			continue
		case n == r.cfg.BatchSize:
			lastFound = time.Now()
			continue // more is waiting
		case n > 0:
			lastFound = time.Now()
		}
		backoff = 100 * time.Millisecond
		select {
		case <-ctx.Done():
		case <-w.wake:
			if time.Since(lastFound) < 20*r.cfg.Linger {
				w.lingers.Add(1)
				sleep(ctx, r.cfg.Linger) // busy: let more commit into this batch
				select {
				case <-w.wake: // the claim below covers what woke it meanwhile
				default:
				}
			}
		case <-time.After(r.cfg.PollInterval):
		}
	}
}

// OwnsAll reports whether this relay publishes every partition now: then
// no other relay has anything to publish, and only this one needs waking.
func (r *Relay) OwnsAll() bool {
	var owned int64
	for _, w := range r.workers {
		owned += w.ownedCount.Load()
	}
	return owned >= Partitions
}

// Wake makes the waiting workers of Run look at the outbox now. It never
// blocks.
func (r *Relay) Wake() {
	for _, w := range r.workers {
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
