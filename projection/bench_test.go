package projection

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/acme/orders/domain"
	"github.com/acme/orders/internal/testenv"
	"github.com/acme/orders/postgres"
)

// BenchmarkApplyBatch measures one projection transaction of 100 new
// order.created events (gate, inbox, apply, positions, checkpoint) for each
// projection; ns/op is per batch, events/s is derived.
func BenchmarkApplyBatch(b *testing.B) {
	db := testenv.DB(b)
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	now := time.Now().UTC().Truncate(time.Microsecond)
	for _, p := range []Projection{OrderViews{}, CustomerSummaries{}, DailySales{}} {
		b.Run(p.Name(), func(b *testing.B) {
			r := mustRunner(b, db, nil, p, logger, Config{})
			ctx := context.Background()
			var seq uint64
			b.ReportAllocs()
			for b.Loop() {
				b.StopTimer()
				events := make([]*event, 100)
				for i := range events {
					o, ev, _ := domain.CreateOrder(uuid.Must(uuid.NewV7()), "t1", domain.NewOrder{CustomerID: "c-" + string(rune('a'+i%20)), Currency: "EUR",
						Lines: []domain.Line{{SKU: "s", Quantity: 1, UnitPrice: 100}}}, now)
					env, _ := domain.NewEnvelope(uuid.Must(uuid.NewV7()), o, ev, now)
					data, _ := json.Marshal(env)
					seq++
					events[i] = &event{data: data, seq: seq, deliveries: 1}
				}
				decode(events)
				b.StartTimer()
				if err := postgres.InTx(ctx, db, func(tx pgx.Tx) error { return r.commitTx(ctx, tx, events) }); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(100*float64(b.N)/b.Elapsed().Seconds(), "events/s")
		})
	}
}
