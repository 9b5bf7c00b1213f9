package settle

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/acme/orders/payment"
)

// ProviderFailed is the decline code (and refund failure reason) the worker
// records for an intent whose key the provider spent on a failure of its
// own (payment.ErrKeySpent), when a look-up finds nothing the key made.
const ProviderFailed = "provider_failed"

// maxSpentKeys bounds the spent keys a worker remembers. Past it (after
// the ones older than spentKeyTTL are dropped) a key is not remembered, so
// its intent waits (retried, parked) instead of being settled: never
// settled early.
const maxSpentKeys = 100_000

// spentKeyTTL is how long a spent key is remembered: the provider forgets
// a key after 24 h, and a key settled by another process (or discarded) is
// never forgotten here otherwise.
const spentKeyTTL = 26 * time.Hour

// spentKeys remembers when this process first met each spent key. The
// provider's search may lag the failed request that spent a key (for up to
// Config.SpentKeyWait: an hour during Stripe's outages), and that request
// may have made a charge despite its 500; a look-up is trusted to have
// found nothing only once the key is known spent for that long. The first meeting is after the failed
// request, so the wait is never too short; a restart, or another process,
// only starts the wait again.
type spentKeys struct {
	mu    sync.Mutex
	first map[string]time.Time
}

// since records key as spent (now, if it is new) and returns how long it
// has been known spent; 0 when it cannot be remembered.
func (s *spentKeys) since(key string, now time.Time) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	first, ok := s.first[key]
	if !ok {
		if s.first == nil {
			s.first = make(map[string]time.Time)
		}
		if len(s.first) >= maxSpentKeys {
			for k, t := range s.first {
				if now.Sub(t) > spentKeyTTL {
					delete(s.first, k)
				}
			}
			if len(s.first) >= maxSpentKeys {
				return 0
			}
		}
		s.first[key] = now
		return 0
	}
	return now.Sub(first)
}

func (s *spentKeys) forget(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.first, key)
}

// spentCharge settles a charge whose key the provider spent on a failure
// (spent, an error wrapping payment.ErrKeySpent): the charge the key made,
// if the provider's search shows one, or else, once the key has been known
// spent for Config.SpentKeyWait, a decline with code ProviderFailed, which
// lets the customer pay again (a new attempt, a new key). Until then it
// returns spent, and the intent is retried. Without this the order stayed
// payment_pending, neither payable nor cancellable, until the provider
// forgot the key (24 h).
func (w *Worker) spentCharge(ctx context.Context, req payment.ChargeRequest, spent error) (payment.Charge, error) {
	if w.spent.since(req.IdempotencyKey, time.Now()) < w.cfg.SpentKeyWait {
		return payment.Charge{}, spent
	}
	ch, found, err := w.provider.FindCharge(ctx, req.IdempotencyKey)
	if err != nil {
		return payment.Charge{}, fmt.Errorf("find charge %s (its key is spent): %w", req.IdempotencyKey, err)
	}
	w.spent.forget(req.IdempotencyKey)
	if found {
		return ch, nil
	}
	return payment.Charge{Amount: req.Amount, Currency: req.Currency, Status: payment.ChargeDeclined, DeclineCode: ProviderFailed,
		DeclineReason: "the provider failed this charge and answers that failure to every retry of its key; nothing was charged: pay again"}, nil
}

// spentRefund is spentCharge for a refund: the refund the key made, if the
// charge's refunds (a list, which does not lag) hold one, or else a failed
// refund with reason ProviderFailed, which the order can ask for again.
func (w *Worker) spentRefund(ctx context.Context, req payment.RefundRequest, spent error) (payment.Refund, error) {
	rf, found, err := w.provider.FindRefund(ctx, req.ChargeID, req.IdempotencyKey)
	if err != nil {
		return payment.Refund{}, fmt.Errorf("find refund %s (its key is spent): %w; %w", req.IdempotencyKey, err, spent)
	}
	if found {
		return rf, nil
	}
	return payment.Refund{ChargeID: req.ChargeID, Amount: req.Amount, Currency: req.Currency, Status: payment.RefundFailed,
		FailureReason: ProviderFailed}, nil
}
