package outbox

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/acme/orders/internal/testenv"
	"github.com/acme/orders/postgres"
)

// The relay's lease connection plans each statement for its arguments
// (plan_cache_mode force_custom_plan): its claim and mark are the
// statements whose generic plans, made while the outbox was nearly empty,
// turned into scans of the whole outbox. The pool's other connections keep
// PostgreSQL's default (auto), which plans a repeated statement once.
func TestLeaseConnectionPlansPerStatement(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn, pool := leaseConnection(t)
	var lease, other string
	if err := conn.QueryRow(ctx, `SELECT current_setting('plan_cache_mode')`).Scan(&lease); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `SELECT current_setting('plan_cache_mode')`).Scan(&other); err != nil {
		t.Fatal(err)
	}
	if lease != "force_custom_plan" || other != "auto" {
		t.Errorf("plan_cache_mode: lease connection %s, pool %s; want force_custom_plan and auto", lease, other)
	}
}

// The lease connection holds its partitions' locks: PostgreSQL probes it,
// so a relay cut off from it (no FIN ever arrives) loses them within about
// 11 s, not the kernel's default of over 2 hours of silence.
func TestLeaseConnectionIsProbedByTheServer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn, _ := leaseConnection(t)
	var idle, interval, count, userTimeout string
	if err := conn.QueryRow(ctx, `SELECT current_setting('tcp_keepalives_idle'), current_setting('tcp_keepalives_interval'),
       current_setting('tcp_keepalives_count'), current_setting('tcp_user_timeout')`).Scan(&idle, &interval, &count, &userTimeout); err != nil {
		t.Fatal(err)
	}
	// Over a Unix socket these read 0: the tests connect over TCP.
	if idle != "5" || interval != "2" || count != "3" || userTimeout != "11000" {
		t.Errorf("the lease connection: keepalives idle %s, interval %s, count %s, user timeout %s; want 5, 2, 3, 11000 (a TCP connection: %s)",
			idle, interval, count, userTimeout, testenv.DatabaseURL(t))
	}
}

// leaseConnection returns a relay worker's lease connection, and the pool
// it came from, on a database of the test's own.
func leaseConnection(t *testing.T) (*pgx.Conn, *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	pool, err := postgres.Open(ctx, testenv.DatabaseURL(t), 4, 10*time.Second, logger)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	w := &worker{r: &Relay{db: pool, logger: logger, cfg: Config{TakeoverInterval: time.Second}}, logger: logger, maxPartitions: Partitions}
	t.Cleanup(w.release)
	conn, _, err := w.lease(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return conn, pool
}
