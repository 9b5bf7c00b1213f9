package query

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/acme/orders/domain"
)

// Position names an order version that a reader has seen (from a command's
// response): "the read model must include this write".
type Position struct {
	OrderID uuid.UUID
	Version int64
}

// GetCustomerSummary asks for a customer's summary, including the effect of
// MinPosition if set (waiting up to Wait for it).
type GetCustomerSummary struct {
	TenantID    string
	CustomerID  string
	MinPosition *Position
	Wait        time.Duration
}

// CustomerSummary is a customer's orders by current status, money paid and
// refunded per currency (paid: charges the provider confirmed, order.paid;
// refunded: refunds it confirmed, order.refunded), and when the last order
// was placed.
type CustomerSummary struct {
	CustomerID string
	ByStatus   map[domain.Status]int64
	// Orders is the sum of ByStatus: the customer's orders.
	Orders      int64
	Totals      []CurrencyTotals
	LastOrderAt time.Time
}

// CurrencyTotals are a customer's money in one currency, in minor units;
// the sums can pass the int64 range (see Amount).
type CurrencyTotals struct {
	Currency string
	Paid     Amount
	Refunded Amount
}

// GetCustomerSummaryHandler handles GetCustomerSummary.
type GetCustomerSummaryHandler struct {
	db      Querier
	changes *Changes
}

// NewGetCustomerSummaryHandler returns a handler reading from db, woken by changes.
func NewGetCustomerSummaryHandler(db Querier, changes *Changes) GetCustomerSummaryHandler {
	return GetCustomerSummaryHandler{db: db, changes: changes}
}

const (
	customerSummaryGetSQL = `
SELECT currency, orders_pending, orders_payment_pending, orders_payment_failed, orders_paid, orders_shipped, orders_cancelled,
       total_paid, total_refunded, last_order_at
FROM customer_summaries
WHERE tenant_id = $1 AND customer_id = $2
ORDER BY currency`

	// The position of one order in a projection (0 if none yet).
	projectionPositionSQL = `
SELECT coalesce(max(version), 0) FROM projection_positions
WHERE projection = $1 AND tenant_id = $2 AND aggregate_id = $3`
)

// Handle returns the summary. It returns a KindNotFound *domain.Error when
// the customer has no orders (in the read model) or q.MinPosition names an
// order the tenant does not have, and a *BehindError when the projection
// did not reach q.MinPosition within q.Wait.
func (h GetCustomerSummaryHandler) Handle(ctx context.Context, q GetCustomerSummary) (CustomerSummary, error) {
	if p := q.MinPosition; p != nil {
		err := awaitVersion(ctx, h.changes, "customer_summaries", q.TenantID, p.OrderID, p.Version, q.Wait, func() (int64, error) {
			var v int64
			err := h.db.QueryRow(ctx, projectionPositionSQL, "customer_summaries", q.TenantID, p.OrderID).Scan(&v)
			return v, err
		})
		if err := explainBehind(ctx, h.db, q.TenantID, p.OrderID, err); err != nil {
			return CustomerSummary{}, err
		}
	}
	s := CustomerSummary{CustomerID: q.CustomerID, ByStatus: map[domain.Status]int64{}}
	rows, _ := h.db.Query(ctx, customerSummaryGetSQL, q.TenantID, q.CustomerID)
	var (
		t                        CurrencyTotals
		pending, paying, failed  int64
		paid, shipped, cancelled int64
		last                     *time.Time
	)
	_, err := pgx.ForEachRow(rows, []any{&t.Currency, &pending, &paying, &failed, &paid, &shipped, &cancelled, &t.Paid, &t.Refunded, &last}, func() error {
		for st, n := range map[domain.Status]int64{
			domain.StatusPending: pending, domain.StatusPaymentPending: paying, domain.StatusPaymentFailed: failed,
			domain.StatusPaid: paid, domain.StatusShipped: shipped, domain.StatusCancelled: cancelled,
		} {
			// Checked, as every sum of the read side: a count a row holds
			// is checked by PostgreSQL, their sums over currencies here.
			// A count below zero (an operator discarded a status change
			// of the projection's) is shown as none, not refused: the
			// summary stays readable until the projection is rebuilt.
			n = max(n, 0)
			byStatus, ok1 := addCount(s.ByStatus[st], n)
			orders, ok2 := addCount(s.Orders, n)
			if !ok1 || !ok2 {
				return fmt.Errorf("customer %q: the count of %s orders passes 2^63-1", q.CustomerID, st)
			}
			s.ByStatus[st], s.Orders = byStatus, orders
		}
		s.Totals = append(s.Totals, t)
		if last != nil && last.After(s.LastOrderAt) {
			s.LastOrderAt = last.UTC()
		}
		return nil
	})
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return CustomerSummary{}, fmt.Errorf("get customer summary: %w", err)
	}
	if len(s.Totals) == 0 {
		return CustomerSummary{}, domain.Errorf(domain.KindNotFound, "customer %q has no orders", q.CustomerID)
	}
	return s, nil
}

// addCount returns a+b of two counts (never negative), and false if it
// passes the int64 range.
func addCount(a, b int64) (int64, bool) {
	if a < 0 || b < 0 || a > math.MaxInt64-b {
		return 0, false
	}
	return a + b, true
}
