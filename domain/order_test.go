package domain_test

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/acme/orders/domain"
)

func validOrder() domain.NewOrder {
	return domain.NewOrder{
		CustomerID: "c-1",
		Currency:   "EUR",
		Lines:      []domain.Line{{SKU: "sku-1", Quantity: 2, UnitPrice: 1250}},
	}
}

func TestNewOrderValidate(t *testing.T) {
	t.Parallel()
	lines := func(n int) []domain.Line {
		ls := make([]domain.Line, n)
		for i := range ls {
			ls[i] = domain.Line{SKU: "s", Quantity: 1, UnitPrice: 1}
		}
		return ls
	}
	tests := []struct {
		name   string
		change func(*domain.NewOrder)
		fields []string // offending fields; none means valid
	}{
		{"valid", func(*domain.NewOrder) {}, nil},
		{"customer id missing", func(n *domain.NewOrder) { n.CustomerID = "" }, []string{"customer_id"}},
		{"customer id 64 chars", func(n *domain.NewOrder) { n.CustomerID = strings.Repeat("c", 64) }, nil},
		{"customer id 65 chars", func(n *domain.NewOrder) { n.CustomerID = strings.Repeat("c", 65) }, []string{"customer_id"}},
		{"customer id with space", func(n *domain.NewOrder) { n.CustomerID = "c 1" }, []string{"customer_id"}},
		{"customer id with control char", func(n *domain.NewOrder) { n.CustomerID = "c\x001" }, []string{"customer_id"}},
		{"customer id non-ascii", func(n *domain.NewOrder) { n.CustomerID = "café" }, []string{"customer_id"}},
		{"currency missing", func(n *domain.NewOrder) { n.Currency = "" }, []string{"currency"}},
		{"currency lower case", func(n *domain.NewOrder) { n.Currency = "eur" }, []string{"currency"}},
		{"currency not iso", func(n *domain.NewOrder) { n.Currency = "XYZ" }, []string{"currency"}},
		{"currency too long", func(n *domain.NewOrder) { n.Currency = "EURO" }, []string{"currency"}},
		{"currency JPY", func(n *domain.NewOrder) { n.Currency = "JPY" }, nil},
		{"no items", func(n *domain.NewOrder) { n.Lines = nil }, []string{"items"}},
		{"100 items", func(n *domain.NewOrder) { n.Lines = lines(100) }, nil},
		{"101 items", func(n *domain.NewOrder) { n.Lines = lines(101) }, []string{"items"}},
		{"sku missing", func(n *domain.NewOrder) { n.Lines[0].SKU = "" }, []string{"items[0].sku"}},
		{"sku 64 chars", func(n *domain.NewOrder) { n.Lines[0].SKU = strings.Repeat("s", 64) }, nil},
		{"sku 65 chars", func(n *domain.NewOrder) { n.Lines[0].SKU = strings.Repeat("s", 65) }, []string{"items[0].sku"}},
		{"quantity 0", func(n *domain.NewOrder) { n.Lines[0].Quantity = 0 }, []string{"items[0].quantity"}},
		{"quantity negative", func(n *domain.NewOrder) { n.Lines[0].Quantity = -1 }, []string{"items[0].quantity"}},
		{"quantity 10000", func(n *domain.NewOrder) { n.Lines[0].Quantity = 10000 }, nil},
		{"quantity 10001", func(n *domain.NewOrder) { n.Lines[0].Quantity = 10001 }, []string{"items[0].quantity"}},
		{"unit price 0", func(n *domain.NewOrder) { n.Lines[0].UnitPrice = 0 }, nil},
		{"unit price negative", func(n *domain.NewOrder) { n.Lines[0].UnitPrice = -1 }, []string{"items[0].unit_price"}},
		{"unit price at MaxAmount", func(n *domain.NewOrder) {
			n.Lines[0] = domain.Line{SKU: "s", Quantity: 1, UnitPrice: domain.MaxAmount}
		}, nil},
		{"unit price MaxAmount+1", func(n *domain.NewOrder) {
			n.Lines[0] = domain.Line{SKU: "s", Quantity: 1, UnitPrice: domain.MaxAmount + 1}
		}, []string{"items[0].unit_price"}},
		{"unit price MaxInt64", func(n *domain.NewOrder) {
			n.Lines[0] = domain.Line{SKU: "s", Quantity: 2, UnitPrice: math.MaxInt64}
		}, []string{"items[0].unit_price"}},
		{"the reported order: 10 × 922337203685477580", func(n *domain.NewOrder) {
			n.Lines[0] = domain.Line{SKU: "s", Quantity: 10, UnitPrice: 922337203685477580}
		}, []string{"items[0].unit_price"}},
		{"line total at MaxAmount", func(n *domain.NewOrder) {
			n.Lines[0] = domain.Line{SKU: "s", Quantity: 10_000, UnitPrice: domain.MaxAmount / 10_000}
		}, nil},
		{"line total MaxAmount+2", func(n *domain.NewOrder) {
			n.Lines[0] = domain.Line{SKU: "s", Quantity: 2, UnitPrice: domain.MaxAmount/2 + 1}
		}, []string{"items[0].line_total"}},
		{"line total 10000 × MaxAmount", func(n *domain.NewOrder) {
			n.Lines[0] = domain.Line{SKU: "s", Quantity: 10_000, UnitPrice: domain.MaxAmount}
		}, []string{"items[0].line_total"}},
		{"order total at MaxAmount", func(n *domain.NewOrder) {
			n.Lines = []domain.Line{
				{SKU: "a", Quantity: 1, UnitPrice: domain.MaxAmount - 1},
				{SKU: "b", Quantity: 1, UnitPrice: 1},
			}
		}, nil},
		{"order total MaxAmount+1", func(n *domain.NewOrder) {
			n.Lines = []domain.Line{
				{SKU: "a", Quantity: 1, UnitPrice: domain.MaxAmount},
				{SKU: "b", Quantity: 1, UnitPrice: 1},
			}
		}, []string{"total"}},
		{"order total of 100 maximal lines", func(n *domain.NewOrder) {
			n.Lines = lines(100)
			for i := range n.Lines {
				n.Lines[i] = domain.Line{SKU: "s", Quantity: 10_000, UnitPrice: domain.MaxAmount / 10_000}
			}
		}, []string{"total"}},
		{"every error at once", func(n *domain.NewOrder) {
			n.CustomerID, n.Currency = "", "x"
			n.Lines = []domain.Line{{SKU: "", Quantity: 0, UnitPrice: -5}}
		}, []string{"customer_id", "currency", "items[0].sku", "items[0].quantity", "items[0].unit_price"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			n := validOrder()
			n.Lines = append([]domain.Line(nil), n.Lines...)
			tt.change(&n)
			err := n.Validate()
			if tt.fields == nil {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			var de *domain.Error
			if !errors.As(err, &de) || de.Kind != domain.KindInvalid {
				t.Fatalf("Validate() = %v, want a KindInvalid *domain.Error", err)
			}
			var got []string
			for _, f := range de.Fields {
				got = append(got, f.Field)
			}
			if strings.Join(got, ",") != strings.Join(tt.fields, ",") {
				t.Fatalf("offending fields = %v, want %v", got, tt.fields)
			}
		})
	}
}

func TestCreateOrder(t *testing.T) {
	t.Parallel()
	id := uuid.Must(uuid.NewV7())
	now := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	n := validOrder()
	n.Lines = append(n.Lines, domain.Line{SKU: "sku-2", Quantity: 3, UnitPrice: 100})

	o, ev, err := domain.CreateOrder(id, "t1", n, now)
	if err != nil {
		t.Fatal(err)
	}
	if o.ID != id || o.TenantID != "t1" || o.Status != domain.StatusPending || o.Version != 1 {
		t.Fatalf("order = %+v", o)
	}
	if o.Total != 2*1250+3*100 || o.Items[0].LineTotal != 2500 || o.Items[1].LineTotal != 300 {
		t.Fatalf("totals wrong: %+v", o)
	}
	if !o.CreatedAt.Equal(now) || !o.UpdatedAt.Equal(now) {
		t.Fatalf("times = %v %v", o.CreatedAt, o.UpdatedAt)
	}
	if ev.Total != o.Total || ev.CustomerID != "c-1" || len(ev.Items) != 2 || ev.Status != domain.StatusPending {
		t.Fatalf("event = %+v", ev)
	}

	limit := validOrder()
	limit.Lines = []domain.Line{
		{SKU: "a", Quantity: 4, UnitPrice: domain.MaxAmount / 8},
		{SKU: "b", Quantity: 1, UnitPrice: domain.MaxAmount / 2},
	}
	if o, _, err := domain.CreateOrder(id, "t1", limit, now); err != nil || o.Total != domain.MaxAmount || o.Items[0].LineTotal != domain.MaxAmount/2 {
		t.Fatalf("CreateOrder(at the limit) = total %d, err %v; want %d, nil", o.Total, err, domain.MaxAmount)
	}

	if _, _, err := domain.CreateOrder(id, "t1", domain.NewOrder{}, now); domain.KindOf(err) != domain.KindInvalid {
		t.Fatalf("CreateOrder(invalid) err = %v, want KindInvalid", err)
	}
}
