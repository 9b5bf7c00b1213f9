package httpapi

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// BenchmarkDecodeCreateBody is what every create pays to read its body:
// the strict decode and the check of its keys (duplicates, spelling).
func BenchmarkDecodeCreateBody(b *testing.B) {
	const body = `{"customer_id":"c-42","currency":"EUR","items":[` +
		`{"sku":"sku-1","quantity":2,"unit_price":1250},` +
		`{"sku":"sku-2","quantity":1,"unit_price":990},` +
		`{"sku":"sku-3","quantity":4,"unit_price":375}]}`
	w := httptest.NewRecorder()
	b.ReportAllocs()
	for b.Loop() {
		r := httptest.NewRequest(http.MethodPost, "/v1/orders", strings.NewReader(body))
		var req createOrderRequest
		if p := decodeJSON(w, r, &req); p != nil {
			b.Fatal(p.Detail)
		}
	}
}
