package settle

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/acme/orders/domain"
	"github.com/acme/orders/stream"
	"github.com/acme/orders/tracing"
)

// consumers pairs each durable consumer with the intent it settles.
var consumers = []struct{ name, eventType string }{
	{ChargeConsumer, domain.TypePaymentRequested},
	{RefundConsumer, domain.TypeRefundRequested},
}

// Consumer creates or updates the durable consumer name (ChargeConsumer or
// RefundConsumer) and returns it. Like the projector's, the server's
// MaxDeliver is unlimited: the worker dead-letters an intent itself at
// Config.MaxDeliver, so the server never drops one silently.
// DeliverAllPolicy: a new consumer, or one created again after it was lost,
// starts at the stream's first message (see Run for why that is safe).
func (w *Worker) Consumer(ctx context.Context, name string) (jetstream.Consumer, error) {
	if w.js == nil {
		return nil, errors.New("settle: this worker has no JetStream")
	}
	var eventType string
	for _, c := range consumers {
		if c.name == name {
			eventType = c.eventType
		}
	}
	if eventType == "" {
		return nil, fmt.Errorf("settle: no consumer %q", name)
	}
	if _, err := stream.Open(ctx, w.js, stream.Settings{Replicas: w.cfg.StreamReplicas}); err != nil {
		return nil, err
	}
	c, err := w.js.CreateOrUpdateConsumer(ctx, stream.Name, jetstream.ConsumerConfig{
		Durable:       name,
		Description:   "payment worker: " + eventType,
		FilterSubject: stream.Subject(eventType),
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       w.cfg.AckWait,
		MaxDeliver:    -1,
		MaxAckPending: w.cfg.MaxAckPending,
		Replicas:      w.cfg.StreamReplicas,
	})
	if err != nil {
		return nil, fmt.Errorf("create or update consumer %s: %w", name, err)
	}
	return c, nil
}

// Run settles intents of both consumers until ctx ends. It retries its
// set-up while NATS is unreachable, and creates a consumer (and the stream)
// again whenever it is lost (stream.Consume): deleted, or gone with NATS's
// JetStream state. On shutdown it finishes each intent in hand (provider
// call, recording, ack) within Config.ShutdownTimeout and hands the
// buffered ones back at once (Nak).
//
// A consumer created again (DeliverAllPolicy, see Consumer) delivers every
// intent of the stream again. That is safe, only slower: each is handled
// as a copy republished past the duplicate window is (G8). One whose
// outcome is recorded is acked without a provider call (payment_inbox); one
// in flight or parked is settled with the same idempotency key, so the
// provider replays the charge or refund it made. The lost consumer's
// intents still in hand are settled too, but not acked
// (stream.ErrConsumerLost): their copies from the new consumer are no-ops.
func (w *Worker) Run(ctx context.Context) error {
	g, gctx := errgroup.WithContext(ctx)
	for _, c := range consumers {
		g.Go(func() error { return w.consume(gctx, c.name) })
	}
	return g.Wait()
}

func (w *Worker) consume(ctx context.Context, name string) (err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	msgs := make(chan handed, w.cfg.Concurrency)
	consumed := make(chan error, 1)
	go func() { consumed <- w.feed(ctx, cancel, name, msgs) }()
	defer func() {
		cancel()
		if cerr := <-consumed; cerr != nil {
			err = fmt.Errorf("consume %s: %w", name, cerr)
		}
		for {
			select {
			case h := <-msgs:
				h.stop()
				_ = h.msg.Nak()
			default:
				return
			}
		}
	}()

	// The intents in hand are finished after ctx ends, within
	// ShutdownTimeout: a provider call already made is recorded and acked
	// rather than left to a redelivery.
	work, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	stopTimer := context.AfterFunc(ctx, func() { time.AfterFunc(w.cfg.ShutdownTimeout, cancelWork) })
	defer stopTimer()

	// The workers settle delivered intents and parked ones the re-drive
	// leased (park.go), Concurrency at once in all.
	slots, fails := newTenantSlots(w.cfg.tenantLimit(), w.cfg.sharedSlots()), newFailures(w.cfg.failureTTL())
	jobs := make(chan parked)
	held := newLeases()
	// The leases in hand are renewed until the last job is written, after
	// ctx ends too (the workers finish on work).
	renewing, stopRenewing := context.WithCancel(work)
	renewed := make(chan struct{})
	go func() { defer close(renewed); w.keepLeases(renewing, name, held) }()
	defer func() { stopRenewing(); <-renewed }()
	var wg sync.WaitGroup
	wg.Go(func() { w.redrive(ctx, name, slots, held, jobs) })
	for range w.cfg.Concurrency {
		wg.Go(func() {
			for {
				select {
				case <-ctx.Done():
					return
				case h := <-msgs:
					w.process(work, name, slots, fails, h.msg)
					h.stop()
				case p := <-jobs:
					w.settleParked(work, name, held, p)
					slots.release(p.Tenant)
				}
			}
		})
	}
	wg.Wait()
	return nil
}

// handed is a delivered intent on its way to a worker, kept in progress
// (stop ends that) from when feed takes it until it is settled: waiting
// for a free worker while every one is in a provider call, or in the call
// itself with its retries, may outlast the ack wait, and the intent is not
// delivered again meanwhile.
type handed struct {
	msg  jetstream.Msg
	stop func()
}

// feed fills msgs from the consumer name until ctx ends (see Run). If it
// cannot consume at all (an invalid option), it ends the run with cancel
// and returns why.
func (w *Worker) feed(ctx context.Context, cancel func(), name string, msgs chan<- handed) error {
	open := func(ctx context.Context) (jetstream.Consumer, error) { return w.Consumer(ctx, name) }
	err := stream.Consume(ctx, open, func(m jetstream.Msg) {
		h := handed{msg: m, stop: stream.KeepInProgress(w.cfg.AckWait, m)}
		select {
		case msgs <- h:
		case <-ctx.Done():
			h.stop()
			_ = m.Nak()
		}
	}, w.logger.With("consumer", name), jetstream.PullMaxMessages(w.cfg.Concurrency))
	if err != nil {
		cancel()
	}
	return err
}

// process settles one delivered intent and acks or terminates it. An
// intent whose tenant holds its share of slots, or has intents parked, is
// parked instead (park.go; see Config.TenantShare); one that fails
// transiently is parked on its backoff (parkFailed: out of the consumer's
// window, retried by the re-drive), unless fails counts Config.MaxDeliver
// failures not the provider's (exhausted), when it is dead-lettered. It is nak'ed only when its row cannot
// be written.
func (w *Worker) process(ctx context.Context, consumer string, slots *tenantSlots, fails *failures, m jetstream.Msg) {
	var delivered uint64 = 1
	var seq uint64
	if md, err := m.Metadata(); err == nil {
		delivered, seq = md.NumDelivered, md.Sequence.Stream
	}
	env, err := domain.DecodeEnvelope(m.Data())
	if err == nil {
		if !slots.acquireDirect(env.TenantID) {
			// Not a failure: nothing was tried. The tenant's intents in
			// hand and parked before finish first; the others' go on
			// meanwhile.
			w.park(ctx, consumer, m, env, seq, delivered, slots, fails)
			return
		}
		defer slots.release(env.TenantID)
	}
	ctx, span := traceIntent(ctx, consumer, m)
	defer span.End()
	r := result{verdict: dead, err: err}
	if err == nil {
		// Redelivered: an earlier delivery may have reached the provider,
		// unless every one of them was handed back here. (One deferred by
		// another process counts as one that may have: a look-up too many
		// costs a call, one too few could cost a second charge.)
		redelivered := int64(delivered)-int64(fails.get(seq).deferred) > 1
		r = w.settleEnvelope(ctx, consumer, env, redelivered)
	}
	tracing.Fail(span, r.err)
	switch r.verdict {
	case done:
		fails.forget(seq)
		if r.timing != nil && w.cfg.Observe != nil {
			w.cfg.Observe(consumer, *r.timing)
		}
		if err := m.Ack(); err != nil {
			w.logger.WarnContext(ctx, "ack (the intent will be redelivered and found recorded)", "consumer", consumer, "stream_seq", seq, "err", err)
		}
	case abandon:
		w.logger.WarnContext(ctx, "intent abandoned before recording; it will be redelivered after the ack wait", "consumer", consumer, "stream_seq", seq, "err", r.err)
	case retry:
		// failed counts this process's failures of the intent that were
		// ours (exhausted); backoff grows with every delivery.
		failed := int(delivered) // without a sequence, every delivery counts
		switch {
		case r.providerDown && seq != 0:
			failed = fails.get(seq).n
		case r.providerDown:
			failed = 0
		case seq != 0:
			failed = fails.add(seq, time.Now())
		}
		if !w.exhausted(r, failed) {
			delay := w.backoff(max(delivered, uint64(failed)))
			w.logger.WarnContext(ctx, "intent failed; retrying with the same key", "consumer", consumer, "stream_seq", seq,
				"delivery", delivered, "failures", failed, "retry_in", delay, "err", r.err)
			// Parked, not handed back: a nak'ed intent waits out its
			// backoff pending in the window (G9).
			if w.parkFailed(ctx, consumer, m, env, seq, failed, delay, r.err, slots, fails) {
				return
			}
			if err := m.NakWithDelay(delay); err != nil {
				w.logger.WarnContext(ctx, "nak (the intent will be redelivered after the ack wait)", "consumer", consumer, "err", err)
			}
			return
		}
		r.err = fmt.Errorf("still failing after %d failed deliveries: %w", failed, r.err)
		fallthrough
	case dead:
		if err := w.deadLetter(ctx, consumer, m.Subject(), m.Data(), seq, delivered, r.err); err != nil {
			w.logger.ErrorContext(ctx, "dead-letter failed; retrying the intent", "consumer", consumer, "stream_seq", seq, "err", err)
			_ = m.NakWithDelay(w.backoff(delivered))
			return
		}
		fails.forget(seq)
		w.stats.deadLettered(consumer)
		w.logger.ErrorContext(ctx, "intent dead-lettered", "consumer", consumer, "stream_seq", seq, "err", r.err)
		if err := m.Term(); err != nil {
			w.logger.WarnContext(ctx, "term (a redelivery finds the dead letter's outcome missing and tries again)", "consumer", consumer, "err", err)
		}
	}
}
