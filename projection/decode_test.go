package projection

import (
	"cmp"
	"testing"

	"github.com/google/uuid"

	"github.com/acme/orders/domain"
)

// The batch order compares aggregate ids without allocating, and is the
// order of their text form (the order PostgreSQL sorts uuids in, which the
// lock-order reasoning relies on), then version.
func TestCompareEventsOrdersByAggregateThenVersionWithoutAllocating(t *testing.T) {
	ids := make([]uuid.UUID, 64)
	for i := range ids {
		ids[i] = uuid.New() // random, so every byte position varies
	}
	ids[1] = ids[0]
	for _, a := range ids {
		for _, b := range ids {
			for _, vs := range [][2]int64{{1, 1}, {1, 2}, {3, 2}} {
				ea := &event{env: domain.Envelope{AggregateID: a, AggregateVersion: vs[0]}}
				eb := &event{env: domain.Envelope{AggregateID: b, AggregateVersion: vs[1]}}
				want := cmp.Compare(a.String(), b.String())
				if want == 0 {
					want = cmp.Compare(vs[0], vs[1])
				}
				if got := compareEvents(ea, eb); got != want {
					t.Fatalf("compareEvents(%s v%d, %s v%d) = %d, want %d", a, vs[0], b, vs[1], got, want)
				}
			}
		}
	}
	ea := &event{env: domain.Envelope{AggregateID: ids[2]}}
	eb := &event{env: domain.Envelope{AggregateID: ids[3]}}
	if n := testing.AllocsPerRun(100, func() { compareEvents(ea, eb) }); n != 0 {
		t.Fatalf("compareEvents allocates %.0f times per call, want 0", n)
	}
}
