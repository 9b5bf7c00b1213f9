package settle

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/trace"

	"github.com/acme/orders/command"
	"github.com/acme/orders/domain"
	"github.com/acme/orders/payment"
	"github.com/acme/orders/tracing"
)

// verdict is what becomes of a delivered intent.
type verdict int

const (
	done    verdict = iota // recorded (now or before): ack
	retry                  // transient: parked on its backoff (nak'ed if that fails), same key next time
	dead                   // no retry cures it: dead-letter and terminate
	abandon                // neither recorded nor acked (AfterProviderCall refused)
)

type result struct {
	verdict verdict
	err     error
	// providerDown marks a retry because the provider gave no outcome
	// (no answer, 5xx, 429, 409, a refund not settled yet): retried for
	// as long as that lasts, never dead-lettered for it (exhausted).
	providerDown bool
	// timing is set when this delivery recorded the outcome.
	timing *Timing
}

// AmountNotChargeable is the decline code the worker records for an intent
// whose amount no provider charge can be (0, or above
// domain.MaxChargeAmount), without calling the provider.
const AmountNotChargeable = "amount_not_chargeable"

// settle charges or refunds the intent in data for consumer and records
// the outcome. redelivered says the intent may have reached the provider
// before: a charge or refund then first looks for the one its key made.
func (w *Worker) settle(ctx context.Context, consumer string, data []byte, redelivered bool) result {
	env, err := domain.DecodeEnvelope(data)
	if err != nil {
		return result{verdict: dead, err: err}
	}
	return w.settleEnvelope(ctx, consumer, env, redelivered)
}

// settleEnvelope is settle for the decoded intent env.
func (w *Worker) settleEnvelope(ctx context.Context, consumer string, env domain.Envelope, redelivered bool) result {
	recorded, order, err := w.lookUp(ctx, consumer, env)
	if err != nil {
		return result{verdict: retry, err: err}
	}
	if recorded {
		w.stats.duplicate(consumer)
		return result{verdict: done}
	}
	if time.Since(env.OccurredAt) > oldIntent {
		// A first delivery of an old intent: a consumer created again
		// (it delivers the stream from its start), or a copy published
		// again after the stream was lost. An earlier delivery may have
		// charged, and a provider that has forgotten the key by now would
		// charge again: look it up first, as for a redelivery.
		redelivered = true
	}
	switch {
	case consumer == ChargeConsumer && env.Type == domain.TypePaymentRequested:
		return w.charge(ctx, env, order, redelivered)
	case consumer == RefundConsumer && env.Type == domain.TypeRefundRequested:
		return w.refund(ctx, env, order, redelivered)
	}
	return result{verdict: dead, err: fmt.Errorf("%w: consumer %s cannot settle a %s event", domain.ErrMalformedEvent, consumer, env.Type)}
}

// heldButNotRecorded checks, when another copy of an intent recorded its
// outcome first, that the record agrees with the provider, which holds the
// succeeded charge or refund (kind) providerID under key. A record of a
// decline or failure means a discard settled the intent as "nothing made"
// while this copy was at the provider: the provider holds money our orders
// do not show (G8). That is an error naming it, which opens a dead letter
// for an operator (refund the charge by hand, or record the refund),
// instead of being acked as a duplicate and forgotten.
func (w *Worker) heldButNotRecorded(ctx context.Context, key, kind, providerID string) error {
	var status, recordedID string
	err := w.db.QueryRow(ctx, `SELECT status, provider_id FROM payments WHERE idempotency_key = $1`, key).Scan(&status, &recordedID)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil // recorded before payments rows were kept
	case err != nil:
		return fmt.Errorf("look up the recorded %s %s: %w", kind, key, err)
	case status == "succeeded":
		return nil
	}
	return fmt.Errorf("%w: the provider holds the succeeded %s %s under key %s, which was recorded as %s (a discard while this copy was at the provider): no order shows it; settle it by hand",
		ErrProviderDisagrees, kind, providerID, key, status)
}

// ErrProviderDisagrees is the error of an intent whose recorded outcome
// the provider contradicts (see heldButNotRecorded): dead-lettered for an
// operator, never retried on its own.
var ErrProviderDisagrees = errors.New("the provider holds what our records say it does not")

// oldIntent is the age past which an intent is looked up at the provider
// before it is settled, even on its first delivery here: far under the
// 24 h the provider keeps a key (and any clock skew between the api that
// stamped it and this worker), far over what a live intent waits.
const oldIntent = time.Hour

// intentLookUpSQL reads, in one round trip, whether consumer $1 recorded
// the outcome of event $2, and the order ($3, $4) it is for as it stands
// (an empty status if the tenant has no such order).
const intentLookUpSQL = `
SELECT EXISTS (SELECT 1 FROM payment_inbox WHERE consumer = $1 AND event_id = $2),
       coalesce(o.status, ''), coalesce(o.total, 0), coalesce(o.currency, ''),
       coalesce(o.payment, '{}'), coalesce(o.refund, '{}')
FROM (VALUES (1)) AS one (x)
LEFT JOIN orders o ON o.tenant_id = $3 AND o.id = $4`

// lookUp reports whether consumer recorded the outcome of intent env, and
// returns its order (for the intent's check against it: awaited) unless it
// did. The order is read without a lock: while it awaits the intent's
// outcome, nothing but that outcome's record moves it.
func (w *Worker) lookUp(ctx context.Context, consumer string, env domain.Envelope) (recorded bool, o domain.Order, err error) {
	o.ID, o.TenantID = env.AggregateID, env.TenantID
	if err := w.db.QueryRow(ctx, intentLookUpSQL, consumer, env.ID, env.TenantID, env.AggregateID).Scan(
		&recorded, &o.Status, &o.Total, &o.Currency, &o.Payment, &o.Refund); err != nil {
		return false, o, fmt.Errorf("look up payment inbox and order: %w", err)
	}
	return recorded, o, nil
}

// awaited checks that order awaits the intent env asks for (check: its
// AwaitsCharge or AwaitsRefund), before the provider is asked for anything:
// an intent no command of ours wrote (published straight to the stream: a
// second attempt of a paid order, another tenant's order, a refund of an
// order never cancelled or of another order's charge) would otherwise move
// money at the provider that no order of ours shows (G8). It is
// dead-lettered instead, with nothing sent.
func awaited(env domain.Envelope, order domain.Order, check func() error) error {
	if order.Status == "" {
		return fmt.Errorf("%w: %s %s is for order %s, which tenant %q does not have: nothing sent to the provider",
			domain.ErrMalformedEvent, env.Type, env.ID, env.AggregateID, env.TenantID)
	}
	if err := check(); err != nil {
		return fmt.Errorf("%w: %s %s: %w: nothing sent to the provider", domain.ErrMalformedEvent, env.Type, env.ID, err)
	}
	return nil
}

// recorded reports whether consumer recorded the outcome of event id.
func (w *Worker) recorded(ctx context.Context, consumer string, id uuid.UUID) (bool, error) {
	var ok bool
	if err := w.db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM payment_inbox WHERE consumer = $1 AND event_id = $2)`,
		consumer, id).Scan(&ok); err != nil {
		return false, fmt.Errorf("look up payment inbox: %w", err)
	}
	return ok, nil
}

// providerResult classifies a provider error: permanent ones are
// dead-lettered, everything else (transient, timeouts) retried, for as long
// as the provider gives no outcome (see exhausted).
func (w *Worker) providerResult(consumer string, err error) result {
	if errors.Is(err, payment.ErrPermanent) {
		return result{verdict: dead, err: err}
	}
	w.stats.transient(consumer)
	return result{verdict: retry, err: err, providerDown: true}
}

// exhausted says whether a retry that failed for the failed-th time is
// dead-lettered: at Config.MaxDeliver failures, unless the provider gave
// no outcome (and failed counts only the failures that were not the
// provider's: after an outage, one failure of ours, such as a recording
// that meets a database blip, must not dead-letter the charge the
// provider has just made). An outage of the provider outlasts any count (ten failures
// are about two minutes of backoff): dead-lettered, every intent in flight
// would need an operator's retry when it came back, and its order would
// stay payment_pending, neither payable again nor cancellable, meanwhile.
// Such an intent stays parked, retried every MaxBackoff with its key, and
// settles on its own when the provider answers;
// orders_payment_provider_transient_failures_total counts the failures.
func (w *Worker) exhausted(r result, failed int) bool {
	return !r.providerDown && failed >= w.cfg.MaxDeliver
}

// recordResult classifies an error of a record command: a refusal no retry
// changes (invalid, unknown order, conflicting outcome) is dead-lettered.
func recordResult(err error) result {
	switch domain.KindOf(err) {
	case domain.KindInvalid, domain.KindNotFound, domain.KindConflict:
		return result{verdict: dead, err: err}
	}
	return result{verdict: retry, err: err}
}

func (w *Worker) afterProviderCall(ctx context.Context, consumer string, id uuid.UUID) error {
	if w.cfg.AfterProviderCall == nil {
		return nil
	}
	return w.cfg.AfterProviderCall(ctx, consumer, id)
}

func (w *Worker) charge(ctx context.Context, env domain.Envelope, order domain.Order, redelivered bool) result {
	req, err := chargeIntent(env)
	if err == nil {
		err = awaited(env, order, func() error { return order.AwaitsCharge(req) })
	}
	if err != nil {
		return result{verdict: dead, err: err}
	}
	var (
		ch    payment.Charge
		found bool
		start = time.Now()
	)
	if !domain.Chargeable(req.Currency, req.Amount) {
		// Asked for before pay refused such totals: the provider refuses
		// it (400, dead-lettered, and again on every retry), which would
		// leave the order payment_pending with nothing able to move it.
		// Nothing can be charged: record it as a decline, without a call.
		ch = payment.Charge{Amount: req.Amount, Currency: req.Currency, Status: payment.ChargeDeclined, DeclineCode: AmountNotChargeable,
			DeclineReason: fmt.Sprintf("the amount %d %s cannot be charged: %s", req.Amount, req.Currency, domain.ChargeableRule(req.Currency))}
		found = true
	} else if redelivered {
		// The key makes the provider replay its charge for 24 h; the
		// charge found under it is taken as it is now, even later: a
		// decline as well (a replay could be a stale answer, such as one
		// first given while the charge was still processing).
		ch, found, err = w.provider.FindCharge(ctx, req.PaymentKey)
		if err != nil {
			return w.providerResult(ChargeConsumer, fmt.Errorf("find charge %s: %w", req.PaymentKey, err))
		}
	}
	if !found {
		cctx, span := tracing.StartChild(ctx, "charge", trace.WithSpanKind(trace.SpanKindClient))
		start = time.Now() // the charge, not the look-up that found none
		creq := payment.ChargeRequest{
			IdempotencyKey: req.PaymentKey, Amount: req.Amount, Currency: req.Currency, PaymentMethod: req.PaymentMethod,
			Metadata: map[string]string{"tenant_id": env.TenantID, "order_id": env.AggregateID.String(), "attempt": strconv.Itoa(req.Attempt)},
		}
		ch, err = w.provider.Charge(cctx, creq)
		if errors.Is(err, payment.ErrKeySpent) {
			ch, err = w.spentCharge(cctx, creq, err)
		}
		tracing.Fail(span, err)
		span.End()
		if err != nil {
			return w.providerResult(ChargeConsumer, fmt.Errorf("charge %s: %w", req.PaymentKey, err))
		}
	}
	timing := Timing{Provider: time.Since(start)}
	if err := w.afterProviderCall(ctx, ChargeConsumer, env.ID); err != nil {
		return result{verdict: abandon, err: err}
	}
	start = time.Now()
	wrote, err := w.recordCharge(ctx, env, req, ch)
	if err != nil {
		return recordResult(err)
	}
	if !wrote { // a racing copy recorded it
		if ch.Status == payment.ChargeSucceeded {
			if err := w.heldButNotRecorded(ctx, req.PaymentKey, "charge", ch.ID); err != nil {
				return result{verdict: dead, err: err}
			}
		}
		w.stats.duplicate(ChargeConsumer)
		return result{verdict: done}
	}
	w.afterRecord()
	w.stats.charged(ch.Status == payment.ChargeSucceeded)
	return recordedNow(env, timing, start)
}

// chargeIntent decodes and checks the payment.requested intent env.
func chargeIntent(env domain.Envelope) (domain.PaymentRequested, error) {
	var req domain.PaymentRequested
	if err := env.Decode(&req); err != nil {
		return req, err
	}
	if req.Attempt < 1 || req.PaymentKey != domain.ChargeKey(env.TenantID, env.AggregateID, req.Attempt) ||
		req.Amount < 0 || !domain.ValidCurrency(req.Currency) || req.PaymentMethod == "" {
		return req, fmt.Errorf("%w: payment.requested %s: attempt %d, key %q, amount %d %q, method %q do not make a charge",
			domain.ErrMalformedEvent, env.ID, req.Attempt, req.PaymentKey, req.Amount, req.Currency, req.PaymentMethod)
	}
	return req, nil
}

// recordCharge records the provider's charge ch of intent req (event env)
// with its inbox row; wrote is false when an earlier delivery or a racing
// copy recorded it.
func (w *Worker) recordCharge(ctx context.Context, env domain.Envelope, req domain.PaymentRequested, ch payment.Charge) (wrote bool, err error) {
	out := command.ChargeOutcome{ChargeID: ch.ID, Amount: ch.Amount, Currency: ch.Currency,
		Succeeded: ch.Status == payment.ChargeSucceeded, DeclineCode: ch.DeclineCode, Reason: ch.DeclineReason}
	if !out.Succeeded {
		// A decline may come without the amount; it is the request's.
		out.Amount, out.Currency = req.Amount, req.Currency
	}
	_, wrote, err = command.NewRecordChargeOutcomeHandler(w.db).HandleRecorded(ctx, command.RecordChargeOutcome{
		TenantID: env.TenantID, OrderID: env.AggregateID, Attempt: req.Attempt, Consumer: ChargeConsumer, EventID: env.ID, Charge: out,
	})
	if err != nil {
		return false, fmt.Errorf("record charge %s (%s): %w", req.PaymentKey, ch.ID, err)
	}
	return wrote, nil
}

func (w *Worker) refund(ctx context.Context, env domain.Envelope, order domain.Order, redelivered bool) result {
	req, err := refundIntent(env)
	if err == nil {
		err = awaited(env, order, func() error { return order.AwaitsRefund(req) })
	}
	if err != nil {
		return result{verdict: dead, err: err}
	}
	var (
		rf    payment.Refund
		found bool
		start = time.Now()
	)
	if redelivered {
		// As for a charge: once the provider forgot the key (24 h), the
		// same key would refund anew, and be refused (the charge is
		// refunded already), so the refund it made is looked up first.
		rf, found, err = w.provider.FindRefund(ctx, req.ChargeID, req.RefundKey)
		if err != nil {
			return w.providerResult(RefundConsumer, fmt.Errorf("find refund %s: %w", req.RefundKey, err))
		}
		// A failed one too: a refund that fails stays failed (the key
		// would refund anew once the provider forgot it).
	}
	if !found {
		rctx, span := tracing.StartChild(ctx, "refund", trace.WithSpanKind(trace.SpanKindClient))
		start = time.Now() // the refund, not the look-up that found none
		rreq := payment.RefundRequest{IdempotencyKey: req.RefundKey, ChargeID: req.ChargeID, Amount: req.Amount, Currency: req.Currency}
		rf, err = w.provider.Refund(rctx, rreq)
		if errors.Is(err, payment.ErrKeySpent) {
			rf, err = w.spentRefund(rctx, rreq, err)
		}
		tracing.Fail(span, err)
		span.End()
		if err != nil {
			return w.providerResult(RefundConsumer, fmt.Errorf("refund %s: %w", req.RefundKey, err))
		}
	}
	timing := Timing{Provider: time.Since(start)}
	if err := w.afterProviderCall(ctx, RefundConsumer, env.ID); err != nil {
		return result{verdict: abandon, err: err}
	}
	start = time.Now()
	wrote, err := w.recordRefund(ctx, env, req, rf)
	if err != nil {
		return recordResult(err)
	}
	if !wrote { // a racing copy recorded it
		if rf.Status == payment.RefundSucceeded {
			if err := w.heldButNotRecorded(ctx, req.RefundKey, "refund", rf.ID); err != nil {
				return result{verdict: dead, err: err}
			}
		}
		w.stats.duplicate(RefundConsumer)
		return result{verdict: done}
	}
	w.afterRecord()
	w.stats.refunded(rf.Status == payment.RefundSucceeded)
	return recordedNow(env, timing, start)
}

// refundIntent decodes and checks the refund.requested intent env.
func refundIntent(env domain.Envelope) (domain.RefundRequested, error) {
	var req domain.RefundRequested
	if err := env.Decode(&req); err != nil {
		return req, err
	}
	if req.Attempt < 1 || req.RefundKey != domain.RefundKey(env.TenantID, env.AggregateID, req.Attempt) ||
		req.Amount <= 0 || !domain.ValidCurrency(req.Currency) || req.ChargeID == "" {
		return req, fmt.Errorf("%w: refund.requested %s: attempt %d, key %q, amount %d %q, charge %q do not make a refund",
			domain.ErrMalformedEvent, env.ID, req.Attempt, req.RefundKey, req.Amount, req.Currency, req.ChargeID)
	}
	return req, nil
}

// recordRefund records the provider's refund rf of intent req (event env)
// with its inbox row; wrote is false when an earlier delivery or a racing
// copy recorded it.
func (w *Worker) recordRefund(ctx context.Context, env domain.Envelope, req domain.RefundRequested, rf payment.Refund) (wrote bool, err error) {
	out := command.RefundOutcome{RefundID: rf.ID, Amount: rf.Amount, Currency: rf.Currency,
		Succeeded: rf.Status == payment.RefundSucceeded, Reason: rf.FailureReason}
	if out.Currency == "" {
		out.Currency = req.Currency
	}
	_, wrote, err = command.NewRecordRefundOutcomeHandler(w.db).HandleRecorded(ctx, command.RecordRefundOutcome{
		TenantID: env.TenantID, OrderID: env.AggregateID, Attempt: req.Attempt, Consumer: RefundConsumer, EventID: env.ID, Refund: out,
	})
	if err != nil {
		return false, fmt.Errorf("record refund %s (%s): %w", req.RefundKey, rf.ID, err)
	}
	return wrote, nil
}

// recordedNow is the result of an outcome of env recorded now by a
// transaction that began at recordStart. Settled is left 0 when the event
// has no time, or one ahead of this clock.
func recordedNow(env domain.Envelope, t Timing, recordStart time.Time) result {
	now := time.Now()
	t.Record = now.Sub(recordStart)
	if !env.OccurredAt.IsZero() && now.After(env.OccurredAt) {
		t.Settled = now.Sub(env.OccurredAt)
	}
	return result{verdict: done, timing: &t}
}

// afterRecord calls Config.AfterRecord, if set.
func (w *Worker) afterRecord() {
	if w.cfg.AfterRecord != nil {
		w.cfg.AfterRecord()
	}
}
