package settle

import (
	"sync"
	"time"
)

// tenantSlots counts, per tenant, the intents of one consumer this process
// is settling (a provider call, then its recording), and keeps each tenant
// under limit, so that a tenant whose provider calls hang cannot hold every
// slot and stall every other tenant's payments (G9).
type tenantSlots struct {
	limit int

	mu   sync.Mutex
	held map[string]int
}

func newTenantSlots(limit int) *tenantSlots {
	return &tenantSlots{limit: limit, held: map[string]int{}}
}

// acquire takes a slot for tenant and reports true, or reports false
// (taking nothing) if tenant holds its limit already.
func (s *tenantSlots) acquire(tenant string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held[tenant] >= s.limit {
		return false
	}
	s.held[tenant]++
	return true
}

// release gives back a slot acquire took.
func (s *tenantSlots) release(tenant string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held[tenant]--; s.held[tenant] <= 0 {
		delete(s.held, tenant)
	}
}

// failures counts, per message (its stream sequence), the deliveries this
// process settled and that failed, so that an intent is dead-lettered after
// Config.MaxDeliver failures, not after MaxDeliver deliveries: deferring an
// intent past its tenant's share is a delivery too (JetStream counts every
// redelivery), and an intent deferred often (its tenant is slow) must not be
// dead-lettered for it.
//
// The count is this process's own: an intent that failed elsewhere, or
// before a restart, starts again from 0 here, so it is retried longer,
// never dead-lettered sooner. An entry is forgotten when its intent is
// settled (done or dead-lettered) here, or once unseen for longer than ttl
// (its intent went to another process). It also counts the deliveries it
// deferred, which never reached the provider: an intent whose every earlier
// delivery was deferred here needs no look-up by key before its first call.
type failures struct {
	ttl time.Duration

	mu        sync.Mutex
	bySeq     map[uint64]failure
	nextSweep time.Time
}

type failure struct {
	n        int // failed deliveries
	deferred int // deliveries deferred past the tenant's share
	seen     time.Time
}

func newFailures(ttl time.Duration) *failures {
	return &failures{ttl: ttl, bySeq: map[uint64]failure{}}
}

// add counts one more failed delivery of seq and returns how many there were.
func (f *failures) add(seq uint64, now time.Time) int {
	return f.update(seq, now, func(e *failure) { e.n++ }).n
}

// deferral counts one more delivery of seq deferred here.
func (f *failures) deferral(seq uint64, now time.Time) {
	f.update(seq, now, func(e *failure) { e.deferred++ })
}

// deferrals is how many deliveries of seq this process deferred (as far as
// it remembers): none of them reached the provider.
func (f *failures) deferrals(seq uint64) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.bySeq[seq].deferred
}

// update applies change to seq's entry, seen now, sweeping entries unseen
// for longer than ttl first when one is due.
func (f *failures) update(seq uint64, now time.Time, change func(*failure)) failure {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !now.Before(f.nextSweep) {
		for s, e := range f.bySeq {
			if now.Sub(e.seen) > f.ttl {
				delete(f.bySeq, s)
			}
		}
		f.nextSweep = now.Add(f.ttl)
	}
	e := f.bySeq[seq]
	change(&e)
	e.seen = now
	f.bySeq[seq] = e
	return e
}

// forget drops the count of seq: its intent is settled.
func (f *failures) forget(seq uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.bySeq, seq)
}
