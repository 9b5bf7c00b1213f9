// Package fakepsptest starts the local payment provider in-process for
// tests: on a fresh database of the PostgreSQL server named by
// TEST_DATABASE_URL (as internal/testenv), served over real HTTP.
package fakepsptest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http/httptest"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/acme/orders/fakepsp"
)

// SecretKey is a key the fake accepts.
const SecretKey = "sk_test_fakepsptest"

// DatabaseURL creates an empty database for the fake, dropped when the test
// ends, and returns its URL. It fails the test when TEST_DATABASE_URL is not
// set.
func DatabaseURL(tb testing.TB) string {
	tb.Helper()
	admin := os.Getenv("TEST_DATABASE_URL")
	if admin == "" {
		tb.Fatal("TEST_DATABASE_URL is not set: set it to the admin database of a PostgreSQL server you own, " +
			"e.g. postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable")
	}
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	name := "fakepsp_test_" + hex.EncodeToString(b)
	url, err := fakepsp.EnsureDatabase(context.Background(), admin, name)
	if err != nil {
		tb.Fatalf("create fakepsp database: %v", err)
	}
	tb.Cleanup(func() {
		conn, err := pgx.Connect(context.Background(), admin)
		if err != nil {
			tb.Errorf("drop %s: %v", name, err)
			return
		}
		defer conn.Close(context.Background())
		if _, err := conn.Exec(context.Background(), "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			tb.Errorf("drop %s: %v", name, err)
		}
	})
	return url
}

// Start serves a fake provider on dbURL (migrating it) at a loopback
// httptest server, both closed when the test ends. cfg.Pool is set here.
// Calling it twice on one dbURL is a restart: the ledger and the keys stay.
func Start(tb testing.TB, dbURL string, cfg fakepsp.Config) (*fakepsp.Server, *httptest.Server) {
	tb.Helper()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		tb.Fatalf("open fakepsp database: %v", err)
	}
	if err := fakepsp.Migrate(ctx, pool); err != nil {
		pool.Close()
		tb.Fatalf("migrate fakepsp database: %v", err)
	}
	cfg.Pool = pool
	srv, err := fakepsp.New(cfg)
	if err != nil {
		pool.Close()
		tb.Fatalf("new fakepsp: %v", err)
	}
	hs := httptest.NewServer(srv)
	tb.Cleanup(func() {
		hs.CloseClientConnections()
		hs.Close()
		pool.Close()
	})
	return srv, hs
}

// Ledger reads the ledger of srv, failing the test on an error.
func Ledger(tb testing.TB, srv *fakepsp.Server) fakepsp.Ledger {
	tb.Helper()
	l, err := srv.ReadLedger(context.Background())
	if err != nil {
		tb.Fatal(fmt.Errorf("read ledger: %w", err))
	}
	return l
}
