package projection

import (
	"cmp"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/acme/orders/domain"
)

// DailySales keeps daily_sales: per tenant, UTC day and currency, the orders
// placed, the amount paid (order.paid: the provider confirmed the charge)
// and the amount refunded (order.refunded: it confirmed the refund) that day. Built from
// deltas, like CustomerSummaries.
type DailySales struct{}

var _ Projection = DailySales{}

// Name implements Projection.
func (DailySales) Name() string { return "daily_sales" }

// Tables implements Projection.
func (DailySales) Tables() []string { return []string{"daily_sales"} }

type salesKey struct {
	tenant   string
	day      time.Time // midnight UTC
	currency string
}

type salesDelta struct{ orders, paid, refunded int64 }

// DailySalesUpsertSQL adds a batch's deltas to the daily rows, one array
// element per row.
const DailySalesUpsertSQL = `
INSERT INTO daily_sales AS s (tenant_id, day, currency, orders, paid_amount, refunded_amount)
SELECT * FROM unnest($1::text[], $2::date[], $3::text[], $4::bigint[], $5::bigint[], $6::bigint[])
ON CONFLICT (tenant_id, day, currency) DO UPDATE SET
    orders          = s.orders + EXCLUDED.orders,
    paid_amount     = s.paid_amount + EXCLUDED.paid_amount,
    refunded_amount = s.refunded_amount + EXCLUDED.refunded_amount`

// Day returns the UTC calendar day of t, the unit daily_sales counts in.
func Day(t time.Time) time.Time {
	y, m, d := t.UTC().Date()
	return time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
}

// Queue implements Projection: the batch's deltas per row, written in one
// statement in key order. Money is checked as in CustomerSummaries: a delta
// past the int64 range is an error wrapping ErrPermanent, and the numeric(38,0)
// columns hold sums exactly up to 10^38 - 1.
func (DailySales) Queue(b *pgx.Batch, events []domain.Envelope) error {
	deltas := newDeltaRows[salesKey, salesDelta](nil)
	delta := func(tenant string, at time.Time, currency string) *salesDelta {
		return deltas.at(salesKey{tenant, Day(at), currency})
	}
	for _, env := range events {
		switch env.Type {
		case domain.TypeOrderCreated:
			e, err := decodeData[domain.OrderCreated](env)
			if err != nil {
				return err
			}
			delta(env.TenantID, e.CreatedAt, e.Currency).orders++
		case domain.TypeOrderPaid:
			e, err := decodeData[domain.OrderPaid](env)
			if err != nil {
				return err
			}
			d := delta(env.TenantID, e.At, e.Currency)
			if err := addMoney(&d.paid, e.Total, "day "+Day(e.At).Format(time.DateOnly)+" "+e.Currency+" paid_amount"); err != nil {
				return err
			}
		case domain.TypeOrderRefunded:
			e, err := decodeData[domain.OrderRefunded](env)
			if err != nil {
				return err
			}
			d := delta(env.TenantID, e.RefundedAt, e.Currency)
			if err := addMoney(&d.refunded, e.Amount, "day "+Day(e.RefundedAt).Format(time.DateOnly)+" "+e.Currency+" refunded_amount"); err != nil {
				return err
			}
		case domain.TypeOrderCancelled:
			e, err := decodeData[domain.OrderCancelled](env)
			if err != nil {
				return err
			}
			if e.Refunded > 0 { // only events written before refunds went through the provider

				d := delta(env.TenantID, e.At, e.Currency)
				if err := addMoney(&d.refunded, e.Refunded, "day "+Day(e.At).Format(time.DateOnly)+" "+e.Currency+" refunded_amount"); err != nil {
					return err
				}
			}
		}
	}
	if deltas.empty() {
		return nil
	}
	var tenants, currencies []string
	var days []time.Time
	var orders, paid, refunded []int64
	deltas.inOrder(func(a, b salesKey) int {
		return cmp.Or(cmp.Compare(a.tenant, b.tenant), a.day.Compare(b.day), cmp.Compare(a.currency, b.currency))
	}, func(k salesKey, d *salesDelta) {
		tenants, days, currencies = append(tenants, k.tenant), append(days, k.day), append(currencies, k.currency)
		orders, paid, refunded = append(orders, d.orders), append(paid, d.paid), append(refunded, d.refunded)
	})
	b.Queue(DailySalesUpsertSQL, tenants, days, currencies, orders, paid, refunded)
	return nil
}
