package httpapi

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/acme/orders/domain"
	"github.com/acme/orders/query"
)

type summaryJSON struct {
	CustomerID  string              `json:"customer_id"`
	Orders      map[string]int64    `json:"orders"`
	Totals      []currencyTotalJSON `json:"totals"`
	LastOrderAt time.Time           `json:"last_order_at"`
}

// currencyTotalJSON: the amounts are JSON numbers with every digit, which
// can pass 2^63 (see query.Amount).
type currencyTotalJSON struct {
	Currency string       `json:"currency"`
	Paid     query.Amount `json:"paid"`
	Refunded query.Amount `json:"refunded"`
}

// customerSummary handles GET /v1/customers/{id}/summary[?min_position=<order id>:<version>]:
// the customer's orders by status and money per currency; with
// min_position it first waits (bounded) until that order version is in it.
func (s *Server) customerSummary(w http.ResponseWriter, r *http.Request) {
	customer, ok := pathParam(r, "id")
	if !ok || domain.ValidateCustomerID(customer) != nil {
		writeProblem(w, r, s.Logger, invalidPathParam("id", "must be a customer id: 1 to 64 visible ASCII characters"), nil)
		return
	}
	q := query.GetCustomerSummary{TenantID: tenantOf(r), CustomerID: customer, Wait: s.readWait(r)}
	if v := r.URL.Query().Get("min_position"); v != "" {
		pos, ok := parsePosition(v)
		if !ok {
			writeProblem(w, r, s.Logger, invalidParam("min_position", "must be <order id>:<version>, from a command's response"), nil)
			return
		}
		q.MinPosition = &pos
	}
	sum, err := s.GetCustomerSummary.Handle(r.Context(), q)
	if err != nil {
		writeProblem(w, r, s.Logger, problemFor(err), err)
		return
	}
	out := summaryJSON{CustomerID: sum.CustomerID, Orders: map[string]int64{}, LastOrderAt: sum.LastOrderAt}
	for _, st := range []domain.Status{domain.StatusPending, domain.StatusPaymentPending, domain.StatusPaymentFailed, domain.StatusPaid, domain.StatusShipped, domain.StatusCancelled} {
		out.Orders[string(st)] = sum.ByStatus[st]
	}
	out.Orders["total"] = sum.Orders
	for _, t := range sum.Totals {
		out.Totals = append(out.Totals, currencyTotalJSON{Currency: t.Currency, Paid: t.Paid, Refunded: t.Refunded})
	}
	w.Header().Set("Cache-Control", "no-cache")
	s.writeJSON(w, r, http.StatusOK, out)
}

func parsePosition(v string) (query.Position, bool) {
	id, ver, ok := strings.Cut(v, ":")
	oid, err1 := uuid.Parse(id)
	n, err2 := strconv.ParseInt(ver, 10, 64)
	if !ok || err1 != nil || len(id) != 36 || err2 != nil || n < 1 {
		return query.Position{}, false
	}
	return query.Position{OrderID: oid, Version: n}, true
}

type dailySalesJSON struct {
	From     string         `json:"from"`
	To       string         `json:"to"`
	Currency string         `json:"currency,omitempty"`
	Days     []daySalesJSON `json:"days"`
}

type daySalesJSON struct {
	Day            string       `json:"day"`
	Currency       string       `json:"currency"`
	Orders         int64        `json:"orders"`
	PaidAmount     query.Amount `json:"paid_amount"`
	RefundedAmount query.Amount `json:"refunded_amount"`
}

const dayLayout = "2006-01-02"

// firstDay is the earliest date a report takes or answers: the year 0 and
// before are not dates a client can send back (0000-… parses, -0001-… does
// not).
var firstDay = time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC)

// latest returns the later of a and b.
func latest(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// dailySales handles GET /v1/reports/daily-sales?from=YYYY-MM-DD&to=YYYY-MM-DD&currency=:
// per UTC day and currency, orders placed and money paid and refunded.
// Both dates are inclusive; the default is the last 30 days.
func (s *Server) dailySales(w http.ResponseWriter, r *http.Request) {
	params := r.URL.Query()
	day := func(name string, def time.Time) (time.Time, bool) {
		v := params.Get(name)
		if v == "" {
			return def, true
		}
		d, err := time.Parse(dayLayout, v)
		if err != nil || d.Before(firstDay) {
			writeProblem(w, r, s.Logger, invalidParam(name, "must be a date such as 2026-11-21, from 0001-01-01 on"), nil)
			return time.Time{}, false
		}
		return d, true
	}
	to, ok := day("to", query.Today())
	if !ok {
		return
	}
	from, ok := day("from", latest(to.AddDate(0, 0, -29), firstDay)) // 30 days up to to
	if !ok {
		return
	}
	currency := params.Get("currency")
	if currency != "" && !domain.ValidCurrency(currency) {
		writeProblem(w, r, s.Logger, invalidParam("currency", "must be an ISO 4217 code in upper case"), nil)
		return
	}
	days, err := s.GetDailySales.Handle(r.Context(), query.GetDailySales{TenantID: tenantOf(r), From: from, To: to, Currency: currency,
		ToIsToday: params.Get("to") == ""})
	if err != nil {
		writeProblem(w, r, s.Logger, problemFor(err), err)
		return
	}
	out := dailySalesJSON{From: from.Format(dayLayout), To: to.Format(dayLayout), Currency: currency, Days: make([]daySalesJSON, len(days))}
	for i, d := range days {
		out.Days[i] = daySalesJSON{Day: d.Day.Format(dayLayout), Currency: d.Currency, Orders: d.Orders, PaidAmount: d.PaidAmount, RefundedAmount: d.RefundedAmount}
	}
	w.Header().Set("Cache-Control", "no-cache")
	s.writeJSON(w, r, http.StatusOK, out)
}
