package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/acme/orders/command"
	"github.com/acme/orders/domain"
	"github.com/acme/orders/httpapi"
	"github.com/acme/orders/query"
)

// TestCreateOrderAmountLimits: amounts up to domain.MaxAmount are accepted
// exactly; one minor unit more is a 422 naming the field, and writes nothing.
func TestCreateOrderAmountLimits(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	body := func(lines string) string {
		return `{"customer_id":"c-1","currency":"EUR","items":[` + lines + `]}`
	}
	line := func(qty, price int64) string {
		return fmt.Sprintf(`{"sku":"s","quantity":%d,"unit_price":%d}`, qty, price)
	}
	const maxAmount = domain.MaxAmount

	refused := []struct {
		name   string
		body   string
		fields []string
	}{
		{"unit price MaxAmount+1", body(line(1, maxAmount+1)), []string{"items[0].unit_price"}},
		{"the reported order: 10 × 922337203685477580", body(line(10, 922337203685477580)), []string{"items[0].unit_price"}},
		{"line total MaxAmount+2", body(line(1, 1) + "," + line(2, maxAmount/2+1)), []string{"items[1].line_total"}},
		{"order total MaxAmount+1", body(line(1, maxAmount) + "," + line(1, 1)), []string{"total"}},
	}
	for i, tt := range refused {
		t.Run(tt.name, func(t *testing.T) {
			res := a.post(t, fmt.Sprintf("over-%d", i), tt.body)
			if res.status != http.StatusUnprocessableEntity {
				t.Fatalf("status = %d, want 422; body %s", res.status, res.body)
			}
			p := decodeProblem(t, res)
			if want := "https://orders.acme.example/problems/validation-failed"; p.Type != want {
				t.Fatalf("type = %q, want %q", p.Type, want)
			}
			var fields []string
			for _, f := range p.Errors {
				fields = append(fields, f.Field)
			}
			if fmt.Sprint(fields) != fmt.Sprint(tt.fields) {
				t.Fatalf("fields = %v, want %v (body %s)", fields, tt.fields, res.body)
			}
		})
	}
	if keys, orders, items, outbox := a.counts(t); keys+orders+items+outbox != 0 {
		t.Fatalf("amounts over the limit wrote rows: keys=%d orders=%d items=%d outbox=%d", keys, orders, items, outbox)
	}

	// Exactly at the limit: a unit price, a line total and the order total of
	// MaxAmount each are accepted and stored exactly.
	for i, b := range []string{
		body(line(1, maxAmount)),
		body(line(10_000, maxAmount/10_000)),
		body(line(4, maxAmount/8) + "," + line(1, maxAmount/2)),
	} {
		res := a.post(t, fmt.Sprintf("at-%d", i), b)
		if res.status != http.StatusCreated {
			t.Fatalf("order %d at the limit: status = %d, want 201; body %s", i, res.status, res.body)
		}
		var o struct{ Total int64 }
		if err := json.Unmarshal(res.body, &o); err != nil || o.Total != maxAmount {
			t.Fatalf("order %d at the limit: total %d (err %v), want %d; body %s", i, o.Total, err, maxAmount, res.body)
		}
	}
	if _, orders, _, _ := a.counts(t); orders != 3 {
		t.Fatalf("orders = %d, want 3", orders)
	}
}

// TestReportsShowMoneySumsExactlyPastInt64: the read-model sums can pass
// 2^63 (orders placed before domain.MaxAmount) and go up to 10^38 - 1; the
// summary and the daily-sales report show every digit as a JSON number.
func TestReportsShowMoneySumsExactlyPastInt64(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	handler := httpapi.New(httpapi.Deps{
		Logger:             slog.New(slog.NewTextHandler(io.Discard, nil)),
		Auth:               a.clients,
		Idempotency:        a.idem,
		Keys:               a.idem,
		CreateOrder:        command.NewCreateOrderHandler(),
		PayOrder:           command.NewPayOrderHandler(),
		ShipOrder:          command.NewShipOrderHandler(),
		CancelOrder:        command.NewCancelOrderHandler(),
		RefundOrder:        command.NewRefundOrderHandler(),
		UpdateOrder:        command.NewUpdateOrderHandler(),
		GetOrder:           query.NewGetOrderHandler(a.db, nil),
		ListOrders:         query.NewListOrdersHandler(a.db),
		GetCustomerSummary: query.NewGetCustomerSummaryHandler(a.db, query.NewChanges()),
		GetDailySales:      query.NewGetDailySalesHandler(a.db),
	})
	srv := httptest.NewServer(validated(t, handler))
	t.Cleanup(srv.Close)
	a.url = srv.URL

	const (
		past  = "18446744073710151600"                   // 2^64 + 599,984: the report's paid sum
		limit = "99999999999999999999999999999999999999" // 10^38 - 1: the columns' limit
	)
	for _, sql := range []string{`
INSERT INTO customer_summaries (tenant_id, customer_id, currency, orders_paid, total_paid, total_refunded, last_order_at)
VALUES ('t1', 'c-1', 'EUR', 6002, $1::numeric, 0, '2026-11-21T12:00:00Z'),
       ('t1', 'c-1', 'JPY', 1, $2::numeric, $2::numeric, '2026-11-21T12:00:00Z')`, `
INSERT INTO daily_sales (tenant_id, day, currency, orders, paid_amount, refunded_amount)
VALUES ('t1', '2026-11-21', 'EUR', 6002, $1::numeric, $2::numeric)`} {
		if _, err := a.db.Exec(context.Background(), sql, past, limit); err != nil {
			t.Fatal(err)
		}
	}

	res := a.do(t, http.MethodGet, "/v1/customers/c-1/summary", nil, "")
	if res.status != http.StatusOK {
		t.Fatalf("summary: status %d; body %s", res.status, res.body)
	}
	var sum struct {
		Totals []struct {
			Currency       string
			Paid, Refunded json.Number
		}
	}
	dec := json.NewDecoder(bytes.NewReader(res.body))
	dec.UseNumber()
	if err := dec.Decode(&sum); err != nil {
		t.Fatalf("summary body %s: %v", res.body, err)
	}
	if len(sum.Totals) != 2 || sum.Totals[0].Paid != past || sum.Totals[0].Refunded != "0" ||
		sum.Totals[1].Paid != limit || sum.Totals[1].Refunded != limit {
		t.Fatalf("summary totals = %+v, want EUR paid %s, JPY paid and refunded %s; body %s", sum.Totals, past, limit, res.body)
	}

	if !strings.Contains(string(res.body), `"paid":6003`) || !strings.Contains(string(res.body), `"total":6003`) {
		t.Fatalf("summary counts: body %s, want 6,003 paid orders over the two currencies", res.body)
	}
	// Counts summed over currencies past 2^63 - 1 are an error, never a
	// count wrapped negative.
	if _, err := a.db.Exec(context.Background(), `
INSERT INTO customer_summaries (tenant_id, customer_id, currency, orders_pending, total_paid, total_refunded, last_order_at)
VALUES ('t1', 'c-huge', 'EUR', 9223372036854775807, 0, 0, now()), ('t1', 'c-huge', 'USD', 1, 0, 0, NULL)`); err != nil {
		t.Fatal(err)
	}
	if res := a.do(t, http.MethodGet, "/v1/customers/c-huge/summary", nil, ""); res.status != http.StatusInternalServerError || strings.Contains(string(res.body), "-9223372036854775808") {
		t.Fatalf("summary whose counts pass 2^63: status %d, body %s; want 500, no wrapped count", res.status, res.body)
	}
	// A count below zero (a status change discarded by an operator) is
	// shown as none; the summary stays readable (it was a 500 for good).
	if _, err := a.db.Exec(context.Background(), `
INSERT INTO customer_summaries (tenant_id, customer_id, currency, orders_pending, orders_paid, total_paid, total_refunded, last_order_at)
VALUES ('t1', 'c-minus', 'EUR', -2, 1, 1000, 0, now())`); err != nil {
		t.Fatal(err)
	}
	if res := a.do(t, http.MethodGet, "/v1/customers/c-minus/summary", nil, ""); res.status != http.StatusOK ||
		!strings.Contains(string(res.body), `"pending":0`) || !strings.Contains(string(res.body), `"total":1}`) {
		t.Fatalf("summary with a count below zero: status %d, body %s; want 200, pending 0, 1 order", res.status, res.body)
	}

	res = a.do(t, http.MethodGet, "/v1/reports/daily-sales?from=2026-11-21&to=2026-11-21", nil, "")
	if res.status != http.StatusOK {
		t.Fatalf("daily sales: status %d; body %s", res.status, res.body)
	}
	want := `"days":[{"day":"2026-11-21","currency":"EUR","orders":6002,"paid_amount":` + past + `,"refunded_amount":` + limit + `}]`
	if !strings.Contains(string(res.body), want) {
		t.Fatalf("daily sales body %s, want it to hold %s", res.body, want)
	}

	// to alone: from defaults to 29 days before it (it was 29 days before
	// today, so a past to was refused as "before from").
	res = a.do(t, http.MethodGet, "/v1/reports/daily-sales?to=2026-11-30", nil, "")
	if res.status != http.StatusOK || !strings.Contains(string(res.body), `"from":"2026-11-01","to":"2026-11-30"`) ||
		!strings.Contains(string(res.body), want) {
		t.Fatalf("daily sales to 2026-11-30: status %d, body %s; want from 2026-11-01, with the 21st", res.status, res.body)
	}

	// Every date it answers can be sent back: none before 0001-01-01 (to
	// in January of the year 1 used to answer from "0000-12-12", and the
	// year 0 as to, from "-0001-12-12").
	res = a.do(t, http.MethodGet, "/v1/reports/daily-sales?to=0001-01-10", nil, "")
	if res.status != http.StatusOK || !strings.Contains(string(res.body), `"from":"0001-01-01","to":"0001-01-10"`) {
		t.Fatalf("daily sales to 0001-01-10: status %d, body %s; want from 0001-01-01", res.status, res.body)
	}
	for _, q := range []string{"to=0000-01-10", "from=0000-12-31&to=0001-01-01"} {
		if res := a.do(t, http.MethodGet, "/v1/reports/daily-sales?"+q, nil, ""); res.status != http.StatusBadRequest {
			t.Fatalf("daily sales ?%s: status %d, body %s; want 400", q, res.status, res.body)
		}
	}

	// A bad range names the bound the client gave: to when both are
	// given, from when to was left to its default, today (it used to name
	// to, which the client never sent).
	for _, tt := range []struct{ query, field, detail string }{
		{"from=2026-01-02&to=2026-01-01", "to", "must not be before from"},
		{"from=2025-01-01&to=2026-01-01", "", ""}, // 366 days, both ends in
		{"from=2024-12-31&to=2026-01-01", "to", "may span at most 366 days"},
		{"from=9999-01-01", "from", "must not be after to (to was not given: it is today, "},
		{"from=0001-01-01", "from", "must be at most 365 days before to (to was not given: it is today, "},
	} {
		res := a.do(t, http.MethodGet, "/v1/reports/daily-sales?"+tt.query, nil, "")
		if tt.field == "" {
			if res.status != http.StatusOK {
				t.Fatalf("daily sales ?%s: status %d, body %s; want 200", tt.query, res.status, res.body)
			}
			continue
		}
		if res.status != http.StatusUnprocessableEntity {
			t.Fatalf("daily sales ?%s: status %d, body %s; want 422", tt.query, res.status, res.body)
		}
		p := decodeProblem(t, res)
		if len(p.Errors) != 1 || p.Errors[0].Field != tt.field || !strings.Contains(p.Errors[0].Detail, tt.detail) {
			t.Fatalf("daily sales ?%s: errors %+v, want %s: %q", tt.query, p.Errors, tt.field, tt.detail)
		}
	}
}
