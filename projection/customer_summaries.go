package projection

import (
	"cmp"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/acme/orders/domain"
)

// CustomerSummaries keeps customer_summaries: per tenant, customer and
// currency, how many orders are in each status, how much was paid (charges
// the provider confirmed: order.paid) and refunded (refunds it confirmed:
// order.refunded; never at the cancellation), and when the last order was placed. It is built from deltas, so
// it depends on the runner's inbox and positions to see each event once.
type CustomerSummaries struct{}

var _ Projection = CustomerSummaries{}

// Name implements Projection.
func (CustomerSummaries) Name() string { return "customer_summaries" }

// Tables implements Projection.
func (CustomerSummaries) Tables() []string { return []string{"customer_summaries"} }

type summaryKey struct{ tenant, customer, currency string }

type summaryDelta struct {
	byStatus       map[domain.Status]int64
	paid, refunded int64
	lastOrderAt    *time.Time
}

// CustomerSummariesUpsertSQL adds a batch's deltas to the summary rows, one
// array element per row.
const CustomerSummariesUpsertSQL = `
INSERT INTO customer_summaries AS s (tenant_id, customer_id, currency, orders_pending, orders_paid,
    orders_shipped, orders_cancelled, total_paid, total_refunded, last_order_at,
    orders_payment_pending, orders_payment_failed)
SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::bigint[], $6::bigint[],
    $7::bigint[], $8::bigint[], $9::bigint[], $10::timestamptz[], $11::bigint[], $12::bigint[])
ON CONFLICT (tenant_id, customer_id, currency) DO UPDATE SET
    orders_pending   = s.orders_pending + EXCLUDED.orders_pending,
    orders_payment_pending = s.orders_payment_pending + EXCLUDED.orders_payment_pending,
    orders_payment_failed  = s.orders_payment_failed + EXCLUDED.orders_payment_failed,
    orders_paid      = s.orders_paid + EXCLUDED.orders_paid,
    orders_shipped   = s.orders_shipped + EXCLUDED.orders_shipped,
    orders_cancelled = s.orders_cancelled + EXCLUDED.orders_cancelled,
    total_paid       = s.total_paid + EXCLUDED.total_paid,
    total_refunded   = s.total_refunded + EXCLUDED.total_refunded,
    last_order_at    = GREATEST(s.last_order_at, EXCLUDED.last_order_at)`

// Queue implements Projection: it sums the batch's deltas per summary row and
// writes them in one statement, rows in key order (so concurrent workers
// lock shared rows in the same order and cannot deadlock). A money delta that
// would pass the int64 range is an error wrapping ErrPermanent; the columns
// are numeric(38,0), so the stored sums themselves are exact up to 10^38 - 1
// (past that PostgreSQL refuses the batch with a range error).
func (CustomerSummaries) Queue(b *pgx.Batch, events []domain.Envelope) error {
	deltas := newDeltaRows[summaryKey](func() *summaryDelta { return &summaryDelta{byStatus: map[domain.Status]int64{}} })
	delta := func(tenant, customer, currency string) *summaryDelta {
		return deltas.at(summaryKey{tenant, customer, currency})
	}
	move := func(env domain.Envelope, t domain.Transition) *summaryDelta {
		d := delta(env.TenantID, t.CustomerID, t.Currency)
		d.byStatus[t.From]--
		d.byStatus[t.Status]++
		return d
	}
	for _, env := range events {
		switch env.Type {
		case domain.TypeOrderCreated:
			e, err := decodeData[domain.OrderCreated](env)
			if err != nil {
				return err
			}
			d := delta(env.TenantID, e.CustomerID, e.Currency)
			d.byStatus[domain.StatusPending]++
			if d.lastOrderAt == nil || e.CreatedAt.After(*d.lastOrderAt) {
				d.lastOrderAt = &e.CreatedAt
			}
		case domain.TypeOrderPaid:
			e, err := decodeData[domain.OrderPaid](env)
			if err != nil {
				return err
			}
			d := move(env, e.Transition)
			if err := addMoney(&d.paid, e.Total, "customer "+e.CustomerID+" "+e.Currency+" total_paid"); err != nil {
				return err
			}
		case domain.TypeOrderShipped:
			e, err := decodeData[domain.OrderShipped](env)
			if err != nil {
				return err
			}
			move(env, e.Transition)
		case domain.TypePaymentRequested:
			e, err := decodeData[domain.PaymentRequested](env)
			if err != nil {
				return err
			}
			move(env, e.Transition)
		case domain.TypeOrderPaymentFailed:
			e, err := decodeData[domain.OrderPaymentFailed](env)
			if err != nil {
				return err
			}
			move(env, e.Transition)
		case domain.TypeOrderCancelled:
			e, err := decodeData[domain.OrderCancelled](env)
			if err != nil {
				return err
			}
			d := move(env, e.Transition)
			// Refunded is 0 in events written since refunds go through the
			// provider (they count at order.refunded); older events carry it.
			if err := addMoney(&d.refunded, e.Refunded, "customer "+e.CustomerID+" "+e.Currency+" total_refunded"); err != nil {
				return err
			}
		case domain.TypeOrderRefunded:
			e, err := decodeData[domain.OrderRefunded](env)
			if err != nil {
				return err
			}
			d := delta(env.TenantID, e.CustomerID, e.Currency)
			if err := addMoney(&d.refunded, e.Amount, "customer "+e.CustomerID+" "+e.Currency+" total_refunded"); err != nil {
				return err
			}
		}
	}
	if deltas.empty() {
		return nil
	}

	var tenants, customers, currencies []string
	var pending, paying, failed, paid, shipped, cancelled, totalPaid, totalRefunded []int64
	var last []*time.Time
	deltas.inOrder(func(a, b summaryKey) int {
		return cmp.Or(cmp.Compare(a.tenant, b.tenant), cmp.Compare(a.customer, b.customer), cmp.Compare(a.currency, b.currency))
	}, func(k summaryKey, d *summaryDelta) {
		tenants, customers, currencies = append(tenants, k.tenant), append(customers, k.customer), append(currencies, k.currency)
		pending = append(pending, d.byStatus[domain.StatusPending])
		paying = append(paying, d.byStatus[domain.StatusPaymentPending])
		failed = append(failed, d.byStatus[domain.StatusPaymentFailed])
		paid = append(paid, d.byStatus[domain.StatusPaid])
		shipped = append(shipped, d.byStatus[domain.StatusShipped])
		cancelled = append(cancelled, d.byStatus[domain.StatusCancelled])
		totalPaid, totalRefunded = append(totalPaid, d.paid), append(totalRefunded, d.refunded)
		last = append(last, d.lastOrderAt)
	})
	b.Queue(CustomerSummariesUpsertSQL, tenants, customers, currencies,
		pending, paid, shipped, cancelled, totalPaid, totalRefunded, last, paying, failed)
	return nil
}
