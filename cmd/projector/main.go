// Command projector keeps the read models: it consumes the event stream and
// applies each batch of events to its projections in one transaction with the
// inbox, then acks. It serves /healthz, /readyz and /metrics on its own
// address (HTTP_ADDR or PROJECTOR_HTTP_ADDR; loopback 127.0.0.1:8081 by
// default).
//
// The program itself is app.RunProjectorProcess.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/acme/orders/internal/app"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := app.RunProjectorProcess(ctx, os.Args, os.Getenv, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "projector:", err)
		os.Exit(1)
	}
}
