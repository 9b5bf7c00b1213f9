package tracing_test

import (
	"context"
	"testing"

	"github.com/acme/orders/tracing"
)

// BenchmarkOffPath is what a command pays per create with tracing off: the
// transaction's StartChild and the outbox row's Inject under no span.
func BenchmarkOffPath(b *testing.B) {
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		cctx, span := tracing.StartChild(ctx, "command")
		if tp, _ := tracing.Inject(cctx); tp != "" {
			b.Fatal("traceparent with tracing off")
		}
		span.End()
	}
}
