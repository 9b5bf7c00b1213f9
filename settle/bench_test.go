package settle_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/acme/orders/domain"
	"github.com/acme/orders/fakepsp"
	"github.com/acme/orders/settle"
)

// BenchmarkQuietTenantBehindAFlood measures what one tenant's flood of
// payment intents costs another tenant's single payment (G9): tenant
// "flood" has 3,000 intents queued in the stream (three consumer windows)
// when the worker starts, with default settings, and the provider answers
// every call after 20 ms; the quiet tenant's intent is published behind
// them. quiet-ms is from its publish to its order paid; flood-s is how
// long the flood took to settle. Run it with -benchtime 1x.
func BenchmarkQuietTenantBehindAFlood(b *testing.B) {
	const flood = 3000
	for b.Loop() {
		r := newRig(b, fakepsp.Faults{LatencyMS: 20})
		r.tenant = "flood"
		orders := make([]uuid.UUID, flood)
		for i := range orders {
			orders[i] = r.order(b)
			r.pay(b, orders[i], domain.DefaultPaymentMethod)
			r.publish(b, orders[i], domain.TypePaymentRequested, 0)
		}
		r.tenant = "quiet"
		quiet := r.order(b)
		r.pay(b, quiet, domain.DefaultPaymentMethod)

		start := time.Now()
		_, stop := r.start(b, settle.Config{})
		r.publish(b, quiet, domain.TypePaymentRequested, 0)
		published := time.Now()
		r.waitStatus(b, quiet, "paid", 5*time.Minute)
		quietPaid := time.Since(published)
		var paid int
		for paid < flood {
			if err := r.db.QueryRow(context.Background(), `SELECT count(*) FROM orders WHERE tenant_id = 'flood' AND status = 'paid'`).Scan(&paid); err != nil {
				b.Fatal(err)
			}
			if time.Since(start) > 5*time.Minute {
				b.Fatalf("%d of %d flood orders paid after 5 minutes", paid, flood)
			}
			time.Sleep(20 * time.Millisecond)
		}
		b.ReportMetric(float64(quietPaid.Milliseconds()), "quiet-ms")
		b.ReportMetric(time.Since(start).Seconds(), "flood-s")
		stop()
	}
}
