package httpapi_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/acme/orders/auth"
	"github.com/acme/orders/command"
	"github.com/acme/orders/httpapi"
	"github.com/acme/orders/internal/testenv"
	"github.com/acme/orders/postgres"
	"github.com/acme/orders/query"
)

// Tenants whose requests each hold a connection for long (here: cancels
// of an order whose row another transaction keeps locked; in the field, a
// list that walks a large history) hold at most their share of the api's
// pool (G9), and two of them together never all of it: another tenant's
// read gets a connection at once. Before the share, tenant t1 within its
// in-flight limit held all 8 connections and t2's read waited for the lock
// to go; before the connections kept for tenants that hold none, t1 at its
// share of 6 and t3 took the 8 between them.
func TestBusyTenantsHoldAtMostTheirShareOfTheDatabasesConnections(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testenv.DatabaseURL(t)
	const poolSize, share = 8, 6
	pool, err := postgres.Open(ctx, url, poolSize, 10*time.Second, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	shares, err := postgres.NewShares(pool, poolSize, share)
	if err != nil {
		t.Fatal(err)
	}
	idem, err := command.NewIdempotency(shares, command.IdempotencyConfig{TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	clients := auth.NewClients(pool, 0)
	srv := httptest.NewServer(httpapi.New(httpapi.Deps{
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Auth: clients,
		Idempotency: idem, Keys: idem,
		CreateOrder: command.NewCreateOrderHandler(), CancelOrder: command.NewCancelOrderHandler(),
		GetOrder: query.NewGetOrderHandler(shares, nil),
	}))
	t.Cleanup(srv.Close)
	// t1 and t2 call through the test's api helpers; send is for calls
	// made off the test's goroutine or with a deadline of their own.
	a := api{url: srv.URL, db: pool, idem: idem, clients: clients}
	tokens := map[string]string{"t1": a.newToken(t, "t1"), "t2": a.newToken(t, "t2"), "t3": a.newToken(t, "t3")}
	send := func(ctx context.Context, tenant, method, path, key, body string) (int, error) {
		req, _ := http.NewRequestWithContext(ctx, method, srv.URL+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+tokens[tenant])
		req.Header.Set("Content-Type", "application/json")
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err
		}
		defer res.Body.Close()
		_, _ = io.Copy(io.Discard, res.Body)
		return res.StatusCode, nil
	}
	// The busy tenants' orders.
	orders := map[string]string{}
	for _, tenant := range []string{"t1", "t3"} {
		a.token = tokens[tenant]
		res := a.post(t, "create", validBody)
		var order struct{ ID string }
		if err := json.Unmarshal(res.body, &order); err != nil || res.status != http.StatusCreated {
			t.Fatalf("create of %s: %d %s", tenant, res.status, res.body)
		}
		orders[tenant] = order.ID
	}

	// Another transaction, on a connection of its own, keeps both orders
	// locked: each cancel of them waits for the lock, holding its
	// connection.
	own, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close(ctx)
	lock, err := own.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	watch, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close(ctx)
	if _, err := lock.Exec(ctx, `SELECT 1 FROM orders WHERE id = ANY($1) FOR UPDATE`, []string{orders["t1"], orders["t3"]}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	statuses := make(chan int, 24)
	cancels := func(tenant string) {
		for i := range 12 {
			wg.Go(func() {
				code, err := send(ctx, tenant, http.MethodPost, "/v1/orders/"+orders[tenant]+"/cancel", "cancel-"+strconv.Itoa(i), `{"reason":"test"}`)
				if err != nil {
					t.Error(err)
				}
				statuses <- code
			})
		}
	}
	waitingForTheLock := func(n int) bool {
		var waiting int
		if err := watch.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		return waiting >= n
	}
	// t1's cancels first take all of its share, then t3's take what the
	// pool keeps for tenants holding none, less one.
	cancels("t1")
	testenv.Eventually(t, 10*time.Second, "t1's cancels wait for the lock on all its share", func() bool { return waitingForTheLock(share) })
	cancels("t3")
	testenv.Eventually(t, 10*time.Second, "t3's first cancel waits for the lock", func() bool { return waitingForTheLock(share + 1) })
	testenv.Eventually(t, 10*time.Second, "t3's other cancels wait for a connection", func() bool { return shares.Waiting("t3") == 11 })
	// A sleep, not a poll: the assertion is that no more of them take a
	// connection in this window.
	time.Sleep(100 * time.Millisecond)
	if held := shares.Held("t1"); held != share {
		t.Errorf("t1 holds %d connections, want its share of %d", held, share)
	}
	if held := shares.Held("t3"); held != 1 {
		t.Errorf("t3 holds %d connections, want 1: the %d kept for tenants holding none less its own", held, poolSize-share)
	}

	readCtx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	start := time.Now()
	code, err := send(readCtx, "t2", http.MethodGet, "/v1/orders/"+uuid.Must(uuid.NewV7()).String(), "", "")
	if err != nil || code != http.StatusNotFound {
		t.Errorf("t2's read while t1's and t3's cancels wait: %d, %v after %s; want its 404 at once", code, err, time.Since(start).Round(time.Millisecond))
	}

	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(statuses)
	for code := range statuses {
		if code != http.StatusOK {
			t.Errorf("a cancel after the lock went: %d, want 200", code)
		}
	}
	for _, tenant := range []string{"t1", "t3"} {
		if held := shares.Held(tenant); held != 0 {
			t.Errorf("%s still holds %d connections after its requests ended", tenant, held)
		}
	}
}
