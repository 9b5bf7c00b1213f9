package query

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/acme/orders/domain"
)

// MaxReportDays bounds the range of one daily-sales report.
const MaxReportDays = 366

// GetDailySales asks for a tenant's sales per UTC day from From to To
// (both dates, inclusive), optionally in one currency.
type GetDailySales struct {
	TenantID string
	From, To time.Time // midnight UTC
	Currency string    // "" for all
	// ToIsToday says the client gave no To (it is today's date): a bad
	// range is then blamed on From, the bound the client chose.
	ToIsToday bool
}

// checkRange refuses a reversed range and one longer than MaxReportDays,
// naming the bound the client gave.
func (q GetDailySales) checkRange() error {
	field, reversed, long := "to", "must not be before from", "the range may span at most "+strconv.Itoa(MaxReportDays)+" days"
	if q.ToIsToday {
		today := " (to was not given: it is today, " + q.To.Format(time.DateOnly) + ")"
		field, reversed, long = "from", "must not be after to"+today, "must be at most "+strconv.Itoa(MaxReportDays-1)+" days before to"+today
	}
	invalid := func(detail string) error {
		return &domain.Error{Kind: domain.KindInvalid, Message: "invalid range",
			Fields: []domain.FieldError{{Field: field, Detail: detail}}}
	}
	switch {
	case q.To.Before(q.From):
		return invalid(reversed)
	case q.To.Sub(q.From) >= MaxReportDays*24*time.Hour:
		return invalid(long)
	}
	return nil
}

// DaySales are one day's figures in one currency. Orders is a count (int64
// is ample); the amounts are sums in minor units that can pass the int64
// range (see Amount).
type DaySales struct {
	Day            time.Time
	Currency       string
	Orders         int64
	PaidAmount     Amount
	RefundedAmount Amount
}

// GetDailySalesHandler handles GetDailySales.
type GetDailySalesHandler struct{ db Querier }

// NewGetDailySalesHandler returns a GetDailySalesHandler reading from db.
func NewGetDailySalesHandler(db Querier) GetDailySalesHandler { return GetDailySalesHandler{db: db} }

// Handle returns the days that had sales, in day and currency order. It
// returns a KindInvalid *domain.Error for a reversed or too long range.
func (h GetDailySalesHandler) Handle(ctx context.Context, q GetDailySales) ([]DaySales, error) {
	if err := q.checkRange(); err != nil {
		return nil, err
	}
	sql := `SELECT day, currency, orders, paid_amount, refunded_amount FROM daily_sales
WHERE tenant_id = $1 AND day BETWEEN $2 AND $3`
	args := []any{q.TenantID, q.From, q.To}
	if q.Currency != "" {
		sql += ` AND currency = $4`
		args = append(args, q.Currency)
	}
	sql += ` ORDER BY day, currency`
	rows, _ := h.db.Query(ctx, sql, args...)
	days, err := pgx.CollectRows(rows, pgx.RowToStructByPos[DaySales])
	if err != nil {
		return nil, fmt.Errorf("get daily sales: %w", err)
	}
	for i := range days {
		days[i].Day = days[i].Day.UTC()
	}
	return days, nil
}

// Today is the current UTC day.
func Today() time.Time {
	y, m, d := time.Now().UTC().Date()
	return time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
}
