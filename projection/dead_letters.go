package projection

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/acme/orders/postgres"
)

// Dead-letter statuses.
const (
	statusOpen      = "open"      // could not be applied; blocks its aggregate
	statusParked    = "parked"    // a later event of a blocked aggregate
	statusRetried   = "retried"   // applied by `dead-letters retry`
	statusDiscarded = "discarded" // skipped by `dead-letters discard`
)

// ErrNoDeadLetter is returned by RetryDeadLetter and DiscardDeadLetter for an
// id that is not an open dead letter of the projection, and by
// DeadLetterProjection for an id that is no dead letter at all.
var ErrNoDeadLetter = errors.New("no open dead letter with that id")

const deadLetterInsertSQL = `
INSERT INTO dead_letters (projection, tenant_id, event_id, aggregate_id, aggregate_version, stream_seq,
                          subject, payload, error, deliveries, status, next_attempt_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, now() + $12::bigint * interval '1 microsecond')`

// noAttempt is the retryIn of a dead letter the runner does not re-drive on
// a clock: an open one, or one parked behind an open one.
const noAttempt time.Duration = -1

// attemptIn is the value of next_attempt_at's offset for retryIn: NULL for
// noAttempt, else microseconds.
func attemptIn(retryIn time.Duration) any {
	if retryIn < 0 {
		return nil
	}
	return retryIn.Microseconds()
}

type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// deadLetter records e with its raw message; a parked one is re-driven
// retryIn from now (noAttempt: not on a clock).
func (r *Runner) deadLetter(ctx context.Context, db execer, e *event, status, reason string, retryIn time.Duration) error {
	var tenant, eventID, aggregate, version any // NULL for a message that is no event at all
	if !e.undecodable {
		tenant, eventID, aggregate, version = e.env.TenantID, e.env.ID, e.env.AggregateID, e.env.AggregateVersion
	}
	if _, err := db.Exec(ctx, deadLetterInsertSQL, r.proj.Name(), tenant, eventID, aggregate, version,
		int64(e.seq), postgres.Text(e.subject), e.data, postgres.Text(reason), int64(e.deliveries), status, attemptIn(retryIn)); err != nil {
		return fmt.Errorf("insert dead letter: %w", err)
	}
	return nil
}

// DeadLetter is one row of dead_letters.
type DeadLetter struct {
	ID               int64
	Projection       string
	EventID          *uuid.UUID
	AggregateID      *uuid.UUID
	AggregateVersion *int64
	StreamSeq        int64
	Error            string
	Deliveries       int32
	Status           string
	CreatedAt        time.Time
}

// ListDeadLetters returns the unresolved (open and parked) dead letters,
// or all of them with all set, oldest first, but those of the consumers
// others: the table also holds the payment worker's, under its consumers'
// names. (A projection renamed or retired keeps its dead letters listed.)
func ListDeadLetters(ctx context.Context, db postgres.DB, others []string, all bool) ([]DeadLetter, error) {
	rows, _ := db.Query(ctx, `
SELECT id, projection, event_id, aggregate_id, aggregate_version, stream_seq, error, deliveries, status, created_at
FROM dead_letters
WHERE projection <> ALL($1) AND ($2 OR status IN ('open', 'parked'))
ORDER BY id`, others, all)
	return pgx.CollectRows(rows, pgx.RowToStructByPos[DeadLetter])
}

// DeadLetterProjection returns the projection that dead letter id belongs
// to. It returns ErrNoDeadLetter if there is no such dead letter, and any
// other database error as it is, with context.
func DeadLetterProjection(ctx context.Context, db postgres.DB, id int64) (string, error) {
	var name string
	err := db.QueryRow(ctx, `SELECT projection FROM dead_letters WHERE id = $1`, id).Scan(&name)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return "", fmt.Errorf("dead letter %d: %w", id, ErrNoDeadLetter)
	case err != nil:
		return "", fmt.Errorf("look up dead letter %d: %w", id, err)
	}
	return name, nil
}

// storedEvents reads the dead letters that clause (the query's text after
// WHERE, with its locking clause) selects, as events in (aggregate, version)
// order. Each event carries its row's id (deadID):
// decode reorders the events, so a list of ids kept beside them would no
// longer line up. Each row's age is the database's (now() - created_at,
// both its clock): a projector whose clock runs minutes ahead read an age
// that long, and called a parked event's predecessor missing while it was
// still being redelivered.
func storedEvents(ctx context.Context, tx pgx.Tx, clause string, args ...any) ([]*event, error) {
	rows, _ := tx.Query(ctx, `SELECT id, subject, payload, stream_seq, deliveries, now() - created_at FROM dead_letters WHERE `+clause, args...)
	var events []*event
	var id, seq int64
	var age time.Duration
	var deliveries int32
	var subject string
	var payload []byte
	if _, err := pgx.ForEachRow(rows, []any{&id, &subject, &payload, &seq, &deliveries, &age}, func() error {
		events = append(events, &event{deadID: id, subject: subject, data: payload, seq: uint64(seq),
			deliveries: uint64(deliveries), parkedFor: age})
		return nil
	}); err != nil {
		return nil, fmt.Errorf("read dead letters: %w", err)
	}
	return decode(events), nil
}

// deadIDs are the dead_letters ids of events.
func deadIDs(events []*event) []int64 {
	ids := make([]int64, len(events))
	for i, e := range events {
		ids[i] = e.deadID
	}
	return ids
}

// RetryDeadLetter applies the open dead letter id of this projection again,
// now that its cause is fixed, and then the events parked behind it, in
// version order, all in one transaction. If the event still cannot be
// applied, nothing changes and the error says why. A parked event that
// fails is recorded as the re-drive records it (an open dead letter of its
// own if no retry can fix it, its later versions parked behind it).
func (r *Runner) RetryDeadLetter(ctx context.Context, id int64) (applied int, err error) {
	return r.resolve(ctx, id, statusRetried)
}

// DiscardDeadLetter skips the open dead letter id of this projection for
// good: its aggregate's position moves past it, and the events parked behind
// it are applied as RetryDeadLetter applies them. Use it only when the event's effect must not (or need not)
// be applied, e.g. an event that should never have been published.
func (r *Runner) DiscardDeadLetter(ctx context.Context, id int64) (applied int, err error) {
	return r.resolve(ctx, id, statusDiscarded)
}

func (r *Runner) resolve(ctx context.Context, id int64, status string) (applied int, err error) {
	err = postgres.InTx(ctx, r.db, func(tx pgx.Tx) error {
		applied = 0
		// As every batch does: a rebuild's swap (which holds the lock
		// exclusively, and reads the discarded events under it) then sees
		// this resolution whole or not at all, and neither waits for the
		// other's position rows in turn.
		if _, err := tx.Exec(ctx, SharedLockSQL, AdvisoryClass, r.proj.Name()); err != nil {
			return err
		}
		dead, err := storedEvents(ctx, tx, `projection = $1 AND id = $2 AND status = 'open' FOR UPDATE`, r.proj.Name(), id)
		if err != nil {
			return err
		}
		if len(dead) == 0 {
			return fmt.Errorf("%w: %d (projection %s)", ErrNoDeadLetter, id, r.proj.Name())
		}
		e := dead[0]
		if _, err := tx.Exec(ctx, `UPDATE dead_letters SET status = $2, resolved_at = now() WHERE id = ANY($1)`, deadIDs(dead), status); err != nil {
			return fmt.Errorf("mark dead letter %d %s: %w", id, status, err)
		}
		if e.undecodable {
			if status == statusRetried {
				return fmt.Errorf("dead letter %d is not an event (%v); it can only be discarded", id, e.err)
			}
			return nil
		}
		if status == statusDiscarded {
			// Skip it: move the position past it, but only from just before
			// it; skipping a missing predecessor too would lose it silently.
			var pos int64
			var owner string
			err := tx.QueryRow(ctx, positionForUpdateSQL, r.proj.Name(), e.env.AggregateID).Scan(&pos, &owner)
			switch {
			case errors.Is(err, pgx.ErrNoRows):
			case err != nil:
				return err
			case owner != e.env.TenantID:
				// It names another tenant's order: it never had a place in
				// that order's versions, so nothing moves, and nothing of
				// that order is parked behind it.
				return nil
			}
			switch {
			case pos >= e.env.AggregateVersion:
				// Past it already: a rebuild since applied it (or skipped
				// it). Marked discarded, the next rebuild would skip an
				// event this read model holds; a retry resolves it as the
				// duplicate it now is, and applies what is parked behind.
				return fmt.Errorf("dead letter %d is version %d but the projection is past it, at version %d of that order (a rebuild applied it since): retry it instead, which resolves it without applying it twice",
					id, e.env.AggregateVersion, pos)
			case pos != e.env.AggregateVersion-1:
				return fmt.Errorf("dead letter %d is version %d but the projection is at version %d of that order: resolve the earlier version first",
					id, e.env.AggregateVersion, pos)
			}
			e.outcome = Stale
			if err := advanceOne(ctx, tx, r.proj.Name(), e.env, pos); err != nil {
				return err
			}
		} else {
			if err := r.commitTx(ctx, tx, dead); err != nil {
				return err
			}
			if e.outcome != Applied && e.outcome != Duplicate && e.outcome != Stale {
				if e.err != nil {
					return fmt.Errorf("dead letter %d is still not applicable: %s: %w", id, e.outcome, e.err)
				}
				return fmt.Errorf("dead letter %d is still not applicable: %s", id, e.outcome)
			}
			if e.outcome == Applied {
				applied++
			}
		}
		parked, err := storedEvents(ctx, tx, `projection = $1 AND aggregate_id = $2 AND tenant_id = $3 AND status = 'parked' FOR UPDATE`,
			r.proj.Name(), e.env.AggregateID, e.env.TenantID)
		if err != nil || len(parked) == 0 {
			return err
		}
		// Each parked event goes as the re-drive takes it: one that fails
		// becomes an open dead letter of its own (the CLI can resolve it
		// next), the later ones stay parked behind it, and the rest are
		// applied; one bad parked event must not undo this resolution.
		if err := r.applyStored(ctx, tx, parked); err != nil {
			return err
		}
		var counts [outcomeCount]int64
		if err := r.recordRedriven(ctx, tx, parked, &counts); err != nil {
			return err
		}
		applied += int(counts[Applied])
		return nil
	})
	return applied, err
}
