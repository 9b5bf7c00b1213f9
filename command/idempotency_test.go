package command_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/acme/orders/command"
	"github.com/acme/orders/domain"
	"github.com/acme/orders/internal/testenv"
	"github.com/acme/orders/postgres"
)

func newOrder(customer string) domain.NewOrder {
	return domain.NewOrder{CustomerID: customer, Currency: "EUR", Lines: []domain.Line{{SKU: "s", Quantity: 1, UnitPrice: 100}}}
}

// createExec is what the HTTP layer's executor does, without HTTP.
func createExec(cmd command.CreateOrder) command.Executor {
	h := command.NewCreateOrderHandler()
	return func(ctx context.Context, tx pgx.Tx) (command.Response, error) {
		o, err := h.Handle(ctx, tx, cmd)
		if err != nil {
			return command.Response{}, err
		}
		return command.Response{Status: http.StatusCreated, Header: map[string]string{"Location": "/v1/orders/" + o.ID.String()}, Body: []byte(o.ID.String())}, nil
	}
}

func count(t *testing.T, db *pgxpool.Pool, sql string) int {
	t.Helper()
	var n int
	if err := db.QueryRow(context.Background(), sql).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A key names one request of its tenant (G3): the same key on another
// route is refused, naming the route it was first used for, and runs
// nothing; another tenant's same key is its own.
func TestAKeyOnAnotherRouteIsRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.DB(t)
	idem := newIdem(t, db, command.IdempotencyConfig{TTL: time.Hour})
	calls := 0
	exec := func(context.Context, pgx.Tx) (command.Response, error) {
		calls++
		return command.Response{Status: 200, Body: []byte("ok")}, nil
	}
	pay := command.KeyedRequest{TenantID: "t1", Scope: "POST /v1/orders/{id}/pay", Key: "k", Command: map[string]string{"id": "1"}}
	if res, err := idem.Do(ctx, pay, time.Second, exec); err != nil || res.Replayed {
		t.Fatalf("first use: %+v %v; want a fresh execution", res, err)
	}
	ship := pay
	ship.Scope = "POST /v1/orders/{id}/ship"
	_, err := idem.Do(ctx, ship, time.Second, exec)
	var mismatch *command.MismatchError
	if !errors.As(err, &mismatch) || mismatch.FirstUsedFor != pay.Scope {
		t.Fatalf("the same key on another route: %v; want a *MismatchError naming %q", err, pay.Scope)
	}
	other := ship
	other.TenantID = "t2"
	if res, err := idem.Do(ctx, other, time.Second, exec); err != nil || res.Replayed {
		t.Fatalf("another tenant's same key: %+v %v; want a fresh execution", res, err)
	}
	if calls != 2 {
		t.Fatalf("executed %d times, want twice (the first use and the other tenant's)", calls)
	}
}

func TestOldFingerprintVersionsCompareByContent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.DB(t)
	idem := newIdem(t, db, command.IdempotencyConfig{TTL: time.Hour})
	req := command.KeyedRequest{TenantID: "t1", Scope: "POST /v1/orders", Key: "k", Command: command.CreateOrder{NewOrder: newOrder("c-1")}}
	if _, err := idem.Do(ctx, req, time.Second, createExec(command.CreateOrder{TenantID: "t1", Key: "k", NewOrder: newOrder("c-1")})); err != nil {
		t.Fatal(err)
	}
	// Pretend an older release wrote the key with another canonical form.
	if _, err := db.Exec(ctx, `UPDATE idempotency_keys SET fingerprint = '\xdead', fingerprint_version = 0`); err != nil {
		t.Fatal(err)
	}
	res, err := idem.Do(ctx, req, time.Second, nil)
	if err != nil || !res.Replayed {
		t.Fatalf("same request, old fingerprint: %+v %v; want a replay", res, err)
	}
	req.Command = command.CreateOrder{NewOrder: newOrder("c-2")}
	var mismatch *command.MismatchError
	if _, err := idem.Do(ctx, req, time.Second, nil); !errors.As(err, &mismatch) || len(mismatch.Fields) != 1 || mismatch.Fields[0] != "customer_id" {
		t.Fatalf("other request, old fingerprint: err %v; want a mismatch on customer_id", err)
	}
}

// The connection of a request dies after the order rows were written and
// before the commit: nothing of it stays, the key included, and a retry
// creates exactly one order.
func TestKilledTransactionLeavesNoKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.DB(t)
	idem := newIdem(t, db, command.IdempotencyConfig{TTL: time.Hour})
	cmd := command.CreateOrder{TenantID: "t1", Key: "k", NewOrder: newOrder("c-1")}
	req := command.KeyedRequest{TenantID: "t1", Scope: "POST /v1/orders", Key: "k", Command: cmd}

	create := createExec(cmd)
	_, err := idem.Do(ctx, req, time.Second, func(ctx context.Context, tx pgx.Tx) (command.Response, error) {
		res, err := create(ctx, tx)
		if err != nil {
			return res, err
		}
		var pid int
		if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
			return res, err
		}
		if _, err := db.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
			return res, err
		}
		return res, nil
	})
	if err == nil {
		t.Fatal("Do succeeded although its connection was killed before the commit")
	}
	if n := count(t, db, `SELECT (SELECT count(*) FROM idempotency_keys) + (SELECT count(*) FROM orders) + (SELECT count(*) FROM outbox)`); n != 0 {
		t.Fatalf("%d rows left behind by the killed transaction", n)
	}

	res, err := idem.Do(ctx, req, time.Second, create)
	if err != nil || res.Replayed || res.Status != http.StatusCreated {
		t.Fatalf("retry: %+v %v", res, err)
	}
	if n := count(t, db, `SELECT count(*) FROM orders`); n != 1 {
		t.Fatalf("%d orders, want 1", n)
	}
}

// An executor that fails (a 5xx in the making) rolls everything back: the
// key stays free for the retry.
func TestFailedExecutionIsNotStored(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.DB(t)
	idem := newIdem(t, db, command.IdempotencyConfig{TTL: time.Hour})
	req := command.KeyedRequest{TenantID: "t1", Scope: "POST /v1/orders", Key: "k", Command: 1}
	boom := errors.New("boom")
	if _, err := idem.Do(ctx, req, time.Second, func(context.Context, pgx.Tx) (command.Response, error) {
		return command.Response{}, boom
	}); !errors.Is(err, boom) {
		t.Fatalf("err = %v, want boom", err)
	}
	if _, err := idem.Do(ctx, req, time.Second, func(context.Context, pgx.Tx) (command.Response, error) {
		return command.Response{Status: http.StatusServiceUnavailable}, nil
	}); err == nil {
		t.Fatal("a 503 response was accepted for storing")
	}
	if n := count(t, db, `SELECT count(*) FROM idempotency_keys`); n != 0 {
		t.Fatalf("%d keys stored for failed executions", n)
	}
}

// The wait bound applies to the key claim only: with the shortest bound,
// concurrent requests on distinct keys never time out on anything else
// (row inserts, the outbox's NOTIFY at commit).
func TestShortestWaitBoundsOnlyTheClaim(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.DB(t)
	idem := newIdem(t, db, command.IdempotencyConfig{TTL: time.Hour})
	const n = 200
	errs := make(chan error, n)
	sem := make(chan struct{}, 16)
	for i := range n {
		sem <- struct{}{}
		go func() {
			defer func() { <-sem }()
			key := "k-" + strconv.Itoa(i)
			cmd := command.CreateOrder{TenantID: "t1", Key: key, NewOrder: newOrder("c-1")}
			_, err := idem.Do(ctx, command.KeyedRequest{TenantID: "t1", Scope: "POST /v1/orders", Key: key, Command: cmd}, 0, createExec(cmd))
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Fatalf("Do with wait 0 on a fresh key: %v", err)
		}
	}
	if got := count(t, db, `SELECT count(*) FROM orders`); got != n {
		t.Fatalf("%d orders, want %d", got, n)
	}
}

func newIdem(tb testing.TB, db *pgxpool.Pool, cfg command.IdempotencyConfig) *command.Idempotency {
	tb.Helper()
	idem, err := command.NewIdempotency(db, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	return idem
}

func TestIdempotencyConfigIsValidated(t *testing.T) {
	t.Parallel()
	for _, cfg := range []command.IdempotencyConfig{
		{TTL: time.Millisecond}, {KeyQuota: -1}, {KeyQuotaRefresh: time.Microsecond},
	} {
		if _, err := command.NewIdempotency(nil, cfg); err == nil {
			t.Errorf("NewIdempotency(%+v) accepted an invalid config", cfg)
		}
	}
	if _, err := command.NewIdempotency(nil, command.IdempotencyConfig{}); err != nil {
		t.Errorf("the zero config (all defaults) was refused: %v", err)
	}
}

// Past its quota a tenant stores no new key (ErrKeyQuotaExceeded, nothing
// written), a retry of a stored key still replays, and another tenant is
// not affected.
func TestKeyQuota(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.DB(t)
	idem := newIdem(t, db, command.IdempotencyConfig{TTL: time.Hour, KeyQuota: 3, KeyQuotaRefresh: time.Hour})
	do := func(tenant, key string) (command.Result, error) {
		cmd := command.CreateOrder{TenantID: tenant, Key: key, NewOrder: newOrder("c-1")}
		return idem.Do(ctx, command.KeyedRequest{TenantID: tenant, Scope: "POST /v1/orders", Key: key, Command: cmd}, time.Second, createExec(cmd))
	}
	for i := range 3 {
		if _, err := do("t1", "k"+strconv.Itoa(i)); err != nil {
			t.Fatalf("key %d of 3: %v", i, err)
		}
	}
	_, err := do("t1", "k3")
	var qe *command.KeyQuotaError
	if !errors.Is(err, command.ErrKeyQuotaExceeded) || !errors.As(err, &qe) || qe.RetryAfter <= 0 {
		t.Fatalf("fourth key: err %v; want ErrKeyQuotaExceeded with a RetryAfter", err)
	}
	if n := count(t, db, `SELECT count(*) FROM idempotency_keys WHERE tenant_id = 't1'`); n != 3 {
		t.Fatalf("%d keys stored for t1, want 3", n)
	}
	if n := count(t, db, `SELECT count(*) FROM orders`); n != 3 {
		t.Fatalf("%d orders, want 3", n)
	}
	if res, err := do("t1", "k1"); err != nil || !res.Replayed {
		t.Fatalf("retry of a stored key at the quota: %+v %v; want a replay", res, err)
	}
	if res, err := do("t2", "k3"); err != nil || res.Replayed {
		t.Fatalf("another tenant: %+v %v; want a fresh execution", res, err)
	}
}

// A refusal that names nothing that exists (404) touches nothing and is not
// stored: the key stays free, and a retry gets the same answer anyway.
func TestNotFoundIsNotStored(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.DB(t)
	idem := newIdem(t, db, command.IdempotencyConfig{TTL: time.Hour})
	req := command.KeyedRequest{TenantID: "t1", Scope: "POST /v1/orders/{id}/pay", Key: "k", Command: 1}
	for range 2 {
		res, err := idem.Do(ctx, req, time.Second, func(context.Context, pgx.Tx) (command.Response, error) {
			return command.Response{Status: http.StatusNotFound, Body: []byte("no such order")}, nil
		})
		if err != nil || res.Status != http.StatusNotFound || res.Replayed || !res.ExpiresAt.IsZero() {
			t.Fatalf("404: %+v %v; want an unstored 404", res, err)
		}
	}
	if n := count(t, db, `SELECT count(*) FROM idempotency_keys`); n != 0 {
		t.Fatalf("%d keys stored for a 404", n)
	}
}

// A claim that times out on a lock other than its key's (here the table,
// locked by a stand-in for DDL or its extension under I/O pressure) is not
// a request in flight: Do claims again instead of answering ErrInFlight,
// and runs once the table is free.
func TestClaimStalledOnAnotherLockIsTriedAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testenv.DatabaseURL(t)
	// One connection, its statements prepared by a first Do: a statement's
	// first Parse takes the table's lock before the batch sets the wait
	// bound, and would wait unbounded on a locked table.
	one, err := postgres.Open(ctx, url, 1, 10*time.Second, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer one.Close()
	other, err := postgres.Open(ctx, url, 4, 10*time.Second, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	idem := newIdem(t, one, command.IdempotencyConfig{TTL: time.Hour})
	do := func(key string) error {
		cmd := command.CreateOrder{TenantID: "t1", Key: key, NewOrder: newOrder("c-1")}
		_, err := idem.Do(ctx, command.KeyedRequest{TenantID: "t1", Scope: "POST /v1/orders", Key: key, Command: cmd}, time.Second, createExec(cmd))
		return err
	}
	if err := do("k-warm"); err != nil {
		t.Fatal(err)
	}

	holder, err := other.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx) //nolint:errcheck // after the commit below, a no-op
	if _, err := holder.Exec(ctx, `LOCK TABLE idempotency_keys IN SHARE MODE`); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- do("k-stalled") }()
	// Two claims seen waiting on the table (their statements started at
	// different times): the first one timed out and Do tried again.
	starts := map[time.Time]bool{}
	testenv.Eventually(t, 10*time.Second, "a second claim waits on the locked table", func() bool {
		select {
		case err := <-done:
			t.Fatalf("Do returned %v while the table was locked", err)
		default:
		}
		var start time.Time
		err := other.QueryRow(ctx, `
SELECT a.query_start FROM pg_locks l JOIN pg_stat_activity a USING (pid)
WHERE NOT l.granted AND l.relation = 'idempotency_keys'::regclass
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&start)
		if err == nil {
			starts[start] = true
		}
		return len(starts) >= 2
	})
	if err := holder.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Do after the table was free: %v", err)
	}
	var n int
	if err := other.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("%d orders (%v), want 2", n, err)
	}
}

// Concurrent duplicates of one key on a keyed command other than create
// (an honest client's retries racing each other, or reaching two api
// processes) each wait for the first and replay it: one execution per key
// and never an error. The key row has two unique indexes, the primary key
// (tenant, scope, key) and (tenant, key); with only the second named as
// the arbiter of ON CONFLICT, a duplicate that passed its pre-check waited
// on the first's primary-key entry and then raised a unique violation (a
// 500), about one key in eight here.
func TestConcurrentDuplicatesOfAKeyReplayAndNeverFail(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.DB(t)
	idem := newIdem(t, db, command.IdempotencyConfig{TTL: time.Hour})
	var execs atomic.Int64
	var mu sync.Mutex
	fails := map[string]int{}
	for k := range 150 {
		req := command.KeyedRequest{TenantID: "t1", Scope: "POST /v1/orders/{id}/pay", Key: fmt.Sprintf("dup-%d", k), Command: map[string]string{"id": "1"}}
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range 4 {
			wg.Go(func() {
				<-start
				_, err := idem.Do(ctx, req, 5*time.Second, func(context.Context, pgx.Tx) (command.Response, error) {
					execs.Add(1)
					return command.Response{Status: 202, Body: []byte(`{"ok":true}`)}, nil
				})
				if err != nil {
					mu.Lock()
					fails[err.Error()]++
					mu.Unlock()
				}
			})
		}
		close(start)
		wg.Wait()
	}
	if n := execs.Load(); n != 150 {
		t.Errorf("%d executions of 150 keys, want one each", n)
	}
	for e, n := range fails {
		t.Errorf("%d× %s", n, e)
	}
}

// A retry of an expired key whose row another retry has deleted (and runs
// under, holding it) waits no longer than its bound: 409, as for any
// duplicate in flight. Its delete of the expired row used to wait, with no
// lock_timeout, for the other's whole execution.
func TestARetryOfAnExpiredKeyWaitsOnlyItsBound(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.DB(t)
	idem := newIdem(t, db, command.IdempotencyConfig{TTL: time.Second})
	ok := func(context.Context, pgx.Tx) (command.Response, error) {
		return command.Response{Status: 200, Body: []byte("ok")}, nil
	}
	req := command.KeyedRequest{TenantID: "t1", Scope: "POST /x", Key: "k1", Command: map[string]int{"a": 1}}
	if _, err := idem.Do(ctx, req, time.Second, ok); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `UPDATE idempotency_keys SET expires_at = now() - interval '1 second' WHERE key = 'k1'`); err != nil {
		t.Fatal(err)
	}
	// The other retry holds the expired row, as its delete does once this
	// retry's claim has found the row there (a lock alone lets the claim
	// pass, as the other's delete did when it came after the claim).
	other, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Rollback(ctx) //nolint:errcheck
	if tag, err := other.Exec(ctx, `SELECT 1 FROM idempotency_keys WHERE key = 'k1' FOR UPDATE`); err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("lock the expired key: %v (%d rows)", err, tag.RowsAffected())
	}
	// Three retries at once: the second and third queue behind the first
	// on the row (a wait that names no relation).
	const retries = 3
	done := make(chan error, retries)
	for range retries {
		go func() {
			_, err := idem.Do(ctx, req, 100*time.Millisecond, ok)
			done <- err
		}()
	}
	for range retries {
		select {
		case err := <-done:
			if !errors.Is(err, command.ErrInFlight) {
				t.Fatalf("retry while another retry holds the expired key: %v, want ErrInFlight", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a retry still waits for the other retry, 10 s past its 100ms bound")
		}
	}
}

// A wait bound past what lock_timeout takes (2^31-1 ms) is clamped to it,
// not sent as is (PostgreSQL refused it, and every claim failed).
func TestAWaitBoundPastLockTimeoutsRangeIsClamped(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	idem := newIdem(t, testenv.DB(t), command.IdempotencyConfig{TTL: time.Hour})
	req := command.KeyedRequest{TenantID: "t1", Scope: "POST /x", Key: "k1", Command: map[string]int{"a": 1}}
	res, err := idem.Do(ctx, req, 700*time.Hour, func(context.Context, pgx.Tx) (command.Response, error) {
		return command.Response{Status: 200, Body: []byte("ok")}, nil
	})
	if err != nil || res.Status != 200 {
		t.Fatalf("Do with a 700h wait bound: %+v, %v", res, err)
	}
}

// storeAsVersion1 runs req under its key (answered 200 with body) and then
// makes its stored row one of fingerprint version 1, as a release before
// wrote it: the fingerprint is no longer comparable, and set (SQL
// assignments, $1 and on bound to args) may rewrite more of it.
func storeAsVersion1(t *testing.T, db *pgxpool.Pool, idem *command.Idempotency, req command.KeyedRequest, body, set string, args ...any) {
	t.Helper()
	ctx := context.Background()
	exec := func(context.Context, pgx.Tx) (command.Response, error) {
		return command.Response{Status: 200, Body: []byte(body)}, nil
	}
	if _, err := idem.Do(ctx, req, time.Second, exec); err != nil {
		t.Fatal(err)
	}
	args = append(args, req.Key)
	if set != "" {
		set = ", " + set
	}
	if _, err := db.Exec(ctx, fmt.Sprintf(`UPDATE idempotency_keys SET fingerprint = '\xdead', fingerprint_version = 1%s WHERE key = $%d`, set, len(args)), args...); err != nil {
		t.Fatal(err)
	}
}

// A pay, ship or cancel key stored by version 1, which ignored If-Match
// (its canonical request has no expected_version), replays for the same
// request sent with If-Match now; a PATCH's stored expected_version still
// counts, and another field still refuses.
func TestAVersion1KeyOfAStepReplaysWithIfMatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.DB(t)
	idem := newIdem(t, db, command.IdempotencyConfig{TTL: time.Hour})
	order := uuid.Must(uuid.NewV7())
	stored := command.KeyedRequest{TenantID: "t1", Scope: "POST /v1/orders/{id}/cancel", Key: "k",
		Command: command.CancelOrder{OrderID: order, Reason: "r"}}
	storeAsVersion1(t, db, idem, stored, `{"status":"cancelled"}`, "")
	retry := stored
	retry.Command = command.CancelOrder{OrderID: order, Reason: "r", ExpectedVersion: 2}
	if res, err := idem.Do(ctx, retry, time.Second, nil); err != nil || !res.Replayed {
		t.Fatalf("the same cancel with If-Match, key of version 1: %+v %v; want a replay", res, err)
	}
	retry.Command = command.CancelOrder{OrderID: order, Reason: "other", ExpectedVersion: 2}
	var mismatch *command.MismatchError
	if _, err := idem.Do(ctx, retry, time.Second, nil); !errors.As(err, &mismatch) || !slices.Equal(mismatch.Fields, []string{"reason"}) {
		t.Fatalf("another reason, key of version 1: %v; want a mismatch on reason alone", err)
	}

	patch := command.KeyedRequest{TenantID: "t1", Scope: "PATCH /v1/orders/{id}", Key: "p",
		Command: command.UpdateOrder{OrderID: order, ExpectedVersion: 1}}
	storeAsVersion1(t, db, idem, patch, `{"status":"cancelled"}`, "")
	patch.Command = command.UpdateOrder{OrderID: order, ExpectedVersion: 2}
	if _, err := idem.Do(ctx, patch, time.Second, nil); !errors.As(err, &mismatch) || !slices.Equal(mismatch.Fields, []string{"expected_version"}) {
		t.Fatalf("a PATCH on another version, key of version 1: %v; want a mismatch on expected_version", err)
	}
}

// A pay stored before pays named a payment method (its canonical request
// has none) ran as a pay without a method runs now: its retry, which now
// carries the default method, replays; one naming another method is still
// refused, on payment_method alone.
func TestAPayKeyStoredBeforePaymentMethodsReplays(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.DB(t)
	idem := newIdem(t, db, command.IdempotencyConfig{TTL: time.Hour})
	order := uuid.Must(uuid.NewV7())
	pay := command.KeyedRequest{TenantID: "t1", Scope: "POST /v1/orders/{id}/pay", Key: "old-pay",
		Command: command.PayOrder{OrderID: order, PaymentMethod: domain.DefaultPaymentMethod}}
	storeAsVersion1(t, db, idem, pay, `{"status":"paid"}`, "request = jsonb_build_object('order_id', $1::text)", order)
	if res, err := idem.Do(ctx, pay, time.Second, nil); err != nil || !res.Replayed {
		t.Fatalf("the same pay, key stored before payment methods: %+v %v; want a replay", res, err)
	}
	other := pay
	other.Command = command.PayOrder{OrderID: order, PaymentMethod: "pm_card_chargeDeclined"}
	var mismatch *command.MismatchError
	if _, err := idem.Do(ctx, other, time.Second, nil); !errors.As(err, &mismatch) || !slices.Equal(mismatch.Fields, []string{"payment_method"}) {
		t.Fatalf("a pay naming another method, key stored before payment methods: %v; want a mismatch on payment_method", err)
	}
}
