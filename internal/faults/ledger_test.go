package faults

import (
	"strings"
	"testing"

	"github.com/acme/orders/fakepsp"
)

// The provider's ledger is held against our orders and payments rows: each
// kind of disagreement is a violation, and second charges are counted.
func TestLedgerViolations(t *testing.T) {
	key := func(s string) *string { return &s }
	charge := func(order, k, id, status string, amount int64) fakepsp.LedgerCharge {
		return fakepsp.LedgerCharge{ID: id, IdempotencyKey: key(k), Amount: amount, Currency: "eur", Status: status,
			Metadata: map[string]string{"order_id": order}}
	}
	refund := func(order, k, id, status string, amount int64) fakepsp.LedgerRefund {
		// Refunds carry no order_id in their metadata: the key names it.
		return fakepsp.LedgerRefund{ID: id, IdempotencyKey: key(k), Amount: amount, Currency: "eur", Status: status}
	}
	row := func(order, kind, k, id, status string, amount int64) paymentRow {
		return paymentRow{OrderID: order, Kind: kind, Key: k, ProviderID: id, Amount: amount, Currency: "EUR", Status: status}
	}
	// o1 paid; o2 declined then paid; o3 paid, cancelled and refunded; o4 never paid.
	orders := []orderRow{
		{ID: "o1", Status: "paid", Total: 500, Currency: "EUR", Paid: true},
		{ID: "o2", Status: "shipped", Total: 700, Currency: "EUR", Paid: true},
		{ID: "o3", Status: "cancelled", Total: 900, Currency: "EUR", Paid: true, Cancelled: true, Refund: "succeeded"},
		{ID: "o4", Status: "cancelled", Total: 100, Currency: "EUR", Cancelled: true},
	}
	good := fakepsp.Ledger{
		Charges: []fakepsp.LedgerCharge{
			charge("o1", "t:order:o1:charge:1", "pi_1", "succeeded", 500),
			charge("o2", "t:order:o2:charge:1", "pi_2", "requires_payment_method", 700),
			charge("o2", "t:order:o2:charge:2", "pi_3", "succeeded", 700),
			charge("o3", "t:order:o3:charge:1", "pi_4", "succeeded", 900),
		},
		Refunds: []fakepsp.LedgerRefund{refund("o3", "t:order:o3:refund:1", "re_1", "succeeded", 900)},
	}
	rows := []paymentRow{
		row("o1", "charge", "t:order:o1:charge:1", "pi_1", "succeeded", 500),
		row("o2", "charge", "t:order:o2:charge:1", "pi_2", "declined", 700),
		row("o2", "charge", "t:order:o2:charge:2", "pi_3", "succeeded", 700),
		row("o3", "charge", "t:order:o3:charge:1", "pi_4", "succeeded", 900),
		row("o3", "refund", "t:order:o3:refund:1", "re_1", "succeeded", 900),
		// o4's payment declined with nothing made: the provider spent the
		// key on a stored 500 (provider_failed), and holds no charge.
		row("o4", "charge", "t:order:o4:charge:1", "", "declined", 100),
	}
	if v, second := ledgerViolations(good, orders, rows); len(v) != 0 || second != 0 {
		t.Fatalf("a consistent ledger: violations %q, second charges %d", v, second)
	}

	for _, tc := range []struct {
		name   string
		change func(l *fakepsp.Ledger, rows *[]paymentRow)
		want   string
		second int
	}{
		{"second charge of a paid order under another key", func(l *fakepsp.Ledger, rows *[]paymentRow) {
			l.Charges = append(l.Charges, charge("o1", "t:order:o1:charge:2", "pi_9", "succeeded", 500))
			*rows = append(*rows, row("o1", "charge", "t:order:o1:charge:2", "pi_9", "succeeded", 500))
		}, "order o1 (paid) has 2 succeeded charges", 1},
		{"a key charged twice", func(l *fakepsp.Ledger, _ *[]paymentRow) {
			l.Charges = append(l.Charges, charge("o1", "t:order:o1:charge:1", "pi_9", "succeeded", 500))
		}, "key t:order:o1:charge:1 charged 2 times", 2},
		{"an unpaid order charged", func(l *fakepsp.Ledger, rows *[]paymentRow) {
			l.Charges = append(l.Charges, charge("o4", "t:order:o4:charge:1", "pi_9", "succeeded", 100))
			*rows = append(*rows, row("o4", "charge", "t:order:o4:charge:1", "pi_9", "succeeded", 100))
		}, "order o4 (cancelled) has 1 succeeded charges, want 0", 0},
		{"a paid order charged the wrong amount", func(l *fakepsp.Ledger, rows *[]paymentRow) {
			l.Charges[0].Amount, (*rows)[0].Amount = 499, 499
		}, "order o1 charged 499 eur, its total is 500 EUR", 0},
		{"a charge we never recorded", func(l *fakepsp.Ledger, rows *[]paymentRow) {
			*rows = (*rows)[1:]
		}, "provider charge pi_1 (key t:order:o1:charge:1) has no payments row", 0},
		{"a payments row the provider does not know", func(l *fakepsp.Ledger, rows *[]paymentRow) {
			l.Charges = l.Charges[1:]
		}, "payments row t:order:o1:charge:1 (charge pi_1) has no provider record", 0},
		{"a succeeded row with no provider id the provider does not know", func(l *fakepsp.Ledger, rows *[]paymentRow) {
			*rows = append(*rows, row("o4", "charge", "t:order:o4:charge:2", "", "succeeded", 100))
		}, "payments row t:order:o4:charge:2 (charge ) has no provider record", 0},
		{"our row and the provider disagree by a cent", func(l *fakepsp.Ledger, rows *[]paymentRow) {
			(*rows)[2].Amount = 701
		}, "payments row t:order:o2:charge:2: ours charge pi_3 succeeded 701 EUR, provider's pi_3 succeeded 700 eur", 0},
		{"a cancelled paid order not refunded", func(l *fakepsp.Ledger, rows *[]paymentRow) {
			l.Refunds, *rows = nil, (*rows)[:4]
		}, "order o3 (cancelled, refund succeeded) has 0 succeeded refunds, want 1", 0},
		{"a refund still pending after the drain", func(l *fakepsp.Ledger, rows *[]paymentRow) {
			l.Refunds, *rows = nil, (*rows)[:4]
			orders[2].Refund = "pending"
		}, "order o3 refund still pending", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := fakepsp.Ledger{Charges: append([]fakepsp.LedgerCharge{}, good.Charges...), Refunds: append([]fakepsp.LedgerRefund{}, good.Refunds...)}
			r := append([]paymentRow{}, rows...)
			saved := orders[2]
			defer func() { orders[2] = saved }()
			tc.change(&l, &r)
			v, second := ledgerViolations(l, orders, r)
			if !strings.Contains(strings.Join(v, "\n"), tc.want) {
				t.Errorf("violations %q lack %q", v, tc.want)
			}
			if second != tc.second {
				t.Errorf("second charges %d, want %d", second, tc.second)
			}
		})
	}
}
