package app

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/acme/orders/internal/invariant"
	"github.com/acme/orders/internal/testenv"
	"github.com/acme/orders/metrics"
	"github.com/acme/orders/projection"
	"github.com/acme/orders/stream"
)

// sqlRecorder is a pgx tracer that keeps every statement a pool runs.
type sqlRecorder struct {
	mu      sync.Mutex
	queries []recordedQuery
}

type recordedQuery struct {
	sql  string
	args []any
}

func (r *sqlRecorder) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.queries = append(r.queries, recordedQuery{sql: d.SQL, args: d.Args})
	return ctx
}

func (r *sqlRecorder) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// take returns the statements recorded since the last take.
func (r *sqlRecorder) take() []recordedQuery {
	r.mu.Lock()
	defer r.mu.Unlock()
	q := r.queries
	r.queries = nil
	return q
}

// unboundedTables grow with the traffic (or with every event, for each
// projection): a scrape must never scan them. projection_checkpoints has
// one row per projection and may be read whole.
var unboundedTables = []string{"inbox", "dead_letters", "outbox", "projection_positions",
	"order_views", "customer_summaries", "daily_sales", "orders", "idempotency_keys"}

// A projector scrape must stay cheap whatever the table sizes: with a big
// inbox and a big dead_letters table, a scrape issues at most one statement
// per projection plus a fixed few, and none of them scans an unbounded table
// (checked on the planner's own plan, with the scrape's arguments, after
// ANALYZE, so the planner knows how big the tables are). The recorder sees
// every statement the pool runs, so a new scrape query cannot escape the
// check.
func TestProjectorScrapeIsBoundedWhateverTheTableSizes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rec := &sqlRecorder{}
	cfg, err := pgxpool.ParseConfig(testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Tracer = rec
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	plain, err := pgxpool.New(ctx, cfg.ConnString()) // for EXPLAIN, unrecorded
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(plain.Close)

	for _, q := range []string{
		`INSERT INTO inbox (projection, event_id, tenant_id, aggregate_id, aggregate_version, stream_seq, applied_at)
SELECT p, gen_random_uuid(), 't1', gen_random_uuid(), 1, g, now() - g * interval '1 ms'
FROM unnest(ARRAY['order_views', 'customer_summaries', 'daily_sales']) AS p, generate_series(1, 60000) AS g`,
		`INSERT INTO dead_letters (projection, stream_seq, subject, payload, error, deliveries, status, aggregate_id, aggregate_version)
SELECT p, g, 'orders.events.x', '\x00', 'old', 1, 'retried', gen_random_uuid(), 1
FROM unnest(ARRAY['order_views', 'customer_summaries', 'daily_sales']) AS p, generate_series(1, 20000) AS g`,
		`INSERT INTO dead_letters (projection, stream_seq, subject, payload, error, deliveries, status, aggregate_id, aggregate_version)
SELECT 'order_views', g, 'orders.events.x', '\x00', 'now', 1, CASE WHEN g <= 3 THEN 'open' ELSE 'parked' END, gen_random_uuid(), 1
FROM generate_series(1, 5) AS g`,
		`ANALYZE`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("fill the tables: %v", err)
		}
	}

	js := testenv.JetStream(t)
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	var runners []*projection.Runner
	for _, p := range projections() {
		r, err := projection.NewRunner(pool, js, p, logger, projection.Config{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := r.Consumer(ctx); err != nil {
			t.Fatal(err)
		}
		runners = append(runners, r)
	}
	pruner, err := projection.NewInboxPruner(pool, []string{"order_views"}, projection.Config{}, projection.InboxPruneConfig{}, logger)
	if err != nil {
		t.Fatal(err)
	}
	reg := metrics.NewRegistry()
	if err := metrics.Register(reg, projectorMetrics(ctx, runners, pruner, pool, logger)...); err != nil {
		t.Fatal(err)
	}
	h := metrics.Handler(reg)
	rec.take()

	for scrape := range 2 {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/metrics", nil))
		if w.Code != http.StatusOK {
			t.Fatalf("scrape %d: status %d", scrape, w.Code)
		}
		body := w.Body.String()
		for _, want := range []string{
			`orders_projection_dead_letters_open{projection="order_views"} 3`,
			`orders_projection_dead_letters_open{projection="daily_sales"} 0`,
			`orders_projection_dead_letters_parked{projection="order_views"} 2`,
			`orders_projection_pending_events{projection="customer_summaries"} 0`,
			`orders_projection_inbox_rows_estimated 180000`,
			`orders_projection_inbox_pruned_total 0`,
		} {
			if !strings.Contains(body, want+"\n") {
				t.Errorf("scrape %d has no line %q:\n%s", scrape, want, body)
			}
		}

		queries := rec.take()
		if max := len(runners) + 1; len(queries) > max {
			t.Errorf("scrape %d ran %d statements, want at most %d (one per projection and one more)", scrape, len(queries), max)
		}
		for _, q := range queries {
			for _, table := range seqScans(t, plain, q) {
				t.Errorf("scrape %d scans %s whole:\n%s", scrape, table, q.sql)
			}
		}
	}
}

// seqScans plans q with its arguments and returns the unbounded tables its
// plan reads whole.
func seqScans(t *testing.T, pool *pgxpool.Pool, q recordedQuery) []string {
	t.Helper()
	var plan []byte
	if err := pool.QueryRow(context.Background(), "EXPLAIN (FORMAT JSON) "+q.sql, q.args...).Scan(&plan); err != nil {
		t.Fatalf("explain %s: %v", q.sql, err)
	}
	var nodes []struct{ Plan planNode }
	if err := json.Unmarshal(plan, &nodes); err != nil {
		t.Fatal(err)
	}
	var found []string
	var walk func(n planNode)
	walk = func(n planNode) {
		for _, table := range unboundedTables {
			if n.NodeType == "Seq Scan" && n.Relation == table {
				found = append(found, table)
			}
		}
		for _, c := range n.Plans {
			walk(c)
		}
	}
	for _, n := range nodes {
		walk(n.Plan)
	}
	return found
}

type planNode struct {
	NodeType string     `json:"Node Type"`
	Relation string     `json:"Relation Name"`
	Plans    []planNode `json:"Plans"`
}

// The applied rate is measured over about the last minute of scrapes, from
// the process start until a minute has passed.
func TestRateWindow(t *testing.T) {
	t.Parallel()
	start := time.Unix(1000, 0)
	w := newRateWindow(start, time.Minute)
	for _, c := range []struct {
		after time.Duration
		n     int64
		want  float64
	}{
		{15 * time.Second, 150, 10},    // since the start
		{30 * time.Second, 300, 10},    // since the start
		{75 * time.Second, 1050, 15},   // since 15 s, the newest sample a minute old
		{90 * time.Second, 1050, 12.5}, // since 30 s
	} {
		if got := w.observe(start.Add(c.after), c.n); got != c.want {
			t.Errorf("after %s at %d: rate %g, want %g", c.after, c.n, got, c.want)
		}
	}
}

// A projection whose consumer is missing (deleted, or lost with NATS's
// JetStream state, and no projector running to create it again) says so in
// `projector status` and in /metrics, with the events it leaves unapplied
// counted as pending: it used to look like a projection with nothing
// pending.
func TestStatusAndMetricsShowAMissingConsumer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, js := testenv.DB(t), testenv.JetStream(t)
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	var runners []*projection.Runner
	for _, p := range projections() {
		r, err := projection.NewRunner(pool, js, p, logger, projection.Config{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := r.Consumer(ctx); err != nil {
			t.Fatal(err)
		}
		runners = append(runners, r)
	}
	for range 2 {
		if _, err := js.Publish(ctx, stream.Subject("order.created"), []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	if err := js.DeleteConsumer(ctx, stream.Name, "order_views"); err != nil {
		t.Fatal(err)
	}

	var out bytes.Buffer
	if err := printStatus(ctx, runners, &out); err != nil {
		t.Fatal(err)
	}
	status := out.String()
	t.Logf("projector status:\n%s", status)
	for _, line := range strings.Split(status, "\n") {
		fields := strings.Fields(line)
		switch {
		case len(fields) == 0 || fields[0] == "PROJECTION" || !slices.Contains(invariant.Projections, fields[0]):
		case fields[0] == "order_views" && (fields[1] != "2" || fields[len(fields)-1] != "missing"):
			t.Errorf("status of order_views: %q; want 2 pending and its consumer missing", line)
		case fields[0] != "order_views" && fields[len(fields)-1] != "ok":
			t.Errorf("status of %s: %q; want its consumer ok", fields[0], line)
		}
	}
	if !strings.Contains(status, "no consumer (so nothing applies the stream) for: order_views.") {
		t.Errorf("status does not say which consumer is missing:\n%s", status)
	}

	pruner, err := projection.NewInboxPruner(pool, []string{"order_views"}, projection.Config{}, projection.InboxPruneConfig{}, logger)
	if err != nil {
		t.Fatal(err)
	}
	reg := metrics.NewRegistry()
	if err := metrics.Register(reg, projectorMetrics(ctx, runners, pruner, pool, logger)...); err != nil {
		t.Fatal(err)
	}
	w := httptest.NewRecorder()
	metrics.Handler(reg).ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	for _, want := range []string{
		`orders_projection_consumer_missing{projection="order_views"} 1`,
		`orders_projection_consumer_missing{projection="daily_sales"} 0`,
		`orders_projection_pending_events{projection="order_views"} 2`,
	} {
		if !strings.Contains(w.Body.String(), want+"\n") {
			t.Errorf("/metrics has no line %q:\n%s", want, w.Body.String())
		}
	}
}
