package fakepsp_test

import (
	"context"
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
