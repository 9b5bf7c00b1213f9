// Package testenv gives integration tests real infrastructure: a fresh,
// migrated PostgreSQL database per test (cloned from a template) and an
// embedded NATS JetStream server per test.
//
// PostgreSQL is not started here: `make test` starts a local server and sets
// TEST_DATABASE_URL to its admin database. Without it, tests fail (never
// skip) with a message saying so.
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/acme/orders/internal/harness"
	"github.com/acme/orders/migrations"
	"github.com/acme/orders/postgres"
)

const envAdminURL = "TEST_DATABASE_URL"

var (
	templateOnce sync.Once
	templateName string
	templateErr  error
)

// DatabaseURL creates a fresh database migrated to the newest schema, drops
// it when the test ends, and returns its URL.
func DatabaseURL(tb testing.TB) string {
	tb.Helper()
	admin := os.Getenv(envAdminURL)
	if admin == "" {
		tb.Fatalf("%s is not set. Run the tests with `make test`, which starts a local PostgreSQL 15 "+
			"and sets it; or set it yourself to the admin database of a PostgreSQL server you own, "+
			"e.g. postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable", envAdminURL)
	}
	templateOnce.Do(func() { templateName, templateErr = ensureTemplate(admin) })
	if templateErr != nil {
		tb.Fatalf("prepare template database: %v", templateErr)
	}

	ctx := context.Background()
	name := "test_" + randomHex(8)
	if err := adminExec(ctx, admin, fmt.Sprintf("CREATE DATABASE %s TEMPLATE %s",
		pgx.Identifier{name}.Sanitize(), pgx.Identifier{templateName}.Sanitize())); err != nil {
		tb.Fatalf("create test database: %v", err)
	}
	tb.Cleanup(func() {
		if err := adminExec(context.Background(), admin, fmt.Sprintf("DROP DATABASE IF EXISTS %s WITH (FORCE)", pgx.Identifier{name}.Sanitize())); err != nil {
			tb.Errorf("drop test database %s: %v", name, err)
		}
	})
	return withDatabase(tb, admin, name)
}

// DB returns a pool on a fresh, migrated database, closed when the test
// ends, with the session settings of the service's own pools.
func DB(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	pool, err := postgres.Open(context.Background(), DatabaseURL(tb), 0, 10*time.Second, slog.New(slog.DiscardHandler))
	if err != nil {
		tb.Fatalf("open test database: %v", err)
	}
	tb.Cleanup(pool.Close) // runs before the DROP registered earlier
	return pool
}

// ensureTemplate creates, once per set of migrations, a template database
// migrated with them. Test binaries of several packages run at once: an
// advisory lock on the admin database lets exactly one of them build it.
func ensureTemplate(admin string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	name := "tmpl_" + migrations.Checksum()[:16]
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return "", fmt.Errorf("connect to %s (is PostgreSQL running? `make test` starts one): %w", redact(admin), err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock(7262531)"); err != nil {
		return "", err
	}
	defer conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock(7262531)") //nolint:errcheck

	var ready bool
	err = conn.QueryRow(ctx, "SELECT datistemplate FROM pg_database WHERE datname = $1", name).Scan(&ready)
	if err == nil && ready {
		return name, nil
	}
	// Absent, or left half-built by an interrupted run: build it anew.
	ident := pgx.Identifier{name}.Sanitize()
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+ident+" WITH (FORCE)"); err != nil {
		return "", err
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+ident); err != nil {
		return "", err
	}
	tconn, err := pgx.Connect(ctx, withDatabase(nil, admin, name))
	if err != nil {
		return "", err
	}
	err = migrations.Apply(ctx, tconn)
	tconn.Close(ctx)
	if err != nil {
		return "", err
	}
	if _, err := conn.Exec(ctx, "ALTER DATABASE "+ident+" WITH IS_TEMPLATE true"); err != nil {
		return "", err
	}
	return name, nil
}

func adminExec(ctx context.Context, admin, sql string) error {
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql)
	return err
}

func withDatabase(tb testing.TB, admin, name string) string {
	u, err := url.Parse(admin)
	if err != nil {
		if tb != nil {
			tb.Fatalf("parse %s: %v", envAdminURL, err)
		}
		return ""
	}
	u.Path = "/" + name
	return u.String()
}

func redact(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(unparsable url)"
	}
	return u.Redacted()
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// NATS starts an embedded NATS server with JetStream, its store in a
// temporary directory, shut down when the test ends. It returns the server,
// whose ClientURL() is what clients dial.
func NATS(tb testing.TB) *server.Server {
	tb.Helper()
	ns, err := server.NewServer(&server.Options{
		Host:      "127.0.0.1",
		Port:      -1,
		JetStream: true,
		StoreDir:  storeDir(tb),
		NoLog:     true,
		NoSigs:    true,
	})
	if err != nil {
		tb.Fatalf("new nats server: %v", err)
	}
	tb.Cleanup(func() { // registered first, so a failed start is shut down too
		ns.Shutdown()
		ns.WaitForShutdown()
	})
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		tb.Fatal("embedded nats server did not start within 10s")
	}
	return ns
}

// NATSCluster starts an embedded JetStream cluster of n servers on loopback,
// each with its own store, shut down when the test ends. It returns the
// servers and a client URL list naming all of them. It waits until the
// cluster has a JetStream meta leader.
func NATSCluster(tb testing.TB, n int) ([]*server.Server, string) {
	tb.Helper()
	ports := make([]int, n)
	for i := range ports {
		ports[i] = freePort(tb)
	}
	var routes []string
	for _, p := range ports {
		routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", p))
	}
	servers := make([]*server.Server, n)
	var urls []string
	for i := range servers {
		ns, err := server.NewServer(&server.Options{
			ServerName: fmt.Sprintf("node-%d", i+1),
			Host:       "127.0.0.1",
			Port:       -1,
			JetStream:  true,
			StoreDir:   storeDir(tb),
			Cluster:    server.ClusterOpts{Name: "orders-test", Host: "127.0.0.1", Port: ports[i]},
			Routes:     server.RoutesFromStr(strings.Join(routes, ",")),
			NoLog:      true,
			NoSigs:     true,
		})
		if err != nil {
			tb.Fatalf("new nats server %d: %v", i+1, err)
		}
		go ns.Start()
		servers[i] = ns
		tb.Cleanup(func() {
			ns.Shutdown()
			ns.WaitForShutdown()
		})
	}
	for i, ns := range servers {
		if !ns.ReadyForConnections(20 * time.Second) {
			tb.Fatalf("nats server %d did not start within 20s", i+1)
		}
		urls = append(urls, ns.ClientURL())
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		ready := 0
		for _, ns := range servers {
			if ns.JetStreamIsClustered() && ns.JetStreamIsCurrent() {
				ready++
			}
		}
		if ready == n {
			break
		}
		if time.Now().After(deadline) {
			tb.Fatal("the JetStream cluster did not form within 30s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	return servers, strings.Join(urls, ",")
}

// storeDir is a new directory for a NATS server's store, removed when the
// test ends, after the server's own cleanup (registered later, so run
// earlier). Not tb.TempDir: a server that has shut down can still be
// removing an atomic batch's directory, and TempDir's single RemoveAll then
// fails the test with "directory not empty"; this one retries for 5 s.
func storeDir(tb testing.TB) string {
	tb.Helper()
	dir, err := os.MkdirTemp("", "nats-store-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		deadline := time.Now().Add(5 * time.Second)
		for {
			err := os.RemoveAll(dir)
			if err == nil {
				return
			}
			if time.Now().After(deadline) {
				tb.Errorf("remove the NATS store %s: %v", dir, err)
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
	return dir
}

func freePort(tb testing.TB) int {
	tb.Helper()
	port, err := harness.FreePort()
	if err != nil {
		tb.Fatal(err)
	}
	return port
}

// JetStream starts an embedded NATS server (see NATS) and returns a
// JetStream client on it, closed when the test ends.
func JetStream(tb testing.TB) jetstream.JetStream {
	tb.Helper()
	return JetStreamAt(tb, NATS(tb).ClientURL())
}

// JetStreamAt returns a JetStream client on url, closed when the test ends.
func JetStreamAt(tb testing.TB, url string) jetstream.JetStream {
	tb.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		tb.Fatalf("connect to nats at %s: %v", url, err)
	}
	tb.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatal(err)
	}
	return js
}

// Eventually polls cond every 20 ms until it holds, and fails the test
// with what if it does not within the given time. Tests wait for conditions
// this way, never for fixed times.
func Eventually(tb testing.TB, within time.Duration, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out after %s waiting until %s", within, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
