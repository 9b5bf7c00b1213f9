package httpapi_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"

	"github.com/acme/orders/domain"
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
