package httpapi

import (
	"testing"
	"time"
)

// The sampler lets through perSecond lines a second, and the first line of
// the next second says how many it held back.
func TestLogSamplerBoundsLinesPerSecondAndCountsTheRest(t *testing.T) {
	s := &logSampler{perSecond: 3}
	t0 := time.Unix(1000, 0)
	let := 0
	for i := range 100 {
		if ok, _ := s.allow(t0.Add(time.Duration(i) * time.Millisecond)); ok {
			let++
		}
	}
	if let != 3 {
		t.Errorf("%d of 100 lines in one second let through, want 3", let)
	}
	if ok, suppressed := s.allow(t0.Add(time.Second)); !ok || suppressed != 97 {
		t.Errorf("the next second's first line: %v, %d held back; want true, 97", ok, suppressed)
	}
}
