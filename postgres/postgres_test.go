package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/acme/orders/internal/testenv"
	"github.com/acme/orders/postgres"
)

// Open's session settings hold on every connection, and the URL can
// override each of them.
func TestOpenSessionSettings(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testenv.DatabaseURL(t)
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, c := range []struct {
		url              string
		timeout, planned string
	}{
		{url, "1min", "auto"},
		{url + sep + "statement_timeout=5s&plan_cache_mode=force_custom_plan", "5s", "force_custom_plan"},
	} {
		pool, err := postgres.Open(ctx, c.url, 2, 10*time.Second, logger)
		if err != nil {
			t.Fatal(err)
		}
		var timeout, planned string
		err = pool.QueryRow(ctx, `SELECT current_setting('statement_timeout'), current_setting('plan_cache_mode')`).Scan(&timeout, &planned)
		pool.Close()
		if err != nil {
			t.Fatal(err)
		}
		if timeout != c.timeout || planned != c.planned {
			t.Errorf("%s: statement_timeout %s, plan_cache_mode %s; want %s and %s", c.url, timeout, planned, c.timeout, c.planned)
		}
	}
}

// Unavailable tells the database being down (or refusing work while it
// stops, starts or is full) from a request's own failure.
func TestUnavailableTellsTheDatabaseDownFromOtherFailures(t *testing.T) {
	t.Parallel()
	pg := func(code string) error { return fmt.Errorf("claim: %w", &pgconn.PgError{Code: code}) }
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{pg("57P01"), true}, // admin shutdown
		{pg("57P03"), true}, // the database system is starting up
		{pg("53300"), true}, // too many connections
		{pg("08006"), true}, // connection failure
		{fmt.Errorf("create: %w", refused), true},
		{fmt.Errorf("create: %w", pgconn.ErrConnClosed), true},
		{fmt.Errorf("read: %w", io.ErrUnexpectedEOF), true},
		{pg("23505"), false}, // unique violation
		{pg("57014"), true},  // statement timeout: a server that stalls, a table locked by DDL
		{pg("55P03"), true},  // lock timeout
		{pg("25006"), true},  // read-only transaction: a standby after a failover
		{pg("53100"), true},  // disk full
		{pg("42P01"), false}, // undefined table: a bug of ours
		{fmt.Errorf("create: %w", context.DeadlineExceeded), false},
		{connectTimeout(t), true}, // a server that accepts and never answers
		{fmt.Errorf("create: %w", context.Canceled), false},
		{errors.New("some bug"), false},
		{nil, false},
	} {
		if got := postgres.Unavailable(tc.err); got != tc.want {
			t.Errorf("Unavailable(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// connectTimeout is the error of connecting, with connect_timeout=1, to a
// listener that accepts and never answers.
func connectTimeout(t *testing.T) error {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() })
		}
	}()
	conn, err := pgx.Connect(context.Background(), "postgres://postgres@"+l.Addr().String()+"/x?sslmode=disable&connect_timeout=1")
	if err == nil {
		conn.Close(context.Background())
		t.Fatal("connected to a listener that never answers")
	}
	return err
}
