package httpapi

import (
	"testing"
	"time"
)

// The sampler lets through perTenant lines of a tenant a second, and
// perSecond in all; the first line of the next second says how many it
// held back. One tenant's flood leaves another's lines through.
func TestLogSamplerBoundsLinesPerSecondAndPerTenant(t *testing.T) {
	s := &logSampler{perSecond: 4, perTenant: 3}
	t0 := time.Unix(1000, 0)
	let := map[string]int{}
	for i := range 100 {
		tenant := "noisy"
		if i%25 == 24 {
			tenant = "quiet"
		}
		if ok, _ := s.allow(tenant, t0.Add(time.Duration(i)*time.Millisecond)); ok {
			let[tenant]++
		}
	}
	if let["noisy"] != 3 || let["quiet"] != 1 {
		t.Errorf("let through %v in one second, want noisy 3 (its share) and quiet 1 (the rest of the 4)", let)
	}
	if ok, suppressed := s.allow("noisy", t0.Add(time.Second)); !ok || suppressed != 75 {
		t.Errorf("the next second's first line: %v, %d held back; want true, 75 (all after the last let through, quiet's at 24 ms)", ok, suppressed)
	}
}
