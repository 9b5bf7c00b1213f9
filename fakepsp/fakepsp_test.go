package fakepsp_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/acme/orders/fakepsp"
	"github.com/acme/orders/fakepsp/fakepsptest"
	"github.com/acme/orders/payment"
)

// TestKeyExpires: after KeyTTL (judged by the database clock) a key is
// forgotten and the same request executes anew, as at Stripe.
func TestKeyExpires(t *testing.T) {
	t.Parallel()
	srv, hs := fakepsptest.Start(t, fakepsptest.DatabaseURL(t), fakepsp.Config{KeyTTL: time.Second})
	s, err := payment.NewStripe(payment.Config{BaseURL: hs.URL, SecretKey: fakepsptest.SecretKey})
	require.NoError(t, err)
	req := payment.ChargeRequest{IdempotencyKey: "k", Amount: 100, Currency: "EUR", PaymentMethod: "pm_card_visa"}
	first, err := s.Charge(context.Background(), req)
	require.NoError(t, err)
	again, err := s.Charge(context.Background(), req)
	require.NoError(t, err)
	require.Equal(t, first.ID, again.ID)
	time.Sleep(1100 * time.Millisecond)
	n, err := srv.PurgeExpiredKeys(context.Background())
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	later, err := s.Charge(context.Background(), req)
	require.NoError(t, err)
	require.NotEqual(t, first.ID, later.ID)
	require.Len(t, fakepsptest.Ledger(t, srv).Charges, 2)
}

func TestConfigAndFaultsValidate(t *testing.T) {
	t.Parallel()
	for _, f := range []fakepsp.Faults{
		{LatencyMS: -1}, {ErrorRate: 1.5}, {LoseResponseRate: -0.1}, {LoseNext: -1}, {LoseMode: "drop"},
	} {
		require.Error(t, f.Validate(), "%+v", f)
	}
	require.NoError(t, fakepsp.Faults{LatencyMS: 10, ErrorRate: 0.1, LoseResponseRate: 1, LoseNext: 3, LoseMode: fakepsp.LoseStall}.Validate())
	_, err := fakepsp.New(fakepsp.Config{})
	require.ErrorContains(t, err, "Config.Pool")
}

// A wrong API key of any length is refused 401, a permanent error for the
// adapter (dead-lettered, as at Stripe); one of 9 to 11 characters used to
// panic the handler, which the adapter took for a lost answer and retried
// for good. The answer never shows more than a fifth of a short key.
func TestAnyWrongKeyIsRefused(t *testing.T) {
	t.Parallel()
	_, hs := fakepsptest.Start(t, fakepsptest.DatabaseURL(t), fakepsp.Config{})
	for _, key := range []string{"x", "sk_live_", "sk_live_x", "sk_live_xyz", "sk_live_xyzw", "sk_live_" + strings.Repeat("x", 30)} {
		s, err := payment.NewStripe(payment.Config{BaseURL: hs.URL, SecretKey: key, Timeout: 5 * time.Second, MaxNetworkRetries: -1})
		require.NoError(t, err)
		_, err = s.Charge(context.Background(), payment.ChargeRequest{IdempotencyKey: "k", Amount: 100, Currency: "EUR", PaymentMethod: "pm_card_visa"})
		require.ErrorIs(t, err, payment.ErrPermanent, "key %q", key)
		if len(key) > 8 && len(key) < 24 {
			require.NotContains(t, err.Error(), key[:8], "key %q shown", key)
		}
	}
}
