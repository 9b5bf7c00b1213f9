package command

import (
	"testing"

	"github.com/acme/orders/domain"
)

func BenchmarkFingerprint(b *testing.B) {
	cmd := CreateOrder{NewOrder: domain.NewOrder{CustomerID: "c-1", Currency: "EUR", Lines: []domain.Line{
		{SKU: "book-42", Quantity: 2, UnitPrice: 1250}, {SKU: "pen-7", Quantity: 3, UnitPrice: 199},
	}}}
	b.ReportAllocs()
	for b.Loop() {
		canonical, err := canonicalJSON(cmd)
		if err != nil {
			b.Fatal(err)
		}
		_ = fingerprint("POST /v1/orders", canonical)
	}
}
