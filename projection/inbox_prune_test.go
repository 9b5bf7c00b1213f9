package projection

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/acme/orders/domain"
	"github.com/acme/orders/stream"
)

// v7At returns a random UUIDv7 whose timestamp is at.
func v7At(t *testing.T, at time.Time) uuid.UUID {
	t.Helper()
	var id uuid.UUID
	if _, err := rand.Read(id[:]); err != nil {
		t.Fatal(err)
	}
	var ms [8]byte
	binary.BigEndian.PutUint64(ms[:], uint64(at.UnixMilli()))
	copy(id[:6], ms[2:])
	id[6] = id[6]&0x0f | 0x70
	id[8] = id[8]&0x3f | 0x80
	return id
}

func newPruner(t *testing.T, f fixture, names []string, cfg InboxPruneConfig) *InboxPruner {
	t.Helper()
	p, err := NewInboxPruner(f.db, names, Config{}, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// The pruner deletes the inbox rows of events older than the retention, in
// statements of at most Batch rows, and keeps the recent ones and those of
// projections it does not prune.
func TestInboxPrunerDeletesOldRowsInBatchesAndKeepsRecentOnes(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Config{})
	ctx := context.Background()
	insert := func(projection string, at time.Time, n int) {
		t.Helper()
		ids := make([]uuid.UUID, n)
		for i := range ids {
			ids[i] = v7At(t, at)
		}
		if _, err := f.db.Exec(ctx, `
INSERT INTO inbox (projection, event_id, tenant_id, aggregate_id, aggregate_version, stream_seq)
SELECT $1, id, 't1', gen_random_uuid(), 1, 1 FROM unnest($2::uuid[]) AS id`, projection, ids); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now()
	insert("order_views", now.Add(-30*24*time.Hour), 1500)
	insert("order_views", now.Add(-(DefaultInboxRetention + time.Hour)), 1000)
	insert("order_views", now.Add(-(DefaultInboxRetention - time.Hour)), 7) // within the retention
	insert("order_views", now, 5)
	insert("customer_summaries", now.Add(-30*24*time.Hour), 3) // not this pruner's

	p := newPruner(t, f, []string{"order_views"}, InboxPruneConfig{Batch: 1000})
	stats, err := p.Prune(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if stats.Deleted != 2500 || stats.Statements != 3 {
		t.Errorf("pruned %d rows in %d statements, want 2500 in 3 (1000, 1000, 500)", stats.Deleted, stats.Statements)
	}
	if n := f.count(t, `SELECT count(*) FROM inbox WHERE projection = 'order_views'`); n != 12 {
		t.Errorf("order_views keeps %d inbox rows, want the 12 within the retention", n)
	}
	if n := f.count(t, `SELECT count(*) FROM inbox WHERE projection = 'customer_summaries'`); n != 3 {
		t.Errorf("customer_summaries keeps %d inbox rows, want 3", n)
	}
	if got := p.Deleted(); got != 2500 {
		t.Errorf("Deleted() = %d, want 2500", got)
	}
	if stats, err := p.Prune(ctx); err != nil || stats.Deleted != 0 || stats.Statements != 1 {
		t.Errorf("second prune: %+v, %v; want nothing deleted in one statement", stats, err)
	}
}

// A retention longer than the time since 1970 keeps every row: the floor
// "now minus the retention" stops at the epoch instead of wrapping to a
// UUIDv7 far in the future (which deleted the whole inbox at every sweep).
func TestInboxPrunerWithARetentionPastTheEpochKeepsEverything(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Config{})
	ctx := context.Background()
	ids := []uuid.UUID{v7At(t, time.Now().Add(-30*24*time.Hour)), v7At(t, time.Now())}
	if _, err := f.db.Exec(ctx, `
INSERT INTO inbox (projection, event_id, tenant_id, aggregate_id, aggregate_version, stream_seq)
SELECT 'order_views', id, 't1', gen_random_uuid(), 1, 1 FROM unnest($1::uuid[]) AS id`, ids); err != nil {
		t.Fatal(err)
	}
	for _, retention := range []time.Duration{100 * 365 * 24 * time.Hour, time.Duration(math.MaxInt64)} {
		p := newPruner(t, f, []string{"order_views"}, InboxPruneConfig{Retention: retention})
		if stats, err := p.Prune(ctx); err != nil || stats.Deleted != 0 {
			t.Errorf("retention %s: pruned %+v, %v; want nothing deleted", retention, stats, err)
		}
	}
	if n := f.count(t, `SELECT count(*) FROM inbox WHERE projection = 'order_views'`); n != 2 {
		t.Errorf("order_views keeps %d inbox rows, want both", n)
	}
}

// An event whose inbox row was pruned and that is then delivered again (a
// republish past the duplicate window, a consumer replay) has no effect:
// the version gate finds the projection past it, and it counts as stale.
// customer_summaries is built from deltas, so a second application would
// count the order twice.
func TestRedeliveredPrunedEventIsStale(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Config{})
	f.runner = mustRunner(t, f.db, f.js, CustomerSummaries{}, slog.New(slog.NewTextHandler(io.Discard, nil)), Config{})
	f.run(t)
	ctx := context.Background()

	orderID := uuid.Must(uuid.NewV7())
	env := createdEvent(t, orderID)
	env.ID = v7At(t, time.Now().Add(-(DefaultInboxRetention + time.Hour))) // an event from before the retention
	publishEnvelope(t, f, env, "first")
	eventually(t, "the event is applied", func() bool { return f.runner.Stats().Applied == 1 })

	stats, err := newPruner(t, f, []string{"customer_summaries"}, InboxPruneConfig{}).Prune(ctx)
	if err != nil || stats.Deleted != 1 {
		t.Fatalf("prune: %+v, %v; want its one row deleted", stats, err)
	}
	if n := f.count(t, `SELECT count(*) FROM inbox WHERE event_id = $1`, env.ID); n != 0 {
		t.Fatalf("inbox rows of the event after pruning = %d, want 0", n)
	}

	publishEnvelope(t, f, env, "again, past the duplicate window")
	eventually(t, "the redelivered event is judged", func() bool { return f.runner.Stats().Stale == 1 })
	if s := f.runner.Stats(); s.Applied != 1 || s.Duplicates != 0 {
		t.Errorf("stats %+v, want 1 applied and the copy stale", s)
	}
	if n := f.count(t, `SELECT orders_pending FROM customer_summaries WHERE customer_id = 'c-1'`); n != 1 {
		t.Errorf("orders_pending = %d, want 1 (the order counted once)", n)
	}
}

// A retention that does not outlast the stream's duplicate window and the
// runner's redelivery horizon is refused, naming the field.
func TestInboxPruneConfigIsValidated(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		runner Config
		cfg    InboxPruneConfig
		want   string
	}{
		{"below the minimum", Config{}, InboxPruneConfig{Retention: 30 * time.Minute}, "Retention"},
		{"within the redelivery horizon", Config{MaxDeliver: 100, AckWait: time.Minute}, InboxPruneConfig{Retention: 2 * time.Hour}, "Retention"},
		{"batch too big", Config{}, InboxPruneConfig{Batch: 100_000}, "Batch"},
	} {
		_, err := NewInboxPruner(nil, []string{"order_views"}, c.runner, c.cfg, slog.New(slog.DiscardHandler))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err %v, want one naming %s", c.name, err, c.want)
		}
	}
	if _, err := NewInboxPruner(nil, []string{"order_views"}, Config{}, InboxPruneConfig{}, slog.New(slog.DiscardHandler)); err != nil {
		t.Errorf("defaults: %v", err)
	}
	if h := RedeliveryHorizon(Config{}); h <= stream.DuplicateWindow || h >= DefaultInboxRetention {
		t.Errorf("default redelivery horizon %s: want between the duplicate window and the default retention", h)
	}
}

func publishEnvelope(t *testing.T, f fixture, env domain.Envelope, msgID string) {
	t.Helper()
	b, err := json.Marshal(env)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.js.Publish(context.Background(), stream.Subject(env.Type), b, jetstream.WithMsgID(msgID)); err != nil {
		t.Fatal(err)
	}
}

// The pruner deletes a projection's dead letters that a re-drive applied
// ('retried') longer ago than the retention, in statements of at most
// Batch rows, and keeps the recent ones, the unresolved ones, the discarded
// ones (a rebuild reads them) and other projections' ones.
func TestInboxPrunerDeletesOldRedrivenDeadLetters(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Config{})
	ctx := context.Background()
	insert := func(projection, status string, resolvedAgo time.Duration, n int) {
		t.Helper()
		if _, err := f.db.Exec(ctx, `
INSERT INTO dead_letters (projection, tenant_id, event_id, aggregate_id, aggregate_version, stream_seq,
                          subject, payload, error, deliveries, status, resolved_at)
SELECT $1, 't1', gen_random_uuid(), gen_random_uuid(), 1, 1, 'events.t1', '\x7b7d', 'x', 1, $2,
       CASE WHEN $2 IN ('retried', 'discarded') THEN now() - $3::bigint * interval '1 millisecond' END
FROM generate_series(1, $4)`, projection, status, resolvedAgo.Milliseconds(), n); err != nil {
			t.Fatal(err)
		}
	}
	old := DefaultInboxRetention + time.Hour
	insert("order_views", "retried", old, 5)
	insert("order_views", "retried", DefaultInboxRetention-time.Hour, 2) // within the retention
	insert("order_views", "discarded", old, 3)
	insert("order_views", "open", 0, 1)
	insert("order_views", "parked", 0, 1)
	insert("customer_summaries", "retried", old, 4) // not this pruner's

	p := newPruner(t, f, []string{"order_views"}, InboxPruneConfig{Batch: 2})
	stats, err := p.Prune(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if stats.DeadLetters != 5 {
		t.Errorf("pruned %d dead letters, want the 5 retried longer ago than the retention", stats.DeadLetters)
	}
	rows, _ := f.db.Query(ctx, `SELECT projection || '/' || status, count(*) FROM dead_letters GROUP BY 1 ORDER BY 1`)
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
		var k string
		var n int
		err := r.Scan(&k, &n)
		return fmt.Sprintf("%s=%d", k, n), err
	})
	if err != nil {
		t.Fatal(err)
	}
	want := "customer_summaries/retried=4 order_views/discarded=3 order_views/open=1 order_views/parked=1 order_views/retried=2"
	if strings.Join(got, " ") != want {
		t.Errorf("dead letters left: %s\nwant %s", strings.Join(got, " "), want)
	}
}
