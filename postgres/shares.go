package postgres

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// Shares is a DB that bounds the connections tenants' requests hold (G9),
// so that no tenant's slow statements (a list that walks a large history,
// say) keep another tenant's request from a connection:
//
//   - one tenant's requests hold at most share connections at once; its
//     request past that waits for one of the tenant's own statements to end;
//   - all tenants' requests together hold at most conns (the pool's
//     connections less what others need, such as the group commit's
//     batches), and the last conns-share of them only go to a tenant that
//     holds none: however many tenants are busy, a tenant that holds no
//     connection finds one as long as fewer than conns-share tenants hold
//     some;
//   - when a connection is given back, the waiting tenant that holds the
//     fewest gets it, so two busy tenants end up with equal halves whoever
//     came first.
//
// Without the first rule, one tenant within its in-flight limit (64 by
// default) held all of an api's 20 connections, and every other tenant's
// one-row read queued behind its slow ones; without the other two, two such
// tenants at their share of 12 took all 16 connections between them.
//
// A statement counts against the tenant of its context (ForTenant); one
// without a tenant (the relay, health checks, token look-ups) is not
// counted. A request holds at most one share at a time: while it holds one
// (a transaction, rows not yet closed), its other statements use that share
// too, so no request waits on itself.
type Shares struct {
	db    DB
	conns int // most connections all tenants' requests hold together
	share int // most connections one tenant's requests hold

	mu      sync.Mutex
	used    int                     // connections tenants' requests hold
	tenants map[string]*tenantShare // tenants holding or waiting
	waiting []*tenantShare          // tenants with requests waiting, oldest first
}

type tenantShare struct {
	name    string
	held    int
	waiters []chan struct{} // oldest first; each is sent to once when granted
}

var _ DB = (*Shares)(nil)

// NewShares returns db with tenants' connections bounded: share for each
// tenant, conns for all of them, and the last conns-share of those only for
// a tenant that holds none.
func NewShares(db DB, conns, share int) (*Shares, error) {
	if share < 1 || share > conns {
		return nil, fmt.Errorf("tenant share of connections must be 1 to the %d tenants may hold, got %d", conns, share)
	}
	return &Shares{db: db, conns: conns, share: share, tenants: map[string]*tenantShare{}}, nil
}

// ticket is one request's claim on its tenant's share; held counts the
// statements of the request that hold the claim now.
type ticket struct {
	tenant string
	mu     sync.Mutex
	held   int
	share  *tenantShare // set while held > 0
}

type ticketKey struct{}

// ForTenant returns ctx for one request of tenant: the statements run with
// it (and contexts derived from it) count against tenant's share.
func ForTenant(ctx context.Context, tenant string) context.Context {
	return context.WithValue(ctx, ticketKey{}, &ticket{tenant: tenant})
}

// acquire takes a connection's slot for ctx's tenant (or joins the one its
// request holds) and returns its release, to be called once.
func (s *Shares) acquire(ctx context.Context) (func(), error) {
	t, _ := ctx.Value(ticketKey{}).(*ticket)
	if t == nil {
		return func() {}, nil
	}
	t.mu.Lock()
	if t.held > 0 {
		t.held++
		t.mu.Unlock()
		return s.releaser(t), nil
	}
	t.mu.Unlock()

	ts, err := s.take(ctx, t.tenant)
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	if t.held > 0 { // the request's other statement took a slot meanwhile: join it
		t.held++
		t.mu.Unlock()
		s.give(ts)
		return s.releaser(t), nil
	}
	t.held, t.share = 1, ts
	t.mu.Unlock()
	return s.releaser(t), nil
}

// take takes a slot for tenant, waiting behind the tenant's earlier
// requests until one is granted or ctx ends.
func (s *Shares) take(ctx context.Context, tenant string) (*tenantShare, error) {
	s.mu.Lock()
	ts := s.tenants[tenant]
	if ts == nil {
		ts = &tenantShare{name: tenant}
		s.tenants[tenant] = ts
	}
	if len(ts.waiters) == 0 && s.may(ts) {
		ts.held++
		s.used++
		s.mu.Unlock()
		return ts, nil
	}
	granted := make(chan struct{}, 1)
	ts.waiters = append(ts.waiters, granted)
	if len(ts.waiters) == 1 {
		s.waiting = append(s.waiting, ts)
	}
	s.mu.Unlock()

	select {
	case <-granted:
		return ts, nil
	case <-ctx.Done():
	}
	s.mu.Lock()
	if i := slices.Index(ts.waiters, granted); i >= 0 {
		ts.waiters = slices.Delete(ts.waiters, i, i+1)
		if len(ts.waiters) == 0 {
			s.notWaiting(ts)
		}
		s.forget(ts)
		s.mu.Unlock()
		return nil, ctx.Err()
	}
	s.mu.Unlock()
	s.give(ts) // granted as ctx ended
	return nil, ctx.Err()
}

// may reports whether ts may take a slot now; s.mu is held.
func (s *Shares) may(ts *tenantShare) bool {
	switch {
	case ts.held >= s.share:
		return false
	case ts.held == 0:
		return s.used < s.conns
	default: // the last conns-share are only for a tenant that holds none
		return s.used < s.share
	}
}

// give gives back one of ts's slots and grants what it frees.
func (s *Shares) give(ts *tenantShare) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ts.held--
	s.used--
	s.grant()
	s.forget(ts)
}

// grant gives free slots to waiting requests, each to the oldest request
// of the waiting tenant that holds the fewest and may take one; s.mu is
// held.
func (s *Shares) grant() {
	for {
		var next *tenantShare
		for _, ts := range s.waiting {
			if s.may(ts) && (next == nil || ts.held < next.held) {
				next = ts
			}
		}
		if next == nil {
			return
		}
		granted := next.waiters[0]
		next.waiters = slices.Delete(next.waiters, 0, 1)
		if len(next.waiters) == 0 {
			s.notWaiting(next)
		}
		next.held++
		s.used++
		granted <- struct{}{}
	}
}

func (s *Shares) notWaiting(ts *tenantShare) {
	if i := slices.Index(s.waiting, ts); i >= 0 {
		s.waiting = slices.Delete(s.waiting, i, i+1)
	}
}

// forget drops ts once it holds and waits for nothing; s.mu is held.
func (s *Shares) forget(ts *tenantShare) {
	if ts.held == 0 && len(ts.waiters) == 0 {
		delete(s.tenants, ts.name)
	}
}

// releaser returns the release of one of t's statements: the last one gives
// the slot back.
func (s *Shares) releaser(t *ticket) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			t.mu.Lock()
			t.held--
			ts := t.share
			if t.held > 0 {
				t.mu.Unlock()
				return
			}
			t.share = nil
			t.mu.Unlock()
			s.give(ts)
		})
	}
}

// Begin starts a transaction that holds its tenant's slot until it ends.
func (s *Shares) Begin(ctx context.Context) (pgx.Tx, error) {
	release, err := s.acquire(ctx)
	if err != nil {
		return nil, err
	}
	tx, err := s.db.Begin(ctx)
	if err != nil {
		release()
		return nil, err
	}
	return &sharedTx{Tx: tx, release: release}, nil
}

// Exec runs sql within its tenant's share.
func (s *Shares) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	release, err := s.acquire(ctx)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	defer release()
	return s.db.Exec(ctx, sql, args...)
}

// Query runs sql within its tenant's share, held until the rows are closed
// or read to their end.
func (s *Shares) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	// Rows are never nil, as pgxpool's are not: callers may read the error
	// from them (rows, _ := db.Query(…); pgx.CollectRows(rows, …)).
	release, err := s.acquire(ctx)
	if err != nil {
		return errRows{err}, err
	}
	rows, err := s.db.Query(ctx, sql, args...)
	if err != nil {
		release()
		if rows == nil {
			rows = errRows{err}
		}
		return rows, err
	}
	return &sharedRows{Rows: rows, release: release}, nil
}

// QueryRow runs sql within its tenant's share, held until Scan.
func (s *Shares) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	release, err := s.acquire(ctx)
	if err != nil {
		return errRow{err}
	}
	return sharedRow{row: s.db.QueryRow(ctx, sql, args...), release: release}
}

// SendBatch sends b within its tenant's share, held until the results are
// closed.
func (s *Shares) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	release, err := s.acquire(ctx)
	if err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	return &sharedBatch{BatchResults: s.db.SendBatch(ctx, b), release: release}
}

type sharedTx struct {
	pgx.Tx
	release func()
}

func (t *sharedTx) Commit(ctx context.Context) error {
	defer t.release()
	return t.Tx.Commit(ctx)
}

func (t *sharedTx) Rollback(ctx context.Context) error {
	defer t.release()
	return t.Tx.Rollback(ctx)
}

type sharedRows struct {
	pgx.Rows
	release func()
}

func (r *sharedRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.release() // pgx closed the rows at their end
	return false
}

func (r *sharedRows) Close() {
	r.Rows.Close()
	r.release()
}

type sharedRow struct {
	row     pgx.Row
	release func()
}

func (r sharedRow) Scan(dest ...any) error {
	defer r.release()
	return r.row.Scan(dest...)
}

type sharedBatch struct {
	pgx.BatchResults
	release func()
}

func (b *sharedBatch) Close() error {
	defer b.release()
	return b.BatchResults.Close()
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// errRows are the rows of a statement that never ran.
type errRows struct{ err error }

func (r errRows) Close()                                       {}
func (r errRows) Err() error                                   { return r.err }
func (r errRows) CommandTag() pgconn.CommandTag                { return pgconn.CommandTag{} }
func (r errRows) FieldDescriptions() []pgconn.FieldDescription { return nil }
func (r errRows) Next() bool                                   { return false }
func (r errRows) Scan(...any) error                            { return r.err }
func (r errRows) Values() ([]any, error)                       { return nil, r.err }
func (r errRows) RawValues() [][]byte                          { return nil }
func (r errRows) Conn() *pgx.Conn                              { return nil }
func (r errRows) TypeMap() *pgtype.Map                         { return nil }

// Held reports how many of tenant's slots are held now (for tests and
// metrics).
func (s *Shares) Held(tenant string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ts := s.tenants[tenant]; ts != nil {
		return ts.held
	}
	return 0
}

// Waiting reports how many of tenant's statements wait for a slot now (for
// tests and metrics).
func (s *Shares) Waiting(tenant string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ts := s.tenants[tenant]; ts != nil {
		return len(ts.waiters)
	}
	return 0
}
