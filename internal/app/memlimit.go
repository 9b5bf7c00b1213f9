package app

import (
	"log/slog"
	"runtime/debug"
)

// The api's memory budget: APIMemoryBase plus APIMemoryPerConn for each
// connection -max-conns lets it keep open (72 MiB at the default 1,024).
//
// Measured at the bench's overloaded step (1,024 connections open, 1,300
// goroutines, `go run ./cmd/bench -only load`): a live heap of 24 MB and
// 22 MB of goroutine stacks, but with the Go runtime's default pacing
// (GOGC=100) the heap grew to twice its live size and the process's
// resident set to 105–109 MiB. The soft limit makes the runtime collect
// earlier and return freed pages as it nears the budget, instead of
// growing to twice the live heap; below it nothing changes.
//
// It is soft: a live heap larger than the budget (512 requests in flight,
// each with a body of up to 1 MiB, is 512 MiB) is never refused memory.
// The runtime then collects continuously, with at most about half the CPU
// (its GC CPU limiter), so such a flood costs CPU rather than growing the
// process. GOMEMLIMIT=off trades back: memory for CPU.
const (
	APIMemoryBase    = 40 << 20
	APIMemoryPerConn = 32 << 10
)

// APIMemoryLimit is the Go runtime's soft memory limit an api process sets
// for itself with -max-conns maxConns.
func APIMemoryLimit(maxConns int) int64 {
	return APIMemoryBase + int64(maxConns)*APIMemoryPerConn
}

// limitMemory sets the process's soft memory limit to limit, unless the
// environment sets GOMEMLIMIT (the runtime's own setting then stands;
// GOMEMLIMIT=off turns the limit off). It is process-wide, so only a
// process's main calls it (RunAPIProcess), never a test that runs an api
// in its own process.
func limitMemory(getenv func(string) string, limit int64, logger *slog.Logger) {
	if v := getenv("GOMEMLIMIT"); v != "" {
		logger.Info("memory limit from GOMEMLIMIT", "GOMEMLIMIT", v)
		return
	}
	debug.SetMemoryLimit(limit)
	logger.Info("memory limit", "mib", limit>>20, "from", "-max-conns")
}
