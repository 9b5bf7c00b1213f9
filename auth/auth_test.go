package auth_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/acme/orders/auth"
	"github.com/acme/orders/internal/testenv"
)

// A token carries a checksum: a forged one (random characters after ord_, a
// flipped character, or the wrong length) is refused without a look-up.
func TestForgedTokenIsRefusedWithoutTheDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, err := auth.New(testenv.DB(t), auth.Config{})
	if err != nil {
		t.Fatal(err)
	}
	token, err := c.CreateToken(ctx, "acme", "test")
	if err != nil {
		t.Fatal(err)
	}
	if !auth.WellFormed(token) {
		t.Fatalf("a new token %q is not well formed", token)
	}
	flipped := []byte(token)
	if flipped[10] == 'a' {
		flipped[10] = 'b'
	} else {
		flipped[10] = 'a'
	}
	forged := []string{
		"ord_" + strings.Repeat("x", 49),
		string(flipped),
		token[:len(token)-1],
		token + "0",
		"ord_",
		"not-a-token",
	}
	for _, f := range forged {
		if _, err := c.Authenticate(ctx, f); !errors.Is(err, auth.ErrUnknownToken) {
			t.Errorf("Authenticate(%q) = %v, want ErrUnknownToken", f, err)
		}
	}
	if n := c.Stats().Lookups; n != 0 {
		t.Fatalf("forged tokens cost %d database look-ups, want 0", n)
	}
	if tenant, err := c.Authenticate(ctx, token); err != nil || tenant != "acme" {
		t.Fatalf("Authenticate(real) = %q, %v", tenant, err)
	}
}

// A well-formed token that is not registered costs one look-up; repeating
// it is answered from the negative cache.
func TestUnknownTokenIsCachedNegatively(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, err := auth.New(testenv.DB(t), auth.Config{})
	if err != nil {
		t.Fatal(err)
	}
	unknown, err := auth.NewToken()
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if _, err := c.Authenticate(ctx, unknown); !errors.Is(err, auth.ErrUnknownToken) {
			t.Fatalf("Authenticate(unknown) = %v, want ErrUnknownToken", err)
		}
	}
	if s := c.Stats(); s.Lookups != 1 || s.NegativeHits != 4 {
		t.Fatalf("stats %+v, want 1 look-up and 4 negative-cache hits", s)
	}
}

// The negative cache is bounded: a flood of distinct unknown tokens does not
// grow it past its size.
func TestNegativeCacheIsBounded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, err := auth.New(testenv.DB(t), auth.Config{NegativeCacheSize: 8})
	if err != nil {
		t.Fatal(err)
	}
	for range 50 {
		tok, err := auth.NewToken()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Authenticate(ctx, tok); !errors.Is(err, auth.ErrUnknownToken) {
			t.Fatalf("Authenticate(unknown) = %v", err)
		}
		if n := c.Stats().NegativeCached; n > 8 {
			t.Fatalf("negative cache holds %d entries, want at most 8", n)
		}
	}
}

// A revoked token is refused at once by the process that revoked it, though
// its tenant was cached; revoking by tenant and name works too.
func TestRevokedTokenIsRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, err := auth.New(testenv.DB(t), auth.Config{CacheTTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	a, err := c.CreateToken(ctx, "acme", "a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.CreateToken(ctx, "acme", "b")
	if err != nil {
		t.Fatal(err)
	}
	for _, tok := range []string{a, b} {
		if _, err := c.Authenticate(ctx, tok); err != nil { // now cached
			t.Fatal(err)
		}
	}
	if n, err := c.Revoke(ctx, auth.Revocation{Token: a}); err != nil || n != 1 {
		t.Fatalf("Revoke(token) = %d, %v; want 1", n, err)
	}
	if _, err := c.Authenticate(ctx, a); !errors.Is(err, auth.ErrUnknownToken) {
		t.Fatalf("revoked token: %v, want ErrUnknownToken", err)
	}
	if _, err := c.Authenticate(ctx, b); err != nil {
		t.Fatalf("the other token: %v", err)
	}
	if n, err := c.Revoke(ctx, auth.Revocation{Tenant: "acme", Name: "b"}); err != nil || n != 1 {
		t.Fatalf("Revoke(tenant, name) = %d, %v; want 1", n, err)
	}
	if _, err := c.Authenticate(ctx, b); !errors.Is(err, auth.ErrUnknownToken) {
		t.Fatalf("revoked by name: %v, want ErrUnknownToken", err)
	}
	if _, err := c.Revoke(ctx, auth.Revocation{}); err == nil {
		t.Fatal("Revoke with nothing to select: no error")
	}
}

// A token created with an expiry works until then and is refused after,
// even while its tenant is cached.
func TestExpiredTokenIsRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, err := auth.New(testenv.DB(t), auth.Config{CacheTTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := c.Create(ctx, auth.NewClient{Tenant: "acme", Name: "short", ExpiresIn: 1500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Authenticate(ctx, tok); err != nil {
		t.Fatalf("before expiry: %v", err)
	}
	time.Sleep(1600 * time.Millisecond)
	if _, err := c.Authenticate(ctx, tok); !errors.Is(err, auth.ErrUnknownToken) {
		t.Fatalf("after expiry: %v, want ErrUnknownToken", err)
	}
}

// A token whose expiry an operator set far ahead by hand (the year 2500,
// or 'infinity') authenticates, and from the cache: the time left is more
// than a time.Duration holds, or an error to compute.
func TestTokenExpiringFarAheadIsCached(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.DB(t)
	c, err := auth.New(db, auth.Config{CacheTTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	for _, expires := range []string{"2500-01-01", "infinity"} {
		tok, err := c.Create(ctx, auth.NewClient{Tenant: "acme", Name: "far-" + expires, ExpiresIn: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.Exec(ctx, `UPDATE api_clients SET expires_at = $1::timestamptz WHERE tenant_id = 'acme' AND name = $2`, expires, "far-"+expires); err != nil {
			t.Fatal(err)
		}
		before := c.Stats().Lookups
		for range 3 {
			if tenant, err := c.Authenticate(ctx, tok); err != nil || tenant != "acme" {
				t.Fatalf("expires %s: %q, %v; want acme", expires, tenant, err)
			}
		}
		if n := c.Stats().Lookups - before; n != 1 {
			t.Errorf("expires %s: 3 requests took %d look-ups, want 1 (then the cache)", expires, n)
		}
	}
}

// Tokens made before the checksum (ord_ + 43 base64url characters) are
// refused with ErrLegacyToken, without a look-up, unless AcceptLegacy.
func TestLegacyTokens(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.DB(t)
	var b [32]byte
	_, _ = rand.Read(b[:])
	legacy := "ord_" + base64.RawURLEncoding.EncodeToString(b[:])
	hash := sha256.Sum256([]byte(legacy))
	if _, err := db.Exec(ctx, `INSERT INTO api_clients (token_hash, tenant_id, name, format) VALUES ($1, 'old', 'legacy', 1)`, hash[:]); err != nil {
		t.Fatal(err)
	}
	strict, err := auth.New(db, auth.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := strict.Authenticate(ctx, legacy); !errors.Is(err, auth.ErrLegacyToken) || !errors.Is(err, auth.ErrUnknownToken) {
		t.Fatalf("legacy token, strict: %v, want ErrLegacyToken (an ErrUnknownToken)", err)
	}
	if n := strict.Stats().Lookups; n != 0 {
		t.Fatalf("legacy token cost %d look-ups when refused", n)
	}
	lenient, err := auth.New(db, auth.Config{AcceptLegacy: true})
	if err != nil {
		t.Fatal(err)
	}
	if tenant, err := lenient.Authenticate(ctx, legacy); err != nil || tenant != "old" {
		t.Fatalf("legacy token, AcceptLegacy: %q, %v", tenant, err)
	}
}

func TestConfigIsValidated(t *testing.T) {
	t.Parallel()
	for _, cfg := range []auth.Config{
		{NegativeCacheSize: -1},
		{NegativeTTL: -time.Second},
		{MaxLookups: -1},
		{PositiveCacheSize: -1},
		{MaxStale: -time.Second},
		{LookupWait: -time.Millisecond},
	} {
		if _, err := auth.New(nil, cfg); err == nil {
			t.Errorf("New(%+v): no error", cfg)
		}
	}
}

// The cache of known tokens is bounded without forgetting the tokens in
// use: a tenant cycling through more tokens than the cache holds pushes out
// its own idle ones, while another tenant's token used all along is never
// looked up again. Before, a full cache was cleared whole.
func TestKnownTokenCacheKeepsTheTokensInUse(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const size = 8
	c, err := auth.New(testenv.DB(t), auth.Config{PositiveCacheSize: size})
	if err != nil {
		t.Fatal(err)
	}
	victim, err := c.CreateToken(ctx, "victim", "test")
	if err != nil {
		t.Fatal(err)
	}
	const cycled = 5 * size
	for i := range cycled {
		if tenant, err := c.Authenticate(ctx, victim); err != nil || tenant != "victim" {
			t.Fatalf("victim's token: %q, %v", tenant, err)
		}
		tok, err := c.CreateToken(ctx, "cycler", "test")
		if err != nil {
			t.Fatal(err)
		}
		if tenant, err := c.Authenticate(ctx, tok); err != nil || tenant != "cycler" {
			t.Fatalf("cycler's token %d: %q, %v", i, tenant, err)
		}
		if n := c.Stats().PositiveCached; n > size {
			t.Fatalf("the cache holds %d tokens, want at most %d", n, size)
		}
	}
	if n := c.Stats().Lookups; n != 1+cycled {
		t.Fatalf("%d look-ups, want %d: one per token, the victim's once", n, 1+cycled)
	}
}
