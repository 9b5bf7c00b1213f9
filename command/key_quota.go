package command

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/acme/orders/postgres"
)

// keyQuota bounds the keys each tenant has stored without a hot row: each
// process holds a per-tenant count, recounted from the database at most once
// per refresh interval (by one request, outside any transaction, with a count
// that stops at the quota), plus the keys it stored itself since then and the
// ones being stored right now. A create pays nothing in the database for it
// (no extra round trip, no shared row); only a tenant at its quota pays one
// extra statement, to find out whether the request is a retry of a stored
// key. Other replicas' keys show up at the next recount, so the quota can be
// overshot by what the other replicas store in one interval.
type keyQuota struct {
	db      postgres.DB
	limit   int64
	refresh time.Duration

	mu      sync.Mutex
	tenants map[string]*tenantKeys
}

// tenantKeys is one tenant's estimate; its fields are guarded by keyQuota.mu
// except counting, which serialises the recounts.
type tenantKeys struct {
	counting sync.Mutex

	counted   int64     // stored keys at the last count
	countedAt time.Time // zero until the first count
	added     int64     // keys this process stored since the count began
	inFlight  int64     // keys this process is storing now (reserved, not ended)
}

func newKeyQuota(db postgres.DB, limit int, refresh time.Duration) *keyQuota {
	return &keyQuota{db: db, limit: int64(limit), refresh: refresh, tenants: map[string]*tenantKeys{}}
}

const keyCountSQL = `
SELECT count(*) FROM (SELECT 1 FROM idempotency_keys WHERE tenant_id = $1 LIMIT $2) AS k`

// reserve reports whether tenant may store one more key and, if so,
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
	if t.counted+t.added+t.inFlight >= q.limit {
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
	addedBefore := t.added
	q.mu.Unlock()

	var n int64
	if err := q.db.QueryRow(ctx, keyCountSQL, tenant, q.limit+1).Scan(&n); err != nil {
		return fmt.Errorf("count idempotency keys of tenant %q: %w", tenant, err)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	t.counted, t.countedAt, t.added = n, time.Now(), t.added-addedBefore
	return nil
}

// end ends a reservation: stored says whether the key was committed.
func (q *keyQuota) end(tenant string, stored bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	t := q.tenants[tenant]
	t.inFlight--
	if stored {
		t.added++
	}
}

// retryAfter is how long a refused request should wait: until this process
// counts again.
func (q *keyQuota) retryAfter() time.Duration { return q.refresh }
