package settle

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// A tenant that parked an intent while a lease ran (which may not have
// seen it) stays due when that lease comes back short; one that did not
// is not asked again until it parks or a scan finds one due.
func TestDryKeepsATenantThatParkedSinceTheLeaseBegan(t *testing.T) {
	s := newTenantSlots(2, 8)
	began := time.Now()
	s.parked("a", began.Add(time.Millisecond))
	s.dry("a", began)
	if got := s.dueTenants(); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("due tenants %v after a short lease that began before a's park, want [a]", got)
	}
	s.dry("a", began.Add(time.Second))
	if got := s.dueTenants(); len(got) != 0 {
		t.Fatalf("due tenants %v after a short lease that began after a's park, want none", got)
	}
	s.parked("a", began.Add(2*time.Second))
	if got := s.dueTenants(); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("due tenants %v after a parked again, want [a]", got)
	}
}

// A scan drops the tenants it did not list, unless one parked here since
// it began or the scan was truncated; a listed tenant takes its due from
// the scan; a tenant at its limit is not due for a lease.
func TestFoundKeepsWhatTheScanCouldNotHaveSeen(t *testing.T) {
	s := newTenantSlots(1, 8)
	t0 := time.Now()
	s.parked("gone", t0)
	s.parked("late", t0)
	s.scanning(t0.Add(time.Second))
	s.parked("late", t0.Add(2*time.Second)) // after the scan began
	s.found(map[string]bool{"listed": true, "waiting": false}, false)
	got := parkingTenants(s)
	slices.Sort(got)
	if want := []string{"late", "listed", "waiting"}; !slices.Equal(got, want) {
		t.Fatalf("parking tenants %v, want %v", got, want)
	}
	due := s.dueTenants()
	slices.Sort(due)
	if want := []string{"late", "listed"}; !slices.Equal(due, want) {
		t.Fatalf("due tenants %v, want %v", due, want)
	}
	if !s.acquire("listed") {
		t.Fatal("listed has a free slot")
	}
	if due := s.dueTenants(); slices.Contains(due, "listed") {
		t.Fatalf("due tenants %v include listed, which holds its limit", due)
	}

	s.scanning(t0.Add(3 * time.Second))
	s.found(map[string]bool{}, true) // truncated: lists only so many
	if got := parkingTenants(s); len(got) != 3 {
		t.Fatalf("a truncated scan dropped tenants: %v", got)
	}
}

func parkingTenants(s *tenantSlots) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	ts := make([]string, 0, len(s.parking))
	for t := range s.parking {
		ts = append(ts, t)
	}
	return ts
}

// Tenants each under their share cannot hold every slot together: an
// eighth is kept for tenants that hold none, so that two tenants whose
// provider calls hang leave slots to a third.
func TestTenantsUnderTheirShareLeaveSlotsToOthers(t *testing.T) {
	cfg := Config{Concurrency: DefaultConcurrency, TenantShare: DefaultTenantShare}
	s := newTenantSlots(cfg.tenantLimit(), cfg.sharedSlots())
	held := 0
	for _, tenant := range []string{"slow-a", "slow-b", "slow-c"} {
		for s.acquireDirect(tenant) {
			held++
		}
	}
	if held >= cfg.Concurrency {
		t.Fatalf("three tenants hold %d of the %d slots: none is left for another", held, cfg.Concurrency)
	}
	for i := held; i < cfg.Concurrency; i++ {
		if !s.acquire(fmt.Sprintf("quiet-%d", i)) {
			t.Fatalf("quiet tenant %d got no slot with %d of %d held", i, i, cfg.Concurrency)
		}
	}
	s.release("slow-a")
	if s.acquire("slow-b") || s.acquire("slow-a") {
		t.Fatal("a tenant holding slots took the one slow-a gave back while the shared ones are all taken")
	}
	if !s.acquire("quiet-new") {
		t.Fatal("a tenant holding none got no slot")
	}
}
