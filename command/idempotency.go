package command

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/acme/orders/domain"
	"github.com/acme/orders/postgres"
	"github.com/acme/orders/tracing"
)

// FingerprintVersion names the canonical form that fingerprints are computed
// from. It is stored with every key; a key is only compared with a request
// fingerprinted the same way, so changing the canonical form (and bumping this)
// never turns an honest retry of an old key into a mismatch.
//
// Version 2: pay, ship and cancel carry expected_version (If-Match) when the
// client sends one; version 1 ignored their If-Match, so a key it stored
// lacks the field, and its request ran on whatever version (see replay).
const FingerprintVersion = 2

// KeyedRequest is one execution of an unsafe request under an Idempotency-Key.
type KeyedRequest struct {
	TenantID string
	// Scope is the method and route template, e.g. "POST /v1/orders". A
	// key names one request of its tenant: the same key on another route is
	// refused (a *MismatchError naming the route it was first used on).
	Scope string
	Key   string
	// Command is the validated command. Its JSON encoding is the canonical form
	// of the request: field order and whitespace of the client's body do not
	// matter, and unknown fields were refused before.
	Command any
}

// Response is the outcome of an executed command as it is stored and replayed.
type Response struct {
	Status int
	Header map[string]string
	Body   []byte
	// Unstored sends the response without storing it under the key (the
	// transaction rolls back, the key stays free): for a refusal by a state
	// that passes, so that a retry with the same key runs again instead of
	// replaying "retry later" for the key's lifetime.
	Unstored bool
}

// Result is what Do returns: the response, whether it is a replay of an
// earlier execution, and when the key expires (by the database clock).
type Result struct {
	Response
	Replayed  bool
	ExpiresAt time.Time
}

// MismatchError is returned by Do when the key was first used with a
// different request: on another route (FirstUsedFor names it), or on the
// same route with another command (Fields names the top-level fields that
// differ, empty if the difference could not be pinned down).
type MismatchError struct {
	FirstUsedFor string // the scope the key was first used on, if not this request's
	Fields       []string
}

func (e *MismatchError) Error() string {
	if e.FirstUsedFor != "" {
		return fmt.Sprintf("idempotency key reused on another route (first used for %s)", e.FirstUsedFor)
	}
	return fmt.Sprintf("idempotency key reused with a different request (fields %v)", e.Fields)
}

// ErrInFlight is returned by Do when another request with the same key is
// still executing and did not finish within the wait bound, and also when
// the key's claim timed out twice on another lock (claimStallAttempts).
// Retrying later with the same key is safe.
var ErrInFlight = errors.New("a request with this idempotency key is still in flight")

// ErrKeyQuotaExceeded is matched (errors.Is) by the *KeyQuotaError that Do
// returns when the request would store a new key and its tenant already has
// as many keys, or as many bytes of keys, stored as IdempotencyConfig's
// KeyQuota or KeyQuotaBytes allows. Nothing was executed or stored; a retry
// of a key that is stored still replays.
var ErrKeyQuotaExceeded = errors.New("idempotency key quota exceeded")

// KeyQuotaError is the error Do returns past a tenant's key quota.
type KeyQuotaError struct {
	Quota      int   // keys a tenant may have stored
	QuotaBytes int64 // bytes of keys a tenant may have stored (storedBytes)
	// RetryAfter is when this process counts the tenant's keys again: the
	// earliest moment expired and deleted keys can make room.
	RetryAfter time.Duration
}

func (e *KeyQuotaError) Error() string {
	return fmt.Sprintf("%v: the tenant has %d keys or %d bytes of keys stored", ErrKeyQuotaExceeded, e.Quota, e.QuotaBytes)
}

// Is makes errors.Is(err, ErrKeyQuotaExceeded) hold.
func (e *KeyQuotaError) Is(target error) bool { return target == ErrKeyQuotaExceeded }

// Executor runs a command inside the key's transaction and renders its
// outcome. It returns an error only for failures that must not be stored (the
// transaction is rolled back and the key left free for a retry). A refusal it
// renders as a 4xx Response is stored and replayed, so it must decide to
// refuse before it writes anything; except a 404 (what the request names does
// not exist), which is sent but not stored: its transaction rolls back, and
// a retry, which finds the same nothing, gets the same answer.
type Executor func(ctx context.Context, tx pgx.Tx) (Response, error)

// A Preclaim runs a command whose response is known before it runs and
// whose writes fit in the statement that claims the key: a create, which
// mints its order's id and writes rows nobody else has. DoPreclaimed sends
// that statement in a pipeline whose one Sync commits it: it inserts the key
// row with the response already in it and, only if that insert claimed the
// key, writes the command's rows. A create so costs one round trip, where
// BEGIN, the claim, the command, storing the response (KeyComplete) and
// COMMIT cost five. With the group on (GroupSlots), concurrent creates'
// statements share that pipeline and its commit (claimGroup); a statement
// that fails its group's transaction is sent again alone, as a transaction
// of its own. If the key is stored (a retry, or a request that held it
// and ended), the statement writes nothing and the stored row, read in one
// statement, is replayed or refused (a mismatch). If that row expired or
// went in between, or the command's writes meet a conflict of their own,
// or the statement timed out on a lock other than the key's, nothing of it
// is written and DoPreclaimed goes on as Do with Otherwise.
type Preclaim struct {
	// Response is what the command answers when its writes go through;
	// stored with the key. It must be storable: 2xx to 4xx, not 404, not
	// 429, not Unstored.
	Response Response
	// SQL is the claim statement, a KeyInsertCTE named k followed by the
	// command's writes, each conditional on a row in k, and returning three
	// columns: k's expires_at and took (NULL if the key was not claimed) and
	// the number of rows the command wrote (more than 0 if it claimed the
	// key). Writes that meet a conflict of their own must raise (a unique
	// violation, say), never skip: the transaction commits as the statement
	// ends (with its group's), and a key row must never commit without them. Its parameters $1 to $11 are
	// the key's, as KeyInsertCTE names them; Args returns $12 on, given the
	// context of the command's span (so that trace context it writes names
	// the command).
	SQL  string
	Args func(ctx context.Context) []any
	// Otherwise is the command as an Executor, run as Do runs one when the
	// statement did not claim the key or raised a conflict: it writes the
	// command's rows itself, or renders the refusal (a create whose key
	// created an order before: the order's key outlives the key row).
	Otherwise Executor
}

// Idempotency runs commands at most once per (tenant, key) and replays
// the stored response to every retry. It is safe for any number of concurrent
// callers in any number of processes sharing the database.
type Idempotency struct {
	db          postgres.DB
	ttl         time.Duration
	quota       *keyQuota
	waitSeconds Observer    // nil: not observed
	afterCommit func()      // nil: none
	group       *claimGroup // nil: each create commits alone

	created, replays, mismatches, waits, waitTimeouts atomic.Int64
}

// IdempotencyStats counts what Do has done since start.
type IdempotencyStats struct {
	Created      int64 // keys claimed and committed with a response
	Replays      int64 // stored responses replayed
	Mismatches   int64 // keys refused for a different request
	Waits        int64 // requests held up (≥ waitThreshold) by an in-flight request with their key
	WaitTimeouts int64 // requests that gave up waiting (ErrInFlight)
}

// Stats returns the counters.
func (s *Idempotency) Stats() IdempotencyStats {
	return IdempotencyStats{
		Created: s.created.Load(), Replays: s.replays.Load(), Mismatches: s.mismatches.Load(),
		Waits: s.waits.Load(), WaitTimeouts: s.waitTimeouts.Load(),
	}
}

// waitThreshold: a claim that found the key taken and took at least this
// long was waiting for the transaction that held it.
const waitThreshold = 5 * time.Millisecond

// Defaults of IdempotencyConfig.
const (
	// DefaultKeyTTL is how long a key is remembered after its first use.
	DefaultKeyTTL = 24 * time.Hour
	// DefaultKeyQuota is how many keys one tenant may have stored at once:
	// about 11 new keys per second, sustained over DefaultKeyTTL (≈ 700 MB
	// of key rows at the ≈ 700 bytes a create's key takes).
	DefaultKeyQuota = 1_000_000
	// DefaultKeyQuotaBytes is how many bytes of keys (storedBytes: request
	// and response) one tenant may have stored at once: DefaultKeyQuota
	// keys of about 1 KiB. Without it a tenant whose every key stores a
	// 100-item order (≈ 19 KB) could store 19 GB.
	DefaultKeyQuotaBytes = 1 << 30
	// DefaultKeyQuotaRefresh is how often a process recounts a tenant's
	// stored keys (to see keys other replicas stored and keys that expired).
	DefaultKeyQuotaRefresh = 10 * time.Second
)

// IdempotencyConfig configures an Idempotency. A zero field takes its default.
type IdempotencyConfig struct {
	// TTL is how long a key is remembered after its first use, by the
	// database clock; at least a second. Default DefaultKeyTTL.
	TTL time.Duration
	// KeyQuota is how many keys one tenant may have stored (expired keys
	// count until the janitor removes them). A request that would store one
	// more gets ErrKeyQuotaExceeded; a retry of a stored key still replays.
	// Default DefaultKeyQuota.
	KeyQuota int
	// KeyQuotaBytes is how many bytes of keys one tenant may have stored:
	// what each key's row keeps of its request and response. A request
	// that would store a key past it gets ErrKeyQuotaExceeded, as past
	// KeyQuota. Default DefaultKeyQuotaBytes.
	KeyQuotaBytes int64
	// KeyQuotaRefresh is how often each process recounts a tenant's stored
	// keys; between counts it adds the keys it stored itself, so other
	// replicas can overshoot the quota by what they store in one interval.
	// Default DefaultKeyQuotaRefresh.
	KeyQuotaRefresh time.Duration
	// WaitSeconds, if set, observes how long each request held up by an
	// in-flight request with its key waited, in seconds (those that timed
	// out included).
	WaitSeconds Observer
	// AfterCommit, if set, is called after every transaction that executed
	// a command and committed (not after a replay or a rollback), outside
	// it: the api wakes its outbox relay with it, so that no NOTIFY runs
	// inside the write transaction. It must not block.
	AfterCommit func()
	// GroupSlots, if above 0, commits the claim statements of concurrent
	// creates together (claimGroup): at most GroupSlots batches in flight,
	// each of at most GroupMaxBatch creates (default DefaultGroupMaxBatch).
	// 0: each create commits in a transaction of its own.
	GroupSlots    int
	GroupMaxBatch int
}

// DefaultGroupMaxBatch is how many creates one group commit takes at most.
const DefaultGroupMaxBatch = 64

// Observer takes one observation, such as a prometheus.Histogram.
type Observer interface{ Observe(float64) }

func (c *IdempotencyConfig) validate() error {
	if c.TTL == 0 {
		c.TTL = DefaultKeyTTL
	}
	if c.KeyQuota == 0 {
		c.KeyQuota = DefaultKeyQuota
	}
	if c.KeyQuotaBytes == 0 {
		c.KeyQuotaBytes = DefaultKeyQuotaBytes
	}
	if c.KeyQuotaRefresh == 0 {
		c.KeyQuotaRefresh = DefaultKeyQuotaRefresh
	}
	if c.GroupMaxBatch == 0 {
		c.GroupMaxBatch = DefaultGroupMaxBatch
	}
	switch {
	case c.TTL < time.Second:
		return fmt.Errorf("idempotency config: TTL must be at least 1s, got %s", c.TTL)
	case c.KeyQuota < 1:
		return fmt.Errorf("idempotency config: KeyQuota must be at least 1, got %d", c.KeyQuota)
	case c.KeyQuotaBytes < 1:
		return fmt.Errorf("idempotency config: KeyQuotaBytes must be at least 1, got %d", c.KeyQuotaBytes)
	case c.GroupSlots < 0:
		return fmt.Errorf("idempotency config: GroupSlots must be 0 (off) or more, got %d", c.GroupSlots)
	case c.GroupMaxBatch < 1 || c.GroupMaxBatch > 1000:
		return fmt.Errorf("idempotency config: GroupMaxBatch must be 1 to 1000, got %d", c.GroupMaxBatch)
	case c.KeyQuotaRefresh < 10*time.Millisecond:
		return fmt.Errorf("idempotency config: KeyQuotaRefresh must be at least 10ms, got %s", c.KeyQuotaRefresh)
	}
	return nil
}

// NewIdempotency returns an Idempotency configured by cfg, or an error that
// names the invalid field.
func NewIdempotency(db postgres.DB, cfg IdempotencyConfig) (*Idempotency, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	s := &Idempotency{db: db, ttl: cfg.TTL, quota: newKeyQuota(db, cfg.KeyQuota, cfg.KeyQuotaBytes, cfg.KeyQuotaRefresh), waitSeconds: cfg.WaitSeconds,
		afterCommit: cfg.AfterCommit}
	if cfg.GroupSlots > 0 {
		s.group = newClaimGroup(db, cfg.GroupSlots, cfg.GroupMaxBatch)
	}
	return s, nil
}

// GroupStats counts what the create group has done (zero if it is off).
func (s *Idempotency) GroupStats() ClaimGroupStats {
	if s.group == nil {
		return ClaimGroupStats{}
	}
	return ClaimGroupStats{Batches: s.group.batches.Load(), Grouped: s.group.grouped.Load(), Alone: s.group.alone.Load(),
		Failed: s.group.failed.Load()}
}

// Do executes exec once for req, in one transaction with the key row, and
// stores its response; or, if the key was used before with the same request,
// returns the stored response with Replayed set. A 404 response is returned
// without being stored (its ExpiresAt is zero). If a transaction holding the
// same key is in flight, Do waits up to wait for it to end (then replays its
// result, or executes if it rolled back), and returns ErrInFlight after that
// (after at most twice the bound if the claim also stalled on another lock;
// see claimStallAttempts).
// It returns a *MismatchError if the key was used with another request, and
// a *KeyQuotaError (ErrKeyQuotaExceeded) if it would store a new key for a
// tenant at its quota; at the quota a key still in flight is waited for
// like any duplicate, then replayed.
func (s *Idempotency) Do(ctx context.Context, req KeyedRequest, wait time.Duration, exec Executor) (Result, error) {
	return s.do(ctx, req, wait, exec, nil)
}

// DoPreclaimed is Do for a command that writes in its key's claim (see
// Preclaim): the same guarantees, in one round trip where no other request
// used the key.
func (s *Idempotency) DoPreclaimed(ctx context.Context, req KeyedRequest, wait time.Duration, pre Preclaim) (Result, error) {
	if r := pre.Response; neverStored(r) || sentNotStored(r) {
		return Result{}, fmt.Errorf("preclaimed response with status %d (unstored %v) cannot be stored", r.Status, r.Unstored)
	}
	return s.do(ctx, req, wait, pre.Otherwise, &pre)
}

// do is Do, or DoPreclaimed when pre is set (exec is then pre.Otherwise).
func (s *Idempotency) do(ctx context.Context, req KeyedRequest, wait time.Duration, exec Executor, pre *Preclaim) (Result, error) {
	canonical, err := canonicalJSON(req.Command)
	if err != nil {
		return Result{}, fmt.Errorf("canonical form of %s: %w", req.Scope, err)
	}
	fp := fingerprint(req.Scope, canonical)

	reserved, err := s.quota.reserve(ctx, req.TenantID)
	if err != nil {
		return Result{}, err
	}
	// Deferred, so that a panicking executor gives its reservation back too.
	keyStored, keyBytes := false, int64(0)
	if reserved {
		defer func() { s.quota.end(req.TenantID, keyStored, keyBytes) }()
	}

	var res Result
	var outcome outcomes
	ctx, span := tracing.StartChild(ctx, "command "+req.Scope)
	defer span.End()
	done := false
	if pre != nil && reserved {
		// At the quota a claimed key is refused anyway: there the key is
		// claimed alone, below, not with the command's writes.
		done, err = s.preclaim(ctx, req, fp, canonical, wait, *pre, &res, &outcome)
	}
	if !done && err == nil {
		// A claim that timed out on a lock other than the key's (the
		// table's extension under I/O pressure, DDL) is tried again: most
		// likely no request holds this key. Past claimStallAttempts the
		// caller gets ErrInFlight after all, a 409 with Retry-After that
		// clients retry.
		for attempt := 1; ; attempt++ {
			err = s.inTx(ctx, req, fp, canonical, wait, reserved, exec, &res, &outcome)
			if !errors.Is(err, errClaimStalled) {
				break
			}
			if attempt == claimStallAttempts {
				outcome |= outcomeWaitTimeout
				err = fmt.Errorf("%w (%w)", ErrInFlight, err)
				break
			}
		}
	}
	if errors.Is(err, errUnstored) {
		err = nil
	}
	tracing.Fail(span, err)
	keyStored = outcome&outcomeCreated != 0 && err == nil
	if keyStored {
		keyBytes = storedBytes(canonical, res.Response)
	}
	if keyStored && s.afterCommit != nil {
		s.afterCommit()
	}
	s.count(outcome, err)
	if err != nil {
		return Result{}, err
	}
	return res, nil
}

// preclaim sends pre's statement with its group's (if the group is on and
// takes it) or as a transaction of its own (see Preclaim), and sets res if
// it claimed the key, or replays (or refuses) the stored key it found.
// done is false, with nothing written, if the key it found expired or went
// since, or the statement raised a conflict of the command's own or a
// serialization failure: the caller then goes Do's way.
// The wait bound (lock_timeout) holds for the whole transaction, the
// command's writes included: a lock timeout on anything but the key (its
// tables' extension, DDL) also leaves nothing written and goes Do's way,
// where only the claim is bounded. took is the
// key's insert as the database timed it, without the command's writes.
func (s *Idempotency) preclaim(ctx context.Context, req KeyedRequest, fp, canonical []byte, wait time.Duration, pre Preclaim, res *Result, outcome *outcomes) (done bool, err error) {
	r := pre.Response
	args := append([]any{req.TenantID, req.Scope, req.Key, fp, FingerprintVersion, canonical, s.ttl.Seconds(),
		r.Status, r.Header, r.Body, storedBytes(canonical, r)}, pre.Args(ctx)...)
	var expiresAt *time.Time
	var keyTook *float64
	var rows int64
	start := time.Now()
	grouped := false
	if s.group != nil {
		c := &groupClaim{tenant: req.TenantID, key: req.Key, sql: pre.SQL, args: args}
		if err := s.group.claim(ctx, c); err != nil {
			return false, err
		}
		if grouped = c.err == nil; grouped {
			expiresAt, keyTook, rows = c.expiresAt, c.took, c.rows
			if keyTook == nil { // the key existed: the batch's round trip is no wait for it
				keyTook = new(float64)
			}
		}
	}
	if !grouped { // alone: in a transaction of its own, with the request's wait bound
		start = time.Now() // not the time it spent in the group
		b := &pgx.Batch{}
		b.Queue(KeyLockTimeout, lockTimeout(wait)) // local: it ends with the batch's transaction
		b.Queue(pre.SQL, args...).QueryRow(func(row pgx.Row) error { return row.Scan(&expiresAt, &keyTook, &rows) })
		err = s.db.SendBatch(ctx, b).Close()
	}
	took := time.Since(start)
	if err == nil && keyTook != nil {
		took = time.Duration(*keyTook * float64(time.Second))
	}
	timedOut := waitedForKey(err)
	if err == nil || timedOut { // a stall on another lock is no wait for the key
		s.observeWait(took, timedOut, outcome)
	}
	switch {
	case timedOut:
		*outcome |= outcomeWaitTimeout
		return false, ErrInFlight
	case postgres.HasCode(err, postgres.CodeUniqueViolation) || postgres.Retryable(err) ||
		postgres.HasCode(err, postgres.CodeLockNotAvailable): // a lock other than the key's: go Do's way
		return false, nil
	case err != nil:
		return false, fmt.Errorf("claim idempotency key: %w", err)
	case expiresAt == nil:
		// The key is stored: the claim waited for any request holding it
		// (and a batch never holds one key twice), so its row is committed,
		// complete, and read here after the claim's own commit; a committed
		// key row does not change until it expires. A retry of a create (the common duplicate) so
		// reads it in one statement outside a transaction and replays,
		// where the keyed transaction took four round trips; a row that
		// expired or went in between goes Do's way.
		k, found, err := s.stored(ctx, s.db, req)
		if err != nil || !found || k.expired {
			return false, err
		}
		return true, s.replay(k, req, fp, canonical, res, outcome)
	case rows == 0:
		// Committed already: a claim statement that skips its writes breaks
		// Preclaim's contract, and its key row now holds a response for
		// writes that never happened.
		return false, fmt.Errorf("claim statement of %s committed its key and no writes (see Preclaim.SQL)", req.Scope)
	}
	*res = Result{Response: pre.Response, ExpiresAt: *expiresAt}
	*outcome |= outcomeCreated
	return true, nil
}

// observeWait counts a key's claim that waited for another request holding
// the key (took at least waitThreshold, or timed out), once per request: a
// preclaim that waited and then went Do's way is one wait, and one
// observation, however long its second claim took.
func (s *Idempotency) observeWait(took time.Duration, timedOut bool, outcome *outcomes) {
	if (took >= waitThreshold || timedOut) && *outcome&outcomeWaited == 0 {
		*outcome |= outcomeWaited
		if s.waitSeconds != nil {
			s.waitSeconds.Observe(took.Seconds())
		}
	}
}

// inTx is Do's transaction: it claims the key, runs exec and stores its
// response, or replays or refuses what the key stored.
func (s *Idempotency) inTx(ctx context.Context, req KeyedRequest, fp, canonical []byte, wait time.Duration, reserved bool, exec Executor, res *Result, outcome *outcomes) error {
	before := *outcome // what a preclaim counted; each attempt starts from it
	return postgres.InTx(ctx, s.db, func(tx pgx.Tx) error {
		*res, *outcome = Result{}, before
		// A key row found expired (the janitor has not removed it yet) is
		// deleted and claimed anew; twice is enough for any race with it.
		for range 3 {
			if !reserved {
				// At the quota: only a retry of a stored key gets an answer.
				k, found, err := s.stored(ctx, tx, req)
				if err != nil {
					return err
				}
				if found && !k.expired {
					return s.replay(k, req, fp, canonical, res, outcome)
				}
				if found {
					return s.quota.refusal()
				}
				// Not committed: it may be in flight. The claim below waits
				// for it like any duplicate; if it claims, the key is new
				// and is refused (the rollback stores nothing).
			}
			claimed, expiresAt, took, err := s.claim(ctx, tx, req, fp, canonical, wait)
			timedOut := waitedForKey(err)
			if err == nil || timedOut { // a stall on another lock is no wait for the key
				s.observeWait(took, timedOut, outcome)
			}
			switch {
			case timedOut:
				*outcome |= outcomeWaitTimeout
				return ErrInFlight
			case postgres.HasCode(err, postgres.CodeLockNotAvailable):
				return fmt.Errorf("%w: %w", errClaimStalled, err)
			case err != nil:
				return fmt.Errorf("claim idempotency key: %w", err)
			case claimed && !reserved:
				return s.quota.refusal()
			case claimed:
				resp, err := exec(ctx, tx)
				if err != nil {
					return err
				}
				if neverStored(resp) {
					return fmt.Errorf("executor returned status %d, which is never stored", resp.Status)
				}
				if sentNotStored(resp) {
					// Nothing it names exists, or it was refused for now:
					// nothing was touched, and a retry runs again.
					*res = Result{Response: resp}
					return errUnstored
				}
				if _, err := tx.Exec(ctx, KeyComplete, req.TenantID, req.Scope, req.Key, resp.Status, resp.Header, resp.Body,
					storedBytes(canonical, resp)); err != nil {
					return fmt.Errorf("store response: %w", err)
				}
				*res = Result{Response: resp, ExpiresAt: expiresAt}
				*outcome |= outcomeCreated
				return nil
			}

			// The key exists and its transaction has ended: replay or refuse.
			k, found, err := s.stored(ctx, tx, req)
			if err != nil {
				return err
			}
			if !found {
				continue // deleted by the janitor in between: claim it
			}
			if k.expired {
				took, err := s.deleteExpired(ctx, tx, req, wait)
				if postgres.HasCode(err, postgres.CodeLockNotAvailable) {
					// Another retry of the expired key deleted it and runs:
					// a duplicate in flight, waited for as long as a claim.
					// (Any lock it timed out on is the key row's, the one
					// row it touches; a third waiter's queue on the row's
					// tuple lock names no relation, so waitedForKey would
					// miss it.)
					s.observeWait(took, true, outcome)
					*outcome |= outcomeWaitTimeout
					return ErrInFlight
				}
				if err != nil {
					return fmt.Errorf("delete expired idempotency key: %w", err)
				}
				continue
			}
			return s.replay(k, req, fp, canonical, res, outcome)
		}
		return fmt.Errorf("idempotency key %q kept changing under us", req.Key)
	})
}

// neverStored reports whether r is a response no executor may return: not
// a 2xx to 4xx, or a 429 (a limit that passes).
func neverStored(r Response) bool {
	return r.Status < 200 || r.Status >= 500 || r.Status == http.StatusTooManyRequests
}

// sentNotStored reports whether r is sent but not stored under its key: a
// 404 (nothing it names exists) or a refusal for now (Unstored).
func sentNotStored(r Response) bool { return r.Status == http.StatusNotFound || r.Unstored }

// errUnstored rolls back the transaction of a response that is sent but not
// stored.
var errUnstored = errors.New("response not stored")

// stored reads the key's stored row; found is false if there is none.
func (s *Idempotency) stored(ctx context.Context, tx queryRower, req KeyedRequest) (k storedKey, found bool, err error) {
	err = tx.QueryRow(ctx, keyGet, req.TenantID, req.Key).Scan(
		&k.scope, &k.fingerprint, &k.fingerprintVersion, &k.request, &k.status, &k.header, &k.body, &k.expiresAt, &k.expired)
	if errors.Is(err, pgx.ErrNoRows) {
		return k, false, nil
	}
	if err != nil {
		return k, false, fmt.Errorf("read idempotency key: %w", err)
	}
	return k, true, nil
}

// replay sets res to the stored response of k if the request is the one k
// was stored for, and returns a *MismatchError if it is not.
func (s *Idempotency) replay(k storedKey, req KeyedRequest, fp, canonical []byte, res *Result, outcome *outcomes) error {
	if k.scope != req.Scope {
		*outcome |= outcomeMismatch
		return &MismatchError{FirstUsedFor: k.scope}
	}
	same := bytes.Equal(k.fingerprint, fp)
	var differ []string
	if !same || k.fingerprintVersion != FingerprintVersion {
		differ = differingFields(k.request, canonical)
	}
	if k.fingerprintVersion != FingerprintVersion {
		// Written by a release with another canonical form: the stored
		// fingerprint cannot be compared, the stored request can.
		if k.fingerprintVersion < 2 && !hasField(k.request, "expected_version") {
			// Its If-Match was ignored, and the request ran on any
			// version: the same request, whatever If-Match says now.
			differ = slices.DeleteFunc(differ, func(f string) bool { return f == "expected_version" })
		}
		if !hasField(k.request, "payment_method") && topLevel(canonical)["payment_method"] == domain.DefaultPaymentMethod {
			// A pay stored before it named a payment method: it ran as
			// one without a method runs now, with the default.
			differ = slices.DeleteFunc(differ, func(f string) bool { return f == "payment_method" })
		}
		same = len(differ) == 0
	}
	if !same {
		*outcome |= outcomeMismatch
		return &MismatchError{Fields: differ}
	}
	*res = Result{
		Response:  Response{Status: k.status, Header: k.header, Body: k.body},
		Replayed:  true,
		ExpiresAt: k.expiresAt,
	}
	*outcome |= outcomeReplay
	return nil
}

// outcomes of one Do, for the counters; set inside the transaction and
// counted only once it has ended, so a retried transaction counts once.
type outcomes uint8

const (
	outcomeCreated outcomes = 1 << iota
	outcomeReplay
	outcomeMismatch
	outcomeWaited
	outcomeWaitTimeout
)

func (s *Idempotency) count(o outcomes, err error) {
	if o&outcomeCreated != 0 && err == nil {
		s.created.Add(1)
	}
	if o&outcomeReplay != 0 && err == nil {
		s.replays.Add(1)
	}
	if o&outcomeMismatch != 0 {
		s.mismatches.Add(1)
	}
	if o&(outcomeWaited|outcomeWaitTimeout) != 0 {
		s.waits.Add(1)
	}
	if o&outcomeWaitTimeout != 0 {
		s.waitTimeouts.Add(1)
	}
}

// KeyRecord is what is stored for a key in one scope, for reconciliation.
type KeyRecord struct {
	Scope     string
	Expired   bool // past expires_at, not yet removed by the janitor
	Status    int
	Header    map[string]string
	CreatedAt time.Time
	ExpiresAt time.Time
}

const keyLookupSQL = `
SELECT scope, expires_at <= now(), status_code, response_headers, created_at, expires_at
FROM idempotency_keys
WHERE tenant_id = $1 AND key = $2
ORDER BY scope`

// Lookup returns what is stored for key in every scope of the tenant, or a
// KindNotFound *domain.Error. A key whose first request is still executing
// is not visible until that request commits.
func (s *Idempotency) Lookup(ctx context.Context, tenantID, key string) ([]KeyRecord, error) {
	rows, _ := s.db.Query(ctx, keyLookupSQL, tenantID, key)
	records, err := pgx.CollectRows(rows, pgx.RowToStructByPos[KeyRecord])
	if err != nil {
		return nil, fmt.Errorf("look up idempotency key: %w", err)
	}
	if len(records) == 0 {
		return nil, domain.Errorf(domain.KindNotFound, "no idempotency key %q is stored for this tenant: it was never used, it expired, or its first request is still running; to learn a request's outcome, send the request again with the same key", key)
	}
	return records, nil
}

const keyDeleteExpiredBatchSQL = `
DELETE FROM idempotency_keys
WHERE (tenant_id, key) IN (
    SELECT tenant_id, key FROM idempotency_keys
    WHERE expires_at <= now()
    ORDER BY expires_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED)`

// DeleteExpired removes up to batch expired keys in one short transaction
// and returns how many it removed. Rows another replica is deleting at the
// same moment are skipped, so any number of replicas may run it.
func (s *Idempotency) DeleteExpired(ctx context.Context, batch int) (int64, error) {
	tag, err := s.db.Exec(ctx, keyDeleteExpiredBatchSQL, batch)
	if err != nil {
		return 0, fmt.Errorf("delete expired idempotency keys: %w", err)
	}
	return tag.RowsAffected(), nil
}

// claim inserts the key row (without a response yet) in tx, in one round
// trip: lock_timeout set to the wait bound for this statement only (so that
// nothing else in the transaction, COMMIT included, can time out on it), the
// insert, and the reset. claimed reports whether the row is now this
// transaction's; if not, a committed request holds the key. took is how long
// the insert took on the server: at least waitThreshold, it was held up by
// another transaction. A wait past the bound is an error with SQLSTATE 55P03.
// (The bound starts with the batch's first statement: the first Parse of
// the insert on a connection takes the table's lock before it, and waits
// for a table lock, DDL's, unbounded.)
func (s *Idempotency) claim(ctx context.Context, tx pgx.Tx, req KeyedRequest, fp, canonical []byte, wait time.Duration) (claimed bool, expiresAt time.Time, took time.Duration, err error) {
	b := &pgx.Batch{}
	b.Queue(KeyLockTimeout, lockTimeout(wait))
	var serverTook float64
	b.Queue(KeyInsert, req.TenantID, req.Scope, req.Key, fp, FingerprintVersion, canonical, s.ttl.Seconds(),
		storedBytes(canonical, Response{})).
		QueryRow(func(row pgx.Row) error {
			var exp *time.Time
			if err := row.Scan(&exp, &serverTook); err != nil {
				return err
			}
			if claimed = exp != nil; claimed {
				expiresAt = *exp
			}
			return nil
		})
	b.Queue(KeyLockTimeoutReset)
	start := time.Now()
	err = tx.SendBatch(ctx, b).Close()
	if err != nil {
		return false, time.Time{}, time.Since(start), err // timed out: waited the whole bound
	}
	// Timed by the server: the round trip to it is no wait for the key
	// (a database 3 ms away made every claim count as one).
	return claimed, expiresAt, time.Duration(serverTook * float64(time.Second)), nil
}

// deleteExpired deletes the key's row found expired, under the same wait
// bound as a claim: a concurrent retry of the expired key may have deleted
// it and claimed it anew, and its whole execution holds the row (without
// the bound, this request waited for all of it, past its own bound).
func (s *Idempotency) deleteExpired(ctx context.Context, tx pgx.Tx, req KeyedRequest, wait time.Duration) (took time.Duration, err error) {
	b := &pgx.Batch{}
	b.Queue(KeyLockTimeout, lockTimeout(wait))
	b.Queue(keyDeleteExpired, req.TenantID, req.Key)
	b.Queue(KeyLockTimeoutReset)
	start := time.Now()
	err = tx.SendBatch(ctx, b).Close()
	return time.Since(start), err
}

// queryRower is a transaction, or the pool for a statement of its own.
type queryRower interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

type storedKey struct {
	scope              string // the route the key was first used on
	fingerprint        []byte
	fingerprintVersion int16
	request            []byte
	status             int
	header             map[string]string
	body               []byte
	expiresAt          time.Time
	expired            bool
}

// The idempotency store's SQL (internal/bench renders it into the create
// ceiling's pgbench script).
const (
	// KeyLockTimeout bounds the wait for a key held by an in-flight request.
	KeyLockTimeout      = `SELECT set_config('lock_timeout', $1, true)`
	KeyLockTimeoutReset = `SET LOCAL lock_timeout TO DEFAULT`

	// KeyInsert claims the key. If a concurrent transaction holds an
	// uncommitted row for it, this waits on the unique index (bounded by
	// lock_timeout) and then inserts (that transaction rolled back) or returns
	// no row (it committed).
	KeyInsert = `
WITH k AS (
    INSERT INTO idempotency_keys (tenant_id, scope, key, fingerprint, fingerprint_version, request, expires_at, stored_bytes)
    VALUES ($1, $2, $3, $4, $5, $6, now() + make_interval(secs => $7), $8)
    ON CONFLICT (tenant_id, key) DO NOTHING
    RETURNING expires_at
)
SELECT k.expires_at, extract(epoch FROM clock_timestamp() - statement_timestamp())
FROM (SELECT) AS one LEFT JOIN k ON true`

	// KeyInsertCTE claims the key as KeyInsert does, with the response
	// already in the row ($8 status, $9 headers, $10 body, $11 the row's
	// stored bytes, storedBytes): the first CTE
	// (k) of a Preclaim's statement, whose writes go on only if it returns
	// a row. took is the seconds from the statement's start to the key's row
	// inserted (the other CTEs read k before they write): the wait for a
	// request in flight with the key, if any.
	KeyInsertCTE = `k AS (
    INSERT INTO idempotency_keys (tenant_id, scope, key, fingerprint, fingerprint_version, request, expires_at,
                                  status_code, response_headers, response_body, stored_bytes)
    VALUES ($1, $2, $3, $4, $5, $6, now() + make_interval(secs => $7), $8, $9, $10, $11)
    ON CONFLICT (tenant_id, key) DO NOTHING
    RETURNING expires_at, extract(epoch FROM clock_timestamp() - statement_timestamp()) AS took
)`

	// KeyComplete stores the response of a key's execution, and the row's
	// stored bytes with it ($7, storedBytes).
	KeyComplete = `
UPDATE idempotency_keys
SET status_code = $4, response_headers = $5, response_body = $6, stored_bytes = $7
WHERE tenant_id = $1 AND scope = $2 AND key = $3`

	keyGet = `
SELECT scope, fingerprint, fingerprint_version, request, status_code, response_headers, response_body,
       expires_at, expires_at <= now()
FROM idempotency_keys
WHERE tenant_id = $1 AND key = $2`

	keyDeleteExpired = `
DELETE FROM idempotency_keys
WHERE tenant_id = $1 AND key = $2 AND expires_at <= now()`
)

// minKeyWait is the shortest wait bound, even for Prefer: wait=0: short
// enough to answer at once, long enough that brief internal locks (such as
// extending the table) rarely time a claim out (one that does is tried
// again: waitedForKey).
const minKeyWait = 50 * time.Millisecond

// lockTimeout renders a wait bound for lock_timeout (where 0 would mean
// "wait forever").
func lockTimeout(wait time.Duration) string {
	return fmt.Sprintf("%dms", min(max(wait, minKeyWait), MaxKeyWait).Milliseconds())
}

// MaxKeyWait is the longest wait bound lock_timeout can take (2^31-1 ms,
// about 24 days); a longer one is this.
const MaxKeyWait = math.MaxInt32 * time.Millisecond

// claimStallAttempts is how many times Do claims a key whose claim timed
// out on a lock other than the key's before it answers ErrInFlight: twice,
// so a request waits at most twice its bound (a preclaimed one, whose
// statement falls back to Do's way, three times), also in the rare case
// the lock was the key's after all (see waitedForKey).
const claimStallAttempts = 2

// errClaimStalled: a claim timed out on a lock other than the key's.
var errClaimStalled = errors.New("claim timed out on a lock other than its key's")

// waitedForKey reports whether err is a lock timeout (the wait bound) spent
// waiting for the transaction that wrote the key's row: a request in flight
// with the key (or one deleting it expired). PostgreSQL then names the
// existing row and the table in the error's context ("while inserting index
// tuple (0,1) in relation "idempotency_keys"", translated with lc_messages
// but for the name). A lock timeout without it waited for something else,
// such as the table's extension, which under I/O pressure passed the 50 ms
// floor in CI and answered a fresh key "in flight". One wait on the key has
// no context: for another insert's speculative token, held only between
// its heap and index writes, which outlasts a bound only when the disk
// stalls; that request is tried again (claimStallAttempts).
func waitedForKey(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == postgres.CodeLockNotAvailable &&
		strings.Contains(pgErr.Where, "idempotency_keys")
}

// canonicalJSON is the canonical form of a validated command: its JSON
// encoding (struct fields in declaration order, no insignificant space).
func canonicalJSON(cmd any) ([]byte, error) { return json.Marshal(cmd) }

// storedBytes is what a key's row keeps of its request and response, as the
// key quota counts it: the canonical request, the response's header names
// and values, and its body.
func storedBytes(canonical []byte, resp Response) int64 {
	n := len(canonical) + len(resp.Body)
	for k, v := range resp.Header {
		n += len(k) + len(v)
	}
	return int64(n)
}

// fingerprint is the SHA-256 of the scope and the canonical command.
func fingerprint(scope string, canonical []byte) []byte {
	h := sha256.New()
	h.Write([]byte(scope))
	h.Write([]byte{'\n'})
	h.Write(canonical)
	return h.Sum(nil)
}

// differingFields names the top-level fields whose values differ between two
// canonical commands, in sorted order.
func differingFields(stored, current []byte) []string {
	a, b := topLevel(stored), topLevel(current)
	var fields []string
	for k, v := range a {
		if w, ok := b[k]; !ok || !reflect.DeepEqual(v, w) {
			fields = append(fields, k)
		}
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			fields = append(fields, k)
		}
	}
	slices.Sort(fields)
	return fields
}

// hasField says whether canonical JSON doc has the top-level field name.
func hasField(doc []byte, name string) bool {
	_, ok := topLevel(doc)[name]
	return ok
}

func topLevel(doc []byte) map[string]any {
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	var m map[string]any
	_ = dec.Decode(&m) // both sides are our own canonical JSON
	return m
}
