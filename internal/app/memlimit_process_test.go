package app_test

import (
	"math"
	"runtime/debug"
	"testing"

	"github.com/acme/orders/internal/app"
)

// cmd/api's program keeps the process's memory budget while it serves;
// RunAPI, which tests run inside their own process, leaves the limit alone.
// Not parallel: the limit is the process's.
func TestOnlyTheAPIProcessSetsAMemoryLimit(t *testing.T) {
	prev := debug.SetMemoryLimit(-1)
	debug.SetMemoryLimit(math.MaxInt64)
	t.Cleanup(func() { debug.SetMemoryLimit(prev) }) // runs after the programs stopped
	prevGC := debug.SetGCPercent(100)                // whatever GOGC the tests run with
	t.Cleanup(func() { debug.SetGCPercent(prevGC) })
	env := newEnv(t)

	start(t, "api-in-a-test", app.RunAPI, env)
	if got := debug.SetMemoryLimit(-1); got != math.MaxInt64 {
		t.Fatalf("RunAPI set the test process's memory limit to %d", got)
	}
	if got := gcPercent(); got == app.GCPercent {
		t.Fatalf("RunAPI set the test process's GOGC to %d", got)
	}

	start(t, "api", app.RunAPIProcess, env)
	if got, budget := debug.SetMemoryLimit(-1), app.APIMemoryLimit(app.DefaultAPIMaxConns); got < budget || got == math.MaxInt64 {
		t.Fatalf("serving, RunAPIProcess left the memory limit at %d, want at least the budget %d", got, budget)
	}
	if got := gcPercent(); got != app.GCPercent {
		t.Fatalf("serving, RunAPIProcess left GOGC at %d, want %d", got, app.GCPercent)
	}
}

// So does cmd/projector's, with its own budget. Not parallel: the limit
// is the process's.
func TestOnlyTheProjectorProcessSetsAMemoryLimit(t *testing.T) {
	prev := debug.SetMemoryLimit(-1)
	debug.SetMemoryLimit(math.MaxInt64)
	t.Cleanup(func() { debug.SetMemoryLimit(prev) }) // runs after the programs stopped
	prevGC := debug.SetGCPercent(100)                // whatever GOGC the tests run with
	t.Cleanup(func() { debug.SetGCPercent(prevGC) })
	env := newEnv(t)

	start(t, "projector-in-a-test", app.RunProjector, env)
	if got := debug.SetMemoryLimit(-1); got != math.MaxInt64 {
		t.Fatalf("RunProjector set the test process's memory limit to %d", got)
	}
	if got := gcPercent(); got == app.GCPercent {
		t.Fatalf("RunProjector set the test process's GOGC to %d", got)
	}

	start(t, "projector", app.RunProjectorProcess, env)
	if got := debug.SetMemoryLimit(-1); got < app.ProjectorMemoryBudget || got == math.MaxInt64 {
		t.Fatalf("serving, RunProjectorProcess left the memory limit at %d, want at least the budget %d", got, app.ProjectorMemoryBudget)
	}
	if got := gcPercent(); got != app.GCPercent {
		t.Fatalf("serving, RunProjectorProcess left GOGC at %d, want %d", got, app.GCPercent)
	}
}

// gcPercent reads the process's GOGC.
func gcPercent() int {
	p := debug.SetGCPercent(-1)
	debug.SetGCPercent(p)
	return p
}
