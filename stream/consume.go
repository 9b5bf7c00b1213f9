package stream

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ErrConsumerLost is what settling (Ack, Nak, Term, …) a message returns
// when the consumer that delivered it is gone (see Consume): the settlement
// is not sent. The consumer created in its place delivers the message
// again, unless it was lost with the stream.
var ErrConsumerLost = errors.New("stream: the consumer that delivered this message is gone; not settled")

// How long Consume waits before it creates a lost consumer again: reopenMin
// after the first loss, doubling while consumers keep being lost or cannot
// be created, up to reopenMax.
const (
	reopenMin = 250 * time.Millisecond
	reopenMax = 5 * time.Second
)

// Consume feeds handler the messages of a durable pull consumer until ctx
// ends, and keeps feeding it when the consumer is lost. A consumer is lost
// when an operator deletes it or the stream, or when NATS comes back
// without its JetStream state (a server restarted on an empty store): the
// pulls of a deleted consumer end with jetstream.ErrConsumerDeleted, and a
// consumer that vanished with its server gets nats.ErrNoResponders until
// its absence is confirmed (ConsumerInfo: consumer or stream not found).
// nats.go's Consume notices neither, so without this a projector or a
// payment worker stayed idle for good while events piled up.
//
// open creates the consumer, or updates it (and creates the stream if it is
// missing): Consume calls it at start and again after each loss, with a
// backoff (reopenMin doubling to reopenMax) while it fails or the consumer
// keeps being lost. A consumer created again delivers what its config says
// (with DeliverAllPolicy, the whole stream again): the caller must take
// redeliveries as no-ops. Settling a message of a lost consumer returns
// ErrConsumerLost and sends nothing: JetStream matches an ack by stream
// sequence only, so a late ack of the old consumer's message would settle
// the new consumer's message of that sequence, a different event if the
// stream was created anew.
//
// opts are the pull options (ConsumeOptions applies on top of them); they
// must not set ConsumeErrHandler: Consume logs the errors on logger. It
// returns an error only when Consume refuses the options (a bug, not an
// outage); otherwise it retries until ctx ends and returns nil.
func Consume(ctx context.Context, open func(context.Context) (jetstream.Consumer, error), handler jetstream.MessageHandler,
	logger *slog.Logger, opts ...jetstream.PullConsumeOpt) error {
	return ConsumeWith(ctx, open, handler, logger, func() []jetstream.PullConsumeOpt { return opts })
}

// ConsumeWith is Consume with the pull options chosen at each start of the
// consume, once open has succeeded (so NATS is connected): options that
// depend on the server, such as a byte limit of at least its max payload.
func ConsumeWith(ctx context.Context, open func(context.Context) (jetstream.Consumer, error), handler jetstream.MessageHandler,
	logger *slog.Logger, opts func() []jetstream.PullConsumeOpt) error {
	wait := reopenMin
	for ctx.Err() == nil {
		cons, err := open(ctx)
		if err != nil {
			if ctx.Err() == nil {
				logger.ErrorContext(ctx, "cannot create the consumer; retrying", "err", err, "retry_in", wait)
			}
			wait = pause(ctx, wait)
			continue
		}
		started := time.Now()
		ended, err := consumeOnce(ctx, cons, handler, logger, opts())
		if err != nil {
			return err
		}
		if ctx.Err() != nil {
			break
		}
		if time.Since(started) > reopenMax {
			wait = reopenMin // it ran long: this loss is news, not a flap
		}
		logger.WarnContext(ctx, "consumer stopped; creating it again", "why", ended, "retry_in", wait)
		wait = pause(ctx, wait)
	}
	return nil
}

// pause waits d (or until ctx ends) and returns the next wait.
func pause(ctx context.Context, d time.Duration) time.Duration {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
	return min(2*d, reopenMax)
}

// consumeOnce runs one Consume of cons until ctx ends (ended is nil then)
// or the consume ends otherwise: the consumer was lost, or nats.go stopped
// it. err is set only when Consume refused to start for a bug (an invalid
// option); a start that failed otherwise (the connection closed) is an
// end like the others.
func consumeOnce(ctx context.Context, cons jetstream.Consumer, handler jetstream.MessageHandler, logger *slog.Logger,
	opts []jetstream.PullConsumeOpt) (ended, err error) {
	s := &session{}
	var deleted atomic.Bool
	suspect := make(chan struct{}, 1)
	onErr := jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
		logger.WarnContext(ctx, "consume", "err", err)
		switch {
		case errors.Is(err, jetstream.ErrConsumerDeleted):
			deleted.Store(true) // set before nats.go stops the consume
		case errors.Is(err, nats.ErrNoResponders), errors.Is(err, jetstream.ErrConsumerNotFound):
			select { // the consumer may be gone with its server's state: look
			case suspect <- struct{}{}:
			default:
			}
		}
	})
	cc, err := cons.Consume(func(m jetstream.Msg) { handler(&sessionMsg{Msg: m, s: s}) },
		ConsumeOptions(append(slices.Clip(opts), onErr)...)...)
	if errors.Is(err, jetstream.ErrInvalidOption) || errors.Is(err, jetstream.ErrHandlerRequired) {
		return nil, err
	}
	if err != nil {
		return err, nil
	}
	defer cc.Stop()
	closed := cc.Closed()
	for {
		select {
		case <-ctx.Done():
			return nil, nil
		case <-closed:
			if deleted.Load() || missing(ctx, cons) {
				s.lose()
				return jetstream.ErrConsumerDeleted, nil
			}
			return errors.New("the consume stopped"), nil
		case <-suspect:
			if missing(ctx, cons) {
				s.lose()
				return jetstream.ErrConsumerNotFound, nil
			}
		}
	}
}

// missing reports whether the server says that cons, or its stream, does
// not exist. An answer it cannot get (NATS unreachable) is not "missing":
// nats.go goes on pulling, and the next error asks again.
func missing(ctx context.Context, cons jetstream.Consumer) bool {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := cons.Info(ctx)
	return errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound)
}

// session is one Consume of a consumer. Once its consumer is lost, its
// messages are settled no more (ErrConsumerLost). The lock makes lose wait
// for the settlements being sent, so that none reaches the server after
// Consume asks for the new consumer.
type session struct {
	mu   sync.RWMutex
	lost bool
}

func (s *session) lose() {
	s.mu.Lock()
	s.lost = true
	s.mu.Unlock()
}

func (s *session) settle(send func() error) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.lost {
		return ErrConsumerLost
	}
	return send()
}

// sessionMsg is a message delivered in session s: settled only while its
// consumer lives.
type sessionMsg struct {
	jetstream.Msg
	s *session
}

func (m *sessionMsg) Ack() error        { return m.s.settle(m.Msg.Ack) }
func (m *sessionMsg) Nak() error        { return m.s.settle(m.Msg.Nak) }
func (m *sessionMsg) InProgress() error { return m.s.settle(m.Msg.InProgress) }
func (m *sessionMsg) Term() error       { return m.s.settle(m.Msg.Term) }

func (m *sessionMsg) DoubleAck(ctx context.Context) error {
	return m.s.settle(func() error { return m.Msg.DoubleAck(ctx) })
}

func (m *sessionMsg) NakWithDelay(d time.Duration) error {
	return m.s.settle(func() error { return m.Msg.NakWithDelay(d) })
}

func (m *sessionMsg) TermWithReason(reason string) error {
	return m.s.settle(func() error { return m.Msg.TermWithReason(reason) })
}

// KeepInProgress tells JetStream every ackWait/3 that msgs are still being
// worked on (InProgress resets each one's ack wait), until stop is called:
// work on a message may outlast the ack wait (a batch held up by a lock, a
// provider call with its retries) without the message being delivered
// again meanwhile, so the ack wait only bounds how long the messages of a
// process that died wait to be delivered again.
func KeepInProgress(ackWait time.Duration, msgs ...jetstream.Msg) (stop func()) {
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(ackWait / 3)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				for _, m := range msgs {
					_ = m.InProgress()
				}
			}
		}
	}()
	return func() { close(done) }
}
