package app

import (
	"io"
	"log/slog"
	"runtime/debug"
	"testing"
)

// The api's budget follows its connection cap: 72 MiB at the default.
func TestAPIMemoryLimitFollowsMaxConns(t *testing.T) {
	if got, want := APIMemoryLimit(DefaultAPIMaxConns), int64(72<<20); got != want {
		t.Errorf("APIMemoryLimit(%d) = %d MiB, want %d MiB", DefaultAPIMaxConns, got>>20, want>>20)
	}
	if got, want := APIMemoryLimit(4*DefaultAPIMaxConns)-APIMemoryLimit(DefaultAPIMaxConns), int64(3*DefaultAPIMaxConns)*APIMemoryPerConn; got != want {
		t.Errorf("3,072 more connections raise the limit by %d bytes, want %d", got, want)
	}
}

// limitMemory sets the runtime's soft limit, unless GOMEMLIMIT already
// said what it should be.
func TestLimitMemoryYieldsToGOMEMLIMIT(t *testing.T) {
	prev := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(prev) })
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))

	limitMemory(func(string) string { return "" }, 123<<20, logger)
	if got := debug.SetMemoryLimit(-1); got != 123<<20 {
		t.Fatalf("without GOMEMLIMIT the limit is %d, want %d", got, 123<<20)
	}
	debug.SetMemoryLimit(prev)
	limitMemory(func(k string) string {
		if k == "GOMEMLIMIT" {
			return "1GiB"
		}
		return ""
	}, 123<<20, logger)
	if got := debug.SetMemoryLimit(-1); got != prev {
		t.Fatalf("with GOMEMLIMIT set the limit became %d, want it left at %d", got, prev)
	}
}
