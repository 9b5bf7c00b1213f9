package settle

import (
	"sync"
	"time"
)

// tenantSlots counts, per tenant, the intents of one consumer this process
// is settling (a provider call, then its recording), and keeps each tenant
// under limit, so that a tenant whose provider calls hang cannot hold every
// slot and stall every other tenant's payments (G9). It also knows which
// tenants have intents parked (park.go), and whether one is due: theirs
// queue behind the parked ones, and a slot one of them gives back wakes the
// re-drive.
type tenantSlots struct {
	limit int
	// shared is how many slots tenants may hold in all before a tenant
	// that holds one already gets no other: the rest are kept for tenants
	// that hold none, so that two or three tenants whose provider calls
	// hang, each under its limit, cannot hold every slot together.
	shared int
	// wake is signalled (without blocking) when a tenant with due parked
	// intents gives a slot back, or parks one while it has a free slot.
	wake chan struct{}

	mu    sync.Mutex
	held  map[string]int
	total int // the sum of held
	// parking holds the tenants with parked intents: those the last scan
	// found, and those this process parked since it began.
	parking map[string]parkState
	scanned time.Time // when the last scan began
}

type parkState struct {
	seen time.Time // when last seen parking
	due  bool      // it may have a parked intent due
}

func newTenantSlots(limit, shared int) *tenantSlots {
	return &tenantSlots{limit: limit, shared: shared, wake: make(chan struct{}, 1), held: map[string]int{}, parking: map[string]parkState{}}
}

// full reports whether tenant may take no other slot: it holds its limit,
// or it holds one while the shared slots are all taken. Called with s.mu
// held.
func (s *tenantSlots) full(tenant string) bool {
	h := s.held[tenant]
	return h >= s.limit || (h > 0 && s.total >= s.shared)
}

// acquire takes a slot for tenant and reports true, or reports false
// (taking nothing) if tenant may take no other (full).
func (s *tenantSlots) acquire(tenant string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.full(tenant) {
		return false
	}
	s.held[tenant]++
	s.total++
	return true
}

// acquireDirect is acquire for a delivered intent: a tenant with parked
// intents gets no slot (its intent is parked behind them, in order), so
// that a busy tenant's parked intents are not overtaken for ever.
func (s *tenantSlots) acquireDirect(tenant string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.parking[tenant]; ok || s.full(tenant) {
		return false
	}
	s.held[tenant]++
	s.total++
	return true
}

// release gives back a slot acquire took, and wakes the re-drive if the
// tenant has a parked intent due.
func (s *tenantSlots) release(tenant string) {
	s.mu.Lock()
	s.total--
	if s.held[tenant]--; s.held[tenant] <= 0 {
		delete(s.held, tenant)
	}
	due := s.parking[tenant].due
	s.mu.Unlock()
	if due {
		s.signal()
	}
}

// giveBack returns k slots of tenant the re-drive took and did not use,
// without waking it again.
func (s *tenantSlots) giveBack(tenant string, k int) {
	if k <= 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.total -= k
	if s.held[tenant] -= k; s.held[tenant] <= 0 {
		delete(s.held, tenant)
	}
}

// parked notes that this process parked an intent of tenant, due now, and
// wakes the re-drive if tenant has a free slot for it.
func (s *tenantSlots) parked(tenant string, now time.Time) {
	s.mu.Lock()
	s.parking[tenant] = parkState{seen: now, due: true}
	free := s.held[tenant] < s.limit
	s.mu.Unlock()
	if free {
		s.signal()
	}
}

// parkedLater notes that this process parked an intent of tenant due
// later (a failed one, on its backoff): its tenant's later intents queue
// behind it, and a scan finds it due. Whether another parked intent of
// tenant is due is left as it was.
func (s *tenantSlots) parkedLater(tenant string, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.parking[tenant]
	st.seen = now
	s.parking[tenant] = st
}

// dry notes that tenant had fewer parked intents due than a lease begun
// at since asked for: it is not asked again until it parks one, or a scan
// finds one due. One it parked since the lease began (which the lease may
// not have seen) keeps it due.
func (s *tenantSlots) dry(tenant string, since time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st, ok := s.parking[tenant]; ok && st.seen.Before(since) {
		st.due = false
		s.parking[tenant] = st
	}
}

// scanning notes that a scan of the parked tenants begins at now.
func (s *tenantSlots) scanning(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.scanned = now
}

// found takes the result of a scan begun at the last scanning: the tenants
// with parked intents, each with whether one is due. A tenant the scan did
// not list is dropped unless this process parked one of its intents since
// the scan began, or the scan was truncated (it lists only so many).
func (s *tenantSlots) found(due map[string]bool, truncated bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for t, st := range s.parking {
		if _, listed := due[t]; !listed && !truncated && st.seen.Before(s.scanned) {
			delete(s.parking, t)
		}
	}
	for t, d := range due {
		st, ok := s.parking[t]
		if !ok || st.seen.Before(s.scanned) {
			st = parkState{seen: s.scanned, due: d}
		}
		st.due = st.due || d
		s.parking[t] = st
	}
}

// dueTenants returns the tenants that may have a parked intent due and
// have a free slot, in no order.
func (s *tenantSlots) dueTenants() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ts []string
	for t, st := range s.parking {
		if st.due && s.held[t] < s.limit {
			ts = append(ts, t)
		}
	}
	return ts
}

func (s *tenantSlots) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// failures counts, per message (its stream sequence), the deliveries this
// process settled and that failed, so that an intent is dead-lettered after
// Config.MaxDeliver failures, not after MaxDeliver deliveries: a delivery
// handed back because its park failed is a delivery too (JetStream counts
// every redelivery), and must not count as a failure.
//
// The count is this process's own: an intent that failed elsewhere, or
// before a restart, starts again from 0 here, so it is retried longer,
// never dead-lettered sooner. An entry is forgotten when its intent is
// settled (done, parked or dead-lettered) here, or once unseen for longer
// than ttl (its intent went to another process). It also counts the
// deliveries it handed back, which never reached the provider: an intent
// whose every earlier delivery was handed back here needs no look-up by key
// before its first call.
type failures struct {
	ttl time.Duration

	mu        sync.Mutex
	bySeq     map[uint64]failure
	nextSweep time.Time
}

type failure struct {
	n        int // failed deliveries
	deferred int // deliveries handed back without a provider call
	seen     time.Time
}

func newFailures(ttl time.Duration) *failures {
	return &failures{ttl: ttl, bySeq: map[uint64]failure{}}
}

// add counts one more failed delivery of seq and returns how many there were.
func (f *failures) add(seq uint64, now time.Time) int {
	return f.update(seq, now, func(e *failure) { e.n++ }).n
}

// deferral counts one more delivery of seq handed back here.
func (f *failures) deferral(seq uint64, now time.Time) {
	f.update(seq, now, func(e *failure) { e.deferred++ })
}

// get is what this process remembers of seq.
func (f *failures) get(seq uint64) failure {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.bySeq[seq]
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
