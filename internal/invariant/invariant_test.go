package invariant_test

import (
	"context"
	"strings"
	"testing"

	"github.com/acme/orders/internal/invariant"
	"github.com/acme/orders/internal/testenv"
)

// The money invariants compare sums past 2^63 exactly (orders placed before
// domain.MaxAmount could carry ~2^63 each): equal sums pass, a sum off by one
// minor unit is a violation, and neither is a "bigint out of range" error.
func TestMoneyInvariantsHoldPastInt64(t *testing.T) {
	t.Parallel()
	db := testenv.DB(t)
	ctx := context.Background()
	for _, sql := range []string{`
INSERT INTO orders (tenant_id, id, customer_id, status, currency, total, version, creating_key, created_at, updated_at, paid_at, items)
SELECT 't1', gen_random_uuid(), 'c-1', 'paid', 'EUR', 9223372036854775807, 2, 'k' || g,
       '2026-11-21T12:00:00Z', '2026-11-21T12:00:00Z', '2026-11-21T12:00:00Z',
       '[{"sku":"s","quantity":1,"unit_price":9223372036854775807,"line_total":9223372036854775807}]'
FROM generate_series(1, 2) g`, `
INSERT INTO customer_summaries (tenant_id, customer_id, currency, orders_paid, total_paid, total_refunded, last_order_at)
VALUES ('t1', 'c-1', 'EUR', 2, 18446744073709551614, 0, '2026-11-21T12:00:00Z')`, `
INSERT INTO daily_sales (tenant_id, day, currency, orders, paid_amount, refunded_amount)
VALUES ('t1', '2026-11-21', 'EUR', 2, 18446744073709551614, 0)`} {
		if _, err := db.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	money := func() []string {
		t.Helper()
		v, err := invariant.Check(ctx, db)
		if err != nil {
			t.Fatalf("Check: %v", err)
		}
		var out []string
		for _, x := range v {
			if strings.HasPrefix(x.Invariant, "customer summaries") || strings.HasPrefix(x.Invariant, "daily sales") {
				out = append(out, x.String())
			}
		}
		return out
	}
	if v := money(); len(v) != 0 {
		t.Fatalf("exact sums past 2^63 reported as violations: %v", v)
	}
	if _, err := db.Exec(ctx, `UPDATE customer_summaries SET total_paid = total_paid + 1;
UPDATE daily_sales SET paid_amount = paid_amount - 1`); err != nil {
		t.Fatal(err)
	}
	if v := money(); len(v) != 2 {
		t.Fatalf("sums off by one minor unit: violations %v, want one per read model", v)
	}
}

// An order's total is the sum of its items' line totals, each quantity ×
// unit price, compared exactly (numeric) at the int64 limit: a total off by
// one minor unit, a line total that is not its product (also one whose
// product passes 2^63, where bigint arithmetic would raise instead of
// report) and an order without items are violations; an exact order of
// 2^63 - 1 is not.
func TestOrderTotalsMatchTheirItems(t *testing.T) {
	t.Parallel()
	db := testenv.DB(t)
	ctx := context.Background()
	if _, err := db.Exec(ctx, `
INSERT INTO orders (tenant_id, id, customer_id, status, currency, total, version, creating_key, created_at, updated_at, items)
VALUES ('t1', gen_random_uuid(), 'c-1', 'pending', 'EUR', 9223372036854775807, 1, 'exact', now(), now(),
        '[{"sku":"a","quantity":1,"unit_price":9223372036854775806,"line_total":9223372036854775806},
          {"sku":"b","quantity":1,"unit_price":1,"line_total":1}]'),
       ('t1', gen_random_uuid(), 'c-1', 'pending', 'EUR', 2501, 1, 'total-off', now(), now(),
        '[{"sku":"a","quantity":2,"unit_price":1250,"line_total":2500}]'),
       ('t1', gen_random_uuid(), 'c-1', 'pending', 'EUR', 2600, 1, 'line-off', now(), now(),
        '[{"sku":"a","quantity":2,"unit_price":1250,"line_total":2600}]'),
       ('t1', gen_random_uuid(), 'c-1', 'pending', 'EUR', 0, 1, 'wraps', now(), now(),
        '[{"sku":"a","quantity":2,"unit_price":9223372036854775807,"line_total":-2}]'),
       ('t1', gen_random_uuid(), 'c-1', 'pending', 'EUR', 0, 1, 'no-items', now(), now(), '[]')`); err != nil {
		t.Fatal(err)
	}
	v, err := invariant.Check(ctx, db)
	if err != nil {
		t.Fatalf("Check: %v", err)
	}
	var totals []string
	for _, x := range v {
		if strings.HasPrefix(x.Invariant, "every order's total") {
			totals = append(totals, x.String())
		}
	}
	all := strings.Join(totals, "\n")
	if len(totals) != 4 || !strings.Contains(all, "2501") || !strings.Contains(all, "2600") ||
		!strings.Contains(all, "-2") || !strings.Contains(all, "[]") {
		t.Fatalf("violations %q, want the order whose total is off, the one whose line total is off, "+
			"the one whose product passes 2^63, and the one without items", totals)
	}
}

// A free order paid and cancelled before payments went through the
// provider (refund '{}') refunded nothing: daily sales has no row for the
// day of its cancellation, and the check expects none.
func TestAFreeOrderCancelledBeforeTheProviderIsNoRefundFact(t *testing.T) {
	t.Parallel()
	db := testenv.DB(t)
	ctx := context.Background()
	for _, sql := range []string{`
INSERT INTO orders (tenant_id, id, customer_id, status, currency, total, version, creating_key, created_at, updated_at, paid_at, cancelled_at, cancel_reason, items)
VALUES ('t1', gen_random_uuid(), 'c-1', 'cancelled', 'CHF', 0, 3, 'k',
        '2026-10-02T12:00:00Z', '2026-10-03T12:00:00Z', '2026-10-02T12:00:00Z', '2026-10-03T12:00:00Z', 'free',
        '[{"sku":"s","quantity":1,"unit_price":0,"line_total":0}]')`, `
INSERT INTO daily_sales (tenant_id, day, currency, orders, paid_amount, refunded_amount)
VALUES ('t1', '2026-10-02', 'CHF', 1, 0, 0)`} {
		if _, err := db.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	v, err := invariant.Check(ctx, db)
	if err != nil {
		t.Fatalf("Check: %v", err)
	}
	for _, x := range v {
		if strings.HasPrefix(x.Invariant, "daily sales") {
			t.Fatalf("a refund of nothing expected in daily sales: %s", x)
		}
	}
}
