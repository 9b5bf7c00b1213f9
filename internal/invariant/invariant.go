// Package invariant checks, from the database alone, that the read models
// agree with the write model: the convergence guarantee (G6) and the
// bookkeeping behind exactly-once projection (G4, G5). Tests, the fault
// suite and operators run it when the system is idle; while events are in
// flight, differences are expected.
//
// Money sums are compared as numeric (PostgreSQL's sum of bigint), never
// cast to bigint: the read models hold them exactly past 2^63, and so must
// the check.
package invariant

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/acme/orders/projection"
)

// Querier runs queries; *pgxpool.Pool and *pgx.Conn are such.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Projections are the read models the projector keeps.
var Projections = []string{"order_views", "customer_summaries", "daily_sales"}

// A check is one invariant: a query that returns one text row per violation
// (at most a few, as examples).
type check struct {
	name string
	sql  string
}

// refundedOrder is the condition of an order whose money was refunded: the
// provider confirmed its refund, or (orders cancelled before refunds went
// through the provider, refund '{}') it was paid and cancelled.
const refundedOrder = `paid_at IS NOT NULL AND cancelled_at IS NOT NULL
    AND (refund->>'status' = 'succeeded' OR refund = '{}'::jsonb)`

var checks = []check{
	{"every committed event is published", `
SELECT format('outbox event %s (%s v%s) not published', id, event_type, aggregate_version)
FROM outbox WHERE published_at IS NULL LIMIT 5`},

	// Only events younger than the shortest inbox retention are compared
	// ($2: the smallest UUIDv7 of that instant); older inbox rows may have
	// been pruned, which the version gate makes harmless.
	{"each projection's inbox holds each event once, and only events of the outbox", `
WITH p(projection) AS (SELECT unnest($1::text[]))
SELECT format('%s: %s inbox rows for %s events', p.projection,
              (SELECT count(*) FROM inbox i WHERE i.projection = p.projection AND i.event_id >= $2),
              (SELECT count(*) FROM outbox WHERE id >= $2))
FROM p
WHERE (SELECT count(*) FROM inbox i WHERE i.projection = p.projection AND i.event_id >= $2)
      <> (SELECT count(*) FROM outbox WHERE id >= $2)
   OR EXISTS (SELECT 1 FROM inbox i WHERE i.projection = p.projection AND i.event_id >= $2
              AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.id = i.event_id))`},

	{"every order's total is the sum of its items' line totals, each quantity × unit price", `
SELECT format('order %s: total %s, items %s', o.id, o.total, o.items)
FROM orders o
WHERE o.total::numeric IS DISTINCT FROM (SELECT sum((i->>'line_total')::numeric) FROM jsonb_array_elements(o.items) i)
   OR jsonb_array_length(o.items) = 0
   OR EXISTS (SELECT FROM jsonb_array_elements(o.items) i
              WHERE (i->>'line_total')::numeric <> (i->>'quantity')::numeric * (i->>'unit_price')::numeric)
LIMIT 5`},

	{"each projection is at every order's version", `
WITH p(projection) AS (SELECT unnest($1::text[]))
SELECT format('%s: order %s at v%s, projection at v%s', p.projection, o.id, o.version, coalesce(pp.version, 0))
FROM p CROSS JOIN orders o
LEFT JOIN projection_positions pp ON pp.projection = p.projection AND pp.aggregate_id = o.id
WHERE pp.version IS DISTINCT FROM o.version
LIMIT 5`},

	{"order views equal the orders, field by field", `
WITH expected AS (
    SELECT o.tenant_id, o.id AS order_id, o.customer_id, o.status, o.currency, o.total, o.version,
           o.created_at, o.updated_at, o.paid_at, o.shipped_at, o.cancelled_at, o.cancel_reason,
           o.shipping_address, o.note, o.payment, o.refund, o.items
    FROM orders o),
actual AS (
    SELECT tenant_id, order_id, customer_id, status, currency, total, version, created_at, updated_at,
           paid_at, shipped_at, cancelled_at, cancel_reason, shipping_address, note, payment, refund, items
    FROM order_views)
SELECT format('order %s: view %s, order %s', coalesce(e.order_id, a.order_id),
              CASE WHEN a.order_id IS NULL THEN 'missing' ELSE to_jsonb(a)::text END,
              CASE WHEN e.order_id IS NULL THEN 'missing' ELSE to_jsonb(e)::text END)
FROM expected e FULL JOIN actual a ON a.tenant_id = e.tenant_id AND a.order_id = e.order_id
WHERE e IS DISTINCT FROM a
LIMIT 5`},

	{"customer summaries equal sums over the orders", `
WITH expected AS (
    SELECT tenant_id, customer_id, currency,
           count(*) FILTER (WHERE status = 'pending')         AS orders_pending,
           count(*) FILTER (WHERE status = 'payment_pending') AS orders_payment_pending,
           count(*) FILTER (WHERE status = 'payment_failed')  AS orders_payment_failed,
           count(*) FILTER (WHERE status = 'paid')            AS orders_paid,
           count(*) FILTER (WHERE status = 'shipped')         AS orders_shipped,
           count(*) FILTER (WHERE status = 'cancelled')       AS orders_cancelled,
           coalesce(sum(total) FILTER (WHERE paid_at IS NOT NULL), 0) AS total_paid,
           coalesce(sum(total) FILTER (WHERE ` + refundedOrder + `), 0) AS total_refunded,
           max(created_at) AS last_order_at
    FROM orders GROUP BY tenant_id, customer_id, currency),
actual AS (
    SELECT tenant_id, customer_id, currency::text, orders_pending, orders_payment_pending, orders_payment_failed,
           orders_paid, orders_shipped, orders_cancelled, total_paid, total_refunded, last_order_at
    FROM customer_summaries)
SELECT format('customer %s/%s/%s: summary %s, orders say %s', coalesce(e.tenant_id, a.tenant_id),
              coalesce(e.customer_id, a.customer_id), coalesce(e.currency::text, a.currency),
              coalesce(to_jsonb(a)::text, 'missing'), coalesce(to_jsonb(e)::text, 'missing'))
FROM expected e FULL JOIN actual a
  ON a.tenant_id = e.tenant_id AND a.customer_id = e.customer_id AND a.currency = e.currency::text
WHERE (e.orders_pending, e.orders_payment_pending, e.orders_payment_failed, e.orders_paid, e.orders_shipped,
       e.orders_cancelled, e.total_paid, e.total_refunded, e.last_order_at)
      IS DISTINCT FROM
      (a.orders_pending, a.orders_payment_pending, a.orders_payment_failed, a.orders_paid, a.orders_shipped,
       a.orders_cancelled, a.total_paid, a.total_refunded, a.last_order_at)
LIMIT 5`},

	{"daily sales equal sums over the orders", `
WITH facts AS (
    SELECT tenant_id, (created_at AT TIME ZONE 'UTC')::date AS day, currency::text, 1 AS orders, 0::bigint AS paid, 0::bigint AS refunded
    FROM orders
    UNION ALL
    SELECT tenant_id, (paid_at AT TIME ZONE 'UTC')::date, currency::text, 0, total, 0
    FROM orders WHERE paid_at IS NOT NULL
    UNION ALL
    SELECT tenant_id, (coalesce((refund->>'settled_at')::timestamptz, cancelled_at) AT TIME ZONE 'UTC')::date,
           currency::text, 0, 0, total
    -- A refund of nothing (a free order paid and cancelled before payments
    -- went through the provider) is no fact: the projection counts none.
    FROM orders WHERE ` + refundedOrder + ` AND total > 0),
expected AS (
    SELECT tenant_id, day, currency, sum(orders)::bigint AS orders, sum(paid) AS paid_amount,
           sum(refunded) AS refunded_amount -- numeric: exact past 2^63, like the read model
    FROM facts GROUP BY tenant_id, day, currency),
actual AS (
    SELECT tenant_id, day, currency::text, orders, paid_amount, refunded_amount FROM daily_sales)
SELECT format('sales %s/%s/%s: report %s, orders say %s', coalesce(e.tenant_id, a.tenant_id),
              coalesce(e.day, a.day), coalesce(e.currency, a.currency),
              coalesce(to_jsonb(a)::text, 'missing'), coalesce(to_jsonb(e)::text, 'missing'))
FROM expected e FULL JOIN actual a ON a.tenant_id = e.tenant_id AND a.day = e.day AND a.currency = e.currency
WHERE (e.orders, e.paid_amount, e.refunded_amount) IS DISTINCT FROM (a.orders, a.paid_amount, a.refunded_amount)
LIMIT 5`},

	// Our own records of the provider's outcomes (the provider's ledger is
	// compared by the fault suite): an order charged through the provider
	// (payment attempt ≥ 1) is paid exactly when it has one succeeded
	// charge row, for its total and currency, with the charge id it shows;
	// an order that never asked for a charge (or a refund) has none.
	{"every paid order has exactly one succeeded charge, and no other order has one", `
SELECT format('order %s (%s, paid_at %s, charge %s): %s succeeded charge rows %s',
              o.id, o.status, o.paid_at, o.payment->>'charge_id', count(p.*), coalesce(string_agg(p.provider_id || ' ' || p.amount || ' ' || p.currency, ', '), ''))
FROM orders o
LEFT JOIN payments p ON p.tenant_id = o.tenant_id AND p.order_id = o.id AND p.kind = 'charge' AND p.status = 'succeeded'
WHERE (o.payment->>'attempt')::int >= 1 OR p.order_id IS NOT NULL -- an order never charged with a charge row too
GROUP BY o.tenant_id, o.id
HAVING count(p.*) <> (CASE WHEN o.paid_at IS NOT NULL THEN 1 ELSE 0 END)
    OR (o.paid_at IS NOT NULL AND (min(p.provider_id) <> o.payment->>'charge_id'
        OR min(p.amount) <> o.total OR min(p.currency) <> o.currency))
LIMIT 5`},

	{"every refunded order has exactly one succeeded refund of its total, and no other order has one", `
SELECT format('order %s (refund %s): %s succeeded refund rows', o.id, o.refund->>'status', count(p.*))
FROM orders o
LEFT JOIN payments p ON p.tenant_id = o.tenant_id AND p.order_id = o.id AND p.kind = 'refund' AND p.status = 'succeeded'
WHERE (o.refund->>'attempt')::int >= 1 OR p.order_id IS NOT NULL -- an order never refunded with a refund row too
GROUP BY o.tenant_id, o.id
HAVING count(p.*) <> (CASE WHEN o.refund->>'status' = 'succeeded' THEN 1 ELSE 0 END)
    OR (o.refund->>'status' = 'succeeded' AND (min(p.provider_id) <> o.refund->>'id' OR min(p.amount) <> o.total))
LIMIT 5`},
}

// Violation is one broken invariant with an example of how.
type Violation struct {
	Invariant string
	Example   string
}

func (v Violation) String() string { return v.Invariant + ": " + v.Example }

// Check runs every invariant once and returns the violations it found.
func Check(ctx context.Context, db Querier) ([]Violation, error) {
	var out []Violation
	for _, c := range checks {
		var args []any
		if strings.Contains(c.sql, "$1") { // the per-projection checks
			args = []any{Projections}
		}
		if strings.Contains(c.sql, "$2") {
			args = append(args, uuidV7Floor(time.Now().Add(-projection.MinInboxRetention)))
		}
		rows, _ := db.Query(ctx, c.sql, args...)
		examples, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return nil, fmt.Errorf("check %q: %w", c.name, err)
		}
		for _, e := range examples {
			out = append(out, Violation{Invariant: c.name, Example: e})
		}
	}
	return out, nil
}

// Converge polls Check until it finds no violation (the system has drained
// and agrees) or timeout passes, and returns the last violations.
func Converge(ctx context.Context, db Querier, timeout time.Duration) ([]Violation, error) {
	deadline := time.Now().Add(timeout)
	for {
		v, err := Check(ctx, db)
		if err != nil || len(v) == 0 || time.Now().After(deadline) {
			return v, err
		}
		select {
		case <-ctx.Done():
			return v, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// uuidV7Floor is the smallest UUIDv7 of the millisecond t falls in: every
// event id made at t or later sorts at or above it.
func uuidV7Floor(t time.Time) uuid.UUID {
	var u uuid.UUID
	ms := uint64(t.UnixMilli())
	for i := range 6 {
		u[i] = byte(ms >> (8 * (5 - i)))
	}
	return u
}
