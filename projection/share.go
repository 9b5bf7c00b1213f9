package projection

import (
	"sync"
	"time"
)

// delayedWindow counts, per tenant, the messages a runner has nak'ed with a
// delay (after a transient failure, or while they wait for a predecessor)
// and not received again. Each of them holds a slot of the consumer's
// ack-pending window until it is redelivered and settled; the runner keeps
// every tenant under its limit, so that no tenant (and so no customer or
// order of it) can fill the window.
//
// The count is this runner's own: a message redelivered to another process
// is forgotten here when its entry expires, some time after its delay.
// Expired entries are swept at least every delayedSweepInterval (and
// whenever the map doubles since the last sweep), so they never pile up,
// even when no tenant reaches its limit.
type delayedWindow struct {
	limit int

	mu        sync.Mutex
	bySeq     map[uint64]delayedMsg // by stream sequence
	perTenant map[string]int
	nextSweep time.Time // sweep expired entries at the first admit from then
	sweepAt   int       // … or once bySeq holds this many
}

// delayedSweepInterval is how often, at most, a delayedWindow's expired
// entries wait for a sweep.
const delayedSweepInterval = 10 * time.Second

type delayedMsg struct {
	tenant string
	until  time.Time // forget it after this (another process took it)
}

func newDelayedWindow(limit int) *delayedWindow {
	return &delayedWindow{limit: limit, bySeq: map[uint64]delayedMsg{}, perTenant: map[string]int{}, sweepAt: 2 * limit}
}

// received forgets the message with stream sequence seq: it is back in a
// batch.
func (w *delayedWindow) received(seq uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.forget(seq)
}

// admit counts the message seq of tenant as delayed until until and reports
// true, or reports false (counting nothing) if tenant already holds its
// limit. A message without a sequence (seq 0) is always admitted.
func (w *delayedWindow) admit(seq uint64, tenant string, until, now time.Time) bool {
	if seq == 0 {
		return true
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.forget(seq)
	if !now.Before(w.nextSweep) || len(w.bySeq) >= w.sweepAt {
		w.sweep(now)
	}
	if w.perTenant[tenant] >= w.limit {
		w.expire(now)
		if w.perTenant[tenant] >= w.limit {
			return false
		}
	}
	w.bySeq[seq] = delayedMsg{tenant: tenant, until: until}
	w.perTenant[tenant]++
	return true
}

// held is how many delayed messages tenant holds.
func (w *delayedWindow) held(tenant string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.perTenant[tenant]
}

func (w *delayedWindow) forget(seq uint64) {
	m, ok := w.bySeq[seq]
	if !ok {
		return
	}
	delete(w.bySeq, seq)
	if w.perTenant[m.tenant]--; w.perTenant[m.tenant] <= 0 {
		delete(w.perTenant, m.tenant)
	}
}

// sweep expires entries and schedules the next sweep: after
// delayedSweepInterval, or once the map holds twice what is left (at least
// twice the limit), so its cost is spread over the admits in between.
func (w *delayedWindow) sweep(now time.Time) {
	w.expire(now)
	w.nextSweep = now.Add(delayedSweepInterval)
	w.sweepAt = 2 * max(len(w.bySeq), w.limit)
}

// expire forgets the messages whose time is up. It scans every entry; it
// runs on a sweep and when a tenant is at its limit.
func (w *delayedWindow) expire(now time.Time) {
	for seq, m := range w.bySeq {
		if now.After(m.until) {
			w.forget(seq)
		}
	}
}
