// Package auth knows the service's callers: bearer tokens, each mapped to the
// tenant it acts for. Tokens are random (256 bits) and stored only as their
// SHA-256, so the table cannot be used to call the API.
package auth

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/acme/orders/domain"
)

// tokenPrefix marks the service's tokens, so that they are easy to spot (and
// to scan for) when they leak into logs or repositories.
const tokenPrefix = "ord_"

// ErrUnknownToken is returned by Authenticate for a token that is not (or no
// longer) registered.
var ErrUnknownToken = errors.New("unknown API token")

// Clients stores API clients in PostgreSQL.
type Clients struct {
	db *pgxpool.Pool

	// A small cache of recent positive look-ups keeps the token check off the
	// database on the hot path. Unknown tokens are never cached.
	mu    sync.Mutex
	cache map[[32]byte]cached
	ttl   time.Duration
}

type cached struct {
	tenant string
	until  time.Time
}

// NewClients returns the client store on db. A token's tenant is cached for
// ttl after a look-up (0 disables the cache).
func NewClients(db *pgxpool.Pool, ttl time.Duration) *Clients {
	return &Clients{db: db, cache: make(map[[32]byte]cached), ttl: ttl}
}

// CreateToken registers a new client of tenant and returns its token. The
// token is not stored and cannot be shown again.
func (c *Clients) CreateToken(ctx context.Context, tenant, name string) (string, error) {
	if msg := checkTenant(tenant); msg != "" {
		return "", domain.Errorf(domain.KindInvalid, "tenant %q %s", tenant, msg)
	}
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	token := tokenPrefix + base64.RawURLEncoding.EncodeToString(b[:])
	hash := sha256.Sum256([]byte(token))
	if _, err := c.db.Exec(ctx, clientInsertSQL, hash[:], tenant, name); err != nil {
		return "", fmt.Errorf("insert api client: %w", err)
	}
	return token, nil
}

// Authenticate returns the tenant of token, or ErrUnknownToken.
func (c *Clients) Authenticate(ctx context.Context, token string) (string, error) {
	if !strings.HasPrefix(token, tokenPrefix) || len(token) > 128 {
		return "", ErrUnknownToken
	}
	hash := sha256.Sum256([]byte(token))
	now := time.Now()
	c.mu.Lock()
	hit, ok := c.cache[hash]
	c.mu.Unlock()
	if ok && now.Before(hit.until) {
		return hit.tenant, nil
	}
	var tenant string
	err := c.db.QueryRow(ctx, clientGetTenantSQL, hash[:]).Scan(&tenant)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", ErrUnknownToken
	}
	if err != nil {
		return "", fmt.Errorf("look up api client: %w", err)
	}
	if c.ttl > 0 {
		c.mu.Lock()
		if len(c.cache) > 10_000 { // bounded: start over rather than grow
			clear(c.cache)
		}
		c.cache[hash] = cached{tenant: tenant, until: now.Add(c.ttl)}
		c.mu.Unlock()
	}
	return tenant, nil
}

const (
	clientInsertSQL    = `INSERT INTO api_clients (token_hash, tenant_id, name) VALUES ($1, $2, $3)`
	clientGetTenantSQL = `SELECT tenant_id FROM api_clients WHERE token_hash = $1`
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
