package app_test

import (
	"math"
	"runtime/debug"
	"testing"

	"github.com/acme/orders/internal/app"
	"github.com/acme/orders/internal/testenv"
)

// cmd/api's and cmd/projector's programs keep the process's memory budget
// and GOGC while they serve; RunAPI and RunProjector, which tests run
// inside their own process, leave both alone. Not parallel: the limit and
// GOGC are the process's.
func TestOnlyTheProgramsOwnProcessesSetAMemoryLimit(t *testing.T) {
	for _, c := range []struct {
		name            string
		inTest, process testenv.Program
		budget          int64
	}{
		{"api", app.RunAPI, app.RunAPIProcess, app.APIMemoryLimit(app.DefaultAPIMaxConns)},
		{"projector", app.RunProjector, app.RunProjectorProcess, app.ProjectorMemoryBudget},
	} {
		t.Run(c.name, func(t *testing.T) {
			prev := debug.SetMemoryLimit(-1)
			debug.SetMemoryLimit(math.MaxInt64)
			t.Cleanup(func() { debug.SetMemoryLimit(prev) }) // runs after the programs stopped
			prevGC := debug.SetGCPercent(100)                // whatever GOGC the tests run with
			t.Cleanup(func() { debug.SetGCPercent(prevGC) })
			env := newEnv(t)

			start(t, c.name+"-in-a-test", c.inTest, env)
			if got := debug.SetMemoryLimit(-1); got != math.MaxInt64 {
				t.Fatalf("the %s run in a test set the process's memory limit to %d", c.name, got)
			}
			if got := gcPercent(); got == app.GCPercent {
				t.Fatalf("the %s run in a test set the process's GOGC to %d", c.name, got)
			}

			start(t, c.name, c.process, env)
			if got := debug.SetMemoryLimit(-1); got < c.budget || got == math.MaxInt64 {
				t.Fatalf("serving, the %s's process left the memory limit at %d, want at least the budget %d", c.name, got, c.budget)
			}
			if got := gcPercent(); got != app.GCPercent {
				t.Fatalf("serving, the %s's process left GOGC at %d, want %d", c.name, got, app.GCPercent)
			}
		})
	}
}

// gcPercent reads the process's GOGC.
func gcPercent() int {
	p := debug.SetGCPercent(-1)
	debug.SetGCPercent(p)
	return p
}
