package query

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/acme/orders/domain"
)

// Limits of one page of ListOrders.
const (
	DefaultPageSize = 20
	MaxPageSize     = 100
	// DefaultStatusScan is the most orders one page filtered by status
	// examines. No index holds status (it changes with every step of an
	// order, so one would cost every projection write), so a page of a rare
	// status walks the tenant's (or customer's) orders by creation time; the
	// bound keeps one request's work, and so what a tenant can take of the
	// database's CPU from the others, small however many orders it has.
	DefaultStatusScan = 10_000
)

// ListOrders asks for a page of a tenant's orders, oldest first, optionally
// of one customer, in one status, or created after a time.
type ListOrders struct {
	TenantID     string
	CustomerID   string        // "" for all
	Status       domain.Status // "" for all
	CreatedAfter time.Time     // zero for no bound
	Limit        int           // 1..MaxPageSize
	After        *Cursor       // where the previous page ended
}

// Cursor marks a position in the list: the (created_at, id) of the last
// order of a page. Pages are keyset-based, so an order inserted while a
// client walks the list never shifts what the client sees: every order that
// existed when the walk began is returned exactly once.
type Cursor struct {
	CreatedAt time.Time `json:"t"`
	ID        uuid.UUID `json:"i"`
}

// String encodes the cursor opaquely for clients.
func (c Cursor) String() string {
	b, _ := json.Marshal(c)
	return base64.RawURLEncoding.EncodeToString(b)
}

// ParseCursor decodes a cursor from String. It returns a KindInvalid
// *domain.Error for anything else.
func ParseCursor(s string) (Cursor, error) {
	var c Cursor
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err == nil {
		err = json.Unmarshal(b, &c)
	}
	if err != nil || c.ID == uuid.Nil || c.CreatedAt.IsZero() {
		return Cursor{}, &domain.Error{Kind: domain.KindInvalid, Message: "invalid cursor",
			Fields: []domain.FieldError{{Field: "cursor", Detail: "must be a next_cursor value from an earlier page"}}}
	}
	return c, nil
}

// OrderPage is one page of orders; Next is nil on the last page. A page
// filtered by status may hold fewer orders than asked for, even none, and
// still have a Next: it examined its share of orders (DefaultStatusScan)
// and ends where it stopped. Following Next until it is nil returns every
// matching order exactly once.
type OrderPage struct {
	Orders []domain.Order
	Next   *Cursor
}

// ListOrdersHandler handles ListOrders.
type ListOrdersHandler struct {
	db         Querier
	statusScan int
}

// NewListOrdersHandler returns a ListOrdersHandler reading from db.
func NewListOrdersHandler(db Querier) ListOrdersHandler {
	return ListOrdersHandler{db: db, statusScan: DefaultStatusScan}
}

// WithStatusScan returns h with pages filtered by status examining at most
// n orders each (n ≥ 1; DefaultStatusScan by default).
func (h ListOrdersHandler) WithStatusScan(n int) ListOrdersHandler {
	h.statusScan = max(n, 1)
	return h
}

// Handle returns one page. The filters become conditions of one indexed
// query on (tenant_id[, customer_id], created_at, order_id).
func (h ListOrdersHandler) Handle(ctx context.Context, q ListOrders) (OrderPage, error) {
	if q.Limit < 1 || q.Limit > MaxPageSize {
		return OrderPage{}, &domain.Error{Kind: domain.KindInvalid, Message: "invalid limit",
			Fields: []domain.FieldError{{Field: "limit", Detail: fmt.Sprintf("must be 1 to %d", MaxPageSize)}}}
	}
	sql := `FROM order_views WHERE tenant_id = $1`
	args := []any{q.TenantID}
	arg := func(v any) string {
		args = append(args, v)
		return "$" + strconv.Itoa(len(args))
	}
	if q.CustomerID != "" {
		sql += ` AND customer_id = ` + arg(q.CustomerID)
	}
	if !q.CreatedAfter.IsZero() {
		sql += ` AND created_at > ` + arg(q.CreatedAfter)
	}
	if q.After != nil {
		sql += ` AND (created_at, order_id) > (` + arg(q.After.CreatedAt) + `, ` + arg(q.After.ID) + `)`
	}
	if q.Status != "" {
		scan, status, limit := arg(h.statusScan), arg(q.Status), arg(q.Limit+2)
		return h.byStatus(ctx, q, sql, scan, status, limit, args)
	}
	sql = `SELECT ` + orderViewColumns + ` ` + sql + ` ORDER BY created_at, order_id LIMIT ` + arg(q.Limit+1)

	rows, _ := h.db.Query(ctx, sql, args...)
	orders, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (domain.Order, error) { return scanOrder(row) })
	if err != nil {
		return OrderPage{}, fmt.Errorf("list order views: %w", err)
	}
	return pageOf(orders, q.Limit), nil
}

// pageOf makes a page of up to limit of orders, with a Next if there are
// more.
func pageOf(orders []domain.Order, limit int) OrderPage {
	page := OrderPage{Orders: orders}
	if len(orders) > limit {
		page.Orders = orders[:limit]
		last := page.Orders[limit-1]
		page.Next = &Cursor{CreatedAt: last.CreatedAt, ID: last.ID}
	}
	return page
}

// byStatus returns a page of the orders of from (the FROM and WHERE of the
// other filters; args holds their values and those of the placeholders
// scan, status and limit) in status q.Status, examining at most
// statusScan orders in one statement: the scan takes the first statusScan
// orders in list order, and returns those in the status, plus the last
// one it examined (its row number is the bound) so that a page that came
// back short ends where the scan stopped. One statement, so the page and
// where it stopped are of one snapshot.
func (h ListOrdersHandler) byStatus(ctx context.Context, q ListOrders, from, scan, status, limit string, args []any) (OrderPage, error) {
	sql := `SELECT ` + orderViewColumns + `, status = ` + status + `, n = ` + scan + `
FROM (SELECT *, row_number() OVER (ORDER BY created_at, order_id) AS n
      FROM (SELECT * ` + from + ` ORDER BY created_at, order_id LIMIT ` + scan + `) AS examined) AS e
WHERE status = ` + status + ` OR n = ` + scan + `
ORDER BY created_at, order_id LIMIT ` + limit
	var orders []domain.Order
	var stopped *Cursor
	rows, _ := h.db.Query(ctx, sql, args...) // a failed Query reports its error at rows.Err
	defer rows.Close()
	for rows.Next() {
		var match, last bool
		o, err := scanOrder(rows, &match, &last)
		if err != nil {
			return OrderPage{}, fmt.Errorf("list order views by status: %w", err)
		}
		if match {
			orders = append(orders, o)
		}
		if last {
			stopped = &Cursor{CreatedAt: o.CreatedAt, ID: o.ID}
		}
	}
	if err := rows.Err(); err != nil {
		return OrderPage{}, fmt.Errorf("list order views by status: %w", err)
	}
	page := pageOf(orders, q.Limit)
	if page.Next == nil && stopped != nil {
		page.Next = stopped
	}
	return page, nil
}
