package settle_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/acme/orders/command"
	"github.com/acme/orders/domain"
	"github.com/acme/orders/fakepsp"
	"github.com/acme/orders/fakepsp/fakepsptest"
	"github.com/acme/orders/internal/testenv"
	"github.com/acme/orders/payment"
	"github.com/acme/orders/postgres"
	"github.com/acme/orders/settle"
	"github.com/acme/orders/stream"
)

// rig is one test's system: its database, JetStream, the local provider
// over HTTP and the adapter on it.
type rig struct {
	db       *pgxpool.Pool
	js       jetstream.JetStream
	psp      *fakepsp.Server
	provider settle.Provider
	pspURL   string
	tenant   string
}

func newRig(t testing.TB, faults fakepsp.Faults) *rig {
	t.Helper()
	return newRigWith(t, fakepsp.Config{Faults: faults})
}

// newRigWith is newRig with a provider configured by cfg.
func newRigWith(t testing.TB, cfg fakepsp.Config) *rig {
	t.Helper()
	psp, hs := fakepsptest.Start(t, fakepsptest.DatabaseURL(t), cfg)
	provider, err := payment.NewStripe(payment.Config{BaseURL: hs.URL, SecretKey: fakepsptest.SecretKey, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	js := testenv.JetStream(t)
	if _, err := stream.Ensure(context.Background(), js, stream.Settings{}); err != nil {
		t.Fatal(err)
	}
	return &rig{db: testenv.DB(t), js: js, psp: psp, provider: provider, pspURL: hs.URL, tenant: "acme"}
}

// start runs a worker until the test ends (or the returned stop is
// called, which waits for it).
func (r *rig) start(t testing.TB, cfg settle.Config) (*settle.Worker, func()) {
	t.Helper()
	if cfg.MinBackoff == 0 {
		cfg.MinBackoff, cfg.MaxBackoff = 50*time.Millisecond, 200*time.Millisecond
	}
	w, err := settle.New(r.db, r.js, r.provider, nil, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("worker Run: %v", err)
				}
			case <-time.After(20 * time.Second):
				t.Errorf("worker did not stop within 20s")
			}
		})
	}
	t.Cleanup(stop)
	return w, stop
}

// order creates a pending order of 2 × 1250 EUR.
func (r *rig) order(t testing.TB) uuid.UUID {
	t.Helper()
	return r.orderIn(t, "EUR")
}

// orderIn creates a pending order of 25.00 in currency.
func (r *rig) orderIn(t testing.TB, currency string) uuid.UUID {
	t.Helper()
	var o domain.Order
	err := postgres.InTx(context.Background(), r.db, func(tx pgx.Tx) error {
		var err error
		o, err = command.NewCreateOrderHandler().Handle(context.Background(), tx, command.CreateOrder{
			TenantID: r.tenant, Key: uuid.NewString(),
			NewOrder: domain.NewOrder{CustomerID: "c-1", Currency: currency, Lines: []domain.Line{{SKU: "sku-1", Quantity: 2, UnitPrice: 1250}}},
		})
		return err
	})
	if err != nil {
		t.Fatalf("create order: %v", err)
	}
	return o.ID
}

func (r *rig) pay(t testing.TB, id uuid.UUID, method string) {
	t.Helper()
	err := postgres.InTx(context.Background(), r.db, func(tx pgx.Tx) error {
		_, err := command.NewPayOrderHandler().Handle(context.Background(), tx, command.PayOrder{TenantID: r.tenant, OrderID: id, PaymentMethod: method})
		return err
	})
	if err != nil {
		t.Fatalf("pay order: %v", err)
	}
}

// payMany creates n orders of r.tenant, pays each and publishes its
// payment.requested, in that order.
func (r *rig) payMany(t testing.TB, n int) []uuid.UUID {
	t.Helper()
	ids := make([]uuid.UUID, n)
	for i := range ids {
		ids[i] = r.order(t)
		r.pay(t, ids[i], domain.DefaultPaymentMethod)
		r.publish(t, ids[i], domain.TypePaymentRequested, 0)
	}
	return ids
}

func (r *rig) cancel(t testing.TB, id uuid.UUID) {
	t.Helper()
	err := postgres.InTx(context.Background(), r.db, func(tx pgx.Tx) error {
		_, err := command.NewCancelOrderHandler().Handle(context.Background(), tx, command.CancelOrder{TenantID: r.tenant, OrderID: id, Reason: "changed my mind"})
		return err
	})
	if err != nil {
		t.Fatalf("cancel order: %v", err)
	}
}

// publish publishes the order's newest event of eventType as the relay
// does; each copy > 0 is published again under another message id, as a
// republish beyond the duplicate window would be.
func (r *rig) publish(t testing.TB, id uuid.UUID, eventType string, copies int) {
	t.Helper()
	var ev uuid.UUID
	var payload []byte
	if err := r.db.QueryRow(context.Background(), `SELECT id, payload::text FROM outbox WHERE aggregate_id = $1 AND event_type = $2
ORDER BY aggregate_version DESC LIMIT 1`, id, eventType).Scan(&ev, &payload); err != nil {
		t.Fatalf("read %s of order %s: %v", eventType, id, err)
	}
	for i := 0; i <= copies; i++ {
		msgID := ev.String()
		if i > 0 {
			msgID += "-copy-" + string(rune('0'+i))
		}
		if _, err := r.js.Publish(context.Background(), stream.Subject(eventType), payload, jetstream.WithMsgID(msgID)); err != nil {
			t.Fatalf("publish %s: %v", eventType, err)
		}
	}
}

func (r *rig) get(t testing.TB, id uuid.UUID) (status string, refund string, version int64) {
	t.Helper()
	if err := r.db.QueryRow(context.Background(), `SELECT status, coalesce(refund->>'status', ''), version FROM orders WHERE id = $1`, id).
		Scan(&status, &refund, &version); err != nil {
		t.Fatalf("read order: %v", err)
	}
	return status, refund, version
}

func (r *rig) waitStatus(t testing.TB, id uuid.UUID, want string, within time.Duration) {
	t.Helper()
	testenv.Eventually(t, within, "order "+want, func() bool { s, _, _ := r.get(t, id); return s == want })
}

// waitRefund waits until the order's refund is no longer pending and
// fails the test unless it is then want.
func (r *rig) waitRefund(t testing.TB, id uuid.UUID, want string) {
	t.Helper()
	testenv.Eventually(t, 15*time.Second, "the refund recorded", func() bool {
		_, rf, _ := r.get(t, id)
		return rf != "pending"
	})
	if _, rf, _ := r.get(t, id); rf != want {
		t.Fatalf("refund %s, want %s", rf, want)
	}
}

// waitSettled waits until every intent published to consumer is settled:
// none left to deliver or pending in its window, and none parked (a copy
// that failed, say 409 while another copy held its key, is parked on its
// backoff and acked before it is tried again).
func (r *rig) waitSettled(t testing.TB, consumer string) {
	t.Helper()
	testenv.Eventually(t, 15*time.Second, "every intent of "+consumer+" settled", func() bool {
		info := consumerInfo(r.js, consumer)
		if info == nil || info.NumPending != 0 || info.NumAckPending != 0 {
			return false
		}
		var parked int
		if err := r.db.QueryRow(context.Background(), `SELECT count(*) FROM dead_letters WHERE projection = $1 AND status = 'parked'`,
			consumer).Scan(&parked); err != nil {
			t.Fatal(err)
		}
		return parked == 0
	})
}

// waitDeadLetters waits up to d for the worker's one open dead letter
// (what names the wait) and returns the list.
func (r *rig) waitDeadLetters(t testing.TB, d time.Duration, what string) []settle.DeadLetter {
	t.Helper()
	var dls []settle.DeadLetter
	testenv.Eventually(t, d, what, func() bool {
		var err error
		if dls, err = settle.ListDeadLetters(context.Background(), r.db, false); err != nil {
			t.Fatal(err)
		}
		return len(dls) == 1
	})
	return dls
}

// succeededCharges counts the provider's succeeded charges of key.
func succeededCharges(l fakepsp.Ledger, key string) (n int) {
	for _, c := range l.Charges {
		if c.IdempotencyKey != nil && *c.IdempotencyKey == key && c.Status == "succeeded" {
			n++
		}
	}
	return n
}

func (r *rig) assertOneCharge(t testing.TB, id uuid.UUID) {
	t.Helper()
	l := fakepsptest.Ledger(t, r.psp)
	succeeded := 0
	for _, c := range l.Charges {
		if c.Metadata["order_id"] == id.String() && c.Status == "succeeded" {
			succeeded++
		}
	}
	if succeeded != 1 {
		t.Fatalf("the provider has %d succeeded charges of order %s, want 1: %+v", succeeded, id, l.Charges)
	}
	var rows int
	if err := r.db.QueryRow(context.Background(), `SELECT count(*) FROM payments WHERE order_id = $1 AND kind = 'charge' AND status = 'succeeded'`, id).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != 1 {
		t.Fatalf("%d succeeded charge rows in payments, want 1", rows)
	}
}

// The provider commits the charge, then drops the connection: the retry
// with the same key gets the same charge, and the order is paid once.
func TestLostResponseRetryGetsTheSameCharge(t *testing.T) {
	t.Parallel()
	r := newRig(t, fakepsp.Faults{LoseNext: 2, LoseMode: fakepsp.LoseClose})
	r.start(t, settle.Config{})
	id := r.order(t)
	r.pay(t, id, domain.DefaultPaymentMethod)
	r.publish(t, id, domain.TypePaymentRequested, 0)
	r.waitStatus(t, id, "paid", 15*time.Second)
	r.assertOneCharge(t, id)
	if lost := r.psp.Stats(); lost.LostResponses < 1 {
		t.Fatalf("no response was lost (%+v): the test proves nothing", lost)
	}
}

// A worker killed after the provider charged and before it recorded the
// outcome, then restarted, charges nothing twice.
func TestWorkerKilledBetweenProviderCallAndCommitChargesOnce(t *testing.T) {
	t.Parallel()
	r := newRig(t, fakepsp.Faults{})
	var killed atomic.Bool
	kill := make(chan struct{})
	_, stop := r.start(t, settle.Config{AckWait: time.Second, AfterProviderCall: func(context.Context, string, uuid.UUID) error {
		if killed.CompareAndSwap(false, true) {
			close(kill)
			return errors.New("killed after the provider call")
		}
		return nil
	}})
	id := r.order(t)
	r.pay(t, id, domain.DefaultPaymentMethod)
	r.publish(t, id, domain.TypePaymentRequested, 0)
	select {
	case <-kill:
	case <-time.After(15 * time.Second):
		t.Fatal("the worker never called the provider")
	}
	stop()
	if s, _, _ := r.get(t, id); s != "payment_pending" {
		t.Fatalf("order is %s after the crash, want payment_pending (nothing recorded)", s)
	}
	if n := succeededCharges(fakepsptest.Ledger(t, r.psp), domain.ChargeKey(r.tenant, id, 1)); n != 1 {
		t.Fatalf("%d charges before the restart, want 1 (the crash came after the provider call)", n)
	}
	r.start(t, settle.Config{AckWait: time.Second})
	r.waitStatus(t, id, "paid", 15*time.Second)
	r.assertOneCharge(t, id)
}

// A payment.requested delivered several times (republished beyond the
// duplicate window, and to two workers at once) makes one charge.
func TestDuplicatedPaymentRequestMakesOneCharge(t *testing.T) {
	t.Parallel()
	r := newRig(t, fakepsp.Faults{LatencyMS: 100})
	r.start(t, settle.Config{})
	r.start(t, settle.Config{})
	id := r.order(t)
	r.pay(t, id, domain.DefaultPaymentMethod)
	r.publish(t, id, domain.TypePaymentRequested, 3)
	r.waitStatus(t, id, "paid", 15*time.Second)
	// every copy is consumed (the stream holds four)
	r.waitSettled(t, settle.ChargeConsumer)
	r.assertOneCharge(t, id)
	if _, _, v := r.get(t, id); v != 3 {
		t.Fatalf("order version %d, want 3 (created, payment requested, paid)", v)
	}
}

// A decline makes the order payment_failed; paying again (a new attempt,
// a new key) ends paid, with exactly one succeeded charge.
func TestDeclinedThenRetriedEndsPaidWithOneCharge(t *testing.T) {
	t.Parallel()
	r := newRig(t, fakepsp.Faults{})
	w, _ := r.start(t, settle.Config{})
	id := r.order(t)
	r.pay(t, id, "pm_card_chargeDeclined")
	r.publish(t, id, domain.TypePaymentRequested, 0)
	r.waitStatus(t, id, "payment_failed", 15*time.Second)
	r.pay(t, id, domain.DefaultPaymentMethod)
	r.publish(t, id, domain.TypePaymentRequested, 0)
	r.waitStatus(t, id, "paid", 15*time.Second)
	r.assertOneCharge(t, id)
	if s := w.Stats(); s.ChargesDeclined != 1 || s.ChargesSucceeded != 1 {
		t.Fatalf("stats %+v, want one decline and one success", s)
	}
}

// Cancelling a paid order refunds it once, however often the intent is
// delivered.
func TestRefundAfterCancelIsMadeOnce(t *testing.T) {
	t.Parallel()
	r := newRig(t, fakepsp.Faults{})
	r.start(t, settle.Config{})
	id := r.order(t)
	r.pay(t, id, domain.DefaultPaymentMethod)
	r.publish(t, id, domain.TypePaymentRequested, 0)
	r.waitStatus(t, id, "paid", 15*time.Second)
	r.cancel(t, id)
	r.publish(t, id, domain.TypeRefundRequested, 2)
	testenv.Eventually(t, 15*time.Second, "refund succeeded", func() bool { _, rf, _ := r.get(t, id); return rf == "succeeded" })
	r.waitSettled(t, settle.RefundConsumer) // every copy, parked ones too (a racing copy may get 409: key in use)
	l := fakepsptest.Ledger(t, r.psp)
	if len(l.Refunds) != 1 || l.Refunds[0].Amount != 2500 || l.Refunds[0].Status != "succeeded" {
		t.Fatalf("refunds at the provider: %+v, want one of 2500", l.Refunds)
	}
}

// A provider that fails keeps the order payment_pending, retried with the
// same key; nothing is lost, and it completes once the provider is back.
func TestProviderDownThenBack(t *testing.T) {
	t.Parallel()
	r := newRig(t, fakepsp.Faults{ErrorRate: 1})
	w, _ := r.start(t, settle.Config{MaxDeliver: 1000})
	id := r.order(t)
	r.pay(t, id, domain.DefaultPaymentMethod)
	r.publish(t, id, domain.TypePaymentRequested, 0)
	testenv.Eventually(t, 15*time.Second, "transient failures", func() bool { return w.Stats().ChargeTransient >= 3 })
	if s, _, _ := r.get(t, id); s != "payment_pending" {
		t.Fatalf("order is %s while the provider fails, want payment_pending", s)
	}
	if err := r.psp.SetFaults(fakepsp.Faults{}); err != nil {
		t.Fatal(err)
	}
	r.waitStatus(t, id, "paid", 15*time.Second)
	r.assertOneCharge(t, id)
}

// A permanent provider failure dead-letters the intent at once; `retry`
// settles it after the cause is fixed, with the same key.
func TestPermanentFailureIsDeadLetteredAndRetried(t *testing.T) {
	t.Parallel()
	r := newRig(t, fakepsp.Faults{})
	// A live key the test provider refuses (401): no retry cures it. (An
	// unknown payment method is the customer's to fix: a decline.)
	wrongKey, err := payment.NewStripe(payment.Config{BaseURL: r.pspURL, SecretKey: "sk_live_not_here", Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	r.provider = wrongKey
	w, stop := r.start(t, settle.Config{})
	id := r.order(t)
	r.pay(t, id, domain.DefaultPaymentMethod)
	r.publish(t, id, domain.TypePaymentRequested, 0)
	dls := r.waitDeadLetters(t, 15*time.Second, "a dead letter")
	if dls[0].Consumer != settle.ChargeConsumer || dls[0].Deliveries != 1 {
		t.Fatalf("dead letter %+v: want the charge consumer's, on the first delivery", dls[0])
	}
	if err := w.RetryDeadLetter(context.Background(), dls[0].ID); err == nil {
		t.Fatal("retry of a still-refused charge succeeded")
	}
	// Stripe's search may not show a charge of the last minute yet: no
	// discard of a charge's dead letter younger than that.
	if _, err := w.DiscardDeadLetter(context.Background(), dls[0].ID); err == nil || !strings.Contains(err.Error(), "may not show a charge made in the last 1m0s") {
		t.Fatalf("discard of a dead letter younger than the search lag: %v, want refused", err)
	}
	// The worker cannot ask the provider whether it charged: no discard.
	noLag, err := settle.New(r.db, nil, wrongKey, nil, settle.Config{ProviderSearchLag: -1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := noLag.DiscardDeadLetter(context.Background(), dls[0].ID); err == nil || !strings.Contains(err.Error(), "cannot tell whether the provider charged") {
		t.Fatalf("discard with a key the provider refuses: %v, want refused", err)
	}
	if s, _, _ := r.get(t, id); s != "payment_pending" {
		t.Fatalf("order %s after a refused discard, want payment_pending", s)
	}
	// With the right key, the retry charges; here the operator discards
	// instead: the provider holds no charge under the intent's key, so
	// the attempt is recorded as declined and the order can be paid again.
	fixed, err := settle.New(r.db, nil, r.rightProvider(t), nil, settle.Config{ProviderSearchLag: -1})
	if err != nil {
		t.Fatal(err)
	}
	outcome, err := fixed.DiscardDeadLetter(context.Background(), dls[0].ID)
	if err != nil || !strings.Contains(outcome, "declined (discarded)") {
		t.Fatalf("discard: %q, %v", outcome, err)
	}
	if _, err := fixed.DiscardDeadLetter(context.Background(), dls[0].ID); !errors.Is(err, settle.ErrNoDeadLetter) {
		t.Fatalf("second discard: %v, want ErrNoDeadLetter", err)
	}
	if s, _, _ := r.get(t, id); s != "payment_failed" {
		t.Fatalf("order %s after the discard, want payment_failed", s)
	}
	if l := fakepsptest.Ledger(t, r.psp); len(l.Charges) != 0 {
		t.Fatalf("the provider holds charges %+v, want none", l.Charges)
	}
	stop()
	r.provider = r.rightProvider(t)
	r.start(t, settle.Config{})
	r.pay(t, id, domain.DefaultPaymentMethod)
	r.publish(t, id, domain.TypePaymentRequested, 0)
	r.waitStatus(t, id, "paid", 15*time.Second)
	r.assertOneCharge(t, id)
}

// rightProvider is an adapter on the rig's provider with its right key.
func (r *rig) rightProvider(t testing.TB) settle.Provider {
	t.Helper()
	p, err := payment.NewStripe(payment.Config{BaseURL: r.pspURL, SecretKey: fakepsptest.SecretKey, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// chargedButRefused makes each charge at the provider, then answers as if
// the provider had refused it for good: a dead letter the provider holds a
// charge of (as an answer lost to a misconfigured proxy would leave).
type chargedButRefused struct{ settle.Provider }

func (c chargedButRefused) Charge(ctx context.Context, r payment.ChargeRequest) (payment.Charge, error) {
	if _, err := c.Provider.Charge(ctx, r); err != nil {
		return payment.Charge{}, err
	}
	return payment.Charge{}, fmt.Errorf("%w: 400 made up", payment.ErrPermanent)
}

// A discard of a dead letter the provider holds a succeeded charge of
// records that charge, as a retry would (the customer was charged: the
// order is paid, and can be cancelled and refunded), not a decline.
func TestADiscardOfAChargeTheProviderMadeRecordsIt(t *testing.T) {
	t.Parallel()
	r := newRig(t, fakepsp.Faults{})
	r.provider = chargedButRefused{r.provider}
	w, _ := r.start(t, settle.Config{ProviderSearchLag: -1})
	id := r.order(t)
	r.pay(t, id, domain.DefaultPaymentMethod)
	r.publish(t, id, domain.TypePaymentRequested, 0)
	dl := r.waitDeadLetters(t, 15*time.Second, "a dead letter")[0]

	outcome, err := w.DiscardDeadLetter(context.Background(), dl.ID)
	if err != nil || !strings.Contains(outcome, "charge attempt 1 as succeeded") {
		t.Fatalf("discard of a charge the provider made: %q, %v; want it recorded", outcome, err)
	}
	r.waitStatus(t, id, "paid", 15*time.Second)
	r.assertOneCharge(t, id)
}

// A discard waits out the provider's search lag from the intent's last
// try, not from when its dead letter was written: an operator's retry
// that reached the provider (and failed) just now could have charged.
func TestADiscardWaitsOutTheSearchLagAfterTheLastRetry(t *testing.T) {
	t.Parallel()
	r := newRig(t, fakepsp.Faults{})
	r.provider = searchLags{chargedButRefused{r.provider}}
	w, _ := r.start(t, settle.Config{})
	id := r.order(t)
	r.pay(t, id, domain.DefaultPaymentMethod)
	r.publish(t, id, domain.TypePaymentRequested, 0)
	dl := r.waitDeadLetters(t, 15*time.Second, "a dead letter")[0]
	if _, err := r.db.Exec(context.Background(), `UPDATE dead_letters SET created_at = now() - interval '10 minutes' WHERE id = $1`, dl.ID); err != nil {
		t.Fatal(err)
	}
	if err := w.RetryDeadLetter(context.Background(), dl.ID); err == nil {
		t.Fatal("retry of a charge answered with a permanent failure succeeded")
	}
	if _, err := w.DiscardDeadLetter(context.Background(), dl.ID); err == nil || !strings.Contains(err.Error(), "its last try was") {
		t.Fatalf("discard right after a retry reached the provider: %v, want refused for the search lag", err)
	}
}

// searchLags finds no charge by key, as Stripe's search does for a
// charge younger than a minute.
type searchLags struct{ settle.Provider }

func (searchLags) FindCharge(context.Context, string) (payment.Charge, bool, error) {
	return payment.Charge{}, false, nil
}

// An intent no command of ours wrote (here a copy of an order's
// payment.requested re-stamped with another tenant) is dead-lettered
// without asking the provider for anything (it used to be charged, then
// found unrecordable), and its dead letter is discarded with nothing
// recorded.
func TestAForgedIntentIsDeadLetteredWithNothingCharged(t *testing.T) {
	t.Parallel()
	r := newRig(t, fakepsp.Faults{})
	w, _ := r.start(t, settle.Config{ProviderSearchLag: -1})
	id := r.order(t)
	r.pay(t, id, domain.DefaultPaymentMethod)
	var env map[string]any
	var payload []byte
	if err := r.db.QueryRow(context.Background(), `SELECT payload::text FROM outbox WHERE aggregate_id = $1 AND event_type = $2`, id, domain.TypePaymentRequested).Scan(&payload); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(payload, &env); err != nil {
		t.Fatal(err)
	}
	env["tenant_id"], env["id"] = "ghost", uuid.NewString()
	env["data"].(map[string]any)["payment_key"] = domain.ChargeKey("ghost", id, 1)
	forged, err := json.Marshal(env)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.js.Publish(context.Background(), stream.Subject(domain.TypePaymentRequested), forged); err != nil {
		t.Fatal(err)
	}
	dl := r.waitDeadLetters(t, 15*time.Second, "a dead letter")[0]
	if !strings.Contains(dl.Error, "nothing sent to the provider") {
		t.Fatalf("dead letter %q, want it to say nothing was sent to the provider", dl.Error)
	}
	if l := fakepsptest.Ledger(t, r.psp); len(l.Charges) != 0 {
		t.Fatalf("the provider holds %d charges, want none: %+v", len(l.Charges), l.Charges)
	}
	outcome, err := w.DiscardDeadLetter(context.Background(), dl.ID)
	if err != nil || !strings.Contains(outcome, "nothing recorded") || strings.Contains(outcome, "the provider holds") {
		t.Fatalf("discard: %q, %v; want nothing recorded, and no charge at the provider", outcome, err)
	}
	if dls, err := settle.ListDeadLetters(context.Background(), r.db, false); err != nil || len(dls) != 0 {
		t.Fatalf("open dead letters %+v (%v), want none", dls, err)
	}
}

// Intents that no order awaits move no money at the provider (G8: its
// ledger equals our orders), whoever published them: a second attempt of a
// paid order, another tenant's order, a refund of an order never
// cancelled, and a refund of a cancelled order naming another order's
// charge. Each is dead-lettered with nothing sent; the real ones settle.
func TestIntentsNoOrderAwaitsMoveNoMoney(t *testing.T) {
	t.Parallel()
	r := newRig(t, fakepsp.Faults{})
	r.start(t, settle.Config{})
	ctx := context.Background()
	paid := r.order(t)
	r.pay(t, paid, domain.DefaultPaymentMethod)
	r.publish(t, paid, domain.TypePaymentRequested, 0)
	r.waitStatus(t, paid, "paid", 15*time.Second)
	var chargeID string
	if err := r.db.QueryRow(ctx, `SELECT payment->>'charge_id' FROM orders WHERE id = $1`, paid).Scan(&chargeID); err != nil {
		t.Fatal(err)
	}
	pending := r.order(t)   // never paid
	cancelled := r.order(t) // cancelled unpaid: no refund pending
	r.cancel(t, cancelled)
	now := time.Now().UTC()
	publish := func(typ, tenant string, order uuid.UUID, version int64, data any) {
		t.Helper()
		d, err := json.Marshal(data)
		if err != nil {
			t.Fatal(err)
		}
		env := domain.Envelope{ID: uuid.Must(uuid.NewV7()), Type: typ, SchemaVersion: domain.SchemaVersion, TenantID: tenant,
			AggregateID: order, AggregateVersion: version, OccurredAt: now, Data: d}
		body, err := json.Marshal(env)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := r.js.Publish(ctx, stream.Subject(typ), body, jetstream.WithMsgID(env.ID.String())); err != nil {
			t.Fatal(err)
		}
	}
	tr := domain.Transition{CustomerID: "c-1", Currency: "EUR", Total: 2500, From: domain.StatusPending, Status: domain.StatusPaymentPending, At: now}
	charge := func(tenant string, order uuid.UUID, attempt int) domain.PaymentRequested {
		return domain.PaymentRequested{Transition: tr, Attempt: attempt, PaymentKey: domain.ChargeKey(tenant, order, attempt), Amount: 2500, PaymentMethod: domain.DefaultPaymentMethod}
	}
	refund := func(order uuid.UUID) domain.RefundRequested {
		return domain.RefundRequested{CustomerID: "c-1", Attempt: 1, RefundKey: domain.RefundKey(r.tenant, order, 1), ChargeID: chargeID, Amount: 2500, Currency: "EUR", At: now}
	}
	publish(domain.TypePaymentRequested, r.tenant, paid, 4, charge(r.tenant, paid, 2))
	publish(domain.TypePaymentRequested, "other", paid, 2, charge("other", paid, 1))
	publish(domain.TypePaymentRequested, r.tenant, pending, 2, charge(r.tenant, pending, 1))
	publish(domain.TypeRefundRequested, r.tenant, paid, 4, refund(paid))
	publish(domain.TypeRefundRequested, r.tenant, cancelled, 3, refund(cancelled))
	var dls []settle.DeadLetter
	testenv.Eventually(t, 15*time.Second, "five dead letters", func() bool {
		dls, _ = settle.ListDeadLetters(ctx, r.db, false)
		return len(dls) == 5
	})
	for _, dl := range dls {
		if !strings.Contains(dl.Error, "nothing sent to the provider") {
			t.Errorf("dead letter %q, want it to say nothing was sent", dl.Error)
		}
	}
	l := fakepsptest.Ledger(t, r.psp)
	if len(l.Charges) != 1 || len(l.Refunds) != 0 {
		t.Fatalf("the provider holds %d charges and %d refunds; the orders show 1 charge and no refund", len(l.Charges), len(l.Refunds))
	}
	r.assertOneCharge(t, paid)
	if st, _, _ := r.get(t, pending); st != "pending" {
		t.Fatalf("the unpaid order is %s", st)
	}
}

// refundRefused refuses every refund for good without calling the provider.
type refundRefused struct{ settle.Provider }

func (refundRefused) Refund(context.Context, payment.RefundRequest) (payment.Refund, error) {
	return payment.Refund{}, fmt.Errorf("%w: 400 made up", payment.ErrPermanent)
}

// A discarded refund the provider holds none of is recorded as failed, so
// the order says its refund failed (the provider's ledger: one charge, no
// refund), not pending for good; one the provider made is refused.
func TestADiscardedRefundIsRecordedAsFailed(t *testing.T) {
	t.Parallel()
	r := newRig(t, fakepsp.Faults{})
	right := r.provider
	r.provider = refundRefused{right}
	w, _ := r.start(t, settle.Config{})
	id := r.order(t)
	r.pay(t, id, domain.DefaultPaymentMethod)
	r.publish(t, id, domain.TypePaymentRequested, 0)
	r.waitStatus(t, id, "paid", 15*time.Second)
	r.cancel(t, id)
	r.publish(t, id, domain.TypeRefundRequested, 0)
	dl := r.waitDeadLetters(t, 15*time.Second, "the refund dead-lettered")[0]

	outcome, err := w.DiscardDeadLetter(context.Background(), dl.ID)
	if err != nil || !strings.Contains(outcome, "refund attempt 1 as failed") {
		t.Fatalf("discard: %q, %v", outcome, err)
	}
	if s, rf, _ := r.get(t, id); s != "cancelled" || rf != "failed" {
		t.Fatalf("order %s, refund %s after the discard, want cancelled, failed", s, rf)
	}
	if l := fakepsptest.Ledger(t, r.psp); len(l.Refunds) != 0 {
		t.Fatalf("the provider holds refunds %+v, want none", l.Refunds)
	}
}

// An intent whose tenant holds a NUL is dead-lettered on its first
// delivery and terminated, not redelivered for ever: its dead letter used
// to name the tenant, which no text column holds, so it could never be
// written. (No command writes such a tenant: a forged or broken stream.)
func TestAnIntentOfANULTenantIsDeadLetteredOnce(t *testing.T) {
	t.Parallel()
	r := newRig(t, fakepsp.Faults{})
	r.start(t, settle.Config{MaxDeliver: 2})
	data, err := json.Marshal(domain.PaymentRequested{Attempt: 1, PaymentKey: "bogus", Amount: 100, PaymentMethod: domain.DefaultPaymentMethod,
		Transition: domain.Transition{CustomerID: "c", Currency: "EUR", Total: 100, From: "pending", Status: "payment_pending", At: time.Now()}})
	if err != nil {
		t.Fatal(err)
	}
	env := domain.Envelope{ID: uuid.Must(uuid.NewV7()), Type: domain.TypePaymentRequested, SchemaVersion: domain.SchemaVersion,
		TenantID: "acme\x00", AggregateID: uuid.Must(uuid.NewV7()), AggregateVersion: 2, OccurredAt: time.Now(), Data: data}
	b, err := json.Marshal(env)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.js.Publish(context.Background(), stream.Subject(domain.TypePaymentRequested), b, jetstream.WithMsgID(env.ID.String())); err != nil {
		t.Fatal(err)
	}
	dls := r.waitDeadLetters(t, 15*time.Second, "a dead letter")
	if dls[0].Deliveries != 1 {
		t.Fatalf("dead letter %+v: want it on the first delivery", dls[0])
	}
	testenv.Eventually(t, 10*time.Second, "nothing awaiting an ack", func() bool {
		info := consumerInfo(r.js, settle.ChargeConsumer)
		return info.NumAckPending == 0 && info.NumPending == 0
	})
}

// Observe gets the timings of each outcome recorded once, however many
// copies of its intent arrive: a copy found recorded (before the provider
// call or, racing, after it) is neither timed nor counted again (racing
// copies used to count a charge three times). The provider's added
// latency shows in the provider part, and the whole is at least its parts.
func TestObserveTimesEachRecordedOutcomeOnce(t *testing.T) {
	t.Parallel()
	const latency = 100 * time.Millisecond
	r := newRig(t, fakepsp.Faults{LatencyMS: int(latency / time.Millisecond)})
	var mu sync.Mutex
	timings := map[string][]settle.Timing{}
	w, _ := r.start(t, settle.Config{Observe: func(consumer string, tm settle.Timing) {
		mu.Lock()
		defer mu.Unlock()
		timings[consumer] = append(timings[consumer], tm)
	}})
	id := r.order(t)
	r.pay(t, id, domain.DefaultPaymentMethod)
	r.publish(t, id, domain.TypePaymentRequested, 2)
	r.waitStatus(t, id, "paid", 15*time.Second)
	r.cancel(t, id)
	r.publish(t, id, domain.TypeRefundRequested, 2)
	testenv.Eventually(t, 15*time.Second, "refund succeeded", func() bool { _, rf, _ := r.get(t, id); return rf == "succeeded" })
	for _, name := range []string{settle.ChargeConsumer, settle.RefundConsumer} {
		r.waitSettled(t, name)
	}
	// The counters, like the timings, count each outcome once.
	if s := w.Stats(); s.ChargesSucceeded != 1 || s.RefundsSucceeded != 1 || s.Duplicates != 4 {
		t.Fatalf("stats %+v: want 1 charge, 1 refund, 4 copies found recorded", s)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, name := range []string{settle.ChargeConsumer, settle.RefundConsumer} {
		got := timings[name]
		if len(got) != 1 {
			t.Fatalf("%s: %d timings for one intent delivered 3 times, want 1: %+v", name, len(got), got)
		}
		tm := got[0]
		if tm.Provider < latency || tm.Record <= 0 || tm.Settled < tm.Provider+tm.Record {
			t.Fatalf("%s: timing %+v: want provider ≥ %s (its added latency), record > 0, settled ≥ provider + record", name, tm, latency)
		}
	}
}

// A payment method the provider does not know fails the payment (the
// customer can pay again with another) instead of being dead-lettered,
// which left the order payment_pending with nothing able to move it.
func TestUnknownPaymentMethodFailsThePaymentAndAnotherPays(t *testing.T) {
	t.Parallel()
	r := newRig(t, fakepsp.Faults{})
	w, _ := r.start(t, settle.Config{})
	id := r.order(t)
	r.pay(t, id, "pm_nonexist")
	r.publish(t, id, domain.TypePaymentRequested, 0)
	r.waitStatus(t, id, "payment_failed", 15*time.Second)
	var reason string
	if err := r.db.QueryRow(context.Background(), `SELECT payment->>'decline_code' FROM orders WHERE id = $1`, id).Scan(&reason); err != nil {
		t.Fatal(err)
	}
	if reason != "resource_missing" {
		t.Fatalf("decline code %q, want resource_missing", reason)
	}
	r.pay(t, id, domain.DefaultPaymentMethod)
	r.publish(t, id, domain.TypePaymentRequested, 0)
	r.waitStatus(t, id, "paid", 15*time.Second)
	r.assertOneCharge(t, id)
	if s := w.Stats(); s.ChargeDeadLettered != 0 || s.ChargesDeclined != 1 || s.ChargesSucceeded != 1 {
		t.Fatalf("stats %+v, want one decline, one success, no dead letter", s)
	}
}

// A currency the provider does not take fails the payment as a business
// outcome (decline currency_not_supported) instead of a dead letter, which
// left the order payment_pending for good: neither payable again nor
// cancellable. The failed order can be cancelled.
func TestACurrencyTheProviderRefusesFailsThePayment(t *testing.T) {
	t.Parallel()
	r := newRig(t, fakepsp.Faults{})
	w, _ := r.start(t, settle.Config{})
	id := r.orderIn(t, "KPW")
	r.pay(t, id, domain.DefaultPaymentMethod)
	r.publish(t, id, domain.TypePaymentRequested, 0)
	r.waitStatus(t, id, "payment_failed", 15*time.Second)
	var code string
	if err := r.db.QueryRow(context.Background(), `SELECT payment->>'decline_code' FROM orders WHERE id = $1`, id).Scan(&code); err != nil {
		t.Fatal(err)
	}
	if code != payment.CurrencyNotSupported {
		t.Fatalf("decline code %q, want %s", code, payment.CurrencyNotSupported)
	}
	// Counted just after the commit the status shows.
	testenv.Eventually(t, 5*time.Second, "one decline counted", func() bool { return w.Stats().ChargesDeclined == 1 })
	if s := w.Stats(); s.ChargeDeadLettered != 0 || s.ChargesDeclined != 1 {
		t.Fatalf("stats %+v, want one decline, no dead letter", s)
	}
	err := postgres.InTx(context.Background(), r.db, func(tx pgx.Tx) error {
		_, err := command.NewCancelOrderHandler().Handle(context.Background(), tx, command.CancelOrder{TenantID: r.tenant, OrderID: id, Reason: "cannot pay"})
		return err
	})
	if err != nil {
		t.Fatalf("cancel the order whose payment failed: %v", err)
	}
}

// An intent for an amount no provider charge can be (queued before pay
// refused such totals: 0, or above domain.MaxChargeAmount, which the
// provider refuses with a 400) fails the payment as a business outcome,
// without a provider call, instead of being dead-lettered, which left the
// order payment_pending for good (cancel 409, pay a no-op). Paying it again
// is then refused (domain.ErrAmountNotChargeable).
func TestUnchargeableAmountQueuedBeforeTheCheckFailsThePayment(t *testing.T) {
	t.Parallel()
	r := newRig(t, fakepsp.Faults{})
	w, _ := r.start(t, settle.Config{})
	for _, amount := range []int64{0, domain.MaxChargeAmount + 1, domain.MaxAmount} {
		id := r.order(t)
		r.pay(t, id, domain.DefaultPaymentMethod)
		// As if the order and its intent had been written without the check.
		if _, err := r.db.Exec(context.Background(), `
WITH o AS (UPDATE orders SET total = $2 WHERE id = $1)
UPDATE outbox SET payload = jsonb_set(payload, '{data,amount}', to_jsonb($2::bigint))
WHERE aggregate_id = $1 AND event_type = 'payment.requested'`, id, amount); err != nil {
			t.Fatal(err)
		}
		r.publish(t, id, domain.TypePaymentRequested, 0)
		r.waitStatus(t, id, "payment_failed", 15*time.Second)
		var code string
		if err := r.db.QueryRow(context.Background(), `SELECT payment->>'decline_code' FROM orders WHERE id = $1`, id).Scan(&code); err != nil {
			t.Fatal(err)
		}
		if code != settle.AmountNotChargeable {
			t.Fatalf("amount %d: decline code %q, want %s", amount, code, settle.AmountNotChargeable)
		}
		err := postgres.InTx(context.Background(), r.db, func(tx pgx.Tx) error {
			_, err := command.NewPayOrderHandler().Handle(context.Background(), tx, command.PayOrder{TenantID: r.tenant, OrderID: id, PaymentMethod: domain.DefaultPaymentMethod})
			return err
		})
		if !errors.Is(err, domain.ErrAmountNotChargeable) {
			t.Fatalf("amount %d: pay again: %v, want ErrAmountNotChargeable", amount, err)
		}
	}
	if l := fakepsptest.Ledger(t, r.psp); len(l.Charges) != 0 {
		t.Fatalf("the provider was asked to charge: %+v", l.Charges)
	}
	if s := w.Stats(); s.ChargeDeadLettered != 0 || s.ChargesDeclined != 3 {
		t.Fatalf("stats %+v, want three declines, no dead letter", s)
	}
}

// slowFor is a provider whose charges of one tenant hang until release.
type slowFor struct {
	settle.Provider
	tenant  string // "": every tenant
	release chan struct{}
	blocked atomic.Int64 // charges of tenant that were held
	// failOnce, when set, fails the first charge of each key of tenant
	// (after its release) with a transient error, nothing charged.
	failOnce bool
	failed   sync.Map // idempotency keys failed once
}

func (s *slowFor) Charge(ctx context.Context, r payment.ChargeRequest) (payment.Charge, error) {
	if s.tenant == "" || r.Metadata["tenant_id"] == s.tenant {
		s.blocked.Add(1)
		select {
		case <-s.release:
		case <-ctx.Done():
			return payment.Charge{}, fmt.Errorf("%w: %v", payment.ErrTransient, ctx.Err())
		}
		if _, again := s.failed.LoadOrStore(r.IdempotencyKey, true); s.failOnce && !again {
			return payment.Charge{}, fmt.Errorf("%w: the provider is busy", payment.ErrTransient)
		}
	}
	return s.Provider.Charge(ctx, r)
}

// releaseOnCleanup returns the function that lets the tenant's held
// charges go on (once, however often called), and calls it when the test
// ends, before a worker started earlier stops (cleanups run last first).
func (s *slowFor) releaseOnCleanup(t testing.TB) func() {
	var once sync.Once
	release := func() { once.Do(func() { close(s.release) }) }
	t.Cleanup(release)
	return release
}

// G9: a tenant whose provider calls hang holds at most its share of the
// worker's slots; the excess is deferred, so another tenant's payment is
// made meanwhile (all 32 slots used to sit in the slow tenant's calls).
// Deferring is not failing: with MaxDeliver 2, the slow tenant's intents,
// each deferred many times and then failing once (transiently) when its
// provider answers again, are retried rather than dead-lettered, and every
// one of its orders is paid, with one charge each.
func TestSlowTenantHoldsOnlyItsShareOfTheSlots(t *testing.T) {
	t.Parallel()
	r := newRig(t, fakepsp.Faults{})
	slow := &slowFor{Provider: r.provider, tenant: "slowco", release: make(chan struct{}), failOnce: true}
	r.provider = slow
	const deferDelay = 50 * time.Millisecond
	w, _ := r.start(t, settle.Config{MaxDeliver: 2, DeferDelay: deferDelay})
	release := slow.releaseOnCleanup(t)

	r.tenant = "slowco"
	slowOrders := r.payMany(t, settle.DefaultConcurrency+8)
	share := int64(settle.DefaultTenantShare * settle.DefaultConcurrency)
	testenv.Eventually(t, 15*time.Second, "slowco holding its share of the slots", func() bool { return slow.blocked.Load() >= share })

	r.tenant = "acme"
	id := r.order(t)
	r.pay(t, id, domain.DefaultPaymentMethod)
	r.publish(t, id, domain.TypePaymentRequested, 0)
	r.waitStatus(t, id, "paid", 5*time.Second)
	r.assertOneCharge(t, id)

	// The excess is parked out of the consumer's window (re-drives, one
	// every deferDelay, find slowco still at its share meanwhile).
	testenv.Eventually(t, 15*time.Second, "slowco's excess parked", func() bool {
		return w.Stats().Parked >= int64(len(slowOrders))-share
	})
	if n := slow.blocked.Load(); n != share {
		t.Fatalf("slowco has %d charges in the provider, want its share %d", n, share)
	}
	release()
	for _, o := range slowOrders {
		r.waitStatus(t, o, "paid", 30*time.Second)
		r.assertOneCharge(t, o)
	}
	dls, err := settle.ListDeadLetters(context.Background(), r.db, false)
	if err != nil {
		t.Fatal(err)
	}
	if s := w.Stats(); len(dls) != 0 || s.ChargeDeadLettered != 0 || s.ChargesSucceeded != int64(len(slowOrders))+1 {
		t.Fatalf("stats %+v, dead letters %+v: want every order charged once, none dead-lettered", s, dls)
	}
}

// An intent whose provider call outlasts the ack wait is kept in progress:
// it is not delivered again meanwhile (a second copy would go to the
// provider too), so the ack wait can be short and only bounds how long the
// intents of a worker that died wait for another delivery.
func TestAProviderCallLongerThanTheAckWaitIsNotDeliveredAgain(t *testing.T) {
	t.Parallel()
	r := newRig(t, fakepsp.Faults{})
	slow := &slowFor{Provider: r.provider, tenant: "slowco", release: make(chan struct{})}
	r.provider = slow
	w, _ := r.start(t, settle.Config{AckWait: time.Second})
	release := slow.releaseOnCleanup(t)

	r.tenant = "slowco"
	id := r.payMany(t, 1)[0]
	testenv.Eventually(t, 15*time.Second, "the charge held in the provider", func() bool { return slow.blocked.Load() == 1 })
	time.Sleep(3500 * time.Millisecond) // three and a half ack waits, each of which would have redelivered it
	if n := slow.blocked.Load(); n != 1 {
		t.Fatalf("the provider was asked %d times while the first call was in progress, want 1: the intent was delivered again", n)
	}
	release()
	r.waitStatus(t, id, "paid", 10*time.Second)
	r.assertOneCharge(t, id)
	if s := w.Stats(); s.ChargesSucceeded != 1 {
		t.Fatalf("stats %+v: want one charge", s)
	}
}

func TestConfigValidateTenantShare(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		cfg     settle.Config
		wantErr string
	}{
		{settle.Config{}, ""},
		{settle.Config{TenantShare: 1, DeferDelay: 10 * time.Millisecond}, ""},
		{settle.Config{TenantShare: -0.1}, "TenantShare"},
		{settle.Config{TenantShare: 1.5}, "TenantShare"},
		{settle.Config{DeferDelay: time.Millisecond}, "DeferDelay"},
	} {
		err := tt.cfg.Validate()
		if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
			t.Errorf("Validate(%+v) = %v, want an error naming %q", tt.cfg, err, tt.wantErr)
		}
	}
}

// G8: a refund whose answers were lost until it was dead-lettered, retried
// after the provider forgot its key, is found by its key and recorded,
// not refunded anew (which the provider refuses, charge_already_refunded,
// a permanent error: the order's refund stayed pending for good while the
// provider's ledger held a succeeded refund).
func TestRefundDeadLetteredThenRetriedAfterTheKeyExpiredIsRecordedOnce(t *testing.T) {
	t.Parallel()
	r := newRigWith(t, fakepsp.Config{KeyTTL: time.Second})
	w, _ := r.start(t, settle.Config{MaxDeliver: 2})
	id := r.order(t)
	r.pay(t, id, domain.DefaultPaymentMethod)
	r.publish(t, id, domain.TypePaymentRequested, 0)
	r.waitStatus(t, id, "paid", 15*time.Second)

	// Every answer of two deliveries (three attempts each) is lost.
	if err := r.psp.SetFaults(fakepsp.Faults{LoseNext: 6}); err != nil {
		t.Fatal(err)
	}
	r.cancel(t, id)
	r.publish(t, id, domain.TypeRefundRequested, 0)
	dls := r.waitDeadLetters(t, 30*time.Second, "the refund dead-lettered")
	if err := r.psp.SetFaults(fakepsp.Faults{}); err != nil {
		t.Fatal(err)
	}
	if _, rf, _ := r.get(t, id); rf != "pending" {
		t.Fatalf("refund %s before the retry, want pending", rf)
	}
	testenv.Eventually(t, 10*time.Second, "the provider forgets the key", func() bool {
		n, err := r.psp.PurgeExpiredKeys(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return n > 0
	})

	if err := w.RetryDeadLetter(context.Background(), dls[0].ID); err != nil {
		t.Fatalf("retry the dead letter: %v", err)
	}
	if _, rf, _ := r.get(t, id); rf != "succeeded" {
		t.Fatalf("refund %s after the retry, want succeeded", rf)
	}
	l := fakepsptest.Ledger(t, r.psp)
	if len(l.Refunds) != 1 || l.Refunds[0].Status != "succeeded" || l.Refunds[0].Amount != 2500 {
		t.Fatalf("refunds at the provider: %+v, want one of 2500", l.Refunds)
	}
	var rows int
	if err := r.db.QueryRow(context.Background(), `SELECT count(*) FROM payments WHERE order_id = $1 AND kind = 'refund' AND status = 'succeeded'`, id).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != 1 {
		t.Fatalf("%d succeeded refund rows in payments, want 1", rows)
	}
}

// countFinds counts the look-ups of charges by key.
type countFinds struct {
	settle.Provider
	n atomic.Int64
}

func (c *countFinds) FindCharge(ctx context.Context, key string) (payment.Charge, bool, error) {
	c.n.Add(1)
	return c.Provider.FindCharge(ctx, key)
}

// An intent deferred past its tenant's share never reached the provider:
// when it gets a slot, it is charged without a look-up by key first (on
// Stripe a look-up is the search API, rate-limited), although JetStream
// counts each deferral as a delivery.
func TestADeferredIntentIsChargedWithoutALookUp(t *testing.T) {
	t.Parallel()
	r := newRig(t, fakepsp.Faults{})
	slow := &slowFor{Provider: r.provider, tenant: "slowco", release: make(chan struct{})}
	finds := &countFinds{Provider: slow}
	r.provider = finds
	w, _ := r.start(t, settle.Config{Concurrency: 2, TenantShare: 0.5, DeferDelay: 20 * time.Millisecond})
	release := slow.releaseOnCleanup(t)

	r.tenant = "slowco"
	orders := r.payMany(t, 3)
	testenv.Eventually(t, 15*time.Second, "slowco's one slot held and its other intents parked", func() bool {
		return slow.blocked.Load() == 1 && w.Stats().Parked >= 2
	})
	release()
	for _, o := range orders {
		r.waitStatus(t, o, "paid", 15*time.Second)
		r.assertOneCharge(t, o)
	}
	if n := finds.n.Load(); n != 0 {
		t.Errorf("%d look-ups by key for intents that were only deferred before their first call, want 0", n)
	}
}

// loseFirst makes the provider's first charge (refund: its first refund),
// and loses its answer (a transient error to the worker), as a dropped
// connection would. calls counts the calls of that kind.
type loseFirst struct {
	settle.Provider
	refund bool
	calls  atomic.Int64
}

// lost reports whether the answer of a call of the kind lose loses, which
// returned err, is to be lost: the first one's, if it succeeded.
func (l *loseFirst) lost(err error) bool { return l.calls.Add(1) == 1 && err == nil }

var errAnswerLost = fmt.Errorf("%w: the answer was lost", payment.ErrTransient)

func (l *loseFirst) Charge(ctx context.Context, r payment.ChargeRequest) (payment.Charge, error) {
	ch, err := l.Provider.Charge(ctx, r)
	if !l.refund && l.lost(err) {
		return payment.Charge{}, errAnswerLost
	}
	return ch, err
}

func (l *loseFirst) Refund(ctx context.Context, r payment.RefundRequest) (payment.Refund, error) {
	rf, err := l.Provider.Refund(ctx, r)
	if l.refund && l.lost(err) {
		return payment.Refund{}, errAnswerLost
	}
	return rf, err
}

// A refund the provider refused, whose answer was lost: the redelivery's
// look-up by key finds the failed refund and records it, without asking
// for the refund again (a refund that fails stays failed; once the
// provider forgot the key, asking again would make a second refund).
func TestAFailedRefundFoundByKeyIsRecordedNotAskedAgain(t *testing.T) {
	t.Parallel()
	r := newRig(t, fakepsp.Faults{})
	lose := &loseFirst{Provider: r.provider, refund: true}
	r.provider = lose
	r.start(t, settle.Config{})
	id := r.order(t)
	r.pay(t, id, "pm_card_refundFail")
	r.publish(t, id, domain.TypePaymentRequested, 0)
	r.waitStatus(t, id, "paid", 15*time.Second)

	r.cancel(t, id)
	r.publish(t, id, domain.TypeRefundRequested, 0)
	r.waitRefund(t, id, "failed")
	if n := lose.calls.Load(); n != 1 {
		t.Errorf("%d refund calls, want 1 (the redelivery finds the failed one by its key)", n)
	}
	if l := fakepsptest.Ledger(t, r.psp); len(l.Refunds) != 1 || l.Refunds[0].Status != "failed" {
		t.Fatalf("refunds at the provider: %+v, want the one that failed", l.Refunds)
	}
}

// An intent older than an hour on its first delivery here (a consumer
// created again delivers the stream from its start; a copy published again
// after the stream was lost) is looked up by key before it is charged: an
// earlier delivery may have charged it, and the provider has forgotten
// the key by now, so charging would charge again.
func TestAnOldIntentOnItsFirstDeliveryIsLookedUpFirst(t *testing.T) {
	t.Parallel()
	r := newRigWith(t, fakepsp.Config{KeyTTL: time.Second})
	id := r.order(t)
	r.pay(t, id, domain.DefaultPaymentMethod)
	// The earlier delivery: charged, then the worker died before recording.
	key := domain.ChargeKey(r.tenant, id, 1)
	if _, err := r.provider.Charge(context.Background(), payment.ChargeRequest{IdempotencyKey: key, Amount: 2500, Currency: "EUR",
		PaymentMethod: domain.DefaultPaymentMethod, Metadata: map[string]string{"tenant_id": r.tenant, "order_id": id.String(), "attempt": "1"}}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the provider forgets the key", func() bool {
		n, err := r.psp.PurgeExpiredKeys(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return n > 0
	})
	if _, err := r.db.Exec(context.Background(), `UPDATE outbox SET payload = jsonb_set(payload, '{occurred_at}', to_jsonb(now() - interval '2 hours'))
WHERE aggregate_id = $1 AND event_type = 'payment.requested'`, id); err != nil {
		t.Fatal(err)
	}
	r.publish(t, id, domain.TypePaymentRequested, 0)
	r.start(t, settle.Config{})
	r.waitStatus(t, id, "paid", 15*time.Second)
	r.assertOneCharge(t, id)
}

// discardDuringCharge charges, then, before answering, records the intent
// as a discard that found nothing would (a decline): the race of a discard
// with a copy of the intent at the provider.
type discardDuringCharge struct {
	settle.Provider
	db      *pgxpool.Pool
	eventID uuid.UUID
}

func (d discardDuringCharge) Charge(ctx context.Context, r payment.ChargeRequest) (payment.Charge, error) {
	ch, err := d.Provider.Charge(ctx, r)
	if err != nil {
		return ch, err
	}
	orderID := uuid.MustParse(r.Metadata["order_id"])
	_, _, rerr := command.NewRecordChargeOutcomeHandler(d.db).HandleRecorded(ctx, command.RecordChargeOutcome{
		TenantID: r.Metadata["tenant_id"], OrderID: orderID, Attempt: 1, Consumer: settle.ChargeConsumer, EventID: d.eventID,
		Charge: command.ChargeOutcome{Amount: r.Amount, Currency: r.Currency, DeclineCode: "discarded", Reason: "discarded by an operator"},
	})
	if rerr != nil {
		return payment.Charge{}, rerr
	}
	return ch, nil
}

// A copy of an intent that charged after a discard recorded "no charge"
// for it is not acked as a duplicate: the provider holds money no order
// shows, so it opens a dead letter naming the charge.
func TestAChargeMadeAfterADiscardRecordedNoneIsDeadLettered(t *testing.T) {
	t.Parallel()
	r := newRig(t, fakepsp.Faults{})
	id := r.order(t)
	r.pay(t, id, domain.DefaultPaymentMethod)
	var ev uuid.UUID
	if err := r.db.QueryRow(context.Background(), `SELECT id FROM outbox WHERE aggregate_id = $1 AND event_type = 'payment.requested'`, id).Scan(&ev); err != nil {
		t.Fatal(err)
	}
	r.provider = discardDuringCharge{Provider: r.provider, db: r.db, eventID: ev}
	w, _ := r.start(t, settle.Config{})
	r.publish(t, id, domain.TypePaymentRequested, 0)
	dls := r.waitDeadLetters(t, 15*time.Second, "the charge no order shows")
	if len(dls) != 1 || !strings.Contains(dls[0].Error, "pi_") || !strings.Contains(dls[0].Error, "recorded as declined") {
		t.Fatalf("dead letters %+v, want one naming the provider's charge", dls)
	}
	// A retry would find the intent recorded and close the dead letter,
	// settling nothing: it is refused, and the dead letter stays open.
	if err := w.RetryDeadLetter(context.Background(), dls[0].ID); !errors.Is(err, settle.ErrProviderDisagrees) {
		t.Fatalf("retry of the dead letter: %v; want it refused (ErrProviderDisagrees)", err)
	}
	if open := r.waitDeadLetters(t, time.Second, "still open"); len(open) != 1 {
		t.Fatalf("open dead letters after the refused retry: %+v", open)
	}
}

// A refund that failed, asked for again (POST /refund): attempt 2 goes to
// the provider under its own key and refunds the charge once; the
// provider holds the failed refund and the succeeded one, and the order
// its refund of attempt 2. Asking again after that changes nothing.
func TestARefundAskedAgainAfterAFailureRefundsOnce(t *testing.T) {
	t.Parallel()
	r := newRig(t, fakepsp.Faults{FailNextRefunds: 1})
	r.start(t, settle.Config{})
	id := r.order(t)
	r.pay(t, id, domain.DefaultPaymentMethod)
	r.publish(t, id, domain.TypePaymentRequested, 0)
	r.waitStatus(t, id, "paid", 15*time.Second)
	r.cancel(t, id)
	r.publish(t, id, domain.TypeRefundRequested, 0)
	r.waitRefund(t, id, "failed")

	refundAgain := func() domain.Order {
		t.Helper()
		var o domain.Order
		err := postgres.InTx(context.Background(), r.db, func(tx pgx.Tx) error {
			var err error
			o, err = command.NewRefundOrderHandler().Handle(context.Background(), tx, command.RefundOrder{TenantID: r.tenant, Key: uuid.NewString(), OrderID: id})
			return err
		})
		if err != nil {
			t.Fatalf("refund again: %v", err)
		}
		return o
	}
	if o := refundAgain(); o.Refund.Status != domain.RefundPending || o.Refund.Attempt != 2 {
		t.Fatalf("after asking again: refund %+v, want attempt 2 pending", o.Refund)
	}
	r.publish(t, id, domain.TypeRefundRequested, 1) // and a copy, as a late republish
	r.waitRefund(t, id, "succeeded")
	if o := refundAgain(); o.Refund.Status != domain.RefundSucceeded || o.Refund.Attempt != 2 {
		t.Fatalf("asking after it succeeded: refund %+v, want attempt 2 succeeded, unchanged", o.Refund)
	}

	l := fakepsptest.Ledger(t, r.psp)
	var failed, succeeded int
	var refunded int64
	for _, rf := range l.Refunds {
		switch rf.Status {
		case "failed":
			failed++
		case "succeeded":
			succeeded++
			refunded += rf.Amount
		}
	}
	if failed != 1 || succeeded != 1 || refunded != 2500 {
		t.Fatalf("refunds at the provider: %+v; want one failed and one succeeded of 2500", l.Refunds)
	}
	var rows int
	if err := r.db.QueryRow(context.Background(), `SELECT count(*) FROM payments WHERE order_id = $1 AND kind = 'refund' AND status = 'succeeded'`, id).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != 1 {
		t.Fatalf("%d succeeded refund rows in payments, want 1", rows)
	}
}

// G9, the window: a tenant with more slow intents than the consumer's
// in-flight window holds cannot fill it. Its excess is parked out of the
// window (acked), not handed back to wait in it, so another tenant's intent
// is still delivered and paid.
func TestASlowTenantCannotFillTheConsumersWindow(t *testing.T) {
	t.Parallel()
	r := newRig(t, fakepsp.Faults{})
	slow := &slowFor{Provider: r.provider, tenant: "slowco", release: make(chan struct{})}
	r.provider = slow
	w, _ := r.start(t, settle.Config{Concurrency: 4, MaxAckPending: 20, DeferDelay: 20 * time.Millisecond})
	release := slow.releaseOnCleanup(t)

	r.tenant = "slowco"
	slowOrders := r.payMany(t, 60) // three windows
	testenv.Eventually(t, 15*time.Second, "slowco holding its share of the slots and its excess parked", func() bool {
		return slow.blocked.Load() >= 2 && w.Stats().Parked >= int64(len(slowOrders))-2
	})

	r.tenant = "acme"
	id := r.order(t)
	r.pay(t, id, domain.DefaultPaymentMethod)
	r.publish(t, id, domain.TypePaymentRequested, 0)
	r.waitStatus(t, id, "paid", 5*time.Second)

	if n := slow.blocked.Load(); n != 2 {
		t.Errorf("slowco has %d charges in the provider, want its share 2", n)
	}
	release()
	for _, o := range slowOrders {
		r.waitStatus(t, o, "paid", 30*time.Second)
		r.assertOneCharge(t, o)
	}
	// A re-driven intent's row is deleted just after its outcome commits:
	// wait for the last of them, then nothing of the consumer is left.
	r.waitSettled(t, settle.ChargeConsumer)
	var left int
	if err := r.db.QueryRow(context.Background(), `SELECT count(*) FROM dead_letters WHERE projection = $1`,
		settle.ChargeConsumer).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Errorf("%d intents left in dead_letters after every order was paid, want none (a settled one is deleted)", left)
	}
}

// G8 for a parked intent: an attempt that reached the provider and was
// never recorded (the process died, or gave up, after the call) is counted
// before the call, so the next lease of the intent looks its charge up by
// key first, as a redelivery does; a lease that only re-asked with the key
// would charge again once the provider forgot it (24 h).
func TestAParkedIntentTriedBeforeIsLookedUpByKey(t *testing.T) {
	t.Parallel()
	r := newRig(t, fakepsp.Faults{})
	slow := &slowFor{Provider: r.provider, tenant: "slowco", release: make(chan struct{})}
	finds := &countFinds{Provider: slow}
	r.provider = finds

	r.tenant = "slowco"
	orders := make([]uuid.UUID, 2)
	for i := range orders {
		orders[i] = r.order(t)
		r.pay(t, orders[i], domain.DefaultPaymentMethod)
	}
	var parkedEvent uuid.UUID
	if err := r.db.QueryRow(context.Background(), `SELECT id FROM outbox WHERE aggregate_id = $1 AND event_type = $2`,
		orders[1], domain.TypePaymentRequested).Scan(&parkedEvent); err != nil {
		t.Fatal(err)
	}
	var abandoned atomic.Int64
	w, _ := r.start(t, settle.Config{Concurrency: 2, TenantShare: 0.5, AckWait: time.Second, Lease: 2 * time.Second, DeferDelay: 20 * time.Millisecond,
		AfterProviderCall: func(_ context.Context, _ string, id uuid.UUID) error {
			if id == parkedEvent && abandoned.Add(1) == 1 {
				return errors.New("test: gave up after the provider call")
			}
			return nil
		}})
	release := slow.releaseOnCleanup(t)

	r.publish(t, orders[0], domain.TypePaymentRequested, 0)
	testenv.Eventually(t, 15*time.Second, "slowco's one slot held", func() bool { return slow.blocked.Load() == 1 })
	r.publish(t, orders[1], domain.TypePaymentRequested, 0)
	testenv.Eventually(t, 15*time.Second, "slowco's second intent parked", func() bool { return w.Stats().Parked >= 1 })
	release()
	for _, o := range orders {
		r.waitStatus(t, o, "paid", 15*time.Second)
		r.assertOneCharge(t, o)
	}
	if n := abandoned.Load(); n < 2 {
		t.Fatalf("the parked intent reached the provider %d times, want an abandoned attempt and another", n)
	}
	if n := finds.n.Load(); n < 1 {
		t.Errorf("no look-up by key before the parked intent was tried again after an attempt that reached the provider")
	}
}

// G9 among busy tenants: a tenant whose intents were parked gets its share
// of the workers back as soon as it has free slots, even while other
// tenants' intents keep every worker busy; it does not wait for their
// backlog to drain.
func TestParkedIntentsAreServedWhileOtherTenantsKeepTheWorkersBusy(t *testing.T) {
	t.Parallel()
	r := newRig(t, fakepsp.Faults{LatencyMS: 20})
	slow := &slowFor{Provider: r.provider, tenant: "slowco", release: make(chan struct{})}
	r.provider = slow
	w, _ := r.start(t, settle.Config{Concurrency: 4, TenantShare: 0.5})
	release := slow.releaseOnCleanup(t)

	r.tenant = "slowco"
	slowOrders := r.payMany(t, 6) // 2 hang in its slots, 4 parked
	testenv.Eventually(t, 15*time.Second, "slowco's excess parked", func() bool {
		return slow.blocked.Load() == 2 && w.Stats().Parked >= 4
	})
	const busy = 3 * 150 // three tenants, each able to hold 2 of the 4 workers
	for i := range busy {
		r.tenant = fmt.Sprintf("busy-%d", i%3)
		id := r.order(t)
		r.pay(t, id, domain.DefaultPaymentMethod)
		r.publish(t, id, domain.TypePaymentRequested, 0)
	}
	release()
	for _, o := range slowOrders {
		r.waitStatus(t, o, "paid", 30*time.Second)
	}
	var paid int
	if err := r.db.QueryRow(context.Background(), `SELECT count(*) FROM orders WHERE tenant_id LIKE 'busy-%' AND status = 'paid'`).Scan(&paid); err != nil {
		t.Fatal(err)
	}
	if paid >= busy {
		t.Errorf("slowco's parked intents were paid only after all %d of the busy tenants' intents", busy)
	}
	t.Logf("slowco paid with %d of %d busy intents paid", paid, busy)
}

// failFor is a provider whose charges of one tenant fail transiently (a
// 503, nothing charged) while failing is set.
type failFor struct {
	settle.Provider
	tenant  string
	failing atomic.Bool
	calls   atomic.Int64 // charges of tenant failed
}

func (f *failFor) Charge(ctx context.Context, r payment.ChargeRequest) (payment.Charge, error) {
	if r.Metadata["tenant_id"] == f.tenant && f.failing.Load() {
		f.calls.Add(1)
		return payment.Charge{}, fmt.Errorf("%w: 503 for this tenant", payment.ErrTransient)
	}
	return f.Provider.Charge(ctx, r)
}

// consumerInfo is the charge consumer's state, or nil if it cannot be read.
func (r *rig) consumerInfo(t testing.TB) *jetstream.ConsumerInfo {
	t.Helper()
	return consumerInfo(r.js, settle.ChargeConsumer)
}

// consumerInfo is the state of consumer, or nil if it cannot be read.
func consumerInfo(js jetstream.JetStream, consumer string) *jetstream.ConsumerInfo {
	c, err := js.Consumer(context.Background(), stream.Name, consumer)
	if err != nil {
		return nil
	}
	info, err := c.Info(context.Background())
	if err != nil {
		return nil
	}
	return info
}

// G9, the window, for failures: a tenant whose provider calls all fail
// transiently, at once, never holds two slots, so it is never deferred;
// its failed intents used to be handed back on their backoff (Nak) and
// stay pending in the consumer's window meanwhile, and a trickle of them
// filled it (20 of 20 pending, all the failing tenant's) so that no other
// tenant's intent was delivered. A failed intent is parked on its backoff
// instead and acked, and the other tenant is paid. Once the provider
// answers again, each of the failing tenant's intents is re-driven and
// paid exactly once (G8 across the park and the re-drive).
func TestATenantWhoseCallsFailCannotFillTheConsumersWindow(t *testing.T) {
	t.Parallel()
	r := newRig(t, fakepsp.Faults{})
	fail := &failFor{Provider: r.provider, tenant: "hog"}
	fail.failing.Store(true)
	finds := &countFinds{Provider: fail}
	r.provider = finds
	const window = 20
	w, _ := r.start(t, settle.Config{MaxAckPending: window, Concurrency: 4, TenantShare: 0.5, MaxDeliver: 1000,
		MinBackoff: 2 * time.Second, MaxBackoff: 2 * time.Second, DeferDelay: 20 * time.Millisecond})

	// A trickle: each of hog's intents is published once the worker has
	// handled the one before (tried and failed, or deferred), so hog never
	// holds more than one slot; or once the window is full.
	r.tenant = "hog"
	hogOrders := make([]uuid.UUID, 30)
	for i := range hogOrders {
		hogOrders[i] = r.order(t)
		r.pay(t, hogOrders[i], domain.DefaultPaymentMethod)
		r.publish(t, hogOrders[i], domain.TypePaymentRequested, 0)
		testenv.Eventually(t, 15*time.Second, fmt.Sprintf("hog's intent %d handled", i+1), func() bool {
			if fail.calls.Load()+w.Stats().Deferred >= int64(i+1) {
				return true
			}
			info := r.consumerInfo(t)
			return info != nil && info.NumAckPending >= window
		})
	}

	r.tenant = "acme"
	id := r.order(t)
	r.pay(t, id, domain.DefaultPaymentMethod)
	r.publish(t, id, domain.TypePaymentRequested, 0)
	var info *jetstream.ConsumerInfo
	func() {
		defer func() {
			if t.Failed() && info != nil {
				t.Logf("the charge consumer had %d of %d pending", info.NumAckPending, window)
			}
		}()
		testenv.Eventually(t, 10*time.Second, "acme's order paid while hog's calls fail", func() bool {
			if s, _, _ := r.get(t, id); s == "paid" {
				return true
			}
			info = r.consumerInfo(t)
			return false
		})
	}()
	r.assertOneCharge(t, id)

	// Every one of hog's intents is parked out of the window, none paid,
	// none dead-lettered.
	var parked, open int
	testenv.Eventually(t, 15*time.Second, "hog's intents all parked, the window empty", func() bool {
		if err := r.db.QueryRow(context.Background(), `SELECT count(*) FILTER (WHERE status = 'parked'), count(*) FILTER (WHERE status = 'open')
FROM dead_letters WHERE projection = $1 AND tenant_id = 'hog'`, settle.ChargeConsumer).Scan(&parked, &open); err != nil {
			t.Fatal(err)
		}
		info := r.consumerInfo(t)
		return parked == len(hogOrders) && info != nil && info.NumPending == 0 && info.NumAckPending == 0
	})
	if open != 0 {
		t.Fatalf("%d of hog's intents dead-lettered, want none (MaxDeliver 1000)", open)
	}
	for _, o := range hogOrders {
		if s, _, _ := r.get(t, o); s != "payment_pending" {
			t.Fatalf("hog's order %s is %s while its calls fail, want payment_pending", o, s)
		}
	}
	if s := w.Stats(); s.ChargeTransient == 0 || s.RetryParked == 0 {
		t.Fatalf("stats %+v: want transient failures, and failed intents parked", s)
	}

	fail.failing.Store(false)
	for _, o := range hogOrders {
		r.waitStatus(t, o, "paid", 30*time.Second)
		r.assertOneCharge(t, o)
	}
	testenv.Eventually(t, 15*time.Second, "no parked intent left", func() bool {
		var left int
		if err := r.db.QueryRow(context.Background(), `SELECT count(*) FROM dead_letters WHERE projection = $1`, settle.ChargeConsumer).Scan(&left); err != nil {
			t.Fatal(err)
		}
		return left == 0
	})
	// A failed call may have reached the provider: its intent's next try
	// looked its charge up by key first.
	if n := finds.n.Load(); n == 0 {
		t.Errorf("no look-up by key before a failed intent was tried again")
	}
}

// G8 for a delivered intent parked on its failure: its call may have
// reached the provider (here it did, and the answer was lost), so its
// first lease looks the charge up by key before it calls again; the key
// alone would charge a second time once the provider forgot it (here
// before the backoff ends).
func TestAFailedIntentParkedOnItsBackoffIsLookedUpByKey(t *testing.T) {
	t.Parallel()
	r := newRigWith(t, fakepsp.Config{KeyTTL: time.Second})
	lose := &loseFirst{Provider: r.provider}
	finds := &countFinds{Provider: lose}
	r.provider = finds
	w, _ := r.start(t, settle.Config{MinBackoff: 2 * time.Second, MaxBackoff: 2 * time.Second, DeferDelay: 20 * time.Millisecond})
	id := r.order(t)
	r.pay(t, id, domain.DefaultPaymentMethod)
	r.publish(t, id, domain.TypePaymentRequested, 0)
	r.waitStatus(t, id, "paid", 15*time.Second)
	r.assertOneCharge(t, id)
	if s := w.Stats(); s.RetryParked != 1 || s.Redriven < 1 {
		t.Fatalf("stats %+v: want the failed intent parked once and re-driven", s)
	}
	if n, c := finds.n.Load(), lose.calls.Load(); n < 1 || c != 1 {
		t.Fatalf("%d look-ups by key and %d charges, want the lease to find the lost charge by key, not charge again", n, c)
	}
}

// An intent whose recording keeps failing transiently (our side, not the
// provider's) is dead-lettered (status open) after MaxDeliver failed
// deliveries, as when its failures were handed back: at once on the last
// delivery with MaxDeliver 1; with more, it is parked after its first
// failure and opened by the re-drive at the MaxDeliver-th, counted on its
// row. Nothing is left parked or in the window, and `retry` settles it
// once the cause is gone, with the one charge its key made.
func TestTransientFailuresAreDeadLetteredAtMaxDeliver(t *testing.T) {
	t.Parallel()
	for _, maxDeliver := range []int{1, 3} {
		t.Run(fmt.Sprint("MaxDeliver=", maxDeliver), func(t *testing.T) {
			t.Parallel()
			r := newRig(t, fakepsp.Faults{})
			failRecording(t, r.db, true)
			w, _ := r.start(t, settle.Config{MaxDeliver: maxDeliver, DeferDelay: 20 * time.Millisecond})
			id := r.order(t)
			r.pay(t, id, domain.DefaultPaymentMethod)
			r.publish(t, id, domain.TypePaymentRequested, 0)
			dls := r.waitDeadLetters(t, 15*time.Second, "a dead letter")
			want := fmt.Sprintf("still failing after %d failed deliveries", maxDeliver)
			if d := dls[0]; d.Consumer != settle.ChargeConsumer || d.Status != "open" || int(d.Deliveries) != maxDeliver ||
				!strings.Contains(d.Error, want) || !strings.Contains(d.Error, "recording fails") {
				t.Fatalf("dead letter %+v: want the charge consumer's, open, after %d failed deliveries (%q: recording fails)", d, maxDeliver, want)
			}
			if all, err := settle.ListDeadLetters(context.Background(), r.db, true); err != nil || len(all) != 1 {
				t.Fatalf("dead letters %+v (%v): want only the open one, none parked", all, err)
			}
			testenv.Eventually(t, 15*time.Second, "the window empty", func() bool {
				info := r.consumerInfo(t)
				return info != nil && info.NumPending == 0 && info.NumAckPending == 0
			})
			s := w.Stats()
			if s.ChargeDeadLettered != 1 || s.ChargeTransient != 0 || s.RetryParked != int64(min(maxDeliver-1, 1)) {
				t.Fatalf("stats %+v: want one dead letter after %d failed recordings and no provider failure, parked after the first unless it was the last", s, maxDeliver)
			}
			failRecording(t, r.db, false)
			if err := w.RetryDeadLetter(context.Background(), dls[0].ID); err != nil {
				t.Fatalf("retry the dead letter: %v", err)
			}
			r.waitStatus(t, id, "paid", 15*time.Second)
			r.assertOneCharge(t, id)
		})
	}
}

// failRecording makes every recording of a payment outcome in db fail with
// an error that is not the provider's and no refusal (XX000), or stops it.
func failRecording(t *testing.T, db *pgxpool.Pool, on bool) {
	t.Helper()
	ctx := context.Background()
	if !on {
		if _, err := db.Exec(ctx, `DROP TRIGGER fail_recording ON payment_inbox`); err != nil {
			t.Fatal(err)
		}
		return
	}
	if _, err := db.Exec(ctx, `
CREATE FUNCTION fail_recording() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'recording fails' USING ERRCODE = 'XX000'; END $$;
CREATE TRIGGER fail_recording BEFORE INSERT ON payment_inbox FOR EACH ROW EXECUTE FUNCTION fail_recording()`); err != nil {
		t.Fatal(err)
	}
}

// failRecordingOnce makes the next recording of a payment outcome in db
// fail (XX000), and no other; fail_recording_n counts the recordings tried.
func failRecordingOnce(t *testing.T, db *pgxpool.Pool) {
	t.Helper()
	if _, err := db.Exec(context.Background(), `
CREATE SEQUENCE fail_recording_n;
CREATE FUNCTION fail_recording_once() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF nextval('fail_recording_n') = 1 THEN RAISE EXCEPTION 'recording fails once' USING ERRCODE = 'XX000'; END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER fail_recording_once BEFORE INSERT ON payment_inbox FOR EACH ROW EXECUTE FUNCTION fail_recording_once()`); err != nil {
		t.Fatal(err)
	}
}

// A provider that gives no outcome for longer than MaxDeliver failures
// (down: 5xx on every call) never gets the intent dead-lettered: it stays
// parked, retried with its key on the backoff, the order payment_pending,
// and settles on its own when the provider answers again, with one charge.
// (Dead-lettered, every intent in flight during an outage of a couple of
// minutes needed an operator's retry, and its order could be neither paid
// again nor cancelled meanwhile.)
func TestAProviderOutageLongerThanMaxDeliverDeadLettersNothing(t *testing.T) {
	t.Parallel()
	r := newRig(t, fakepsp.Faults{})
	fail := &failFor{Provider: r.provider, tenant: r.tenant}
	fail.failing.Store(true)
	r.provider = fail
	const maxDeliver = 2
	w, _ := r.start(t, settle.Config{MaxDeliver: maxDeliver, DeferDelay: 20 * time.Millisecond,
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 30 * time.Millisecond})
	id := r.order(t)
	r.pay(t, id, domain.DefaultPaymentMethod)
	r.publish(t, id, domain.TypePaymentRequested, 0)
	testenv.Eventually(t, 15*time.Second, "five times MaxDeliver failed calls", func() bool { return fail.calls.Load() >= 5*maxDeliver })
	all, err := settle.ListDeadLetters(context.Background(), r.db, true)
	if err != nil || len(all) != 1 || all[0].Status != "parked" || all[0].Deliveries != 0 {
		t.Fatalf("dead letters %+v (%v): want the intent parked, with none of the provider's failures counted, not open", all, err)
	}
	if s := w.Stats(); s.ChargeDeadLettered != 0 {
		t.Fatalf("stats %+v: want nothing dead-lettered while the provider is down", s)
	}
	if s, _, _ := r.get(t, id); s != "payment_pending" {
		t.Fatalf("order is %s while the provider is down, want payment_pending", s)
	}
	// The provider comes back as the database has a blip: the first
	// recording of its charge fails. One failure of ours is not
	// MaxDeliver (the outage's failures used to count, and it opened a
	// dead letter over a charge the provider had made).
	failRecordingOnce(t, r.db)
	fail.failing.Store(false)
	r.waitStatus(t, id, "paid", 15*time.Second)
	r.assertOneCharge(t, id)
	var n int64
	if err := r.db.QueryRow(context.Background(), `SELECT last_value FROM fail_recording_n`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("%d recordings tried (%v), want 2 (one failed, then the one that paid)", n, err)
	}
	testenv.Eventually(t, 15*time.Second, "no dead letter left", func() bool {
		all, err := settle.ListDeadLetters(context.Background(), r.db, true)
		return err == nil && len(all) == 0
	})
}

// gated refuses charges permanently until opened; then its next charge
// waits for release before it goes to the provider.
type gated struct {
	settle.Provider
	open     atomic.Bool
	charging chan struct{} // closed when a charge waits for release
	release  chan struct{}
	once     sync.Once
}

func (g *gated) Charge(ctx context.Context, r payment.ChargeRequest) (payment.Charge, error) {
	if !g.open.Load() {
		return payment.Charge{}, fmt.Errorf("%w: 401 refused", payment.ErrPermanent)
	}
	g.once.Do(func() { close(g.charging) })
	<-g.release
	return g.Provider.Charge(ctx, r)
}

// One resolution of a payment dead letter wins: a discard while its retry
// is charging is refused (it used to mark discarded the dead letter whose
// retry then charged and recorded the charge, telling the operator to
// settle by hand what was settled), and after the retry the dead letter is
// retried, its order paid with one charge, and a discard finds nothing.
func TestADiscardWhileTheRetryChargesIsRefused(t *testing.T) {
	t.Parallel()
	r := newRig(t, fakepsp.Faults{})
	g := &gated{Provider: r.provider, charging: make(chan struct{}), release: make(chan struct{})}
	r.provider = g
	w, _ := r.start(t, settle.Config{})
	id := r.order(t)
	r.pay(t, id, domain.DefaultPaymentMethod)
	r.publish(t, id, domain.TypePaymentRequested, 0)
	dl := r.waitDeadLetters(t, 15*time.Second, "a dead letter")[0]

	g.open.Store(true)
	retried := make(chan error, 1)
	go func() { retried <- w.RetryDeadLetter(context.Background(), dl.ID) }()
	<-g.charging
	if _, err := w.DiscardDeadLetter(context.Background(), dl.ID); !errors.Is(err, settle.ErrDeadLetterBusy) {
		t.Fatalf("discard while the retry charges: %v, want ErrDeadLetterBusy", err)
	}
	if err := w.RetryDeadLetter(context.Background(), dl.ID); !errors.Is(err, settle.ErrDeadLetterBusy) {
		t.Fatalf("a second retry while the first charges: %v, want ErrDeadLetterBusy", err)
	}
	close(g.release)
	if err := <-retried; err != nil {
		t.Fatalf("retry: %v", err)
	}
	r.waitStatus(t, id, "paid", 15*time.Second)
	r.assertOneCharge(t, id)
	if _, err := w.DiscardDeadLetter(context.Background(), dl.ID); !errors.Is(err, settle.ErrNoDeadLetter) {
		t.Fatalf("discard after the retry: %v, want ErrNoDeadLetter", err)
	}
	all, err := settle.ListDeadLetters(context.Background(), r.db, true)
	if err != nil || len(all) != 1 || all[0].Status != "retried" {
		t.Fatalf("dead letters %+v (%v), want the one retried", all, err)
	}
}

// A worker whose charge consumer is deleted (by an operator, say) creates
// it again and settles the intents that come next. Before, its Consume
// stopped with "consumer deleted" and nothing was charged until the worker
// restarted. The new consumer delivers the first intent again: it is found
// recorded and acked, not charged twice (G8).
func TestWorkerCreatesItsDeletedConsumerAgainAndChargesOnce(t *testing.T) {
	t.Parallel()
	r := newRig(t, fakepsp.Faults{})
	r.start(t, settle.Config{})
	first := r.order(t)
	r.pay(t, first, domain.DefaultPaymentMethod)
	r.publish(t, first, domain.TypePaymentRequested, 0)
	r.waitStatus(t, first, "paid", 15*time.Second)

	if err := r.js.DeleteConsumer(context.Background(), stream.Name, settle.ChargeConsumer); err != nil {
		t.Fatal(err)
	}
	second := r.order(t)
	r.pay(t, second, domain.DefaultPaymentMethod)
	r.publish(t, second, domain.TypePaymentRequested, 0)
	r.waitStatus(t, second, "paid", 20*time.Second)
	r.waitSettled(t, settle.ChargeConsumer)
	if info := r.consumerInfo(t); info.Delivered.Stream < 2 {
		t.Fatalf("the charge consumer created again delivered up to sequence %d; want both intents", info.Delivered.Stream)
	}
	r.assertOneCharge(t, first)
	r.assertOneCharge(t, second)
}

// failThenHold fails the first charge of each key of tenant transiently
// (so the intent is parked) and holds every later one until release.
type failThenHold struct {
	settle.Provider
	tenant  string
	release chan struct{}
	mu      sync.Mutex
	calls   map[string]int
	held    atomic.Int64
}

func (f *failThenHold) Charge(ctx context.Context, r payment.ChargeRequest) (payment.Charge, error) {
	if r.Metadata["tenant_id"] == f.tenant {
		f.mu.Lock()
		f.calls[r.IdempotencyKey]++
		n := f.calls[r.IdempotencyKey]
		f.mu.Unlock()
		if n == 1 {
			return payment.Charge{}, fmt.Errorf("%w: the provider is busy", payment.ErrTransient)
		}
		f.held.Add(1)
		select {
		case <-f.release:
		case <-ctx.Done():
			return payment.Charge{}, fmt.Errorf("%w: %v", payment.ErrTransient, ctx.Err())
		}
	}
	return f.Provider.Charge(ctx, r)
}

// A parked intent's re-driven call that outlasts its lease several times
// over is not leased and sent again meanwhile: the worker renews the lease
// while the call lasts (unrenewed, a lease of twice the ack wait sent the
// intent to the provider twice, and so did a 2 s lease).
func TestAParkedIntentsLongCallIsNotLeasedAgain(t *testing.T) {
	t.Parallel()
	r := newRig(t, fakepsp.Faults{})
	p := &failThenHold{Provider: r.provider, tenant: "slowco", release: make(chan struct{}), calls: map[string]int{}}
	r.provider = p
	r.start(t, settle.Config{Concurrency: 4, TenantShare: 0.5, AckWait: time.Second, Lease: 2 * time.Second})
	var once sync.Once
	release := func() { once.Do(func() { close(p.release) }) }
	t.Cleanup(release)
	r.tenant = "slowco"
	id := r.payMany(t, 1)[0]
	testenv.Eventually(t, 15*time.Second, "the re-driven call held", func() bool { return p.held.Load() >= 1 })
	time.Sleep(7 * time.Second) // three and a half leases, each of which sent it again unrenewed
	held := p.held.Load()
	release()
	r.waitStatus(t, id, "paid", 20*time.Second)
	r.assertOneCharge(t, id)
	if held != 1 {
		t.Fatalf("sent to the provider %d times while its first re-driven call was in flight, want 1", held)
	}
}

// Intents waiting for a free worker while every worker is in a long
// provider call are kept in progress too: they are not delivered again
// (copies deferred, parked, looked up) when the wait outlasts the ack wait.
func TestIntentsWaitingForAWorkerAreNotDeliveredAgain(t *testing.T) {
	t.Parallel()
	r := newRig(t, fakepsp.Faults{})
	slow := &slowFor{Provider: r.provider, release: make(chan struct{})} // every tenant's charges
	r.provider = slow
	w, _ := r.start(t, settle.Config{Concurrency: 2, TenantShare: 0.5, AckWait: time.Second})
	release := slow.releaseOnCleanup(t)
	ids := map[string]uuid.UUID{}
	for i := range 4 {
		r.tenant = fmt.Sprintf("t-%d", i)
		ids[r.tenant] = r.payMany(t, 1)[0]
	}
	testenv.Eventually(t, 10*time.Second, "two calls held", func() bool { return slow.blocked.Load() == 2 })
	time.Sleep(3500 * time.Millisecond) // three and a half ack waits for the two waiting
	release()
	for tenant, id := range ids {
		r.tenant = tenant
		r.waitStatus(t, id, "paid", 20*time.Second)
		r.assertOneCharge(t, id)
	}
	if s := w.Stats(); s.Duplicates != 0 || s.Deferred != 0 || slow.blocked.Load() != 4 {
		t.Fatalf("%d duplicates, %d deferred, %d provider calls: want none, none and 4 (one intent per tenant)", s.Duplicates, s.Deferred, slow.blocked.Load())
	}
}

// A charge whose first request failed once it began gets that 500 back for
// every retry with its key (Stripe stores it for 24 h). Once the key has
// been known spent for the provider's search lag and the search shows no
// charge, the payment is declined (provider_failed): the order is payable
// again, with a new key, instead of payment_pending for a day.
func TestAChargeKeyTheProviderSpentOnAFailureDeclinesThePayment(t *testing.T) {
	t.Parallel()
	r := newRig(t, fakepsp.Faults{StoreErrorNext: 1})
	lag := 2 * time.Second
	w, _ := r.start(t, settle.Config{SpentKeyWait: lag, MaxBackoff: time.Second})
	id := r.order(t)
	r.pay(t, id, domain.DefaultPaymentMethod)
	r.publish(t, id, domain.TypePaymentRequested, 0)
	start := time.Now()
	r.waitStatus(t, id, "payment_failed", 30*time.Second)
	if waited := time.Since(start); waited < lag {
		t.Fatalf("declined %s after the intent, before its key was known spent for SpentKeyWait (%s)", waited, lag)
	}
	var code string
	if err := r.db.QueryRow(context.Background(), `SELECT payment->>'decline_code' FROM orders WHERE id = $1`, id).Scan(&code); err != nil {
		t.Fatal(err)
	}
	if code != settle.ProviderFailed {
		t.Fatalf("decline code %q, want %q", code, settle.ProviderFailed)
	}
	if st := r.psp.Stats(); st.Replays < 1 {
		t.Fatalf("provider stats %+v: the stored 500 was never replayed", st)
	}
	if l := fakepsptest.Ledger(t, r.psp); len(l.Charges) != 0 {
		t.Fatalf("charges at the provider after the failure: %+v, want none", l.Charges)
	}

	r.pay(t, id, domain.DefaultPaymentMethod)
	r.publish(t, id, domain.TypePaymentRequested, 0)
	r.waitStatus(t, id, "paid", 15*time.Second)
	r.assertOneCharge(t, id)
	if s := w.Stats(); s.ChargesDeclined != 1 || s.ChargesSucceeded != 1 {
		t.Fatalf("stats %+v, want one decline and one success", s)
	}
}

// A refund whose key the provider spent on a failure is recorded as failed
// (its charge's refunds hold none), so it can be asked for again, and the
// second attempt refunds once.
func TestARefundKeyTheProviderSpentOnAFailureFailsTheRefund(t *testing.T) {
	t.Parallel()
	r := newRig(t, fakepsp.Faults{})
	r.start(t, settle.Config{MaxBackoff: time.Second})
	id := r.order(t)
	r.pay(t, id, domain.DefaultPaymentMethod)
	r.publish(t, id, domain.TypePaymentRequested, 0)
	r.waitStatus(t, id, "paid", 15*time.Second)
	if err := r.psp.SetFaults(fakepsp.Faults{StoreErrorNext: 1}); err != nil {
		t.Fatal(err)
	}
	r.cancel(t, id)
	r.publish(t, id, domain.TypeRefundRequested, 0)
	r.waitRefund(t, id, "failed")
	var reason string
	if err := r.db.QueryRow(context.Background(), `SELECT refund->>'failure_reason' FROM orders WHERE id = $1`, id).Scan(&reason); err != nil {
		t.Fatal(err)
	}
	if reason != settle.ProviderFailed {
		t.Fatalf("refund failure reason %q, want %q", reason, settle.ProviderFailed)
	}
	err := postgres.InTx(context.Background(), r.db, func(tx pgx.Tx) error {
		_, err := command.NewRefundOrderHandler().Handle(context.Background(), tx, command.RefundOrder{TenantID: r.tenant, Key: uuid.NewString(), OrderID: id})
		return err
	})
	if err != nil {
		t.Fatalf("refund again: %v", err)
	}
	r.publish(t, id, domain.TypeRefundRequested, 0)
	r.waitRefund(t, id, "succeeded")
	if l := fakepsptest.Ledger(t, r.psp); len(l.Refunds) != 1 || l.Refunds[0].Status != "succeeded" || l.Refunds[0].Amount != 2500 {
		t.Fatalf("refunds at the provider: %+v, want one succeeded of 2500", l.Refunds)
	}
}

// G8 with a card that asks the customer to authenticate (3D Secure): the
// worker cannot, so the payment is declined, but only once the
// PaymentIntent is cancelled. Left in requires_action, the customer could
// authenticate it after paying again with another card: two charges. Lost
// answers (of the create and of the cancel) change nothing.
func TestAPaymentWaitingForTheCustomerIsCancelledBeforeItIsDeclined(t *testing.T) {
	t.Parallel()
	for name, faults := range map[string]fakepsp.Faults{
		"answered":     {},
		"answers lost": {LoseNext: 3, LoseMode: fakepsp.LoseClose},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, faults)
			r.start(t, settle.Config{MaxBackoff: time.Second})
			id := r.order(t)
			r.pay(t, id, "pm_card_authenticationRequired")
			r.publish(t, id, domain.TypePaymentRequested, 0)
			r.waitStatus(t, id, "payment_failed", 30*time.Second)

			var intents []string
			for _, c := range fakepsptest.Ledger(t, r.psp).Charges {
				if c.Metadata["order_id"] == id.String() {
					intents = append(intents, c.ID+" "+c.Status)
					charged, err := r.psp.CompleteAuthentication(context.Background(), c.ID)
					if err != nil {
						t.Fatal(err)
					}
					if charged {
						t.Errorf("payment intent %s (%s) was charged when the customer authenticated it after its decline", c.ID, c.Status)
					}
				}
			}
			if len(intents) != 1 || !strings.HasSuffix(intents[0], " canceled") {
				t.Fatalf("the order's payment intents at the provider: %v, want one, canceled", intents)
			}

			r.pay(t, id, domain.DefaultPaymentMethod)
			r.publish(t, id, domain.TypePaymentRequested, 0)
			r.waitStatus(t, id, "paid", 30*time.Second)
			r.assertOneCharge(t, id)
		})
	}
}
