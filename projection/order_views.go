package projection

import (
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/acme/orders/domain"
)

// OrderViews keeps order_views: every order as clients read it, including
// the timestamps its status history is derived from.
type OrderViews struct{}

var _ Projection = OrderViews{}

// Name implements Projection.
func (OrderViews) Name() string { return "order_views" }

// Tables implements Projection.
func (OrderViews) Tables() []string { return []string{"order_views"} }

const (
	// OrderViewInsertSQL inserts the views of new orders, many in one go.
	OrderViewInsertSQL = `
INSERT INTO order_views (tenant_id, order_id, customer_id, status, currency, items, total, version, created_at, updated_at)
SELECT tenant_id, order_id, customer_id, status, currency, items, total, version, created_at, created_at
FROM unnest($1::text[], $2::uuid[], $3::text[], $4::text[], $5::text[], $6::jsonb[], $7::bigint[], $8::bigint[], $9::timestamptz[])
     AS v(tenant_id, order_id, customer_id, status, currency, items, total, version, created_at)
ON CONFLICT (tenant_id, order_id) DO NOTHING`

	// orderViewPaidSQL: a legacy order.paid (no charge id) leaves payment as is.
	orderViewPaidSQL = `
UPDATE order_views SET status = $3, paid_at = $4, version = $5, updated_at = $4,
    payment = payment || $6::jsonb
WHERE tenant_id = $1 AND order_id = $2`

	orderViewPaymentRequestedSQL = `
UPDATE order_views SET status = $3, payment = $4, version = $5, updated_at = $6
WHERE tenant_id = $1 AND order_id = $2`

	orderViewPaymentFailedSQL = `
UPDATE order_views SET status = $3, version = $4, updated_at = $5,
    payment = payment || $6::jsonb
WHERE tenant_id = $1 AND order_id = $2`

	orderViewRefundRequestedSQL = `
UPDATE order_views SET refund = $3, version = $4, updated_at = $5
WHERE tenant_id = $1 AND order_id = $2`

	orderViewRefundSettledSQL = `
UPDATE order_views SET version = $3, updated_at = $4, refund = refund || $5::jsonb
WHERE tenant_id = $1 AND order_id = $2`

	orderViewShippedSQL = `
UPDATE order_views SET status = $3, shipped_at = $4, version = $5, updated_at = $4
WHERE tenant_id = $1 AND order_id = $2`

	orderViewCancelledSQL = `
UPDATE order_views SET status = $3, cancelled_at = $4, version = $5, updated_at = $4, cancel_reason = $6
WHERE tenant_id = $1 AND order_id = $2`

	orderViewUpdatedSQL = `
UPDATE order_views SET shipping_address = $3, note = $4, version = $5, updated_at = $6
WHERE tenant_id = $1 AND order_id = $2`

	// An event type this projection does not know still moves the version.
	orderViewBumpSQL = `
UPDATE order_views SET version = $3, updated_at = $4 WHERE tenant_id = $1 AND order_id = $2`
)

// Queue implements Projection: the new orders in one insert, then one
// statement per later event. An
// order's created event precedes its other events, so inserting every new
// view first keeps each order's events in order.
func (OrderViews) Queue(b *pgx.Batch, events []domain.Envelope) error {
	var created struct {
		tenants, customers, statuses, currencies []string
		ids                                      []uuid.UUID
		items                                    [][]domain.Item
		totals, versions                         []int64
		at                                       []time.Time
	}
	var updates []func()
	for _, env := range events {
		t, id, v := env.TenantID, env.AggregateID, env.AggregateVersion
		switch env.Type {
		case domain.TypeOrderCreated:
			e, err := decodeData[domain.OrderCreated](env)
			if err != nil {
				return err
			}
			c := &created
			c.tenants, c.ids, c.customers = append(c.tenants, t), append(c.ids, id), append(c.customers, e.CustomerID)
			c.statuses, c.currencies, c.items = append(c.statuses, string(e.Status)), append(c.currencies, e.Currency), append(c.items, e.Items)
			c.totals, c.versions, c.at = append(c.totals, e.Total), append(c.versions, v), append(c.at, e.CreatedAt)
			continue // a view that exists already (an earlier life of it) stays
		case domain.TypeOrderPaid:
			e, err := decodeData[domain.OrderPaid](env)
			if err != nil {
				return err
			}
			updates = append(updates, func() {
				queueOne(b, env, orderViewPaidSQL, t, id, e.Status, e.At, v, jsonPatch("charge_id", e.ChargeID))
			})
		case domain.TypePaymentRequested:
			e, err := decodeData[domain.PaymentRequested](env)
			if err != nil {
				return err
			}
			at := e.At
			p := domain.Payment{Attempt: e.Attempt, Key: e.PaymentKey, Method: e.PaymentMethod, RequestedAt: &at}
			updates = append(updates, func() { queueOne(b, env, orderViewPaymentRequestedSQL, t, id, e.Status, p, v, e.At) })
		case domain.TypeOrderPaymentFailed:
			e, err := decodeData[domain.OrderPaymentFailed](env)
			if err != nil {
				return err
			}
			updates = append(updates, func() {
				queueOne(b, env, orderViewPaymentFailedSQL, t, id, e.Status, v, e.At,
					jsonPatch("decline_code", e.DeclineCode, "failure_reason", e.Reason, "failed_at", e.At))
			})
		case domain.TypeRefundRequested:
			e, err := decodeData[domain.RefundRequested](env)
			if err != nil {
				return err
			}
			at := e.At
			r := domain.Refund{Status: domain.RefundPending, Attempt: e.Attempt, Key: e.RefundKey, RequestedAt: &at}
			updates = append(updates, func() { queueOne(b, env, orderViewRefundRequestedSQL, t, id, r, v, e.At) })
		case domain.TypeOrderRefunded:
			e, err := decodeData[domain.OrderRefunded](env)
			if err != nil {
				return err
			}
			updates = append(updates, func() {
				queueOne(b, env, orderViewRefundSettledSQL, t, id, v, e.RefundedAt,
					jsonPatch("status", string(domain.RefundSucceeded), "id", e.RefundID, "settled_at", e.RefundedAt))
			})
		case domain.TypeOrderRefundFailed:
			e, err := decodeData[domain.OrderRefundFailed](env)
			if err != nil {
				return err
			}
			updates = append(updates, func() {
				queueOne(b, env, orderViewRefundSettledSQL, t, id, v, e.At,
					jsonPatch("status", string(domain.RefundFailed), "failure_reason", e.Reason, "settled_at", e.At))
			})
		case domain.TypeOrderShipped:
			e, err := decodeData[domain.OrderShipped](env)
			if err != nil {
				return err
			}
			updates = append(updates, func() { queueOne(b, env, orderViewShippedSQL, t, id, e.Status, e.At, v) })
		case domain.TypeOrderCancelled:
			e, err := decodeData[domain.OrderCancelled](env)
			if err != nil {
				return err
			}
			updates = append(updates, func() { queueOne(b, env, orderViewCancelledSQL, t, id, e.Status, e.At, v, e.Reason) })
		case domain.TypeOrderUpdated:
			e, err := decodeData[domain.OrderUpdated](env)
			if err != nil {
				return err
			}
			updates = append(updates, func() { queueOne(b, env, orderViewUpdatedSQL, t, id, e.ShippingAddress, e.Note, v, e.At) })
		default: // a type this build does not know: its version counts, its time is the view's
			updates = append(updates, func() { queueOne(b, env, orderViewBumpSQL, t, id, v, env.OccurredAt) })
		}
	}
	if c := created; len(c.ids) > 0 {
		b.Queue(OrderViewInsertSQL, c.tenants, c.ids, c.customers, c.statuses, c.currencies, c.items, c.totals, c.versions, c.at)
	}
	for _, queue := range updates {
		queue()
	}
	return nil
}

// jsonPatch builds a JSON object from name, value pairs to merge into a
// stored domain.Payment or domain.Refund, leaving out empty strings as those
// types' JSON (omitempty) does, so view and order compare equal.
func jsonPatch(kv ...any) map[string]any {
	m := make(map[string]any, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		if s, ok := kv[i+1].(string); ok && s == "" {
			continue
		}
		m[kv[i].(string)] = kv[i+1]
	}
	return m
}

// queueOne queues an update that must hit exactly the event's view row.
// Missing it is permanent: the gate let the event through as next in line
// for its order, so the view should be there, and no redelivery brings it
// (an order's first event that is not order.created, say, or an event
// naming another tenant's order). As a permanent failure its batch is
// halved to find it and it is dead-lettered on its first delivery; as a
// transient one it made every batch it came in go one event per
// transaction, on each of its deliveries.
func queueOne(b *pgx.Batch, env domain.Envelope, sql string, args ...any) {
	b.Queue(sql, args...).Exec(func(tag pgconn.CommandTag) error {
		if tag.RowsAffected() != 1 {
			return fmt.Errorf("%w: apply %s v%d: no view of order %s of tenant %q", ErrPermanent, env.Type, env.AggregateVersion, env.AggregateID, env.TenantID)
		}
		return nil
	})
}

// decodeData unmarshals an event's data, wrapping domain.ErrMalformedEvent.
func decodeData[T any](env domain.Envelope) (T, error) {
	var v T
	err := env.Decode(&v)
	return v, err
}
