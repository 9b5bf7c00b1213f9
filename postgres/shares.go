package postgres

import (
	"context"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// Shares is a DB that bounds the connections each tenant's requests hold at
// once (G9): a tenant's request past its share waits for one of that
// tenant's own statements to end, not for the pool, so another tenant's
// request finds a connection however slow the first tenant's statements are
// (a list that walks a large history, say). Without it a tenant within its
// in-flight limit (64 by default) held all of an api's 20 connections, and
// every other tenant's one-row read queued behind its slow ones.
//
// A statement counts against the tenant of its context (ForTenant); one
// without a tenant (the relay, health checks, token look-ups) is not
// counted. A request holds at most one share at a time: while it holds one
// (a transaction, rows not yet closed), its other statements use that share
// too, so no request waits on itself.
type Shares struct {
	db    DB
	share int

	mu      sync.Mutex
	tenants map[string]*tenantShare
}

type tenantShare struct {
	slots chan struct{}
	refs  int // requests holding or waiting for a slot; at 0 the entry goes
}

var _ DB = (*Shares)(nil)

// NewShares returns db with each tenant's connections bounded to share.
func NewShares(db DB, share int) (*Shares, error) {
	if share < 1 {
		return nil, fmt.Errorf("tenant share of connections must be at least 1, got %d", share)
	}
	return &Shares{db: db, share: share, tenants: map[string]*tenantShare{}}, nil
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

// acquire takes a slot of ctx's tenant (or joins the one its request holds)
// and returns its release, to be called once.
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

	s.mu.Lock()
	ts := s.tenants[t.tenant]
	if ts == nil {
		ts = &tenantShare{slots: make(chan struct{}, s.share)}
		s.tenants[t.tenant] = ts
	}
	ts.refs++
	s.mu.Unlock()

	select {
	case ts.slots <- struct{}{}:
	case <-ctx.Done():
		s.unref(t.tenant, ts)
		return nil, ctx.Err()
	}
	t.mu.Lock()
	if t.held > 0 { // the request's other statement took a slot meanwhile: join it
		t.held++
		t.mu.Unlock()
		<-ts.slots
		s.unref(t.tenant, ts)
		return s.releaser(t), nil
	}
	t.held, t.share = 1, ts
	t.mu.Unlock()
	return s.releaser(t), nil
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
			<-ts.slots
			s.unref(t.tenant, ts)
		})
	}
}

func (s *Shares) unref(tenant string, ts *tenantShare) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ts.refs--; ts.refs == 0 {
		delete(s.tenants, tenant)
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
		return len(ts.slots)
	}
	return 0
}
