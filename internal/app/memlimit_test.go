package app

import (
	"io"
	"log/slog"
	"runtime/debug"
	"testing"
)

// The api's budget follows its connection cap: 72 MiB at the default, and
// it cannot overflow at the largest cap.
func TestAPIMemoryLimitFollowsMaxConns(t *testing.T) {
	if got, want := APIMemoryLimit(DefaultAPIMaxConns), int64(72<<20); got != want {
		t.Errorf("APIMemoryLimit(%d) = %d MiB, want %d MiB", DefaultAPIMaxConns, got>>20, want>>20)
	}
	if got, want := APIMemoryLimit(MaxAPIConns), int64(40<<20+32<<30); got != want {
		t.Errorf("APIMemoryLimit(%d) = %d, want %d", MaxAPIConns, got, want)
	}
}

// The limit is the budget until the live heap outgrows it; then it keeps
// 1.5 × the live heap plus the stacks and the slack, so that no tenant's
// legal bodies make the collector run back to back.
func TestMemoryLimitNeverSqueezesTheLiveHeap(t *testing.T) {
	const budget = 72 << 20
	for _, c := range []struct {
		name         string
		live, stacks int64
		want         int64
	}{
		{"idle", 4 << 20, 1 << 20, budget},
		{"the bench's overloaded step", 24e6, 22.5e6, budget}, // measured; 36 + 22.5 + 8.4 MB < 72 MiB
		{"one tenant's 64 bodies of 1 MiB", 88 << 20, 22 << 20, 132<<20 + 22<<20 + memoryLimitSlack},
		{"at the budget exactly", 0, budget - memoryLimitSlack, budget},
	} {
		if got := memoryLimitFor(budget, c.live, c.stacks); got != c.want {
			t.Errorf("%s: memoryLimitFor(%d MiB live, %d MiB stacks) = %d, want %d", c.name, c.live>>20, c.stacks>>20, got, c.want)
		}
	}
}

// keepMemoryBudget sets the runtime's soft limit, unless GOMEMLIMIT already
// said what it should be. Not parallel: the limit is the process's.
func TestKeepMemoryBudgetYieldsToGOMEMLIMIT(t *testing.T) {
	prev := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(prev) })
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))

	const budget = 1 << 40 // far above this test binary's live heap
	stop := keepMemoryBudget(func(string) string { return "" }, budget, "test", logger)
	got := debug.SetMemoryLimit(-1)
	stop()
	if got != budget {
		t.Fatalf("without GOMEMLIMIT the limit is %d, want the budget %d", got, int64(budget))
	}

	debug.SetMemoryLimit(prev)
	defer keepMemoryBudget(func(k string) string {
		if k == "GOMEMLIMIT" {
			return "1GiB"
		}
		return ""
	}, budget, "test", logger)()
	if got := debug.SetMemoryLimit(-1); got != prev {
		t.Fatalf("with GOMEMLIMIT set the limit became %d, want it left at %d", got, prev)
	}
}

// keepMemoryBudget raises GOGC to GCPercent under the limit and puts it
// back when stopped; GOGC or GOMEMLIMIT in the environment leave it alone.
// Not parallel: GOGC is the process's.
func TestKeepMemoryBudgetRaisesGOGCUnderItsLimit(t *testing.T) {
	prevLimit := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(prevLimit) })
	prev := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(prev) })
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	gcPercent := func() int { p := debug.SetGCPercent(-1); debug.SetGCPercent(p); return p }

	stop := keepMemoryBudget(func(string) string { return "" }, 1<<40, "test", logger)
	if got := gcPercent(); got != GCPercent {
		t.Errorf("kept: GOGC %d, want %d", got, GCPercent)
	}
	stop()
	if got := gcPercent(); got != 100 {
		t.Errorf("stopped: GOGC %d, want it put back to 100", got)
	}

	// A second keeper while one keeps the budget keeps nothing: stopping
	// it leaves the first one's settings.
	stop = keepMemoryBudget(func(string) string { return "" }, 1<<40, "first", logger)
	keepMemoryBudget(func(string) string { return "" }, 1<<30, "second", logger)()
	if got, limit := gcPercent(), debug.SetMemoryLimit(-1); got != GCPercent || limit != 1<<40 {
		t.Errorf("after a second keeper: GOGC %d, limit %d; want the first's %d, %d", got, limit, GCPercent, int64(1<<40))
	}
	stop()
	if got := gcPercent(); got != 100 {
		t.Errorf("both stopped: GOGC %d, want it put back to 100", got)
	}

	for set, v := range map[string]string{"GOGC": "200", "GOMEMLIMIT": "1GiB"} {
		stop := keepMemoryBudget(func(k string) string {
			if k == set {
				return v
			}
			return ""
		}, 1<<40, "test", logger)
		if got := gcPercent(); got != 100 {
			t.Errorf("with %s=%s: GOGC %d, want it left at 100", set, v, got)
		}
		stop()
	}
}
