package auth_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/acme/orders/auth"
	"github.com/acme/orders/internal/testenv"
)

// lookupGate is a pgx tracer that, while armed, holds every token look-up
// (the SELECT on api_clients) after it has read its row, until released:
// the look-up keeps its slot and has not yet cached what it read.
type lookupGate struct {
	armed   atomic.Bool
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

type sqlKey struct{}

func newLookupGate() *lookupGate {
	return &lookupGate{entered: make(chan struct{}, 64), release: make(chan struct{})}
}

func (g *lookupGate) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	return context.WithValue(ctx, sqlKey{}, d.SQL)
}

func (g *lookupGate) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	sql, _ := ctx.Value(sqlKey{}).(string)
	if g.armed.Load() && strings.HasPrefix(sql, "SELECT tenant_id") {
		g.entered <- struct{}{}
		<-g.release
	}
}

func (g *lookupGate) open() { g.once.Do(func() { close(g.release) }) }

// waitEntered waits for n look-ups to be held.
func (g *lookupGate) waitEntered(tb testing.TB, n int) {
	tb.Helper()
	for range n {
		select {
		case <-g.entered:
		case <-time.After(5 * time.Second):
			tb.Fatal("a look-up did not reach the database")
		}
	}
}

// gatedDB opens a pool on a fresh database whose token look-ups g holds.
func gatedDB(tb testing.TB, g *lookupGate) *pgxpool.Pool {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(testenv.DatabaseURL(tb))
	if err != nil {
		tb.Fatal(err)
	}
	cfg.ConnConfig.Tracer = g
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	tb.Cleanup(g.open) // runs first: nothing stays held
	return pool
}

// A look-up that read a token's row before a revocation committed must not
// cache it after the revocation: the revoked token is refused at once.
func TestRevokeRacingALookupIsNotUndone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g := newLookupGate()
	c, err := auth.New(gatedDB(t, g), auth.Config{CacheTTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := c.CreateToken(ctx, "acme", "racy")
	if err != nil {
		t.Fatal(err)
	}
	g.armed.Store(true)
	type result struct {
		tenant string
		err    error
	}
	done := make(chan result, 1)
	go func() {
		tenant, err := c.Authenticate(ctx, tok)
		done <- result{tenant, err}
	}()
	g.waitEntered(t, 1) // the look-up has read the live row
	g.armed.Store(false)
	if n, err := c.Revoke(ctx, auth.Revocation{Token: tok}); err != nil || n != 1 {
		t.Fatalf("Revoke = %d, %v; want 1", n, err)
	}
	g.open()
	if r := <-done; r.err != nil || r.tenant != "acme" { // it read the row before the revoke
		t.Fatalf("the racing look-up: %q, %v", r.tenant, r.err)
	}
	if tenant, err := c.Authenticate(ctx, tok); !errors.Is(err, auth.ErrUnknownToken) {
		t.Fatalf("revoked token after the racing look-up: %q, %v; want ErrUnknownToken", tenant, err)
	}
}

// With every look-up slot held by slow look-ups of unknown (minted) tokens,
// a known token whose cache entry is past its TTL is still answered at
// once, and one background look-up re-reads it.
func TestKnownTokenDoesNotWaitBehindLookups(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g := newLookupGate()
	const ttl = 100 * time.Millisecond
	c, err := auth.New(gatedDB(t, g), auth.Config{CacheTTL: ttl, MaxLookups: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	known, err := c.CreateToken(ctx, "acme", "known")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Authenticate(ctx, known); err != nil { // now cached
		t.Fatal(err)
	}
	time.Sleep(2 * ttl) // its entry is past the TTL

	g.armed.Store(true)
	var wg sync.WaitGroup
	for range 2 { // minted tokens hold both slots
		minted, err := auth.NewToken()
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() { _, _ = c.Authenticate(ctx, minted) })
	}
	g.waitEntered(t, 2)

	for i := range 5 {
		start := time.Now()
		tctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		tenant, err := c.Authenticate(tctx, known)
		cancel()
		if err != nil || tenant != "acme" {
			t.Fatalf("known token, try %d: %q, %v; want acme", i, tenant, err)
		}
		if d := time.Since(start); d > 100*time.Millisecond {
			t.Fatalf("known token, try %d, waited %s behind the look-ups of minted tokens", i, d)
		}
	}
	if s := c.Stats(); s.Refreshes != 1 {
		t.Fatalf("%d background re-reads for one stale token, want 1", s.Refreshes)
	}

	// A token that needs a look-up does not queue: ErrBusy after LookupWait.
	other, err := auth.NewToken()
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	tctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	_, err = c.Authenticate(tctx, other)
	cancel()
	if d := time.Since(start); !errors.Is(err, auth.ErrBusy) || d > time.Second {
		t.Fatalf("token needing a look-up with all slots busy: %v after %s; want ErrBusy after about %s", err, d, auth.DefaultLookupWait)
	}
	if errors.Is(err, auth.ErrUnknownToken) {
		t.Fatal("ErrBusy must not be an ErrUnknownToken: the token may be valid")
	}

	g.armed.Store(false)
	g.open()
	wg.Wait()
	// The re-read (held by the gate too) completes and the entry is fresh.
	testenv.Eventually(t, 5*time.Second, "the stale entry is re-read and fresh again", func() bool {
		before := c.Stats()
		_, err := c.Authenticate(ctx, known)
		after := c.Stats()
		return err == nil && after.Lookups == before.Lookups && after.StaleHits == before.StaleHits
	})
}

// Concurrent first uses of one token (a client's burst when the process
// starts, or with the cache off) share one look-up: they neither take a slot
// each nor get ErrBusy while it runs.
func TestConcurrentUsesOfOneTokenShareALookup(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g := newLookupGate()
	c, err := auth.New(gatedDB(t, g), auth.Config{CacheTTL: -1, MaxLookups: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	tok, err := c.CreateToken(ctx, "acme", "burst")
	if err != nil {
		t.Fatal(err)
	}
	g.armed.Store(true)
	const n = 20
	errs := make(chan error, n)
	var wg sync.WaitGroup
	use := func() {
		tenant, err := c.Authenticate(ctx, tok)
		if err == nil && tenant != "acme" {
			err = errors.New("tenant " + tenant)
		}
		errs <- err
	}
	wg.Go(use)
	g.waitEntered(t, 1) // the first look-up holds the only slot
	for range n - 1 {
		wg.Go(use)
	}
	time.Sleep(4 * auth.DefaultLookupWait) // longer than any of them would wait for a slot
	g.armed.Store(false)
	g.open()
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("a use of the token during its look-up: %v", err)
		}
	}
	if l := c.Stats().Lookups; l != 1 {
		t.Fatalf("%d look-ups for %d concurrent uses of one token, want 1", l, n)
	}
}
