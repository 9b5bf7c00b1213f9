package command_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/acme/orders/command"
	"github.com/acme/orders/internal/testenv"
)

// An executor that panics (the HTTP layer recovers it) gives its quota
// reservation back: the tenant can store its one key afterwards.
func TestPanickingExecutorFreesItsQuotaReservation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.DB(t)
	idem := newIdem(t, db, command.IdempotencyConfig{TTL: time.Hour, KeyQuota: 1, KeyQuotaRefresh: time.Hour})
	req := func(key string) command.KeyedRequest {
		cmd := command.CreateOrder{TenantID: "t1", Key: key, NewOrder: newOrder("c-1")}
		return command.KeyedRequest{TenantID: "t1", Scope: "POST /v1/orders", Key: key, Command: cmd}
	}
	func() {
		defer func() {
			if v := recover(); v == nil {
				t.Fatal("the executor's panic did not reach the caller")
			}
		}()
		_, _ = idem.Do(ctx, req("boom"), time.Second, func(context.Context, pgx.Tx) (command.Response, error) {
			panic("executor bug")
		})
	}()
	r := req("k1")
	if _, err := idem.Do(ctx, r, time.Second, createExec(r.Command.(command.CreateOrder))); err != nil {
		t.Fatalf("the tenant's first stored key after a panicking executor: %v; want it stored", err)
	}
}

// At its quota, a retry of a key whose first request is still in flight
// waits for it like any duplicate and then replays its result, instead of
// being refused as a new key.
func TestRetryOfInFlightKeyAtQuotaWaits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.DB(t)
	idem := newIdem(t, db, command.IdempotencyConfig{TTL: time.Hour, KeyQuota: 1, KeyQuotaRefresh: time.Hour})
	cmd := command.CreateOrder{TenantID: "t1", Key: "k", NewOrder: newOrder("c-1")}
	req := command.KeyedRequest{TenantID: "t1", Scope: "POST /v1/orders", Key: "k", Command: cmd}
	started, release := make(chan struct{}), make(chan struct{})
	first := make(chan error, 1)
	go func() {
		exec := createExec(cmd)
		_, err := idem.Do(ctx, req, time.Second, func(ctx context.Context, tx pgx.Tx) (command.Response, error) {
			close(started)
			<-release
			return exec(ctx, tx)
		})
		first <- err
	}()
	<-started // the key is claimed, not committed; the tenant is at its quota
	time.AfterFunc(300*time.Millisecond, func() { close(release) })
	res, err := idem.Do(ctx, req, 5*time.Second, createExec(cmd))
	if err != nil || !res.Replayed {
		t.Fatalf("retry of the in-flight key at the quota: %+v, %v; want a replay after the wait", res, err)
	}
	if err := <-first; err != nil {
		t.Fatalf("first request: %v", err)
	}
	// A new key is still refused, and nothing of it is stored.
	cmd2 := command.CreateOrder{TenantID: "t1", Key: "k2", NewOrder: newOrder("c-1")}
	_, err = idem.Do(ctx, command.KeyedRequest{TenantID: "t1", Scope: "POST /v1/orders", Key: "k2", Command: cmd2}, time.Second, createExec(cmd2))
	if !errors.Is(err, command.ErrKeyQuotaExceeded) {
		t.Fatalf("a new key at the quota: %v; want ErrKeyQuotaExceeded", err)
	}
	if n := count(t, db, `SELECT count(*) FROM idempotency_keys`); n != 1 {
		t.Fatalf("%d keys stored, want 1", n)
	}
}
