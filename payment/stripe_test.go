package payment_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acme/orders/fakepsp"
	"github.com/acme/orders/fakepsp/fakepsptest"
	"github.com/acme/orders/payment"
)

// start serves a fresh fake provider and returns it with an adapter on it.
func start(t *testing.T, cfg payment.Config) (*fakepsp.Server, *payment.Stripe) {
	t.Helper()
	srv, hs := fakepsptest.Start(t, fakepsptest.DatabaseURL(t), fakepsp.Config{})
	return srv, adapter(t, hs.URL, cfg)
}

func adapter(t *testing.T, baseURL string, cfg payment.Config) *payment.Stripe {
	t.Helper()
	cfg.BaseURL, cfg.SecretKey = baseURL, fakepsptest.SecretKey
	if cfg.Timeout == 0 {
		cfg.Timeout = 5 * time.Second
	}
	s, err := payment.NewStripe(cfg)
	require.NoError(t, err)
	return s
}

func chargeReq(key string) payment.ChargeRequest {
	return payment.ChargeRequest{
		IdempotencyKey: key, Amount: 1250, Currency: "EUR", PaymentMethod: "pm_card_visa",
		Metadata: map[string]string{"tenant_id": "dev", "order_id": "o1", "attempt": "1"},
	}
}

func TestChargeSucceeds(t *testing.T) {
	t.Parallel()
	srv, s := start(t, payment.Config{})
	c, err := s.Charge(context.Background(), chargeReq("dev:order:o1:charge:1"))
	require.NoError(t, err)
	require.Equal(t, payment.ChargeSucceeded, c.Status)
	require.Regexp(t, `^pi_`, c.ID)
	require.Equal(t, int64(1250), c.Amount)
	require.Equal(t, "EUR", c.Currency)

	l := fakepsptest.Ledger(t, srv)
	require.Len(t, l.Charges, 1)
	got := l.Charges[0]
	require.Equal(t, c.ID, got.ID)
	require.Equal(t, "dev:order:o1:charge:1", *got.IdempotencyKey)
	require.Equal(t, "succeeded", got.Status)
	require.Equal(t, "eur", got.Currency)
	require.Equal(t, map[string]string{"tenant_id": "dev", "order_id": "o1", "attempt": "1", "idempotency_key": "dev:order:o1:charge:1"}, got.Metadata)
}

// TestChargeRequestOnTheWire pins what stripe-go really sends, which the
// fake must understand.
func TestChargeRequestOnTheWire(t *testing.T) {
	t.Parallel()
	srv, _ := fakepsptest.Start(t, fakepsptest.DatabaseURL(t), fakepsp.Config{})
	var (
		mu   sync.Mutex
		seen []*http.Request
		body []url.Values
	)
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		form, _ := url.ParseQuery(string(b))
		mu.Lock()
		seen, body = append(seen, r.Clone(context.Background())), append(body, form)
		mu.Unlock()
		r.Body = io.NopCloser(strings.NewReader(string(b)))
		srv.ServeHTTP(w, r)
	}))
	t.Cleanup(hs.Close)
	s := adapter(t, hs.URL, payment.Config{})
	_, err := s.Charge(context.Background(), chargeReq("k1"))
	require.NoError(t, err)
	require.Len(t, seen, 1)
	r, f := seen[0], body[0]
	require.Equal(t, "POST /v1/payment_intents", r.Method+" "+r.URL.Path)
	require.Equal(t, "application/x-www-form-urlencoded", r.Header.Get("Content-Type"))
	require.Equal(t, "k1", r.Header.Get("Idempotency-Key"))
	require.Equal(t, "Bearer "+fakepsptest.SecretKey, r.Header.Get("Authorization"))
	require.Equal(t, "true", f.Get("confirm"))
	require.Equal(t, "1250", f.Get("amount"))
	require.Equal(t, "eur", f.Get("currency"))
	require.Equal(t, "pm_card_visa", f.Get("payment_method"))
	require.Equal(t, "k1", f.Get("metadata[idempotency_key]"))
	require.Equal(t, "o1", f.Get("metadata[order_id]"))

	_, _, err = s.FindCharge(context.Background(), "k1")
	require.NoError(t, err)
	require.Len(t, seen, 2)
	require.Equal(t, "GET /v1/payment_intents/search", seen[1].Method+" "+seen[1].URL.Path)
	require.Equal(t, "metadata['idempotency_key']:'k1'", seen[1].URL.Query().Get("query"))
}

func TestDeclineIsAnOutcome(t *testing.T) {
	t.Parallel()
	srv, s := start(t, payment.Config{})
	for _, tc := range []struct{ method, code string }{
		{"pm_card_chargeDeclined", "generic_decline"},
		{"pm_card_chargeDeclinedInsufficientFunds", "insufficient_funds"},
		{"pm_card_chargeDeclinedProcessingError", "processing_error"},
	} {
		r := chargeReq("decline:" + tc.method)
		r.PaymentMethod = tc.method
		c, err := s.Charge(context.Background(), r)
		require.NoError(t, err, tc.method)
		require.Equal(t, payment.ChargeDeclined, c.Status, tc.method)
		require.Equal(t, tc.code, c.DeclineCode, tc.method)
		require.NotEmpty(t, c.DeclineReason, tc.method)
		require.Regexp(t, `^pi_`, c.ID)

		again, err := s.Charge(context.Background(), r) // the stored 402 is replayed
		require.NoError(t, err)
		require.Equal(t, c, again)
	}
	l := fakepsptest.Ledger(t, srv)
	require.Len(t, l.Charges, 3)
	for _, c := range l.Charges {
		require.Equal(t, "requires_payment_method", c.Status)
	}
	require.Equal(t, int64(3), srv.Stats().Replays)
}

func TestSameKeyTwiceIsOneCharge(t *testing.T) {
	t.Parallel()
	srv, s := start(t, payment.Config{})
	first, err := s.Charge(context.Background(), chargeReq("k"))
	require.NoError(t, err)
	second, err := s.Charge(context.Background(), chargeReq("k"))
	require.NoError(t, err)
	require.Equal(t, first, second)
	require.Len(t, fakepsptest.Ledger(t, srv).Charges, 1)
	require.Equal(t, int64(1), srv.Stats().Replays)
}

func TestSameKeyOtherParamsIsPermanent(t *testing.T) {
	t.Parallel()
	srv, s := start(t, payment.Config{})
	_, err := s.Charge(context.Background(), chargeReq("k"))
	require.NoError(t, err)
	other := chargeReq("k")
	other.Amount = 999
	_, err = s.Charge(context.Background(), other)
	require.ErrorIs(t, err, payment.ErrPermanent)
	require.NotErrorIs(t, err, payment.ErrTransient)
	require.Contains(t, err.Error(), "idempotency_error")
	require.Len(t, fakepsptest.Ledger(t, srv).Charges, 1)
}

// A payment method the provider does not know is the customer's to fix
// (pay again with another): a decline, not an error to dead-letter, which
// left the order payment_pending for good. Nothing is made, so nothing is
// stored under the key: corrected, the same key charges.
func TestUnknownPaymentMethodIsADecline(t *testing.T) {
	t.Parallel()
	srv, s := start(t, payment.Config{})
	r := chargeReq("k")
	r.PaymentMethod = "pm_card_unknown"
	c, err := s.Charge(context.Background(), r)
	require.NoError(t, err)
	require.Equal(t, payment.Charge{Amount: 1250, Currency: "EUR", Status: payment.ChargeDeclined,
		DeclineCode: "resource_missing", DeclineReason: "No such PaymentMethod: 'pm_card_unknown'"}, c)
	require.Empty(t, fakepsptest.Ledger(t, srv).Charges)

	r.PaymentMethod = "pm_card_visa"
	c, err = s.Charge(context.Background(), r)
	require.NoError(t, err)
	require.Equal(t, payment.ChargeSucceeded, c.Status)
}

// A currency the provider does not take (Stripe's 400 on currency, without
// a code) is a decline: the order's currency is fixed, and a dead letter
// would leave it payment_pending for good.
func TestAnUnsupportedCurrencyIsADecline(t *testing.T) {
	t.Parallel()
	srv, s := start(t, payment.Config{})
	r := chargeReq("k")
	r.Currency = "KPW"
	c, err := s.Charge(context.Background(), r)
	require.NoError(t, err)
	require.Equal(t, payment.ChargeDeclined, c.Status)
	require.Equal(t, payment.CurrencyNotSupported, c.DeclineCode)
	require.Contains(t, c.DeclineReason, "Invalid currency: kpw")
	require.Equal(t, int64(1250), c.Amount)
	require.Equal(t, "KPW", c.Currency)
	require.Empty(t, fakepsptest.Ledger(t, srv).Charges)
}

// A PaymentIntent still processing is no outcome: an ErrTransient error,
// looked up again later, never a decline (which would let the customer pay
// again while it may still succeed). Charge and FindCharge alike.
func TestAChargeStillProcessingIsNoOutcomeYet(t *testing.T) {
	t.Parallel()
	const pi = `{"id":"pi_1","object":"payment_intent","amount":1250,"currency":"eur","status":"processing","metadata":{"idempotency_key":"k"}}`
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.Method == http.MethodGet { // the search
			_, _ = io.WriteString(w, `{"object":"search_result","data":[`+pi+`],"has_more":false}`)
			return
		}
		_, _ = io.WriteString(w, pi)
	}))
	defer hs.Close()
	s := adapter(t, hs.URL, payment.Config{})
	_, err := s.Charge(context.Background(), chargeReq("k"))
	require.ErrorIs(t, err, payment.ErrTransient)
	require.Contains(t, err.Error(), "processing")
	_, _, err = s.FindCharge(context.Background(), "k")
	require.ErrorIs(t, err, payment.ErrTransient)
}

// A 200 whose body is no PaymentIntent or Refund (a proxy's page, a body
// mangled on the way), or a PaymentIntent in a status that is neither
// charged nor declined, is no outcome: the provider may have charged, and
// a decline would let the customer pay again. Before, `{}` was recorded as
// a decline with no code, and the next pay charged a second time.
func TestAnAnswerThatIsNoOutcomeIsTransient(t *testing.T) {
	t.Parallel()
	for _, body := range []string{
		`{}`,
		`{"object":"payment_intent","status":"succeeded","amount":1250,"currency":"eur"}`,
		`{"id":"pi_1","object":"payment_intent","amount":1250,"currency":"eur","status":"requires_capture"}`,
		`{"id":"pi_1","object":"payment_intent","amount":1250,"currency":"eur","status":"on_hold"}`,
		`{"id":"pi_1","object":"payment_intent","amount":1250,"currency":"eur"}`,
	} {
		hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			if r.Method == http.MethodGet { // the search
				_, _ = io.WriteString(w, `{"object":"search_result","data":[`+body+`],"has_more":false}`)
				return
			}
			_, _ = io.WriteString(w, body)
		}))
		s := adapter(t, hs.URL, payment.Config{})
		_, err := s.Charge(context.Background(), chargeReq("k"))
		require.ErrorIs(t, err, payment.ErrTransient, "charge answered %s", body)
		_, _, err = s.FindCharge(context.Background(), "k")
		require.ErrorIs(t, err, payment.ErrTransient, "search answered %s", body)
		hs.Close()
	}

	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{}`)
	}))
	defer hs.Close()
	s := adapter(t, hs.URL, payment.Config{})
	_, err := s.Refund(context.Background(), payment.RefundRequest{IdempotencyKey: "k", ChargeID: "pi_1", Amount: 1250, Currency: "EUR"})
	require.ErrorIs(t, err, payment.ErrTransient)
}

// Any other refused request is ours to fix: permanent, dead-lettered;
// a payment_method refused for how we sent it (not for what it is) too.
func TestInvalidRequestIsPermanent(t *testing.T) {
	t.Parallel()
	srv, s := start(t, payment.Config{})
	r := chargeReq("k")
	r.Currency = "E1R"
	_, err := s.Charge(context.Background(), r)
	require.ErrorIs(t, err, payment.ErrPermanent)
	require.Contains(t, err.Error(), "parameter_invalid_string")
	require.Empty(t, fakepsptest.Ledger(t, srv).Charges)

	// fakepsp's 400 parameter_missing on payment_method, as if we had
	// sent none: ours, not the customer's.
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, `{"error":{"type":"invalid_request_error","code":"parameter_missing","param":"payment_method","message":"Missing required param: payment_method."}}`)
	}))
	defer hs.Close()
	_, err = adapter(t, hs.URL, payment.Config{}).Charge(context.Background(), chargeReq("k2"))
	require.ErrorIs(t, err, payment.ErrPermanent)
	require.Contains(t, err.Error(), "parameter_missing")
}

// TestLostResponseIsRecoveredWithTheSameKey: the provider commits the
// charge, then loses the answer; stripe-go's network retry sends the same
// key and gets the same charge.
func TestLostResponseIsRecoveredWithTheSameKey(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{fakepsp.LoseClose, fakepsp.LoseStall} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			srv, s := start(t, payment.Config{Timeout: time.Second})
			require.NoError(t, srv.SetFaults(fakepsp.Faults{LoseNext: 1, LoseMode: mode}))
			c, err := s.Charge(context.Background(), chargeReq("lost"))
			require.NoError(t, err)
			require.Equal(t, payment.ChargeSucceeded, c.Status)
			require.Equal(t, int64(1), srv.Stats().LostResponses)
			require.Equal(t, int64(1), srv.Stats().Replays)
			l := fakepsptest.Ledger(t, srv)
			require.Len(t, l.Charges, 1)
			require.Equal(t, c.ID, l.Charges[0].ID)
		})
	}
}

// TestLostResponsesBeyondRetriesAreTransient: when every answer is lost the
// adapter gives up with ErrTransient; the caller's retry later, with the
// same key, gets the one charge.
func TestLostResponsesBeyondRetriesAreTransient(t *testing.T) {
	t.Parallel()
	srv, s := start(t, payment.Config{MaxNetworkRetries: -1})
	require.NoError(t, srv.SetFaults(fakepsp.Faults{LoseResponseRate: 1}))
	_, err := s.Charge(context.Background(), chargeReq("lost"))
	require.ErrorIs(t, err, payment.ErrTransient)
	require.NoError(t, srv.SetFaults(fakepsp.Faults{}))
	c, err := s.Charge(context.Background(), chargeReq("lost"))
	require.NoError(t, err)
	l := fakepsptest.Ledger(t, srv)
	require.Len(t, l.Charges, 1)
	require.Equal(t, c.ID, l.Charges[0].ID)
}

func TestKeyInFlightIsTransient(t *testing.T) {
	t.Parallel()
	srv, s := start(t, payment.Config{MaxNetworkRetries: -1})
	require.NoError(t, srv.SetFaults(fakepsp.Faults{LatencyMS: 1500}))
	type result struct {
		c   payment.Charge
		err error
	}
	done := make(chan result, 1)
	go func() {
		c, err := s.Charge(context.Background(), chargeReq("busy"))
		done <- result{c, err}
	}()
	require.Eventually(t, func() bool { return srv.InFlight() == 1 }, 5*time.Second, 5*time.Millisecond)
	_, err := s.Charge(context.Background(), chargeReq("busy"))
	require.ErrorIs(t, err, payment.ErrTransient)
	require.Contains(t, err.Error(), "409")
	require.Contains(t, err.Error(), "idempotency_key_in_use")
	first := <-done
	require.NoError(t, first.err)
	require.Len(t, fakepsptest.Ledger(t, srv).Charges, 1)
	require.Equal(t, int64(1), srv.Stats().IdempotencyConflicts)
}

func TestProviderErrorIsTransient(t *testing.T) {
	t.Parallel()
	srv, s := start(t, payment.Config{})
	require.NoError(t, srv.SetFaults(fakepsp.Faults{ErrorRate: 1}))
	_, err := s.Charge(context.Background(), chargeReq("k"))
	require.ErrorIs(t, err, payment.ErrTransient)
	require.Empty(t, fakepsptest.Ledger(t, srv).Charges)
	require.NoError(t, srv.SetFaults(fakepsp.Faults{}))
	_, err = s.Charge(context.Background(), chargeReq("k")) // the 500 was not stored under the key
	require.NoError(t, err)
	require.Len(t, fakepsptest.Ledger(t, srv).Charges, 1)
}

func TestRestartKeepsLedgerAndKeys(t *testing.T) {
	t.Parallel()
	dbURL := fakepsptest.DatabaseURL(t)
	_, hs1 := fakepsptest.Start(t, dbURL, fakepsp.Config{})
	first, err := adapter(t, hs1.URL, payment.Config{}).Charge(context.Background(), chargeReq("k"))
	require.NoError(t, err)
	hs1.Close()

	srv2, hs2 := fakepsptest.Start(t, dbURL, fakepsp.Config{})
	s2 := adapter(t, hs2.URL, payment.Config{})
	again, err := s2.Charge(context.Background(), chargeReq("k"))
	require.NoError(t, err)
	require.Equal(t, first, again)
	require.Equal(t, int64(1), srv2.Stats().Replays)
	l := fakepsptest.Ledger(t, srv2)
	require.Len(t, l.Charges, 1)
	found, ok, err := s2.FindCharge(context.Background(), "k")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, first, found)
}

func TestRefundOncePerKey(t *testing.T) {
	t.Parallel()
	srv, s := start(t, payment.Config{})
	ctx := context.Background()
	c, err := s.Charge(ctx, chargeReq("dev:order:o1:charge:1"))
	require.NoError(t, err)
	req := payment.RefundRequest{IdempotencyKey: "dev:order:o1:refund:1", ChargeID: c.ID, Amount: c.Amount, Currency: "EUR"}
	r1, err := s.Refund(ctx, req)
	require.NoError(t, err)
	require.Equal(t, payment.Refund{ID: r1.ID, ChargeID: c.ID, Amount: 1250, Currency: "EUR", Status: payment.RefundSucceeded}, r1)
	require.Regexp(t, `^re_`, r1.ID)
	r2, err := s.Refund(ctx, req)
	require.NoError(t, err)
	require.Equal(t, r1, r2)

	// Another key cannot refund the money twice.
	req.IdempotencyKey = "dev:order:o1:refund:2"
	_, err = s.Refund(ctx, req)
	require.ErrorIs(t, err, payment.ErrPermanent)
	require.Contains(t, err.Error(), "charge_already_refunded")

	l := fakepsptest.Ledger(t, srv)
	require.Len(t, l.Refunds, 1)
	require.Equal(t, "dev:order:o1:refund:1", *l.Refunds[0].IdempotencyKey)
	require.Equal(t, c.ID, l.Refunds[0].PaymentIntent)
	require.Equal(t, int64(1250), l.Refunds[0].Amount)
}

func TestRefundOutcomes(t *testing.T) {
	t.Parallel()
	_, s := start(t, payment.Config{})
	ctx := context.Background()
	r := chargeReq("c1")
	r.PaymentMethod = "pm_card_refundFail"
	c, err := s.Charge(ctx, r)
	require.NoError(t, err)
	require.Equal(t, payment.ChargeSucceeded, c.Status)
	ref, err := s.Refund(ctx, payment.RefundRequest{IdempotencyKey: "r1", ChargeID: c.ID, Amount: c.Amount, Currency: "EUR"})
	require.NoError(t, err)
	require.Equal(t, payment.RefundFailed, ref.Status)
	require.NotEmpty(t, ref.FailureReason)

	_, err = s.Refund(ctx, payment.RefundRequest{IdempotencyKey: "r2", ChargeID: "pi_unknown", Amount: 1, Currency: "EUR"})
	require.ErrorIs(t, err, payment.ErrPermanent)

	d := chargeReq("c2")
	d.PaymentMethod = "pm_card_chargeDeclined"
	declined, err := s.Charge(ctx, d)
	require.NoError(t, err)
	_, err = s.Refund(ctx, payment.RefundRequest{IdempotencyKey: "r3", ChargeID: declined.ID, Amount: 1, Currency: "EUR"})
	require.ErrorIs(t, err, payment.ErrPermanent)
}

func TestFindChargeByKey(t *testing.T) {
	t.Parallel()
	_, s := start(t, payment.Config{})
	ctx := context.Background()
	c, err := s.Charge(ctx, chargeReq("dev:order:o1:charge:1"))
	require.NoError(t, err)
	d := chargeReq("dev:order:o1:charge:2")
	d.PaymentMethod = "pm_card_chargeDeclined"
	declined, err := s.Charge(ctx, d)
	require.NoError(t, err)

	got, ok, err := s.FindCharge(ctx, "dev:order:o1:charge:1")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, c, got)
	got, ok, err = s.FindCharge(ctx, "dev:order:o1:charge:2")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, declined, got)
	_, ok, err = s.FindCharge(ctx, "dev:order:o1:charge:3")
	require.NoError(t, err)
	require.False(t, ok)
}

func TestNewStripeValidates(t *testing.T) {
	t.Parallel()
	for _, cfg := range []payment.Config{
		{},
		{SecretKey: "sk_test_x", BaseURL: "ftp://x"},
		{SecretKey: "sk_test_x", MaxNetworkRetries: -2},
		{SecretKey: "sk_test_x", Timeout: -time.Second},
	} {
		_, err := payment.NewStripe(cfg)
		require.Error(t, err, "%+v", cfg)
	}
	_, err := payment.NewStripe(payment.Config{SecretKey: "sk_test_x"})
	require.NoError(t, err)
}

// FindRefund finds a refund of a charge by the key that made it, through
// the list of the PaymentIntent's refunds (paged: more than one page of
// refunds), whatever it came to; a key that made none is not found, nor is
// a refund of another charge.
func TestFindRefundByKey(t *testing.T) {
	t.Parallel()
	_, s := start(t, payment.Config{})
	ctx := context.Background()
	big := chargeReq("dev:order:o1:charge:1")
	big.Amount = 100_000
	c, err := s.Charge(ctx, big)
	require.NoError(t, err)
	var made []payment.Refund
	for i := range 105 { // more than one page of 100
		rf, err := s.Refund(ctx, payment.RefundRequest{IdempotencyKey: fmt.Sprintf("dev:order:o1:refund:%d", i+1), ChargeID: c.ID, Amount: int64(i + 1), Currency: "EUR"})
		require.NoError(t, err)
		made = append(made, rf)
	}
	other, err := s.Charge(ctx, chargeReq("dev:order:o2:charge:1"))
	require.NoError(t, err)
	for _, i := range []int{0, 50, 104} {
		got, ok, err := s.FindRefund(ctx, c.ID, fmt.Sprintf("dev:order:o1:refund:%d", i+1))
		require.NoError(t, err)
		require.True(t, ok, "refund %d", i+1)
		require.Equal(t, made[i], got)
	}
	_, ok, err := s.FindRefund(ctx, c.ID, "dev:order:o1:refund:200")
	require.NoError(t, err)
	require.False(t, ok)
	_, ok, err = s.FindRefund(ctx, other.ID, "dev:order:o1:refund:1")
	require.NoError(t, err)
	require.False(t, ok)

	// A failed refund is found as failed.
	f := chargeReq("dev:order:o3:charge:1")
	f.PaymentMethod = "pm_card_refundFail"
	fc, err := s.Charge(ctx, f)
	require.NoError(t, err)
	failed, err := s.Refund(ctx, payment.RefundRequest{IdempotencyKey: "dev:order:o3:refund:1", ChargeID: fc.ID, Amount: 1250, Currency: "EUR"})
	require.NoError(t, err)
	got, ok, err := s.FindRefund(ctx, fc.ID, "dev:order:o3:refund:1")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, payment.RefundFailed, got.Status)
	require.Equal(t, failed, got)
}

// Amounts go to the provider in its units of the currency and come back in
// ours (domain.ChargeUnits): ISK in hundredths of a króna, MGA in whole
// ariary. Before, an ISK order of 5,000 krónur was charged 50 and recorded
// paid, the provider's 5000 matching the order's total.
func TestAmountsGoInTheProvidersUnitsAndComeBackInOurs(t *testing.T) {
	t.Parallel()
	srv, s := start(t, payment.Config{})
	ctx := context.Background()
	for i, tt := range []struct {
		currency    string
		ours, units int64
	}{{"ISK", 5000, 500000}, {"MGA", 1500, 15}, {"KWD", 1250, 1250}, {"JPY", 500, 500}} {
		r := chargeReq(fmt.Sprintf("dev:order:o%d:charge:1", i))
		r.Currency, r.Amount = tt.currency, tt.ours
		c, err := s.Charge(ctx, r)
		require.NoError(t, err)
		require.Equal(t, tt.ours, c.Amount, tt.currency)
		found, ok, err := s.FindCharge(ctx, r.IdempotencyKey)
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, tt.ours, found.Amount, tt.currency)
		rf, err := s.Refund(ctx, payment.RefundRequest{IdempotencyKey: fmt.Sprintf("dev:order:o%d:refund:1", i), ChargeID: c.ID, Amount: c.Amount, Currency: tt.currency})
		require.NoError(t, err)
		require.Equal(t, tt.ours, rf.Amount, tt.currency)

		l := fakepsptest.Ledger(t, srv)
		require.Equal(t, tt.units, l.Charges[len(l.Charges)-1].Amount, tt.currency)
		require.Equal(t, tt.units, l.Refunds[len(l.Refunds)-1].Amount, tt.currency)
	}
	// Amounts that are no whole number of the provider's units, or a
	// three-decimal amount not in tens: refused before any call.
	for _, tt := range []struct {
		currency string
		amount   int64
	}{{"MGA", 1550}, {"KWD", 1005}, {"ISK", 1_000_000}} {
		r := chargeReq("dev:order:bad-" + tt.currency + ":charge:1")
		r.Currency, r.Amount = tt.currency, tt.amount
		_, err := s.Charge(ctx, r)
		require.ErrorIs(t, err, payment.ErrPermanent, tt.currency)
	}
	require.Len(t, fakepsptest.Ledger(t, srv).Charges, 4)
}

// An amount the provider refuses (under its minimum for the currency, say:
// Stripe's 400 amount_too_small on amount) is a decline the order can
// leave, not a permanent error that would keep it payment_pending.
func TestARefusedAmountIsADecline(t *testing.T) {
	t.Parallel()
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, `{"error":{"type":"invalid_request_error","code":"amount_too_small","param":"amount","message":"Amount must be at least €0.50 eur"}}`)
	}))
	defer hs.Close()
	r := chargeReq("k")
	r.Amount = 30
	c, err := adapter(t, hs.URL, payment.Config{}).Charge(context.Background(), r)
	require.NoError(t, err)
	require.Equal(t, payment.ChargeDeclined, c.Status)
	require.Equal(t, "amount_too_small", c.DeclineCode)
	require.Equal(t, int64(30), c.Amount)
}

// A charge that waits for the customer to authenticate (3D Secure) is
// cancelled before it is a decline, and the decline says what it waited
// for. One the customer authenticated before the cancel came is a charge:
// the cancel is refused (payment_intent_unexpected_state) and its live
// state read. FindCharge alike.
func TestAChargeWaitingForTheCustomerIsCancelledOrFoundCharged(t *testing.T) {
	t.Parallel()
	srv, hs := fakepsptest.Start(t, fakepsptest.DatabaseURL(t), fakepsp.Config{})
	target, err := url.Parse(hs.URL)
	require.NoError(t, err)
	var authenticateFirst atomic.Bool
	proxy := httputil.NewSingleHostReverseProxy(target)
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if id, ok := strings.CutSuffix(strings.TrimPrefix(r.URL.Path, "/v1/payment_intents/"), "/cancel"); ok && authenticateFirst.Load() {
			if charged, err := srv.CompleteAuthentication(r.Context(), id); err != nil || !charged {
				t.Errorf("the customer's authentication of %s before its cancel: charged %v, err %v", id, charged, err)
			}
		}
		proxy.ServeHTTP(w, r)
	}))
	defer front.Close()
	s := adapter(t, front.URL, payment.Config{})

	req := chargeReq("k-3ds")
	req.PaymentMethod = "pm_card_authenticationRequired"
	c, err := s.Charge(context.Background(), req)
	require.NoError(t, err)
	require.Equal(t, payment.ChargeDeclined, c.Status)
	require.Equal(t, "requires_action", c.DeclineCode)
	again, err := s.Charge(context.Background(), req) // the create replayed, the cancel refused: still a decline
	require.NoError(t, err)
	require.Equal(t, c, again)
	found, ok, err := s.FindCharge(context.Background(), "k-3ds")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, payment.ChargeDeclined, found.Status)
	charged, err := srv.CompleteAuthentication(context.Background(), c.ID)
	require.NoError(t, err)
	require.False(t, charged, "a declined payment intent could still be charged")

	authenticateFirst.Store(true)
	req = chargeReq("k-3ds-authenticated")
	req.PaymentMethod = "pm_card_authenticationRequired"
	c, err = s.Charge(context.Background(), req)
	require.NoError(t, err)
	require.Equal(t, payment.ChargeSucceeded, c.Status)
	require.Equal(t, int64(1250), c.Amount)
	l := fakepsptest.Ledger(t, srv)
	statuses := map[string]string{}
	for _, pi := range l.Charges {
		statuses[pi.ID] = pi.Status
	}
	require.Equal(t, map[string]string{found.ID: "canceled", c.ID: "succeeded"}, statuses)
}

// FindCharge takes only a PaymentIntent made with the key it looks for
// (its metadata), whatever else the search matched: another intent's
// charge taken for this one would mark its order paid by a charge of
// another.
func TestFindChargeTakesOnlyAnIntentOfItsKey(t *testing.T) {
	t.Parallel()
	const other = `{"id":"pi_other","object":"payment_intent","amount":1250,"currency":"eur","status":"succeeded","metadata":{"idempotency_key":"k-other"}}`
	const mangled = `{"id":"pi_mangled","object":"payment_intent","amount":1250,"currency":"eur","status":"succeeded"}`
	var answer atomic.Value
	answer.Store(other)
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"object":"search_result","data":[`+answer.Load().(string)+`],"has_more":false}`)
	}))
	defer hs.Close()
	s := adapter(t, hs.URL, payment.Config{})
	_, found, err := s.FindCharge(context.Background(), "k")
	require.NoError(t, err)
	require.False(t, found, "a PaymentIntent of another key was taken for this one")
	// One without the key in its metadata may be ours: no outcome yet.
	answer.Store(mangled)
	_, _, err = s.FindCharge(context.Background(), "k")
	require.ErrorIs(t, err, payment.ErrTransient)
}
