package projection

import (
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// inHand is the set of messages a runner holds, from its consume callback
// until their batch is processed: each is sent InProgress every AckWait/3,
// so that JetStream does not deliver again what is only waiting behind a
// long batch (a lock, a rebuild's swap). Without it, only the batch in hand
// was kept in progress, and a batch held up for 28 s had 751 buffered
// events delivered again (no-ops, but work, and deliveries counted towards
// their backoffs) while the projector was alive.
type inHand struct {
	mu   sync.Mutex
	msgs map[jetstream.Msg]struct{}
}

func (h *inHand) add(m jetstream.Msg) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.msgs == nil {
		h.msgs = make(map[jetstream.Msg]struct{})
	}
	h.msgs[m] = struct{}{}
}

func (h *inHand) remove(msgs ...jetstream.Msg) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, m := range msgs {
		delete(h.msgs, m)
	}
}

// keep sends InProgress for every message held, every interval, until ctx
// ends.
func (h *inHand) keep(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	var held []jetstream.Msg
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		h.mu.Lock()
		held = held[:0]
		for m := range h.msgs {
			held = append(held, m)
		}
		h.mu.Unlock()
		for _, m := range held {
			_ = m.InProgress()
		}
	}
}
