package settle

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/acme/orders/domain"
	"github.com/acme/orders/payment"
	"github.com/acme/orders/postgres"
)

// ErrNoDeadLetter is returned by RetryDeadLetter and DiscardDeadLetter for
// an id that is not an open dead letter of the payment worker.
var ErrNoDeadLetter = errors.New("no open payment worker dead letter with that id")

const deadLetterInsertSQL = `
INSERT INTO dead_letters (projection, tenant_id, event_id, aggregate_id, aggregate_version, stream_seq,
                          subject, payload, error, deliveries, status)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, 'open')`

// deadLetter records an intent no retry settles in dead_letters, with the
// consumer's name as its projection (the projector never touches those).
func (w *Worker) deadLetter(ctx context.Context, consumer, subject string, data []byte, seq, deliveries uint64, cause error) error {
	var tenant, eventID, aggregate, version any // NULL for a message that is no event
	if env, err := domain.DecodeEnvelope(data); err == nil {
		tenant, eventID, aggregate, version = env.TenantID, env.ID, env.AggregateID, env.AggregateVersion
	}
	if _, err := w.db.Exec(ctx, deadLetterInsertSQL, consumer, tenant, eventID, aggregate, version,
		int64(seq), postgres.Text(subject), data, postgres.Text(cause.Error()), int64(deliveries)); err != nil {
		return fmt.Errorf("insert dead letter: %w", err)
	}
	return nil
}

// DeadLetter is one dead letter of the payment worker.
type DeadLetter struct {
	ID          int64
	Consumer    string
	AggregateID *uuid.UUID
	StreamSeq   int64
	Error       string
	Deliveries  int32
	Status      string
	CreatedAt   time.Time
}

// ListDeadLetters returns the payment worker's open dead letters, or all of
// them with all set, oldest first.
func ListDeadLetters(ctx context.Context, db postgres.DB, all bool) ([]DeadLetter, error) {
	rows, _ := db.Query(ctx, `
SELECT id, projection, aggregate_id, stream_seq, error, deliveries, status, created_at
FROM dead_letters
WHERE projection = ANY($1) AND ($2 OR status = 'open')
ORDER BY id`, Consumers, all)
	dls, err := pgx.CollectRows(rows, pgx.RowToStructByPos[DeadLetter])
	if err != nil {
		return nil, fmt.Errorf("list dead letters: %w", err)
	}
	return dls, nil
}

// RetryDeadLetter settles the open dead letter id again, now that its cause
// is fixed: the provider call with the intent's own key (which replays a
// charge or refund made before) and the recording, then marks it retried.
// If it still fails, the dead letter stays open and the error says why.
func (w *Worker) RetryDeadLetter(ctx context.Context, id int64) error {
	unlock, err := w.lockDeadLetter(ctx, id)
	if err != nil {
		return err
	}
	defer unlock()
	consumer, data, why, err := w.openDeadLetter(ctx, id)
	if err != nil {
		return err
	}
	if strings.Contains(why, ErrProviderDisagrees.Error()) {
		// A retry would find the intent recorded and close the only
		// record of money the provider holds, settling nothing.
		return fmt.Errorf("dead letter %d: %w: a retry cannot settle it; refund what the provider holds by hand (the dead letter's error names it), then discard the dead letter", id, ErrProviderDisagrees)
	}
	// The provider may be called from here on: a discard waits out its
	// search lag from now (searchable).
	if _, err := w.db.Exec(ctx, `UPDATE dead_letters SET last_tried_at = now() WHERE id = $1`, id); err != nil {
		return fmt.Errorf("dead letter %d: %w", id, err)
	}
	if r := w.settle(ctx, consumer, data, true); r.verdict != done {
		return fmt.Errorf("dead letter %d still fails: %w", id, r.err)
	}
	return w.resolve(ctx, id, "retried")
}

// DiscardDeadLetter marks the open dead letter id discarded: the worker
// never settles its intent again. So that its order does not wait for an
// outcome for good (payment_pending, neither payable again nor
// cancellable; a refund pending), a charge or refund is first looked up at
// the provider under the intent's key, and what was found is recorded:
//   - a charge or refund the provider made (succeeded, or declined /
//     failed): that outcome, as a retry would record it;
//   - none: a decline (DiscardedCode) or a failed refund, so that the
//     order can be paid again or cancelled, or shows its refund failed.
//
// If recording is refused for good (the order is unknown, or the outcome
// does not fit it: what dead-lettered the intent in the first place),
// nothing is recorded and outcome names what the provider holds, for the
// operator to settle by hand. If the provider cannot be asked, or the
// intent's last try is younger than its search lag, the discard is
// refused and the dead letter stays open. A dead letter that is no intent
// (malformed), or whose outcome was recorded meanwhile, is only marked.
// outcome says what was done, for the operator.
//
// Nothing calls the provider with the key afterwards: the outcome's inbox
// row makes every later delivery of the intent a no-op, and a retry or
// discard of the dead letter is held off (lockDeadLetter). A delivery that
// passed its inbox check before the discard committed (a worker that
// crashed between the dead letter and its Term, redelivering just then)
// could still charge: the ledger check (make faults) would show it.
func (w *Worker) DiscardDeadLetter(ctx context.Context, id int64) (outcome string, err error) {
	unlock, err := w.lockDeadLetter(ctx, id)
	if err != nil {
		return "", err
	}
	defer unlock()
	consumer, data, _, err := w.openDeadLetter(ctx, id)
	if err != nil {
		return "", err
	}
	if outcome, err = w.discardIntent(ctx, id, consumer, data); err != nil {
		return "", fmt.Errorf("dead letter %d not discarded: %w", id, err)
	}
	return outcome, w.resolve(ctx, id, "discarded")
}

// DiscardedCode is the decline code DiscardDeadLetter records for a charge
// the provider holds none of.
const DiscardedCode = "discarded"

// discardIntent records the outcome the provider holds of dead letter
// id's intent, or a decline or failed refund when it holds none (see
// DiscardDeadLetter).
func (w *Worker) discardIntent(ctx context.Context, id int64, consumer string, data []byte) (string, error) {
	env, err := domain.DecodeEnvelope(data)
	if err != nil {
		return "nothing recorded: not an intent", nil
	}
	switch recorded, err := w.recorded(ctx, consumer, env.ID); {
	case err != nil:
		return "", err
	case recorded:
		return "nothing recorded: its outcome was recorded before", nil
	}
	switch {
	case consumer == ChargeConsumer && env.Type == domain.TypePaymentRequested:
		req, err := chargeIntent(env)
		if err != nil {
			return "nothing recorded: not a charge", nil
		}
		if err := w.searchable(ctx, id); err != nil {
			return "", err
		}
		ch, found, err := w.provider.FindCharge(ctx, req.PaymentKey)
		switch {
		case err != nil:
			return "", fmt.Errorf("cannot tell whether the provider charged under key %s: %w", req.PaymentKey, err)
		case !found:
			ch = payment.Charge{Status: payment.ChargeDeclined, DeclineCode: DiscardedCode,
				DeclineReason: fmt.Sprintf("payment dead letter %d discarded; the provider holds no charge under its key", id)}
		}
		what := fmt.Sprintf("order %s's charge attempt %d as %s", env.AggregateID, req.Attempt, ch.Status)
		if ch.Status != payment.ChargeSucceeded {
			what += " (" + ch.DeclineCode + ")"
		}
		wrote, err := w.recordCharge(ctx, env, req, ch)
		return discarded(what, found && ch.Status == payment.ChargeSucceeded, "charge "+ch.ID, wrote, err)
	case consumer == RefundConsumer && env.Type == domain.TypeRefundRequested:
		req, err := refundIntent(env)
		if err != nil {
			return "nothing recorded: not a refund", nil
		}
		rf, found, err := w.provider.FindRefund(ctx, req.ChargeID, req.RefundKey)
		switch {
		case err != nil:
			return "", fmt.Errorf("cannot tell whether the provider refunded under key %s: %w", req.RefundKey, err)
		case !found:
			rf = payment.Refund{Status: payment.RefundFailed,
				FailureReason: fmt.Sprintf("payment dead letter %d discarded; the provider holds no refund under its key (refund by hand if need be)", id)}
		}
		what := fmt.Sprintf("order %s's refund attempt %d as %s", env.AggregateID, req.Attempt, rf.Status)
		wrote, err := w.recordRefund(ctx, env, req, rf)
		return discarded(what, found && rf.Status == payment.RefundSucceeded, "refund "+rf.ID, wrote, err)
	}
	return "nothing recorded: not an intent of " + consumer, nil
}

// discarded says what a discard recorded (what), or why it recorded
// nothing: a racing copy recorded first (not wrote), or the recording was
// refused for good (a domain refusal: the order is unknown, or the outcome
// does not fit it), when the provider's own charge or refund (made, with
// its id in held) is left for the operator to settle by hand. Any other
// error keeps the dead letter open.
func discarded(what string, made bool, held string, wrote bool, err error) (string, error) {
	switch kind := domain.KindOf(err); {
	case err == nil && wrote:
		return "recorded " + what, nil
	case err == nil:
		return "nothing recorded: a delivery of the intent recorded its outcome meanwhile", nil
	case kind == domain.KindInvalid, kind == domain.KindNotFound, kind == domain.KindConflict:
		if made {
			return fmt.Sprintf("nothing recorded (%v); the provider holds %s, which no order records: settle it by hand", err, held), nil
		}
		return fmt.Sprintf("nothing recorded (%v)", err), nil
	}
	return "", err
}

// ErrDeadLetterBusy is returned by RetryDeadLetter and DiscardDeadLetter
// while another retry or discard of the same dead letter runs.
var ErrDeadLetterBusy = errors.New("another retry or discard of this dead letter is running")

// deadLetterLockClass is the first key of the session advisory lock a
// retry or discard holds on its dead letter (the second: the id, modulo
// 2^31; two ids that share it only refuse each other for a moment).
const deadLetterLockClass = 0x0d1e7e7

// lockDeadLetter holds dead letter id against every other retry or
// discard of it, in any process, until unlock. Without it a discard could
// mark discarded a dead letter whose retry was charging meanwhile: the
// charge recorded, the dead letter saying it never would be (and the
// operator told to settle it by hand at the provider, a second charge). A
// session lock (postgres.TrySessionLock), so that no transaction stays open
// across the provider call. A db that hands out no connection (not a pool)
// is not locked.
func (w *Worker) lockDeadLetter(ctx context.Context, id int64) (unlock func(), err error) {
	pool, ok := w.db.(postgres.Acquirer)
	if !ok {
		return func() {}, nil
	}
	_, unlock, got, err := postgres.TrySessionLock(ctx, pool, "$1, $2", int32(deadLetterLockClass), int32(id%(1<<31)))
	switch {
	case err != nil:
		return nil, fmt.Errorf("dead letter %d: %w", id, err)
	case !got:
		return nil, fmt.Errorf("dead letter %d: %w", id, ErrDeadLetterBusy)
	}
	return unlock, nil
}

func (w *Worker) openDeadLetter(ctx context.Context, id int64) (consumer string, data []byte, why string, err error) {
	err = w.db.QueryRow(ctx, `SELECT projection, payload, error FROM dead_letters WHERE id = $1 AND projection = ANY($2) AND status = 'open'`,
		id, Consumers).Scan(&consumer, &data, &why)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return "", nil, "", fmt.Errorf("dead letter %d: %w", id, ErrNoDeadLetter)
	case err != nil:
		return "", nil, "", fmt.Errorf("read dead letter %d: %w", id, err)
	}
	return consumer, data, why, nil
}

func (w *Worker) resolve(ctx context.Context, id int64, status string) error {
	tag, err := w.db.Exec(ctx, `UPDATE dead_letters SET status = $2, resolved_at = now() WHERE id = $1 AND status = 'open'`, id, status)
	if err != nil {
		return fmt.Errorf("mark dead letter %d %s: %w", id, status, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("dead letter %d: %w", id, ErrNoDeadLetter)
	}
	return nil
}

// searchable refuses dead letter id while its last try (its opening, or
// an operator's retry: last_tried_at, else created_at) is younger than the
// provider's search lag (Config.ProviderSearchLag): a charge that try made
// could still be missing from the search.
func (w *Worker) searchable(ctx context.Context, id int64) error {
	var age time.Duration
	if err := w.db.QueryRow(ctx, `SELECT now() - greatest(created_at, last_tried_at) FROM dead_letters WHERE id = $1`, id).Scan(&age); err != nil {
		return fmt.Errorf("read dead letter %d: %w", id, err)
	}
	if wait := w.cfg.ProviderSearchLag - age; wait > 0 {
		return fmt.Errorf("its last try was %s ago, and the provider's search may not show a charge made in the last %s: discard it in %s",
			age.Round(time.Second), w.cfg.ProviderSearchLag, wait.Round(time.Second)+time.Second)
	}
	return nil
}
