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

// OrderPage is one page of orders; Next is nil on the last page.
type OrderPage struct {
	Orders []domain.Order
	Next   *Cursor
}

// ListOrdersHandler handles ListOrders.
type ListOrdersHandler struct{ db Querier }

// NewListOrdersHandler returns a ListOrdersHandler reading from db.
func NewListOrdersHandler(db Querier) ListOrdersHandler { return ListOrdersHandler{db: db} }

// Handle returns one page. The filters become conditions of one indexed
// query on (tenant_id[, customer_id], created_at, order_id).
func (h ListOrdersHandler) Handle(ctx context.Context, q ListOrders) (OrderPage, error) {
	if q.Limit < 1 || q.Limit > MaxPageSize {
		return OrderPage{}, &domain.Error{Kind: domain.KindInvalid, Message: "invalid limit",
			Fields: []domain.FieldError{{Field: "limit", Detail: fmt.Sprintf("must be 1 to %d", MaxPageSize)}}}
	}
	sql := `SELECT ` + orderViewColumns + ` FROM order_views WHERE tenant_id = $1`
	args := []any{q.TenantID}
	arg := func(v any) string {
		args = append(args, v)
		return "$" + strconv.Itoa(len(args))
	}
	if q.CustomerID != "" {
		sql += ` AND customer_id = ` + arg(q.CustomerID)
	}
	if q.Status != "" {
		sql += ` AND status = ` + arg(q.Status)
	}
	if !q.CreatedAfter.IsZero() {
		sql += ` AND created_at > ` + arg(q.CreatedAfter)
	}
	if q.After != nil {
		sql += ` AND (created_at, order_id) > (` + arg(q.After.CreatedAt) + `, ` + arg(q.After.ID) + `)`
	}
	sql += ` ORDER BY created_at, order_id LIMIT ` + arg(q.Limit+1)

	rows, _ := h.db.Query(ctx, sql, args...)
	orders, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (domain.Order, error) { return scanOrder(row) })
	if err != nil {
		return OrderPage{}, fmt.Errorf("list order views: %w", err)
	}
	page := OrderPage{Orders: orders}
	if len(orders) > q.Limit {
		page.Orders = orders[:q.Limit]
		last := page.Orders[q.Limit-1]
		page.Next = &Cursor{CreatedAt: last.CreatedAt, ID: last.ID}
	}
	return page, nil
}
