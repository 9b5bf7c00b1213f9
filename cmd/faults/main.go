// Command faults runs the fault-injection suite (internal/faults): the real
// api, projector, payment worker and fakepsp binaries, PostgreSQL and
// nats-server as separate processes, careful clients, a seeded schedule of
// crashes, restarts, network and payment-provider faults, and an invariant
// check after the system drained (the provider's ledger included); before
// the faults, a noisy-neighbour run (internal/noisy) on the healthy system. It
// prints a one-screen report and exits 1 on any violation.
//
//	go run ./cmd/faults -seed 42 -duration 3m -noisy-phase 15s
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/acme/orders/internal/faults"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	seed := flag.Uint64("seed", uint64(time.Now().UnixNano()%1_000_000), "seed of the schedule and the clients (printed; reuse it to reproduce)")
	duration := flag.Duration("duration", 3*time.Minute, "how long faults are injected")
	every := flag.Duration("every", 3*time.Second, "mean time between faults")
	clients := flag.Int("clients", 8, "concurrent clients")
	dir := flag.String("dir", ".local/faults", "state directory, relative to the module root unless absolute (wiped first)")
	noisyPhase := flag.Duration("noisy-phase", faults.DefaultNoisyPhase, "each measured phase of the noisy-neighbour run before the faults (alone, then under each attack)")
	flag.Parse()
	root, err := os.Getwd()
	if err != nil {
		fmt.Fprintln(os.Stderr, "faults:", err)
		os.Exit(2)
	}
	stateDir := *dir
	if !filepath.IsAbs(stateDir) { // relative to the module root; an absolute one as given
		stateDir = filepath.Join(root, stateDir)
	}
	rep, err := faults.Run(ctx, faults.Config{
		Seed: *seed, Duration: *duration, Every: *every, Clients: *clients,
		Root: root, Dir: stateDir, NoisyPhase: *noisyPhase,
	}, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "faults: the run could not be carried out:", err)
		os.Exit(2)
	}
	if len(rep.Violations) > 0 {
		os.Exit(1)
	}
}
