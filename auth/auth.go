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
	"log/slog"
	"slices"
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

// ErrMalformedToken is returned by Authenticate for a token no server ever
// issued: the wrong length, characters or checksum (a typo, a truncated
// paste, another service's token). It is an ErrUnknownToken.
var ErrMalformedToken = fmt.Errorf("%w: not the form of a token (length, characters or checksum)", ErrUnknownToken)

// ErrBusy is returned by Authenticate for a token that needs a database
// look-up while all Config.MaxLookups look-ups stayed busy for
// Config.LookupWait (a flood of well-formed but unknown tokens, or a slow
// database). The token may well be valid: it is not an ErrUnknownToken, and
// the caller should retry shortly (the HTTP layer answers 503 auth-busy with
// Retry-After).
var ErrBusy = errors.New("api token look-ups busy")

// Defaults of Config.
const (
	// DefaultCacheTTL is how long a known token's tenant is cached fresh;
	// past it the next use re-reads it in the background (see
	// DefaultMaxStale). A token revoked by another process (or the CLI)
	// keeps working in this one that long, plus one background re-read.
	DefaultCacheTTL = 30 * time.Second
	// DefaultMaxStale is how long past its CacheTTL a known token's cached
	// tenant is still served while one background look-up re-reads it (for
	// instance while look-ups are busy or the database is down). Past it the
	// token needs a look-up of its own again.
	DefaultMaxStale = 5 * time.Minute
	// DefaultPositiveCacheSize bounds the cache of known tokens.
	DefaultPositiveCacheSize = 10_000
	// DefaultNegativeCacheSize bounds the cache of well-formed tokens found
	// unknown, revoked or expired.
	DefaultNegativeCacheSize = 4096
	// DefaultNegativeTTL is how long such a token is refused without a look-up.
	DefaultNegativeTTL = time.Minute
	// DefaultMaxLookups bounds the token look-ups running at once, so
	// well-formed but unknown tokens can hold at most that many database
	// connections. The background re-reads of known tokens have as many
	// slots of their own, so a flood of unknown tokens cannot starve them.
	DefaultMaxLookups = 4
	// DefaultLookupWait is how long a token waits for a free look-up slot
	// before Authenticate gives up with ErrBusy: look-ups never queue
	// without bound.
	DefaultLookupWait = 50 * time.Millisecond
	// lookupTimeout bounds a shared look-up (several callers may wait for
	// it, so no one caller's cancellation ends it) and a background re-read.
	lookupTimeout = 5 * time.Second
)

// Config tunes a Clients. Zero fields take the defaults.
type Config struct {
	// CacheTTL is how long a known token's tenant is cached fresh
	// (DefaultCacheTTL if 0; a negative value disables the cache). A
	// revocation in another process takes effect here within it (plus one
	// background re-read, see MaxStale).
	CacheTTL time.Duration
	// MaxStale is how long past CacheTTL a cached tenant is still served
	// while one background look-up re-reads the token (DefaultMaxStale if
	// 0). A token found revoked or expired by that look-up is dropped; one
	// past its own expiry is never served.
	MaxStale time.Duration
	// PositiveCacheSize bounds the cache of known tokens
	// (DefaultPositiveCacheSize if 0).
	PositiveCacheSize int
	// NegativeCacheSize bounds the cache of refused well-formed tokens
	// (DefaultNegativeCacheSize if 0).
	NegativeCacheSize int
	// NegativeTTL is how long a refused token stays in it (DefaultNegativeTTL if 0).
	NegativeTTL time.Duration
	// MaxLookups bounds concurrent database look-ups (DefaultMaxLookups if
	// 0); background re-reads of known tokens have as many slots again.
	MaxLookups int
	// LookupWait is how long Authenticate waits for a look-up slot before it
	// returns ErrBusy (DefaultLookupWait if 0).
	LookupWait time.Duration
	// Logger receives the failures of background re-reads (slog.Default()
	// if nil).
	Logger *slog.Logger
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
	case c.MaxStale < 0:
		return fmt.Errorf("auth: MaxStale must not be negative, got %s", c.MaxStale)
	case c.LookupWait < 0:
		return fmt.Errorf("auth: LookupWait must not be negative, got %s", c.LookupWait)
	}
	if c.MaxStale == 0 {
		c.MaxStale = DefaultMaxStale
	}
	if c.LookupWait == 0 {
		c.LookupWait = DefaultLookupWait
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
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

// Clients stores API clients in PostgreSQL. Close it to stop its background
// look-ups.
type Clients struct {
	db        *pgxpool.Pool
	cfg       Config
	lookups   chan struct{} // semaphore of MaxLookups, for tokens not cached
	refreshes chan struct{} // semaphore of MaxLookups, for re-reads of known tokens

	// Small bounded caches keep the token check off the database on the hot
	// path: known tokens (fresh for CacheTTL, then served stale for up to
	// MaxStale while one background look-up re-reads them, never past their
	// own expiry) and well-formed tokens found unknown (for NegativeTTL).
	mu       sync.Mutex
	positive map[[32]byte]*cached
	negative map[[32]byte]time.Time
	// flights are the look-ups under way, by token: concurrent uses of one
	// token share one look-up (and one slot).
	flights map[[32]byte]*flight
	// gen counts revocations: a look-up caches what it read only if no
	// revocation committed while it ran, since it may have read the row
	// before the revocation did.
	gen uint64

	ctx    context.Context // ends on Close
	cancel context.CancelFunc
	wg     sync.WaitGroup // background re-reads

	nLookups, nNegativeHits, nBusy, nStaleHits, nRefreshes atomic.Int64
}

// flight is one look-up that several callers wait for; tenant and err are
// set before done is closed.
type flight struct {
	done   chan struct{}
	tenant string
	err    error
}

type cached struct {
	tenant     string
	fresh      time.Time // served without a look-up until then
	expires    time.Time // the token's own expiry; zero if none
	refreshing bool      // a background re-read is under way
	used       time.Time // last answered from the cache (or looked up)
}

// Stats counts what Authenticate did.
type Stats struct {
	Lookups        int64 // database look-ups (re-reads included)
	NegativeHits   int64 // tokens refused from the negative cache
	NegativeCached int   // entries in the negative cache now
	PositiveCached int   // entries in the cache of known tokens now
	Busy           int64 // tokens refused with ErrBusy
	StaleHits      int64 // known tokens served past CacheTTL
	Refreshes      int64 // background re-reads started
}

// New returns the client store on db with cfg, or an error naming a bad field.
func New(db *pgxpool.Pool, cfg Config) (*Clients, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Clients{
		db: db, cfg: cfg,
		lookups:   make(chan struct{}, cfg.MaxLookups),
		refreshes: make(chan struct{}, cfg.MaxLookups),
		positive:  make(map[[32]byte]*cached),
		negative:  make(map[[32]byte]time.Time),
		flights:   make(map[[32]byte]*flight),
		ctx:       ctx, cancel: cancel,
	}, nil
}

// Close stops the background re-reads and waits for them. Authenticate
// still works after it, without re-reading stale entries in the background.
// Calling it twice is harmless.
func (c *Clients) Close() {
	c.cancel()
	c.wg.Wait()
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
	n, p := len(c.negative), len(c.positive)
	c.mu.Unlock()
	return Stats{
		Lookups: c.nLookups.Load(), NegativeHits: c.nNegativeHits.Load(), NegativeCached: n, PositiveCached: p,
		Busy: c.nBusy.Load(), StaleHits: c.nStaleHits.Load(), Refreshes: c.nRefreshes.Load(),
	}
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
// none was live). This process refuses them at once (a look-up that read
// them before the revocation committed does not cache them); other
// processes within their CacheTTL plus one re-read. Revoking twice is
// harmless.
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
	c.gen++ // even if none was live here: another process may have revoked it
	for _, h := range hashes {
		var k [32]byte
		copy(k[:], h)
		delete(c.positive, k)
	}
	c.mu.Unlock()
	return len(hashes), nil
}

// Authenticate returns the tenant of token, or an error that is
// ErrUnknownToken (ErrLegacyToken for an old-format token it refuses,
// ErrMalformedToken for one of no token's form) or ErrBusy. A malformed
// token or one failing its checksum is refused without
// the database; so is a well-formed one refused within NegativeTTL. A known
// token is answered from the cache: fresh for CacheTTL, then stale for up to
// MaxStale while one background look-up re-reads it, so a known caller never
// waits behind the look-ups of unknown tokens. Any other token waits at most
// LookupWait for one of MaxLookups look-up slots, else ErrBusy; concurrent
// uses of one token share one look-up.
//
// The checksum only filters typos and random garbage: it is public (CRC32),
// so anyone can mint well-formed tokens, each of which costs one look-up
// (then NegativeTTL in the negative cache). A keyed checksum (an HMAC under
// a server secret) would refuse minted tokens without the database too; that
// is the next step if such floods matter.
func (c *Clients) Authenticate(ctx context.Context, token string) (string, error) {
	switch format(token) {
	case formatCurrent:
	case formatLegacy:
		if !c.cfg.AcceptLegacy {
			return "", ErrLegacyToken
		}
	default:
		return "", ErrMalformedToken
	}
	hash := sha256.Sum256([]byte(token))
	now := time.Now()
	c.mu.Lock()
	if hit, ok := c.positive[hash]; ok && (hit.expires.IsZero() || now.Before(hit.expires)) {
		hit.used = now
		switch {
		case now.Before(hit.fresh):
			c.mu.Unlock()
			return hit.tenant, nil
		case now.Before(hit.fresh.Add(c.cfg.MaxStale)):
			c.nStaleHits.Add(1)
			if !hit.refreshing && c.ctx.Err() == nil {
				hit.refreshing = true
				c.nRefreshes.Add(1)
				c.wg.Add(1)
				go c.refresh(hash)
			}
			c.mu.Unlock()
			return hit.tenant, nil
		}
	}
	refusedUntil, refused := c.negative[hash]
	if refused && now.Before(refusedUntil) {
		c.mu.Unlock()
		c.nNegativeHits.Add(1)
		return "", ErrUnknownToken
	}
	if f, ok := c.flights[hash]; ok { // another use of this token is looking it up
		c.mu.Unlock()
		select {
		case <-f.done:
			return f.tenant, f.err
		case <-ctx.Done():
			return "", fmt.Errorf("wait for the look-up of api client: %w", ctx.Err())
		}
	}
	f := &flight{done: make(chan struct{})}
	c.flights[hash] = f
	c.mu.Unlock()

	// Shared: not ended by this caller's cancellation, bounded by lookupTimeout.
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), lookupTimeout)
	defer cancel()
	f.err = acquire(lctx, c.lookups, c.cfg.LookupWait)
	if errors.Is(f.err, ErrBusy) {
		c.nBusy.Add(1)
	}
	if f.err == nil {
		f.tenant, f.err = c.lookup(lctx, hash)
		<-c.lookups
	}
	c.mu.Lock()
	delete(c.flights, hash)
	c.mu.Unlock()
	close(f.done)
	return f.tenant, f.err
}

// acquire takes a slot of sem, waiting at most wait: ErrBusy past it, or
// ctx's error.
func acquire(ctx context.Context, sem chan struct{}, wait time.Duration) error {
	select {
	case sem <- struct{}{}:
		return nil
	default:
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case sem <- struct{}{}:
		return nil
	case <-t.C:
		return ErrBusy
	case <-ctx.Done():
		return fmt.Errorf("wait to look up api client: %w", ctx.Err())
	}
}

// refresh re-reads a known token in the background (its slot of
// c.refreshes held by no caller), keeping its stale entry if the look-up
// fails.
func (c *Clients) refresh(hash [32]byte) {
	defer c.wg.Done()
	ctx, cancel := context.WithTimeout(c.ctx, lookupTimeout)
	defer cancel()
	err := acquire(ctx, c.refreshes, lookupTimeout)
	if err == nil {
		_, err = c.lookup(ctx, hash)
		<-c.refreshes
	}
	c.mu.Lock()
	if hit, ok := c.positive[hash]; ok {
		hit.refreshing = false // a failed re-read is tried again on the next use
	}
	c.mu.Unlock()
	if err != nil && !errors.Is(err, ErrUnknownToken) && c.ctx.Err() == nil {
		c.cfg.Logger.Warn("re-read api token; its cached tenant is served stale meanwhile", "err", err)
	}
}

// lookup reads hash's client from the database (the caller holds a slot)
// and caches the outcome: a found token as fresh, unless a revocation
// committed meanwhile; an unknown, revoked or expired one negatively,
// dropping its positive entry.
func (c *Clients) lookup(ctx context.Context, hash [32]byte) (string, error) {
	c.mu.Lock()
	gen := c.gen
	c.mu.Unlock()
	c.nLookups.Add(1)
	now := time.Now()
	var tenant string
	var remaining *float64 // seconds until expiry, by the database clock
	err := c.db.QueryRow(ctx, clientGetTenantSQL, hash[:]).Scan(&tenant, &remaining)
	if errors.Is(err, pgx.ErrNoRows) {
		c.mu.Lock()
		delete(c.positive, hash)
		c.mu.Unlock()
		c.refuse(hash, now)
		return "", ErrUnknownToken
	}
	if err != nil {
		return "", fmt.Errorf("look up api client: %w", err)
	}
	if c.cfg.CacheTTL > 0 {
		e := &cached{tenant: tenant, fresh: now.Add(c.cfg.CacheTTL), used: now}
		if remaining != nil {
			e.expires = now.Add(time.Duration(*remaining * float64(time.Second)))
		}
		c.mu.Lock()
		if c.gen == gen { // else a revocation committed while we read: do not cache
			if _, ok := c.positive[hash]; !ok && len(c.positive) >= c.cfg.PositiveCacheSize {
				c.evict(now)
			}
			c.positive[hash] = e
		}
		c.mu.Unlock()
	}
	return tenant, nil
}

// evict makes room in the full cache of known tokens: it drops the entries
// no use could be answered from any more (past their stale window or their
// expiry), and if that frees less than a quarter, the least recently used
// down to three quarters. So a tenant cycling through many tokens of its
// own pushes out its own idle ones, not a token used between each few
// thousand others; before, a full cache was cleared whole, and every
// tenant's next request waited for a look-up. c.mu is held.
func (c *Clients) evict(now time.Time) {
	for k, e := range c.positive {
		if !now.Before(e.fresh.Add(c.cfg.MaxStale)) || (!e.expires.IsZero() && !now.Before(e.expires)) {
			delete(c.positive, k)
		}
	}
	keep := c.cfg.PositiveCacheSize * 3 / 4
	if len(c.positive) <= keep {
		return
	}
	type entry struct {
		hash [32]byte
		used time.Time
	}
	all := make([]entry, 0, len(c.positive))
	for k, e := range c.positive {
		all = append(all, entry{k, e.used})
	}
	slices.SortFunc(all, func(a, b entry) int { return a.used.Compare(b.used) })
	for _, e := range all[:len(all)-keep] {
		delete(c.positive, e.hash)
	}
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
	// clientGetTenantSQL reads the tenant of a live token and the seconds
	// until it expires: NULL (never) past 100 years, which covers an
	// expires_at of 'infinity' (its difference to now() is an error) and
	// one whose nanoseconds no time.Duration holds (the cache would have
	// held it as expired, and every request looked it up).
	clientGetTenantSQL = `SELECT tenant_id,
    CASE WHEN expires_at < now() + interval '100 years' THEN extract(epoch FROM expires_at - now())::float8 END
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
