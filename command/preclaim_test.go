package command_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/acme/orders/command"
	"github.com/acme/orders/internal/testenv"
)

// tunedPool opens a pool of its own on a fresh test database, configured
// by tune, and closes it when the test ends.
func tunedPool(t *testing.T, tune func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	tune(cfg)
	db, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	return db
}

// render is what the HTTP layer renders for a create, without HTTP.
func render(out command.Outcome) (command.Response, error) {
	if out.Refusal != nil {
		return command.Response{Status: http.StatusConflict, Body: []byte(out.Refusal.Error())}, nil
	}
	return command.Response{Status: http.StatusCreated, Header: map[string]string{"Location": "/v1/orders/" + out.Order.ID.String()},
		Body: []byte(out.Order.ID.String())}, nil
}

// creates returns a function that creates an order of tenant t1 for
// customer under key, through CreateOrderHandler.Run (a Preclaim), waiting
// up to wait for the key's holder.
func creates(idem *command.Idempotency, wait time.Duration) func(key, customer string) (command.Result, error) {
	create := command.NewCreateOrderHandler()
	return func(key, customer string) (command.Result, error) {
		cmd := command.CreateOrder{TenantID: "t1", Key: key, NewOrder: newOrder(customer)}
		return create.Run(context.Background(), idem, command.OrderRequest[command.CreateOrder]{
			TenantID: "t1", Scope: "POST /v1/orders", Key: key, Wait: wait, Command: cmd}, render)
	}
}

// A create is one round trip: the statement that claims its key and writes
// the order with the response in the key row, a transaction of its own (the
// batch's Sync commits it), and the key row written once. A retry replays
// that response; a key another request holds writes nothing.
func TestCreateClaimsItsKeyAndWritesTheOrderInOneStatement(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	trips := &testenv.RoundTrips{}
	db := tunedPool(t, func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = trips })
	idem := newIdem(t, db, command.IdempotencyConfig{KeyQuotaRefresh: time.Hour})
	run := creates(idem, time.Second)
	if _, err := run("warm-up", "c-1"); err != nil { // counts the tenant's keys once (the quota)
		t.Fatal(err)
	}

	before := trips.Count()
	first, err := run("k1", "c-1")
	if err != nil || first.Status != http.StatusCreated || first.Replayed || first.ExpiresAt.IsZero() {
		t.Fatalf("create: %+v %v; want a fresh 201 with its key's expiry", first, err)
	}
	if n := trips.Count() - before; n != 1 {
		t.Errorf("a create took %d round trips, want 1 (the claim with the order, committed by its Sync)", n)
	}
	var status int
	var body []byte
	if err := db.QueryRow(ctx, `SELECT status_code, response_body FROM idempotency_keys WHERE key = 'k1'`).Scan(&status, &body); err != nil {
		t.Fatal(err)
	}
	if status != http.StatusCreated || string(body) != string(first.Body) {
		t.Errorf("stored response %d %q, want %d %q", status, body, first.Status, first.Body)
	}

	retry, err := run("k1", "c-1")
	if err != nil || !retry.Replayed || retry.Status != first.Status || string(retry.Body) != string(first.Body) {
		t.Fatalf("retry: %+v %v; want the first response replayed", retry, err)
	}
	_, err = run("k1", "c-2")
	var mismatch *command.MismatchError
	if !errors.As(err, &mismatch) {
		t.Fatalf("same key, another request: %v; want a mismatch", err)
	}
	if n := count(t, db, `SELECT count(*) FROM orders`); n != 2 {
		t.Fatalf("%d orders after a create, its retry and a mismatch (and the warm-up), want 2", n)
	}
	if n := count(t, db, `SELECT count(*) FROM outbox`); n != 2 {
		t.Fatalf("%d outbox events, want 2", n)
	}
}

// The key's response is stored with it, so a create at the tenant's key
// quota is refused before anything it wrote commits.
func TestPreclaimedCreateAtTheQuotaWritesNothing(t *testing.T) {
	t.Parallel()
	db := testenv.DB(t)
	idem := newIdem(t, db, command.IdempotencyConfig{KeyQuota: 1, KeyQuotaRefresh: time.Hour})
	run := func(key string) (command.Result, error) { return creates(idem, time.Second)(key, "c-1") }
	if _, err := run("k1"); err != nil {
		t.Fatal(err)
	}
	if _, err := run("k2"); !errors.Is(err, command.ErrKeyQuotaExceeded) {
		t.Fatalf("second key at a quota of 1: %v; want ErrKeyQuotaExceeded", err)
	}
	if n := count(t, db, `SELECT count(*) FROM orders`); n != 1 {
		t.Fatalf("%d orders, want 1", n)
	}
	if n := count(t, db, `SELECT count(*) FROM idempotency_keys`); n != 1 {
		t.Fatalf("%d keys, want 1", n)
	}
}

// A preclaimed response must be one that is stored: a 404, a 429, a 5xx or
// an unstored one is refused before anything is sent.
func TestPreclaimRefusesAResponseThatIsNeverStored(t *testing.T) {
	t.Parallel()
	db := testenv.DB(t)
	idem := newIdem(t, db, command.IdempotencyConfig{})
	for _, resp := range []command.Response{
		{Status: http.StatusNotFound}, {Status: http.StatusTooManyRequests}, {Status: http.StatusInternalServerError},
		{Status: http.StatusConflict, Unstored: true}, {Status: 0},
	} {
		_, err := idem.DoPreclaimed(context.Background(), command.KeyedRequest{TenantID: "t1", Scope: "POST /v1/orders", Key: "k", Command: 1},
			time.Second, command.Preclaim{Response: resp, SQL: command.KeyedOrderCreateSQL, Args: func(context.Context) []any { return nil }})
		if err == nil {
			t.Errorf("preclaimed %+v: no error", resp)
		}
	}
	if n := count(t, db, `SELECT count(*) FROM idempotency_keys`); n != 0 {
		t.Fatalf("%d keys, want 0", n)
	}
}

// A create whose key an open transaction holds waits for it on the key's
// unique index; when that transaction rolls back, the create claims the key
// and writes its order, and it counts as one wait (the database times the
// key's insert alone, not the order's writes).
func TestPreclaimedCreateWaitsForTheKeyAndRunsIfItsHolderRollsBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.DB(t)
	idem := newIdem(t, db, command.IdempotencyConfig{KeyQuotaRefresh: time.Hour})
	run := func(key string) (command.Result, error) { return creates(idem, 5*time.Second)(key, "c-1") }
	if _, err := run("warm-up"); err != nil {
		t.Fatal(err)
	}
	if st := idem.Stats(); st.Waits != 0 {
		t.Fatalf("a create nobody held counted %d waits", st.Waits)
	}

	holder, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := holder.Exec(ctx, `INSERT INTO idempotency_keys (tenant_id, scope, key, fingerprint, fingerprint_version, request, expires_at)
VALUES ('t1', 'POST /v1/orders', 'held', '\x00', 1, '{}', now() + interval '1 hour')`); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	var res command.Result
	go func() {
		var err error
		res, err = run("held")
		done <- err
	}()
	// It waits on the holder's key row: seen in pg_stat_activity, not
	// assumed after a sleep (a loaded machine may start it later).
	testenv.Eventually(t, 10*time.Second, "the create waiting for the key's holder", func() bool {
		select {
		case err := <-done:
			t.Fatalf("the create did not wait for the key's holder: %+v %v", res, err)
		default:
		}
		return count(t, db, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'
  AND clock_timestamp() - query_start > interval '50 milliseconds'`) == 1 // a wait, counted as one from 5 ms
	})
	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil || res.Replayed || res.Status != http.StatusCreated {
		t.Fatalf("after the holder rolled back: %+v %v; want a fresh 201", res, err)
	}
	if st := idem.Stats(); st.Waits != 1 || st.Created != 2 {
		t.Fatalf("stats %+v; want 1 wait and 2 keys created", st)
	}
	if n := count(t, db, `SELECT count(*) FROM orders WHERE creating_key = 'held'`); n != 1 {
		t.Fatalf("%d orders under the held key, want 1", n)
	}
}

// A create whose key is held by a request that then commits waits for it and
// replays what it stored; it writes nothing of its own.
func TestPreclaimedCreateWaitsForTheKeyAndReplaysIfItsHolderCommits(t *testing.T) {
	t.Parallel()
	db := testenv.DB(t)
	idem := newIdem(t, db, command.IdempotencyConfig{KeyQuotaRefresh: time.Hour})
	run := creates(idem, 5*time.Second)
	holderIdem := newIdem(t, db, command.IdempotencyConfig{}) // its own stats: only the create's are checked

	holder := make(chan struct{})
	first := make(chan command.Result, 1)
	go func() {
		// The first create, held open until the second is waiting for it.
		// Its command has the create's canonical form (CreateOrder's JSON
		// is its NewOrder's), so the create below is its retry.
		res, err := holderIdem.Do(context.Background(), command.KeyedRequest{TenantID: "t1", Scope: "POST /v1/orders", Key: "held",
			Command: newOrder("c-1")}, time.Second,
			func(ctx context.Context, tx pgx.Tx) (command.Response, error) {
				<-holder
				return command.Response{Status: http.StatusCreated, Body: []byte("the holder's")}, nil
			})
		if err != nil {
			t.Error(err)
		}
		first <- res
	}()
	time.Sleep(100 * time.Millisecond)
	done := make(chan error, 1)
	var res command.Result
	go func() {
		var err error
		res, err = run("held", "c-1")
		done <- err
	}()
	time.Sleep(200 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("the create did not wait for the key's holder: %+v %v", res, err)
	default:
	}
	close(holder)
	<-first
	if err := <-done; err != nil || !res.Replayed || string(res.Body) != "the holder's" {
		t.Fatalf("after the holder committed: %+v %v; want its response replayed", res, err)
	}
	if st := idem.Stats(); st.Waits != 1 || st.Created != 0 || st.Replays != 1 {
		t.Fatalf("stats of the create %+v; want 1 wait, 1 replay, no key created", st)
	}
	if n := count(t, db, `SELECT count(*) FROM orders`); n != 0 {
		t.Fatalf("%d orders, want none (the holder wrote none, the replay must not)", n)
	}
}

// A key whose row expired after it created an order: the one statement
// raises on the order's key and commits nothing, and the general way
// answers the refusal that names the existing order, without storing it
// (ErrKeyRanBefore: another body under the key must not take it over).
// Neither way leaves its lock_timeout on the pooled connection.
func TestPreclaimedCreateOfAnExpiredKeyCommitsOnlyTheRefusal(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// One connection: every statement below runs on the one the creates used.
	db := tunedPool(t, func(cfg *pgxpool.Config) { cfg.MaxConns = 1 })
	idem := newIdem(t, db, command.IdempotencyConfig{KeyQuotaRefresh: time.Hour})
	run := creates(idem, time.Second)

	first, err := run("k1", "c-1")
	if err != nil || first.Status != http.StatusCreated {
		t.Fatalf("create: %+v %v", first, err)
	}
	if _, err := db.Exec(ctx, `DELETE FROM idempotency_keys WHERE key = 'k1'`); err != nil { // as the janitor would
		t.Fatal(err)
	}
	late, err := run("k1", "c-1")
	if err != nil || late.Status != http.StatusConflict || late.Replayed {
		t.Fatalf("late retry: %+v %v; want a fresh 409", late, err)
	}
	if n := count(t, db, `SELECT count(*) FROM idempotency_keys WHERE key = 'k1'`); n != 0 {
		t.Fatalf("the refusal was stored under the key (%d rows)", n)
	}
	if n := count(t, db, `SELECT count(*) FROM orders`); n != 1 {
		t.Fatalf("%d orders, want 1", n)
	}
	if n := count(t, db, `SELECT count(*) FROM outbox`); n != 1 {
		t.Fatalf("%d outbox events, want 1", n)
	}
	var timeout string
	if err := db.QueryRow(ctx, `SHOW lock_timeout`).Scan(&timeout); err != nil || timeout != "0" {
		t.Fatalf("lock_timeout on the pooled connection: %q %v; want 0 (the default)", timeout, err)
	}
}

// beginCounter counts the transactions a pool's connections begin.
type beginCounter struct{ n atomic.Int64 }

func (c *beginCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.EqualFold(strings.TrimSpace(d.SQL), "begin") {
		c.n.Add(1)
	}
	return ctx
}

func (c *beginCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// A retry of a create whose key is stored replays from one read outside a
// transaction, after the claim statement found the key: no keyed
// transaction (which cost four round trips). A retry with another body is
// still refused, and one whose key row expired still goes the keyed way
// (its row is deleted and claimed anew).
func TestARetriedCreateReplaysWithoutATransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	begins := &beginCounter{}
	db := tunedPool(t, func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = begins })
	for _, group := range []int{0, 2} {
		idem := newIdem(t, db, command.IdempotencyConfig{KeyQuotaRefresh: time.Hour, GroupSlots: group})
		run := creates(idem, time.Second)
		key := fmt.Sprintf("k-%d", group)
		first, err := run(key, "c-1")
		if err != nil || first.Status != http.StatusCreated || first.Replayed {
			t.Fatalf("group %d: create: %+v %v", group, first, err)
		}
		before := begins.n.Load()
		again, err := run(key, "c-1")
		if err != nil || !again.Replayed || string(again.Body) != string(first.Body) {
			t.Fatalf("group %d: retry: %+v %v; want the stored response replayed", group, again, err)
		}
		if n := begins.n.Load() - before; n != 0 {
			t.Fatalf("group %d: the replay began %d transactions, want none", group, n)
		}
		var mismatch *command.MismatchError
		if _, err := run(key, "c-2"); !errors.As(err, &mismatch) {
			t.Fatalf("group %d: the key with another body: %v; want a *MismatchError", group, err)
		}
		if _, err := db.Exec(ctx, `UPDATE idempotency_keys SET expires_at = now() - interval '1 second' WHERE key = $1`, key); err != nil {
			t.Fatal(err)
		}
		late, err := run(key, "c-1")
		if err != nil || late.Status != http.StatusConflict || late.Replayed {
			t.Fatalf("group %d: retry after the key expired: %+v %v; want a fresh 409 (the order exists)", group, late, err)
		}
	}
}
