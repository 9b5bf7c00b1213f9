package command

import (
	"fmt"
	"testing"
)

// queue queues claims of tenant under keys, as claim does, without sending.
func (g *claimGroup) queue(tenant string, keys ...string) {
	for _, k := range keys {
		if len(g.queues[tenant]) == 0 {
			g.turns = append(g.turns, tenant)
		}
		g.queues[tenant] = append(g.queues[tenant], &groupClaim{tenant: tenant, key: k, queued: true})
	}
}

func names(batch []*groupClaim) []string {
	var s []string
	for _, c := range batch {
		s = append(s, c.tenant+"/"+c.key)
	}
	return s
}

// Tenants take turns in a batch: a tenant with a thousand creates queued
// leaves room for each other tenant's oldest, and no batch holds one key
// twice (the second waits for the next batch). Nothing is lost or taken
// twice across batches.
func TestAGroupBatchTakesTenantsInTurn(t *testing.T) {
	g := newClaimGroup(nil, 1, 4)
	var flood []string
	for i := range 1000 {
		flood = append(flood, fmt.Sprintf("k%d", i))
	}
	g.queue("noisy", flood...)
	g.queue("quiet", "a", "a", "b")
	g.queue("other", "x")

	first := names(g.take())
	want := []string{"noisy/k0", "quiet/a", "other/x", "noisy/k1"}
	if fmt.Sprint(first) != fmt.Sprint(want) {
		t.Fatalf("first batch %v, want %v", first, want)
	}
	second := names(g.take())
	// quiet's second "a" waited for this batch, which starts after noisy,
	// the tenant served last (other's queue is empty now).
	want = []string{"quiet/a", "noisy/k2", "quiet/b", "noisy/k3"}
	if fmt.Sprint(second) != fmt.Sprint(want) {
		t.Fatalf("second batch %v, want %v", second, want)
	}
	seen := map[string]bool{}
	for _, n := range append(first[:1], second...) {
		seen[n] = true
	}
	taken := 8
	for {
		b := g.take()
		if len(b) == 0 {
			break
		}
		for _, n := range names(b) {
			if seen[n] && n != "quiet/a" {
				t.Fatalf("%s taken twice", n)
			}
			seen[n] = true
		}
		taken += len(b)
	}
	if taken != 1004 || len(g.queues) != 0 || len(g.turns) != 0 {
		t.Fatalf("took %d of 1004 claims; left queues %d, turns %v", taken, len(g.queues), g.turns)
	}
}

// With more tenants queued than a batch holds, the next batch starts after
// the tenant served last: a tenant that queues behind a hundred others,
// each with creates to spare, is served in the second batch, not after
// every tenant before it was served again and again.
func TestAGroupBatchStartsAfterTheTenantServedLast(t *testing.T) {
	g := newClaimGroup(nil, 1, 64)
	for i := range 100 {
		g.queue(fmt.Sprintf("t%03d", i), "a", "b", "c", "d", "e")
	}
	g.queue("quiet", "q")
	for batch := 1; batch <= 2; batch++ {
		for _, n := range names(g.take()) {
			if n == "quiet/q" {
				return
			}
		}
	}
	t.Fatal("the quiet tenant was not served in the first two batches")
}
