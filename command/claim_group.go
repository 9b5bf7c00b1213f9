package command

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/acme/orders/postgres"
)

// claimGroup commits the claim statements (Preclaim.SQL) of concurrent
// creates together: one pipeline, one transaction, one commit and so one
// WAL flush for the group, where each create alone queued for a flush of
// its own (under load three quarters of a create's time in PostgreSQL was
// that queue: BENCHMARKS "What bounds the remaining ratios").
//
// Each create's statement still writes its key row, its order and its
// event together or not at all (G1); the group only shares their commit.
// There is no linger: a statement waits only while all of the group's
// slots have a batch in flight, so one request alone goes at once, and
// under load the batches grow with the queue.
//
// A batch that fails commits nothing, and nothing in it is lost. The
// claims of the tenant whose statement failed for its own rows (a key in
// flight elsewhere past the batch's lock timeout, a key that created an
// order before) go alone, each as it
// did before the group existed (Idempotency.preclaim's single statement),
// and the others are sent again; after groupAttempts failures every claim
// of the batch goes alone. A batch whose outcome is unknown (the
// connection broke) goes alone too: a claim that did commit is then found
// stored, and replayed.
//
// Tenants are kept apart (G9). A batch takes one queued claim of each
// tenant in turn, and the next batch starts after the tenant served last,
// so a tenant with many creates queued fills a batch only when no other
// tenant waits, and every tenant with a create queued is served within
// (tenants queued / maxBatch) + 1 batches, whatever the others queued. A
// tenant whose statement failed a batch has its queued creates taken out
// and sends its creates alone for groupStrike, so that its failing creates
// (on purpose or not) cost the others at most one batch sent again per
// slot in flight per groupStrike, not every batch. Any other failure (a
// lock on a table, the commit, the connection) sends the batch alone.
//
// Each lock wait of a batch is bounded by groupLockTimeout (PostgreSQL
// bounds each wait, not their sum). A create whose batch committed but whose
// answer was lost (the connection broke) finds its key stored when it goes
// alone, and answers with that stored response, marked replayed (its relay
// wake-up and its key-quota credit are then left to the relay's poll and
// the quota's recount).
type claimGroup struct {
	db       postgres.DB
	slots    int // batches in flight at most
	maxBatch int // claims in one batch at most
	// lockTimeout is groupLockTimeout (tests lengthen it to hold a batch).
	lockTimeout string

	mu       sync.Mutex
	queues   map[string][]*groupClaim // by tenant, oldest first
	turns    []string                 // tenants with queued claims, in the order they are served
	inflight int
	struck   map[string]time.Time // tenants whose claims go alone until then

	batches, grouped, alone, failed atomic.Int64
}

// groupClaim is one create's claim statement and, once done is closed, its
// result: the scan of its row, or errAlone.
type groupClaim struct {
	tenant, key string
	sql         string
	args        []any

	expiresAt *time.Time
	took      *float64
	rows      int64
	err       error
	sent      time.Time // when its batch was sent (the last time)
	done      chan struct{}
	queued    bool // guarded by claimGroup.mu
}

// errAlone: the claim was not committed with its group; send it alone.
var errAlone = errors.New("claim not committed in its group: send it alone")

// groupLockTimeout bounds how long a batch waits for a lock (a key another
// request holds, mostly): the whole batch waits with it, so it is short.
// The claim that waited goes alone, with its request's own wait bound.
const groupLockTimeout = "20ms"

// groupAttempts is how many times a batch is sent, each time without the
// tenant whose statement failed it, before all of its claims go alone.
const groupAttempts = 3

// groupStrike is how long a tenant whose statement failed a batch sends its
// creates alone.
const groupStrike = 5 * time.Second

// groupTimeout bounds a batch's round trip; past it the batch's claims go
// alone (each finds its key stored if the batch did commit).
const groupTimeout = 10 * time.Second

func newClaimGroup(db postgres.DB, slots, maxBatch int) *claimGroup {
	return &claimGroup{db: db, slots: slots, maxBatch: maxBatch, lockTimeout: groupLockTimeout, queues: map[string][]*groupClaim{}, struck: map[string]time.Time{}}
}

// claim queues c, and returns once its batch has answered for it, or with
// ctx's error if ctx ends while c is still queued (it is then never sent).
// c.err is errAlone if the group did not commit it (or will not take it:
// its tenant is struck).
func (g *claimGroup) claim(ctx context.Context, c *groupClaim) error {
	c.done = make(chan struct{})
	g.mu.Lock()
	if until, ok := g.struck[c.tenant]; ok {
		if time.Now().Before(until) {
			g.mu.Unlock()
			g.alone.Add(1)
			c.err = errAlone
			return nil
		}
		delete(g.struck, c.tenant)
	}
	if len(g.queues[c.tenant]) == 0 {
		g.turns = append(g.turns, c.tenant)
	}
	g.queues[c.tenant] = append(g.queues[c.tenant], c)
	c.queued = true
	lead := g.inflight < g.slots
	if lead {
		g.inflight++
	}
	g.mu.Unlock()
	if lead {
		go g.lead()
	}
	select {
	case <-c.done:
		return nil
	case <-ctx.Done():
	}
	g.mu.Lock()
	if c.queued { // not taken: withdraw it
		g.remove(c)
		g.mu.Unlock()
		return ctx.Err()
	}
	g.mu.Unlock()
	<-c.done // in a batch already: its outcome decides what the caller answers
	return nil
}

// remove takes c out of its tenant's queue; g.mu is held.
func (g *claimGroup) remove(c *groupClaim) {
	q := g.queues[c.tenant]
	for i, x := range q {
		if x == c {
			q = append(q[:i:i], q[i+1:]...)
			break
		}
	}
	c.queued = false
	g.setQueue(c.tenant, q)
}

// setQueue stores tenant's queue q, dropping the tenant from the turns when
// q is empty; g.mu is held.
func (g *claimGroup) setQueue(tenant string, q []*groupClaim) {
	if len(q) > 0 {
		g.queues[tenant] = q
		return
	}
	delete(g.queues, tenant)
	for i, t := range g.turns {
		if t == tenant {
			g.turns = append(g.turns[:i:i], g.turns[i+1:]...)
			break
		}
	}
}

// lead sends batches until the queue is empty, then gives its slot back.
func (g *claimGroup) lead() {
	for {
		g.mu.Lock()
		batch := g.take()
		if len(batch) == 0 {
			g.inflight--
			g.mu.Unlock()
			return
		}
		g.mu.Unlock()
		g.send(batch)
	}
}

// take removes the next batch from the queues: one claim of each tenant in
// turn, round after round, up to maxBatch, and never two claims of one key
// (the second waits for a later batch, where it finds the first's row).
// The next batch starts with the tenant after the one served last, so
// with more tenants queued than a batch holds every tenant is served
// within len(turns)/maxBatch + 1 batches. g.mu is held.
func (g *claimGroup) take() []*groupClaim {
	var batch []*groupClaim
	type tenantKey struct{ tenant, key string }
	keys := map[tenantKey]bool{}
	last := -1 // the index in turns of the tenant served last
	for len(batch) < g.maxBatch {
		took := false
		for i, t := range g.turns {
			if len(batch) == g.maxBatch {
				break
			}
			for _, c := range g.queues[t] {
				if k := (tenantKey{t, c.key}); !keys[k] {
					keys[k] = true
					c.queued = false
					batch = append(batch, c)
					took, last = true, i
					break
				}
			}
		}
		if !took {
			break
		}
	}
	if next := last + 1; next > 0 && next < len(g.turns) { // the next batch starts after it
		g.turns = append(g.turns[next:], g.turns[:next]...)
	}
	for _, t := range append([]string(nil), g.turns...) {
		q := g.queues[t]
		kept := q[:0:0]
		for _, c := range q {
			if c.queued {
				kept = append(kept, c)
			}
		}
		g.setQueue(t, kept)
	}
	return batch
}

// send commits batch as one transaction. If a statement fails it, the
// claims of that statement's tenant go alone and the tenant is struck, and
// the rest is sent again, up to groupAttempts in all; then, or if no
// statement failed it (the commit, the connection), all go alone.
func (g *claimGroup) send(batch []*groupClaim) {
	for attempt := 1; len(batch) > 0; attempt++ {
		failed, err := g.try(batch)
		if err != nil {
			g.failed.Add(1)
		}
		if err == nil {
			g.batches.Add(1)
			for _, c := range batch {
				if c.expiresAt != nil {
					g.grouped.Add(1)
				}
				close(c.done)
			}
			return
		}
		if failed < 0 || attempt == groupAttempts {
			g.goAlone(batch)
			return
		}
		tenant := batch[failed].tenant
		alone := g.strike(tenant)
		var rest []*groupClaim
		for _, c := range batch {
			if c.tenant == tenant {
				alone = append(alone, c)
			} else {
				rest = append(rest, c)
			}
		}
		g.goAlone(alone)
		batch = rest
	}
}

// strike sends tenant's creates alone for groupStrike, and returns those it
// had queued, taken out of the queue: they go alone too.
func (g *claimGroup) strike(tenant string) (queued []*groupClaim) {
	now := time.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	queued = g.queues[tenant]
	for _, c := range queued {
		c.queued = false
	}
	g.setQueue(tenant, nil)
	if len(g.struck) >= 1024 { // forget the strikes that ended
		for t, until := range g.struck {
			if now.After(until) {
				delete(g.struck, t)
			}
		}
	}
	g.struck[tenant] = now.Add(groupStrike)
	return queued
}

func (g *claimGroup) goAlone(batch []*groupClaim) {
	g.alone.Add(int64(len(batch)))
	for _, c := range batch {
		c.err = errAlone
		close(c.done)
	}
}

// try sends batch in one pipeline whose Sync commits it. On an error it
// returns the index of the claim whose statement raised it, or -1 if the
// error is not one a statement raises for its own rows (statementsOwn):
// the commit, the connection, a lock on a table.
func (g *claimGroup) try(batch []*groupClaim) (failed int, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), groupTimeout)
	defer cancel()
	failed = -1
	b := &pgx.Batch{}
	b.Queue(KeyLockTimeout, g.lockTimeout)
	sent := time.Now()
	for i, c := range batch {
		c.sent = sent
		b.Queue(c.sql, c.args...).QueryRow(func(row pgx.Row) error {
			err := row.Scan(&c.expiresAt, &c.took, &c.rows)
			if failed < 0 && statementsOwn(err) {
				failed = i
			}
			return err
		})
	}
	if err = g.db.SendBatch(ctx, b).Close(); err == nil {
		return -1, nil
	}
	return failed, err
}

// statementsOwn reports whether err is one a claim statement raises for
// its own rows: a unique violation (its key created an order before), or a
// lock timeout waiting for its key's row (a request in flight with it).
func statementsOwn(err error) bool {
	return postgres.HasCode(err, postgres.CodeUniqueViolation) || waitedForKey(err)
}

// ClaimGroupStats counts what the create group has done since start.
type ClaimGroupStats struct {
	Batches int64 // batches committed
	Grouped int64 // creates committed in them (their keys claimed)
	Alone   int64 // creates sent alone: their batch failed, or their tenant was struck
	Failed  int64 // batches sent that failed (each sent again without the failing tenant, or alone)
}
