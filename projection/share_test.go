package projection

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/acme/orders/domain"
)

func TestDelayedWindowKeepsEachTenantUnderItsLimit(t *testing.T) {
	t.Parallel()
	now := time.Now()
	w := newDelayedWindow(2)
	later := now.Add(time.Minute)
	if !w.admit(1, "a", later, now) || !w.admit(2, "a", later, now) {
		t.Fatal("tenant a refused under its limit")
	}
	if w.admit(3, "a", later, now) {
		t.Fatal("tenant a admitted past its limit")
	}
	if !w.admit(4, "b", later, now) {
		t.Fatal("tenant b refused because of tenant a")
	}
	if !w.admit(1, "a", later, now) {
		t.Fatal("a message delayed again was counted twice")
	}
	w.received(1) // redelivered: no longer holds a delayed slot
	if !w.admit(3, "a", later, now) {
		t.Fatal("tenant a refused after one of its messages came back")
	}
	if w.admit(5, "a", later, now) {
		t.Fatal("tenant a admitted past its limit")
	}
	if !w.admit(5, "a", later, later.Add(time.Second)) {
		t.Fatal("expired entries (taken by another process) still counted")
	}
	if !w.admit(0, "a", later, now) {
		t.Fatal("a message without a stream sequence was refused")
	}
}

func TestConfigValidateNamesTheField(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg   Config
		field string
	}{
		{Config{TenantShare: 1.5}, "TenantShare"},
		{Config{TenantShare: -0.1}, "TenantShare"},
		{Config{MaxAckPending: -1}, "MaxAckPending"},
		{Config{AckWait: 1_000_000 * time.Hour}, "AckWait"},          // the horizons wrapped negative
		{Config{MaxDeliver: 200_000_000}, "MaxDeliver"},              // RedeliveryHorizon wrapped
		{Config{AckWait: MaxAckWait, MaxDeliver: MaxMaxDeliver}, ""}, // at the bounds: valid
	} {
		if tc.field == "" {
			if err := tc.cfg.Validate(); err != nil || RedeliveryHorizon(tc.cfg) <= 0 {
				t.Errorf("Validate(%+v) = %v, horizon %s: want valid, and a positive horizon", tc.cfg, err, RedeliveryHorizon(tc.cfg))
			}
			continue
		}
		err := tc.cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("Validate(%+v) = %v, want an error naming %s", tc.cfg, err, tc.field)
		}
		if _, err := NewRunner(nil, nil, OrderViews{}, slog.New(slog.DiscardHandler), tc.cfg); err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("NewRunner with %+v = %v, want an error naming %s", tc.cfg, err, tc.field)
		}
	}
	if err := (Config{}).Validate(); err != nil {
		t.Fatalf("the defaults do not validate: %v", err)
	}
	if got := (Config{}).withDefaults().tenantLimit(); got != 500 {
		t.Fatalf("default tenant limit = %d, want 10%% of 5,000", got)
	}
}

// Entries of messages another process took expire even when no tenant ever
// reaches its limit: the map and the per-tenant counts do not grow without
// bound.
func TestDelayedWindowSweepsExpiredEntries(t *testing.T) {
	t.Parallel()
	now := time.Now()
	w := newDelayedWindow(2)
	for seq := uint64(1); seq <= 1000; seq++ {
		tenant := fmt.Sprintf("t%d", seq) // each tenant stays under its limit
		if !w.admit(seq, tenant, now.Add(time.Second), now) {
			t.Fatalf("tenant %s refused under its limit", tenant)
		}
	}
	later := now.Add(delayedSweepInterval + 2*time.Second) // every entry expired
	if !w.admit(5000, "other", later.Add(time.Second), later) {
		t.Fatal("tenant other refused")
	}
	w.mu.Lock()
	entries, tenants := len(w.bySeq), len(w.perTenant)
	w.mu.Unlock()
	if entries != 1 || tenants != 1 {
		t.Fatalf("after expiry the window holds %d entries of %d tenants, want 1 of 1", entries, tenants)
	}
	if n := w.held("t7"); n != 0 {
		t.Fatalf("an expired tenant still holds %d", n)
	}
}

// The delayed events a batch defers past their tenant's share are parked in
// one statement (one round trip, not one commit each), and each is acked
// only once that statement committed.
func TestDeferralsOfABatchAreParkedInOneStatement(t *testing.T) {
	t.Parallel()
	tracer := &failingTracer{match: "INSERT INTO dead_letters"}
	db := tracedDB(t, tracer)
	f := newFixture(t, Config{})
	f.db = db
	cfg := Config{Workers: 1, MaxAckPending: 4, TenantShare: 0.25, RetryDelay: time.Minute} // a tenant holds 1
	failing := failingProjection{Projection: OrderViews{}, fail: func(domain.Envelope) error {
		return errors.New("connection reset") // transient: delayed, and counted against the share
	}}
	f.runner = mustRunner(t, db, f.js, failing, slog.New(slog.NewTextHandler(testLogOutput(), nil)), cfg)
	const n = 4
	for range n {
		v1 := createdEvent(t, uuid.Must(uuid.NewV7()))
		f.publish(t, v1, v1.ID.String())
	}
	ctx := context.Background()
	cons, err := f.runner.Consumer(ctx)
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(n, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var msgs []jetstream.Msg
	for m := range batch.Messages() {
		msgs = append(msgs, m)
	}
	if len(msgs) != n {
		t.Fatalf("fetched %d messages, want %d", len(msgs), n)
	}
	f.runner.Process(ctx, msgs)

	if got := f.count(t, `SELECT count(*) FROM dead_letters WHERE status = 'parked' AND error LIKE 'deferred:%'`); got != n-1 {
		t.Fatalf("%d events deferred, want %d (all but the one within the share)", got, n-1)
	}
	if hits := tracer.hits.Load(); hits != 1 {
		t.Fatalf("deferring %d events took %d statements, want 1", n-1, hits)
	}
	eventually(t, "the deferred events are acked, the delayed one is not", func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumAckPending == 1
	})
}
