package app

import (
	"log/slog"
	"runtime/debug"
	"runtime/metrics"
	"sync/atomic"
	"time"
)

// APIMemoryBase and APIMemoryPerConn make the api's memory budget:
// APIMemoryBase plus APIMemoryPerConn for each connection -max-conns lets
// it keep open (72 MiB at the default 1,024).
//
// Measured at the bench's overloaded step (1,024 connections open, 1,300
// goroutines, `go run ./cmd/bench -only load`): a live heap of 24 MB and
// 22 MB of goroutine stacks, but with the Go runtime's default pacing
// (GOGC=100) the heap grew to twice its live size and the process's
// resident set to 100–106 MiB. With the budget as the runtime's soft
// memory limit, the runtime collects earlier and returns freed pages as
// the process nears it, instead of growing past it (below it, GCPercent
// paces the collector).
const (
	APIMemoryBase    = 40 << 20
	APIMemoryPerConn = 32 << 10
)

// MaxAPIConns is the most -max-conns accepts.
const MaxAPIConns = 1 << 20

// APIMemoryLimit is the memory budget of an api with -max-conns maxConns.
func APIMemoryLimit(maxConns int) int64 {
	return APIMemoryBase + int64(maxConns)*APIMemoryPerConn
}

// The soft limit never squeezes the collector harder than this: it stays
// at least 1.5 × the live heap plus the goroutine stacks and
// memoryLimitSlack for the runtime's own. A live heap that outgrows the
// budget is not an error: a tenant may legally hold 64 request bodies of
// up to 1 MiB each, 64 MiB, and a fixed limit below that would have the
// runtime collect back to back (up to half the CPU, its GC CPU limiter's
// cap), slowing every tenant for one tenant's bodies. Above the budget
// the process collects as if GOGC were 50, and grows.
const (
	memoryLimitSlack = 8 << 20
	memoryLimitEvery = 250 * time.Millisecond
)

// ProjectorMemoryBudget is the projector's memory budget: its soft limit
// (it peaked at 40–51 MiB with the runtime's defaults in `make bench`).
const ProjectorMemoryBudget = 64 << 20

// GCPercent is the GOGC of a process that keeps its memory budget (the api
// and the projector): how far the heap may grow past its live size before
// a collection, below the soft limit. With the limit in place the default
// of 100 only made the collector run more often than memory needs: at 64
// concurrent creates the live heap is a few MiB, and the collector took
// 13% of the api's CPU and 14% of the projector's (pprof, `BENCH_PPROF=1
// go run ./cmd/bench -only create`). At 400 it runs a quarter as often
// there; near the budget the limit decides, as before. GOGC in the
// environment overrides it.
const GCPercent = 400

// budgetKept is whether a keepMemoryBudget keeps the process's budget.
var budgetKept atomic.Bool

// memoryLimitFor is the soft limit for budget with live bytes of live
// heap and stacks bytes of goroutine stacks: the budget, or the floor
// above, whichever is higher.
func memoryLimitFor(budget, live, stacks int64) int64 {
	return max(budget, live+live/2+stacks+memoryLimitSlack)
}

// keepMemoryBudget holds the process's soft memory limit at
// memoryLimitFor(budget, …), re-reading the live heap every
// memoryLimitEvery, and its GOGC at GCPercent (unless the environment
// sets GOGC), until stop is called (stop waits for the last update and
// puts GOGC back), unless the environment sets GOMEMLIMIT (the runtime's
// own settings then stand, GOGC's too: without the limit a higher GOGC
// would let the heap grow unbounded; GOMEMLIMIT=off turns the limit off).
// The settings are the process's, so only a process's own main keeps them
// (RunAPIProcess, RunProjectorProcess), never a test that runs a program
// inside the test's process; and one keeper at a time: a second one while
// another keeps the budget keeps nothing and says so (two would overwrite
// each other's limit and GOGC).
func keepMemoryBudget(getenv func(string) string, budget int64, from string, logger *slog.Logger) (stop func()) {
	if v := getenv("GOMEMLIMIT"); v != "" {
		logger.Info("memory limit from GOMEMLIMIT", "GOMEMLIMIT", v)
		return func() {}
	}
	if !budgetKept.CompareAndSwap(false, true) {
		logger.Warn("a memory budget is kept in this process already; this one is not", "mib", budget>>20, "from", from)
		return func() {}
	}
	logger.Info("memory budget", "mib", budget>>20, "from", from)
	samples := []metrics.Sample{{Name: "/gc/heap/live:bytes"}, {Name: "/memory/classes/heap/stacks:bytes"}}
	set := func() {
		metrics.Read(samples)
		debug.SetMemoryLimit(memoryLimitFor(budget, int64(samples[0].Value.Uint64()), int64(samples[1].Value.Uint64())))
	}
	set()
	restoreGC := func() {}
	if getenv("GOGC") == "" { // after the limit: the heap never grows unbounded
		prev := debug.SetGCPercent(GCPercent)
		restoreGC = func() { debug.SetGCPercent(prev) }
	}
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(memoryLimitEvery)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				set()
			}
		}
	}()
	return func() {
		close(done)
		<-stopped
		restoreGC()
		budgetKept.Store(false)
	}
}
