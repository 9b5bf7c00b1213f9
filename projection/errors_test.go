package projection

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/acme/orders/internal/testenv"
)

// failingTracer makes every query whose SQL contains match fail (with a
// cancelled context) while fail is set, and counts those queries.
type failingTracer struct {
	match string
	fail  atomic.Bool
	hits  atomic.Int64
}

func (f *failingTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if !strings.Contains(data.SQL, f.match) {
		return ctx
	}
	f.hits.Add(1)
	if !f.fail.Load() {
		return ctx
	}
	failed, cancel := context.WithCancel(ctx)
	cancel()
	return failed
}

func (f *failingTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// tracedDB opens a pool on a fresh database whose queries go through tracer.
func tracedDB(t *testing.T, tracer pgx.QueryTracer) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Tracer = tracer
	db, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	return db
}

// An event on its last delivery whose predecessor is missing asks whether
// its order has an open dead letter (to park behind it). While that lookup
// fails, the answer is unknown, not "no": the event is redelivered, never
// parked on a guess. Once the lookup works, it is parked, waiting for v1.
func TestFailedDeadLetterLookupIsNotReadAsNone(t *testing.T) {
	t.Parallel()
	tracer := &failingTracer{match: "SELECT EXISTS (SELECT 1 FROM dead_letters"}
	tracer.fail.Store(true)
	db := tracedDB(t, tracer)
	f := newFixture(t, Config{})
	f.db = db
	f.runner = mustRunner(t, db, f.js, OrderViews{}, slog.New(slog.NewTextHandler(testLogOutput(), nil)),
		Config{Workers: 1, MaxDeliver: 1, GapDelay: 10 * time.Millisecond})

	v2 := createdEvent(t, uuid.Must(uuid.NewV7()))
	v2.AggregateVersion = 2 // v1 never comes
	f.publish(t, v2, v2.ID.String())
	f.run(t)

	eventually(t, "the lookup failed on three deliveries", func() bool { return tracer.hits.Load() >= 3 })
	if n := f.count(t, `SELECT count(*) FROM dead_letters`); n != 0 {
		t.Fatalf("%d dead letters written while the lookup failed; want none", n)
	}
	tracer.fail.Store(false)
	eventually(t, "the event is parked once the lookup answers", func() bool {
		return f.count(t, `SELECT count(*) FROM dead_letters WHERE status = 'parked' AND event_id = $1 AND error LIKE 'waiting for version 1%'`, v2.ID) == 1
	})
}
