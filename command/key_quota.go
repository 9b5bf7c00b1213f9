package command

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/acme/orders/postgres"
)

// keyQuota bounds the keys each tenant has stored, and their bytes, without a
// hot row: each process holds a per-tenant count and sum, recounted from the
// database at most once per refresh interval (by one request, outside any
// transaction, from the unique index that carries each row's stored_bytes,
// with a scan that stops past the quota of keys), plus the keys it stored
// itself since then and the ones being stored right now. A key's bytes are
// known only once its response is: a reservation counts as a key but as no
// bytes, so a tenant can overshoot its bytes by what its requests in flight
// store (bounded by its in-flight limit). A create pays nothing in the database for it
// (no extra round trip, no shared row); only a tenant at its quota pays one
// extra statement, to find out whether the request is a retry of a stored
// key. Other replicas' keys show up at the next recount, so the quota can be
// overshot by what the other replicas store in one interval.
type keyQuota struct {
	db         postgres.DB
	limit      int64 // keys
	limitBytes int64 // bytes of keys (storedBytes)
	refresh    time.Duration

	mu      sync.Mutex
	tenants map[string]*tenantKeys
}

// tenantKeys is one tenant's estimate; its fields are guarded by keyQuota.mu
// except counting, which serialises the recounts.
type tenantKeys struct {
	counting sync.Mutex

	counted      int64     // stored keys at the last count
	countedBytes int64     // their stored bytes
	countedAt    time.Time // zero until the first count
	added        int64     // keys this process stored since the count began
	addedBytes   int64     // their stored bytes
	inFlight     int64     // keys this process is storing now (reserved, not ended)
}

func newKeyQuota(db postgres.DB, limit int, limitBytes int64, refresh time.Duration) *keyQuota {
	return &keyQuota{db: db, limit: int64(limit), limitBytes: limitBytes, refresh: refresh, tenants: map[string]*tenantKeys{}}
}

// keyCountSQL counts a tenant's keys, up to $2, and sums their stored bytes
// (NULL in a row an api older than stored_bytes wrote: no bytes). An
// index-only scan of the primary key (tenant_id, key) INCLUDE (stored_bytes).
const keyCountSQL = `
SELECT count(*), coalesce(sum(stored_bytes), 0)::bigint
FROM (SELECT stored_bytes FROM idempotency_keys WHERE tenant_id = $1 LIMIT $2) AS k`

// reserve reports whether tenant may store one more key (it has fewer keys
// than the quota, and fewer bytes of keys) and, if so,
// reserves it; every reservation must be ended with end. It recounts the
// tenant's keys first when the count is older than the refresh interval.
func (q *keyQuota) reserve(ctx context.Context, tenant string) (bool, error) {
	q.mu.Lock()
	t := q.tenants[tenant]
	if t == nil {
		t = &tenantKeys{}
		q.tenants[tenant] = t
	}
	stale, never := time.Since(t.countedAt) >= q.refresh, t.countedAt.IsZero()
	q.mu.Unlock()

	if stale {
		// The first count is waited for; later ones are made by one request
		// while the others go on with the previous count.
		if never {
			t.counting.Lock()
		} else if !t.counting.TryLock() {
			stale = false
		}
	}
	if stale {
		err := q.recount(ctx, tenant, t)
		t.counting.Unlock()
		if err != nil {
			return false, err
		}
	}

	q.mu.Lock()
	defer q.mu.Unlock()
	if t.counted+t.added+t.inFlight >= q.limit || t.countedBytes+t.addedBytes >= q.limitBytes {
		return false, nil
	}
	t.inFlight++
	return true, nil
}

// recount counts the tenant's stored keys (up to the quota) in the database.
// Keys this process stored while the count ran stay in added: counted twice
// at worst, which errs on the safe side until the next count.
func (q *keyQuota) recount(ctx context.Context, tenant string, t *tenantKeys) error {
	q.mu.Lock()
	if time.Since(t.countedAt) < q.refresh { // another request just counted
		q.mu.Unlock()
		return nil
	}
	addedBefore, addedBytesBefore := t.added, t.addedBytes
	q.mu.Unlock()

	var n, bytes int64
	if err := q.db.QueryRow(ctx, keyCountSQL, tenant, min(q.limit, math.MaxInt64-1)+1).Scan(&n, &bytes); err != nil {
		return fmt.Errorf("count idempotency keys of tenant %q: %w", tenant, err)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	t.counted, t.countedBytes, t.countedAt = n, bytes, time.Now()
	t.added, t.addedBytes = t.added-addedBefore, t.addedBytes-addedBytesBefore
	return nil
}

// end ends a reservation: stored says whether the key was committed, and
// bytes what its row keeps (storedBytes).
func (q *keyQuota) end(tenant string, stored bool, bytes int64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	t := q.tenants[tenant]
	t.inFlight--
	if stored {
		t.added++
		t.addedBytes += bytes
	}
}

// refusal is the error of a request refused at the quota.
func (q *keyQuota) refusal() *KeyQuotaError {
	return &KeyQuotaError{Quota: int(q.limit), QuotaBytes: q.limitBytes, RetryAfter: q.retryAfter()}
}

// retryAfter is how long a refused request should wait: until this process
// counts again.
func (q *keyQuota) retryAfter() time.Duration { return q.refresh }
