package projection

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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

// BenchmarkApplyBatch measures one projection transaction of n new
// order.created events (gate, inbox, apply, positions) for each projection,
// at n = 3 (a batch under light load) and n = 100, each way: "careful"
// (BEGIN, positions, inbox, apply, COMMIT: commitTx) and "pipelined" (the
// same in two round trips: commitPipelined). ns/op is per batch; events/s
// is derived. The two ways run one after the other in the same run (the
// pipelined one second, on tables a little larger), so compare them within
// a run: with -count N, each count runs both.
func BenchmarkApplyBatch(b *testing.B) {
	db := testenv.DB(b)
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	now := time.Now().UTC().Truncate(time.Microsecond)
	var seq uint64
	batch := func(n int) []*event {
		events := make([]*event, n)
		for i := range events {
			o, ev, _ := domain.CreateOrder(uuid.Must(uuid.NewV7()), "t1", domain.NewOrder{CustomerID: "c-" + string(rune('a'+i%20)), Currency: "EUR",
				Lines: []domain.Line{{SKU: "s", Quantity: 1, UnitPrice: 100}}}, now)
			env, _ := domain.NewEnvelope(uuid.Must(uuid.NewV7()), o, ev, now)
			data, _ := json.Marshal(env)
			seq++
			events[i] = &event{data: data, seq: seq, deliveries: 1}
		}
		return decode(events)
	}
	for _, p := range []Projection{OrderViews{}, CustomerSummaries{}, DailySales{}} {
		r := mustRunner(b, db, nil, p, logger, Config{})
		ways := []struct {
			name  string
			apply func(ctx context.Context, events []*event) error
		}{
			{"careful", func(ctx context.Context, events []*event) error {
				return postgres.InTx(ctx, db, func(tx pgx.Tx) error { return r.commitTx(ctx, tx, events) })
			}},
			{"pipelined", func(ctx context.Context, events []*event) error {
				if !r.commitPipelined(ctx, events) {
					return errors.New("the pipelined batch was refused")
				}
				return nil
			}},
		}
		for _, n := range []int{3, 100} {
			for _, way := range ways {
				b.Run(fmt.Sprintf("%s/%d/%s", p.Name(), n, way.name), func(b *testing.B) {
					ctx := context.Background()
					b.ReportAllocs()
					for b.Loop() {
						b.StopTimer()
						events := batch(n)
						b.StartTimer()
						if err := way.apply(ctx, events); err != nil {
							b.Fatal(err)
						}
					}
					b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "events/s")
				})
			}
		}
	}
}

// BenchmarkRebuild measures a rebuild of order_views from an event log of n
// events (distinct new orders), for two sizes of the log: the events/s of
// the two should be about the same, since a rebuild reads the log once
// (twice, counting the catch-up walk before the swap), whatever its length.
func BenchmarkRebuild(b *testing.B) {
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, n := range []int{10_000, 40_000} {
		b.Run(fmt.Sprintf("order_views/%d", n), func(b *testing.B) {
			ctx := context.Background()
			db := testenv.DB(b)
			if _, err := db.Exec(ctx, logEventsSQL, n); err != nil {
				b.Fatal(err)
			}
			if _, err := db.Exec(ctx, `VACUUM ANALYZE outbox`); err != nil {
				b.Fatal(err)
			}
			r := mustRunner(b, db, nil, OrderViews{}, logger, Config{})
			for b.Loop() {
				st, err := r.Rebuild(ctx)
				if err != nil {
					b.Fatal(err)
				}
				if st.Events != n {
					b.Fatalf("rebuilt %d events, want %d", st.Events, n)
				}
			}
			b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "events/s")
		})
	}
}
