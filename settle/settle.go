// Package settle is the payment worker's runtime: it consumes the intent
// events (payment.requested, refund.requested) from JetStream, asks the
// payment provider to charge or refund with the idempotency key the intent
// carries, outside any transaction, and records the outcome through
// command.RecordChargeOutcome / command.RecordRefundOutcome (one
// transaction with an inbox row) before it acks.
//
// Every step may run again after a crash, a lost answer or a redelivery:
// the provider replays its first answer for the same key, and the inbox
// row makes a second recording a no-op. A failure no retry cures goes to
// dead_letters (with the consumer's name in its projection column), where
// `worker dead-letters retry|discard` resolves it. A tenant's excess over
// its share of the slots waits there too, parked out of the consumer's
// window until the re-drive settles it (park.go).
package settle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/acme/orders/payment"
	"github.com/acme/orders/postgres"
)

// Provider is the payment provider as the worker uses it; payment.Stripe
// implements it. Errors wrap payment.ErrTransient (retry with the same key)
// or payment.ErrPermanent (dead-letter); a decline or a failed refund is an
// outcome, not an error.
type Provider interface {
	Charge(ctx context.Context, r payment.ChargeRequest) (payment.Charge, error)
	Refund(ctx context.Context, r payment.RefundRequest) (payment.Refund, error)
	FindCharge(ctx context.Context, idempotencyKey string) (payment.Charge, bool, error)
	FindRefund(ctx context.Context, chargeID, idempotencyKey string) (payment.Refund, bool, error)
}

var _ Provider = (*payment.Stripe)(nil)

// The durable consumers, one per intent; their names are also the inbox's
// consumer and the dead letters' projection.
const (
	ChargeConsumer = "payment_worker_charges"
	RefundConsumer = "payment_worker_refunds"
)

// Consumers are the names of every consumer of the worker.
var Consumers = []string{ChargeConsumer, RefundConsumer}

// Defaults of Config.
const (
	// DefaultConcurrency is how many intents one process works on at once,
	// per consumer. An intent mostly waits (the provider's answer, two
	// commits): at 8, one worker settled about 100 payments/s on the 2-core
	// bench machine, below 25% of the create rate once creates no longer
	// NOTIFY (#12), and pay → paid queued for seconds; 32 keeps up.
	DefaultConcurrency = 32
	// DefaultAckWait is how long JetStream waits for an ack before it
	// redelivers: how long the intents of a worker that died (kill -9, a
	// crash) wait to be settled by another or by its restart. An intent
	// being worked on is kept in progress (every AckWait/3), however long
	// its provider call with the adapter's own retries (3 × 10 s +
	// backoff) and the recording after it take. It was a minute: after a
	// kill -9 under load, orders stayed payment_pending for up to two.
	DefaultAckWait = 10 * time.Second
	// DefaultMaxDeliver is how many deliveries an intent gets before it is
	// dead-lettered.
	DefaultMaxDeliver = 10
	// MaxAckWait and MaxMaxDeliver bound Config.AckWait and
	// Config.MaxDeliver, as the projector's are bounded: the time a
	// failure is remembered adds up the ack wait and the backoffs, and far
	// past these it would wrap time.Duration negative (failures forgotten
	// at once, an intent never dead-lettered).
	MaxAckWait    = time.Hour
	MaxMaxDeliver = 10_000
	// DefaultMinBackoff and DefaultMaxBackoff bound the delay of the next
	// try after a transient failure (doubling per failure): parked that
	// long (park.go), or handed back for that long if its park fails.
	DefaultMinBackoff = 500 * time.Millisecond
	DefaultMaxBackoff = 30 * time.Second
	// DefaultMaxAckPending is each consumer's in-flight window: intents
	// delivered and not yet acked (a failed or deferred one leaves it,
	// parked, unless its park fails: then it waits there).
	DefaultMaxAckPending = 1000
	// DefaultTenantShare is the most of a consumer's Concurrency one tenant
	// may hold at once in this process (16 of the default 32 slots): a
	// tenant whose provider calls hang leaves the other half of the slots
	// to every other tenant, and a single busy tenant still settles with
	// 16 at once.
	DefaultTenantShare = 0.5
	// DefaultDeferDelay is how often the re-drive looks for parked
	// intents besides when a slot frees up (park.go), and how long an
	// intent waits to be delivered again when its park failed.
	DefaultDeferDelay = time.Second
	// DefaultShutdownTimeout bounds how long Run waits, once its context
	// ends, for the intents in hand to be charged, recorded and acked.
	DefaultShutdownTimeout = 30 * time.Second
	// DefaultLease is how long a lease of a parked intent lasts unless it
	// is renewed: the process holding it renews it every Lease/3 until the
	// result is written (lease.go), however long the call takes, so it
	// only bounds how long a parked intent whose process died waits for
	// another (it was a fixed 2 min, unrenewed, before: the fault suite's
	// drains waited out a killed worker's leases).
	DefaultLease = 30 * time.Second
	// DefaultProviderSearchLag is Config.ProviderSearchLag's default: Stripe's
	// search shows a charge within a minute.
	DefaultProviderSearchLag = time.Minute
	// DefaultSpentKeyWait is Config.SpentKeyWait's default with a provider
	// whose search lags: Stripe's search is within a minute "under normal
	// operating conditions" but "can be up to an hour behind during
	// outages", which is when it stores 500s.
	DefaultSpentKeyWait = 2 * time.Hour
)

// Config configures a Worker. A zero field takes its default.
type Config struct {
	// Concurrency is how many intents of each consumer this process works
	// on at once (DefaultConcurrency).
	Concurrency int
	// AckWait: redeliver an intent after this long without an ack
	// (DefaultAckWait; at least 1 s).
	AckWait time.Duration
	// MaxDeliver: dead-letter an intent after this many failed deliveries
	// (DefaultMaxDeliver), counted by this process while it is delivered
	// (see failures) and on its row once it is parked (park.go): a
	// deferral past the tenant's share is no failure, and a failure that
	// is the provider giving no outcome (down, 5xx, 429) never opens a
	// dead letter: the intent stays parked until it answers (exhausted).
	MaxDeliver int
	// MinBackoff and MaxBackoff bound the delay of the next try after a
	// transient failure (DefaultMinBackoff, DefaultMaxBackoff).
	MinBackoff, MaxBackoff time.Duration
	// MaxAckPending is each consumer's in-flight window
	// (DefaultMaxAckPending).
	MaxAckPending int
	// ShutdownTimeout bounds the wait for intents in hand on stop
	// (DefaultShutdownTimeout).
	ShutdownTimeout time.Duration
	// Lease is how long a lease of a parked intent the re-drive took lasts
	// unless renewed (it is, every Lease/3, while this process has the
	// intent in hand; a job whose lease was not confirmed for half of it
	// is dropped, and tried again once it ends); default DefaultLease.
	Lease time.Duration
	// TenantShare is the most of Concurrency (at least one slot) that one
	// tenant's intents may hold at once, per consumer, in this process;
	// in (0, 1], default DefaultTenantShare. An intent of a tenant at its
	// share is deferred: parked out of the consumer's window and re-driven
	// when the tenant has a free slot (park.go), which does not count as a
	// failed delivery, so that other tenants are served while its provider
	// calls are slow.
	TenantShare float64
	// DeferDelay is how often the re-drive looks for parked intents
	// besides when a slot frees up, and how long an intent whose park
	// failed waits to be delivered again (DefaultDeferDelay; at least
	// 10 ms).
	DeferDelay time.Duration
	// StreamReplicas is the replication of the stream (if this process
	// creates it) and of the consumers (1 when 0).
	StreamReplicas int
	// ProviderSearchLag is how long the provider's search of charges may
	// lag its writes (DefaultProviderSearchLag, Stripe's; -1 for none, as
	// fakepsp's). DiscardDeadLetter refuses a charge's dead letter younger
	// than that: its look-up could miss the charge.
	ProviderSearchLag time.Duration
	// SpentKeyWait is how long a charge key the provider spent on a stored
	// 500 (payment.ErrKeySpent) must have been known spent before a search
	// that finds no charge under it is trusted, and the payment declined
	// (see spentCharge): DefaultSpentKeyWait, or none (-1) when
	// ProviderSearchLag is none. A decline too early would let the
	// customer pay again while the failed request's charge still shows up.
	SpentKeyWait time.Duration
	// AfterProviderCall, when set, runs after each provider call answered
	// and before its outcome is recorded; a non-nil error abandons the
	// intent there, neither recorded nor acked, as if the process had died
	// (tests use it to crash in that window).
	AfterProviderCall func(ctx context.Context, consumer string, eventID uuid.UUID) error
	// AfterRecord, when set, is called after each outcome's transaction
	// committed (its outbox event with it), outside it: the worker process
	// wakes the relays with it (a coalesced NOTIFY, postgres.Notifier). It
	// must not block.
	AfterRecord func()
	// Observe, when set, takes the timings of each outcome this process
	// recorded (not of a redelivery found recorded before), with the
	// consumer that settled it (ChargeConsumer or RefundConsumer). It must
	// not block.
	Observe func(consumer string, t Timing)
}

// Timing is how long one settled intent took, in its parts.
type Timing struct {
	// Provider is the provider's answer: the call (or, on a redelivery,
	// the look-up of the charge its key made), with the adapter's retries.
	Provider time.Duration
	// Record is the transaction recording the outcome.
	Record time.Duration
	// Settled is from the intent's event (its OccurredAt, the api's clock)
	// to its outcome committed: the relay, the queue before the worker,
	// the provider and the recording; 0 if the event carries no time or
	// one ahead of this process's clock.
	Settled time.Duration
}

// Validate reports the first invalid field of c (after defaults), naming it.
func (c Config) Validate() error { return c.setDefaults() }

func (c *Config) setDefaults() error {
	if c.Concurrency == 0 {
		c.Concurrency = DefaultConcurrency
	}
	if c.AckWait == 0 {
		c.AckWait = DefaultAckWait
	}
	if c.MaxDeliver == 0 {
		c.MaxDeliver = DefaultMaxDeliver
	}
	if c.MinBackoff == 0 {
		c.MinBackoff = DefaultMinBackoff
	}
	if c.MaxBackoff == 0 {
		c.MaxBackoff = DefaultMaxBackoff
	}
	if c.MaxAckPending == 0 {
		c.MaxAckPending = DefaultMaxAckPending
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = DefaultShutdownTimeout
	}
	if c.Lease == 0 {
		c.Lease = DefaultLease
	}
	if c.StreamReplicas == 0 {
		c.StreamReplicas = 1
	}
	if c.TenantShare == 0 {
		c.TenantShare = DefaultTenantShare
	}
	if c.DeferDelay == 0 {
		c.DeferDelay = DefaultDeferDelay
	}
	switch c.ProviderSearchLag {
	case 0:
		c.ProviderSearchLag = DefaultProviderSearchLag
	case -1:
		c.ProviderSearchLag = 0
	}
	switch {
	case c.SpentKeyWait == -1:
		c.SpentKeyWait = 0
	case c.SpentKeyWait == 0 && c.ProviderSearchLag > 0:
		c.SpentKeyWait = max(DefaultSpentKeyWait, c.ProviderSearchLag)
	}
	switch {
	case c.Concurrency < 1 || c.Concurrency > 256:
		return fmt.Errorf("settle: Config.Concurrency must be 1 to 256, got %d", c.Concurrency)
	case c.AckWait < time.Second || c.AckWait > MaxAckWait:
		return fmt.Errorf("settle: Config.AckWait must be 1s to %s, got %s", MaxAckWait, c.AckWait)
	case c.MaxDeliver < 1 || c.MaxDeliver > MaxMaxDeliver:
		return fmt.Errorf("settle: Config.MaxDeliver must be 1 to %d, got %d", MaxMaxDeliver, c.MaxDeliver)
	case c.MinBackoff < 0 || c.MaxBackoff < c.MinBackoff:
		return fmt.Errorf("settle: Config.MinBackoff (%s) and MaxBackoff (%s) must satisfy 0 ≤ min ≤ max", c.MinBackoff, c.MaxBackoff)
	case c.MaxAckPending < 1:
		return fmt.Errorf("settle: Config.MaxAckPending must be at least 1, got %d", c.MaxAckPending)
	case c.Lease < time.Second:
		return fmt.Errorf("settle: Config.Lease must be at least 1s, got %s", c.Lease)
	case c.ShutdownTimeout < 0:
		return fmt.Errorf("settle: Config.ShutdownTimeout must not be negative, got %s", c.ShutdownTimeout)
	case c.StreamReplicas < 1 || c.StreamReplicas > 5:
		return fmt.Errorf("settle: Config.StreamReplicas must be 1 to 5, got %d", c.StreamReplicas)
	case !(c.TenantShare > 0 && c.TenantShare <= 1):
		return fmt.Errorf("settle: Config.TenantShare must be in (0, 1], got %v", c.TenantShare)
	case c.ProviderSearchLag < 0:
		return fmt.Errorf("settle: Config.ProviderSearchLag must be -1 (none) or positive, got %s", c.ProviderSearchLag)
	case c.DeferDelay < 10*time.Millisecond:
		return fmt.Errorf("settle: Config.DeferDelay must be at least 10ms, got %s", c.DeferDelay)
	}
	return nil
}

// tenantLimit is how many intents of one consumer one tenant may hold at
// once in this process: TenantShare of Concurrency, at least one.
func (c Config) tenantLimit() int {
	return max(1, int(c.TenantShare*float64(c.Concurrency)))
}

// sharedSlots is how many of a consumer's Concurrency slots tenants may
// hold in all before one that holds a slot gets no other: an eighth (4 of
// the default 32) is kept for tenants that hold none. With each tenant
// under its share alone, two tenants whose provider calls hang held all 32,
// and another tenant's charge waited 8 to 66 s (an audit); the reserve
// serves it at once.
func (c Config) sharedSlots() int {
	return c.Concurrency - c.Concurrency/8
}

// failureTTL is how long a message's failure count is kept unseen: longer
// than it can be away between two deliveries to this process.
func (c Config) failureTTL() time.Duration {
	return 2 * (c.MaxBackoff + c.AckWait + c.DeferDelay)
}

// Worker settles payment and refund intents. Create it with New; Run
// consumes until its context ends. It is safe to run in any number of
// processes at once: they share the durable consumers.
type Worker struct {
	db       postgres.DB
	js       jetstream.JetStream
	provider Provider
	logger   *slog.Logger
	cfg      Config
	stats    counters
	spent    spentKeys
}

// New returns a Worker that records in db (a *pgxpool.Pool), consumes from
// js (nil for one that only resolves dead letters) and calls provider. It
// returns an error naming an invalid Config field.
func New(db postgres.DB, js jetstream.JetStream, provider Provider, logger *slog.Logger, cfg Config) (*Worker, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	if db == nil || provider == nil {
		return nil, errors.New("settle: New needs a database and a provider")
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Worker{db: db, js: js, provider: provider, logger: logger, cfg: cfg}, nil
}

// backoff is the delay of the next try after the delivery-th failed
// delivery: MinBackoff doubled per delivery up to MaxBackoff, less up to a
// quarter at random, so that the intents an outage failed together do not
// all call the provider again in the same instant when it is back.
func (w *Worker) backoff(delivery uint64) time.Duration {
	d := w.cfg.MinBackoff
	for i := uint64(1); i < delivery && d < w.cfg.MaxBackoff; i++ {
		d *= 2
	}
	d = min(d, w.cfg.MaxBackoff)
	return d - rand.N(d/4+1)
}
