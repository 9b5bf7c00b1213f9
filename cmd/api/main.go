// Command api serves the order service's REST API and, unless -relay=false,
// relays the outbox to JetStream.
//
//	api            serve (the default)
//	api migrate    apply the schema migrations and exit
//
// The program itself is app.RunAPIProcess.
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
	if err := app.RunAPIProcess(ctx, os.Args, os.Getenv, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "api:", err)
		os.Exit(1)
	}
}
