// Command worker is the payment worker: it consumes payment.requested and
// refund.requested intents from JetStream, charges or refunds through the
// Stripe-compatible provider (PAYMENT_PROVIDER_URL, by default the local
// cmd/fakepsp) with the idempotency key each intent carries, records the
// outcome in one transaction with an inbox row, then acks. It serves
// /healthz, /readyz and /metrics on WORKER_HTTP_ADDR (loopback
// 127.0.0.1:8082 by default). Any number of workers may run at once.
//
// The program itself is app.RunWorker.
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
	if err := app.RunWorker(ctx, os.Args, os.Getenv, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(1)
	}
}
