// Command bench measures the service against its physical ceiling in one
// run (internal/bench) and prints the table; the JSON goes next to the
// state. `make bench` runs it.
//
//	go run ./cmd/bench -phase 10s
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

	"github.com/acme/orders/internal/bench"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	phase := flag.Duration("phase", 10*time.Second, "length of each load measurement")
	backlog := flag.Int("backlog", 100_000, "events of the drain measurements")
	dir := flag.String("dir", ".local/bench", "state directory (wiped first; relative to the module's root unless absolute)")
	only := flag.String("only", "", `"create" (ceilings, create with the pipeline on and api only, lag after a burst), "load" (create, replay, read, end to end, pay), "drain", "e2e" (one create phase for the rate, then end to end and the sustained rate) or "pay" (one create phase for the rate, then pay → paid) to measure only those`)
	natsSync := flag.String("nats-sync", "", "nats-server sync_interval (default always, the production setting; e.g. 2m for the NATS default)")
	payShare := flag.Float64("pay-share", 0.25, "rate of the pay → paid phase, as a share of the maximal create rate (the target is at 0.25)")
	payRate := flag.Float64("pay-rate", 0, "rate of the pay → paid phase per second, instead of -pay-share (to compare two builds at the same load)")
	e2eRate := flag.Float64("e2e-rate", 0, "rate of the end-to-end measurement per second, instead of 25% of the maximal create rate (to compare two builds at the same load)")
	flag.Parse()
	root, err := os.Getwd()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	state := *dir
	if !filepath.IsAbs(state) {
		state = filepath.Join(root, state)
	}
	rep, err := bench.Run(ctx, bench.Config{Root: root, Dir: state, Phase: *phase,
		Clients: []int{1, 16, 64}, Backlog: *backlog, Only: *only, NATSSync: *natsSync, PayShare: *payShare, PayRate: *payRate, E2ERate: *e2eRate, Out: os.Stdout})
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
	rep.Print(os.Stdout)
	rep.PrintProfiles(os.Stdout)
	file := filepath.Join(state, "results.json")
	if err := rep.WriteJSON(file); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
	fmt.Println("\nresults:", file)
}
