// Package auth knows the service's callers: bearer tokens, each mapped to the
// tenant it acts for. Tokens are random (256 bits) with a checksum (see
// NewToken) and stored only as their SHA-256, so the table cannot be used to
// call the API. A token may expire and may be revoked.
package auth

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/acme/orders/domain"
)

// ErrUnknownToken is returned by Authenticate for a token that is not (or no
// longer) registered: malformed, failing its checksum, unknown, revoked or
// expired.
var ErrUnknownToken = errors.New("unknown API token")

// ErrLegacyToken is returned by Authenticate for a token in the format issued
// before tokens carried a checksum, unless Config.AcceptLegacy. It is an
// ErrUnknownToken (errors.Is matches both).
var ErrLegacyToken = fmt.Errorf("%w: a token in the old format, without checksum", ErrUnknownToken)

// Defaults of Config.
const (
	// DefaultCacheTTL is how long a known token's tenant is cached: also the
	// longest a token revoked by another process (or the CLI) keeps working
	// in this one.
	DefaultCacheTTL = 30 * time.Second
	// DefaultPositiveCacheSize bounds the cache of known tokens.
	DefaultPositiveCacheSize = 10_000
	// DefaultNegativeCacheSize bounds the cache of well-formed tokens found
	// unknown, revoked or expired.
	DefaultNegativeCacheSize = 4096
	// DefaultNegativeTTL is how long such a token is refused without a look-up.
	DefaultNegativeTTL = time.Minute
	// DefaultMaxLookups bounds the token look-ups running at once, so
	// well-formed but unknown tokens can hold at most that many database
	// connections.
	DefaultMaxLookups = 4
)

// Config tunes a Clients. Zero fields take the defaults.
type Config struct {
	// CacheTTL is how long a known token's tenant is cached (DefaultCacheTTL
	// if 0; a negative value disables the cache). A revocation in another
	// process takes effect here within it.
	CacheTTL time.Duration
	// PositiveCacheSize bounds the cache of known tokens
	// (DefaultPositiveCacheSize if 0).
	PositiveCacheSize int
	// NegativeCacheSize bounds the cache of refused well-formed tokens
	// (DefaultNegativeCacheSize if 0).
	NegativeCacheSize int
	// NegativeTTL is how long a refused token stays in it (DefaultNegativeTTL if 0).
	NegativeTTL time.Duration
	// MaxLookups bounds concurrent database look-ups (DefaultMaxLookups if 0).
	MaxLookups int
	// AcceptLegacy admits tokens issued before the checksum. Off by default:
	// such a token cannot be told from a forgery without a look-up.
	AcceptLegacy bool
}

func (c *Config) validate() error {
	switch {
	case c.PositiveCacheSize < 0:
		return fmt.Errorf("auth: PositiveCacheSize must not be negative, got %d", c.PositiveCacheSize)
	case c.NegativeCacheSize < 0:
		return fmt.Errorf("auth: NegativeCacheSize must not be negative, got %d", c.NegativeCacheSize)
	case c.NegativeTTL < 0:
		return fmt.Errorf("auth: NegativeTTL must not be negative, got %s", c.NegativeTTL)
	case c.MaxLookups < 0:
		return fmt.Errorf("auth: MaxLookups must not be negative, got %d", c.MaxLookups)
	}
	if c.CacheTTL == 0 {
		c.CacheTTL = DefaultCacheTTL
	}
	if c.PositiveCacheSize == 0 {
		c.PositiveCacheSize = DefaultPositiveCacheSize
	}
	if c.NegativeCacheSize == 0 {
		c.NegativeCacheSize = DefaultNegativeCacheSize
	}
	if c.NegativeTTL == 0 {
		c.NegativeTTL = DefaultNegativeTTL
	}
	if c.MaxLookups == 0 {
		c.MaxLookups = DefaultMaxLookups
	}
	return nil
}

// Clients stores API clients in PostgreSQL.
type Clients struct {
	db      *pgxpool.Pool
	cfg     Config
	lookups chan struct{} // semaphore of MaxLookups

	// Small bounded caches keep the token check off the database on the hot
	// path: known tokens (until CacheTTL or their expiry, whichever is first)
	// and well-formed tokens found unknown (for NegativeTTL).
	mu       sync.Mutex
	positive map[[32]byte]cached
	negative map[[32]byte]time.Time

	nLookups, nNegativeHits atomic.Int64
}

type cached struct {
	tenant string
	until  time.Time
}

// Stats counts what Authenticate did.
type Stats struct {
	Lookups        int64 // database look-ups
	NegativeHits   int64 // tokens refused from the negative cache
	NegativeCached int   // entries in the negative cache now
}

// New returns the client store on db with cfg, or an error naming a bad field.
func New(db *pgxpool.Pool, cfg Config) (*Clients, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Clients{
		db: db, cfg: cfg,
		lookups:  make(chan struct{}, cfg.MaxLookups),
		positive: make(map[[32]byte]cached),
		negative: make(map[[32]byte]time.Time),
	}, nil
}

// NewClients returns the client store on db with the default Config, except
// that a token's tenant is cached for ttl (0 disables that cache).
func NewClients(db *pgxpool.Pool, ttl time.Duration) *Clients {
	if ttl == 0 {
		ttl = -1
	}
	c, err := New(db, Config{CacheTTL: ttl})
	if err != nil { // cannot happen: only CacheTTL is set, and any value is valid
		panic(err)
	}
	return c
}

// Stats returns the counters.
func (c *Clients) Stats() Stats {
	c.mu.Lock()
	n := len(c.negative)
	c.mu.Unlock()
	return Stats{Lookups: c.nLookups.Load(), NegativeHits: c.nNegativeHits.Load(), NegativeCached: n}
}

// NewClient describes a client to register.
type NewClient struct {
	Tenant string
	Name   string // a label, such as "billing"; revoke by it
	// ExpiresIn, if positive, is how long the token works (judged by the
	// database clock); 0 means it does not expire.
	ExpiresIn time.Duration
}

// Create registers a new client and returns its token. The token is not
// stored and cannot be shown again. An invalid tenant is a domain.KindInvalid
// error.
func (c *Clients) Create(ctx context.Context, nc NewClient) (string, error) {
	if msg := checkTenant(nc.Tenant); msg != "" {
		return "", domain.Errorf(domain.KindInvalid, "tenant %q %s", nc.Tenant, msg)
	}
	if nc.ExpiresIn < 0 {
		return "", domain.Errorf(domain.KindInvalid, "expiry must not be negative, got %s", nc.ExpiresIn)
	}
	token, err := NewToken()
	if err != nil {
		return "", err
	}
	hash := sha256.Sum256([]byte(token))
	var expiresIn *float64
	if nc.ExpiresIn > 0 {
		s := nc.ExpiresIn.Seconds()
		expiresIn = &s
	}
	if _, err := c.db.Exec(ctx, clientInsertSQL, hash[:], nc.Tenant, nc.Name, expiresIn); err != nil {
		return "", fmt.Errorf("insert api client: %w", err)
	}
	return token, nil
}

// CreateToken registers a new client of tenant that does not expire and
// returns its token (see Create).
func (c *Clients) CreateToken(ctx context.Context, tenant, name string) (string, error) {
	return c.Create(ctx, NewClient{Tenant: tenant, Name: name})
}

// Revocation selects the clients to revoke: by Token, or by Tenant and Name
// (every live client of that tenant with that label).
type Revocation struct {
	Token        string
	Tenant, Name string
}

// Revoke revokes the selected clients and returns how many it revoked (0 if
// none was live). This process refuses them at once; other processes within
// their CacheTTL. Revoking twice is harmless.
func (c *Clients) Revoke(ctx context.Context, sel Revocation) (int, error) {
	var rows pgx.Rows
	var err error
	switch {
	case sel.Token != "" && sel.Tenant == "" && sel.Name == "":
		hash := sha256.Sum256([]byte(sel.Token))
		rows, err = c.db.Query(ctx, clientRevokeByHashSQL, hash[:])
	case sel.Token == "" && sel.Tenant != "" && sel.Name != "":
		rows, err = c.db.Query(ctx, clientRevokeByNameSQL, sel.Tenant, sel.Name)
	default:
		return 0, domain.Errorf(domain.KindInvalid, "revoke needs a token, or a tenant and a name")
	}
	if err != nil {
		return 0, fmt.Errorf("revoke api clients: %w", err)
	}
	hashes, err := pgx.CollectRows(rows, pgx.RowTo[[]byte])
	if err != nil {
		return 0, fmt.Errorf("revoke api clients: %w", err)
	}
	c.mu.Lock()
	for _, h := range hashes {
		var k [32]byte
		copy(k[:], h)
		delete(c.positive, k)
	}
	c.mu.Unlock()
	return len(hashes), nil
}

// Authenticate returns the tenant of token, or an error that is
// ErrUnknownToken (ErrLegacyToken for an old-format token it refuses). A
// malformed token or one failing its checksum is refused without the
// database; so is a well-formed one refused within NegativeTTL.
func (c *Clients) Authenticate(ctx context.Context, token string) (string, error) {
	switch format(token) {
	case formatCurrent:
	case formatLegacy:
		if !c.cfg.AcceptLegacy {
			return "", ErrLegacyToken
		}
	default:
		return "", ErrUnknownToken
	}
	hash := sha256.Sum256([]byte(token))
	now := time.Now()
	c.mu.Lock()
	hit, ok := c.positive[hash]
	refusedUntil, refused := c.negative[hash]
	c.mu.Unlock()
	if ok && now.Before(hit.until) {
		return hit.tenant, nil
	}
	if refused && now.Before(refusedUntil) {
		c.nNegativeHits.Add(1)
		return "", ErrUnknownToken
	}

	select {
	case c.lookups <- struct{}{}:
	case <-ctx.Done():
		return "", fmt.Errorf("wait to look up api client: %w", ctx.Err())
	}
	c.nLookups.Add(1)
	var tenant string
	var remaining *float64 // seconds until expiry, by the database clock
	err := c.db.QueryRow(ctx, clientGetTenantSQL, hash[:]).Scan(&tenant, &remaining)
	<-c.lookups
	if errors.Is(err, pgx.ErrNoRows) {
		c.refuse(hash, now)
		return "", ErrUnknownToken
	}
	if err != nil {
		return "", fmt.Errorf("look up api client: %w", err)
	}
	if c.cfg.CacheTTL > 0 {
		until := now.Add(c.cfg.CacheTTL)
		if remaining != nil {
			if exp := now.Add(time.Duration(*remaining * float64(time.Second))); exp.Before(until) {
				until = exp
			}
		}
		c.mu.Lock()
		if len(c.positive) >= c.cfg.PositiveCacheSize { // bounded: start over rather than grow
			clear(c.positive)
		}
		c.positive[hash] = cached{tenant: tenant, until: until}
		c.mu.Unlock()
	}
	return tenant, nil
}

// refuse puts hash in the negative cache, dropping expired entries (or, if
// none has expired, all of them) when it is full.
func (c *Clients) refuse(hash [32]byte, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.negative) >= c.cfg.NegativeCacheSize {
		for k, until := range c.negative {
			if !now.Before(until) {
				delete(c.negative, k)
			}
		}
		if len(c.negative) >= c.cfg.NegativeCacheSize {
			clear(c.negative)
		}
	}
	c.negative[hash] = now.Add(c.cfg.NegativeTTL)
}

const (
	clientInsertSQL = `INSERT INTO api_clients (token_hash, tenant_id, name, expires_at, format)
VALUES ($1, $2, $3, now() + make_interval(secs => $4), 2)`
	clientGetTenantSQL = `SELECT tenant_id, extract(epoch FROM expires_at - now())::float8
FROM api_clients
WHERE token_hash = $1 AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now())`
	clientRevokeByHashSQL = `UPDATE api_clients SET revoked_at = now()
WHERE token_hash = $1 AND revoked_at IS NULL RETURNING token_hash`
	clientRevokeByNameSQL = `UPDATE api_clients SET revoked_at = now()
WHERE tenant_id = $1 AND name = $2 AND revoked_at IS NULL RETURNING token_hash`
)

// checkTenant returns "" for a good tenant name: 1 to 64 characters of
// a-z, 0-9, '-' and '_'.
func checkTenant(t string) string {
	if t == "" || len(t) > 64 {
		return "must be 1 to 64 characters"
	}
	for _, r := range t {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return "may hold only a-z, 0-9, '-' and '_'"
		}
	}
	return ""
}
