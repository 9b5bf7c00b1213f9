package httpapi

import (
	"encoding/json"
	"errors"
	"testing"
)

// A wrong type is named by its path with array indexes, as every other
// problem names its field: encoding/json's own Field leaves them out
// ("items.quantity" for the second item's).
func TestWrongTypesAreNamedWithTheirIndexes(t *testing.T) {
	t.Parallel()
	type item struct {
		SKU      string `json:"sku"`
		Quantity int64  `json:"quantity"`
		Price    int64  `json:"unit_price"`
	}
	var v struct {
		Items []item `json:"items"`
		A     struct {
			B []int `json:"b"`
		} `json:"a"`
	}
	for _, tc := range []struct{ body, want string }{
		{`{"items":[{"sku":"a","quantity":1,"unit_price":1},{"sku":"s","quantity":"1","unit_price":1}]}`, "items[1].quantity"},
		{`{"items":[{"sku":"a","quantity":1,"unit_price":1250.0}]}`, "items[0].unit_price"},
		{`{ "items" : [ {"sku":"a"}, {"sku":"b"}, {"sku":"c", "quantity" : 2e0 } ] }`, "items[2].quantity"},
		{`{"items":[{"sku":"a","quantity":{"x":[1]}}]}`, "items[0].quantity"},
		{`{"items":[{"sku":"a","quantity":[1,2]}]}`, "items[0].quantity"},
		{`{"a":{"b":[1,"x"]}}`, "a.b[1]"},
		{`{"a":{"b":[1,2]},"items":"x"}`, "items"},
		{`{"items":[{"sku":7}]}`, "items[0].sku"},
	} {
		err := json.Unmarshal([]byte(tc.body), &v)
		var te *json.UnmarshalTypeError
		if !errors.As(err, &te) {
			t.Fatalf("%s: %v, want a type error", tc.body, err)
		}
		if got := valuePathAt([]byte(tc.body), te.Offset); got != tc.want {
			t.Errorf("%s: %q, want %q (encoding/json says %q)", tc.body, got, tc.want, te.Field)
		}
	}
	if got := valuePathAt([]byte(`{"a":`), 3); got != "" {
		t.Errorf("a broken body: %q, want \"\"", got)
	}
}
