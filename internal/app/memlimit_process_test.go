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
	env := newEnv(t)

	start(t, "api-in-a-test", app.RunAPI, env)
	if got := debug.SetMemoryLimit(-1); got != math.MaxInt64 {
		t.Fatalf("RunAPI set the test process's memory limit to %d", got)
	}

	start(t, "api", app.RunAPIProcess, env)
	if got, budget := debug.SetMemoryLimit(-1), app.APIMemoryLimit(app.DefaultAPIMaxConns); got < budget || got == math.MaxInt64 {
		t.Fatalf("serving, RunAPIProcess left the memory limit at %d, want at least the budget %d", got, budget)
	}
}
