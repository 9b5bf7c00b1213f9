package httpapi

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strconv"
	"testing"
	"unicode"

	"github.com/acme/orders/domain"
)

// FuzzCheckKeys holds checkKeys' byte walker to what encoding/json's token
// reader found before it (tokenCheckKeys, kept here as the reference): for
// any body the api would go on to check (valid JSON in UTF-8, no lone
// surrogate), both name the same first bad key with the same complaint,
// whatever type the body is checked against.
func FuzzCheckKeys(f *testing.F) {
	for _, seed := range []string{
		`{"customer_id":"c","currency":"EUR","items":[{"sku":"s","quantity":1,"unit_price":1}]}`,
		`{"customer_id":"first","Customer_Id":"second"}`,
		`{"customer_id":"c","items":[{"ſku":"s"}]}`,
		`{"items":[{"sku":"s"},{"quantity":1,"quantity":2}]}`,
		`{"city":"Berlin","City":"Paris"}`,
		`[{"a":1},{"b":[{"c":2,"C":3}]}]`,
		`{"\u0063ustomer_id":"x","customer_id":"y"}`,
		`{"a":{"b":{"K":1,"k":2}}}`,
		` { "" : 1 , "" : 2 } `,
		`{"x":[1,-2.5e3,true,false,null,"s\"}"],"y":{}}`,
	} {
		f.Add([]byte(seed))
	}
	types := []reflect.Type{nil, reflect.TypeFor[createOrderRequest](), reflect.TypeFor[domain.Address](),
		reflect.TypeFor[map[string]any](), reflect.TypeFor[[]createOrderRequest]()}
	f.Fuzz(func(t *testing.T, body []byte) {
		if !json.Valid(body) || checkUnicode(body) != nil {
			return // refused before checkKeys runs
		}
		for _, typ := range types {
			for _, path := range []string{"", "shipping_address"} {
				wantField, wantDetail := tokenCheckKeys(body, typ, path)
				var gotField, gotDetail string
				if p := checkKeys(body, typ, path); p != nil {
					gotField, gotDetail = p.Errors[0].Field, p.Errors[0].Detail
				}
				if gotField != wantField || gotDetail != wantDetail {
					t.Fatalf("%s against %v at %q: got %q %q, the token reader %q %q", body, typ, path, gotField, gotDetail, wantField, wantDetail)
				}
			}
		}
	})
}

// tokenCheckKeys is checkKeys as it was until 2026-11-24, on
// encoding/json's token reader: the reference for FuzzCheckKeys.
func tokenCheckKeys(body []byte, t reflect.Type, path string) (field, detail string) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	field, detail, _ = tokenWalkKeys(dec, t, path)
	return field, detail
}

func tokenWalkKeys(dec *json.Decoder, t reflect.Type, path string) (field, detail string, err error) {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == rawMessageType || (t != nil && t.Kind() == reflect.Interface) {
		t = nil
	}
	tok, err := dec.Token()
	if err != nil {
		return "", "", err
	}
	join := func(path, key string) string {
		if path == "" {
			return key
		}
		return path + "." + key
	}
	switch tok {
	case json.Delim('{'):
		fields := structFields(t)
		seen := map[string]bool{}
		for dec.More() {
			tok, err := dec.Token()
			if err != nil {
				return "", "", err
			}
			key, _ := tok.(string)
			at := join(path, key)
			folded := foldKey(key)
			if seen[folded] {
				return at, "duplicate key (keys are compared ignoring case)", nil
			}
			seen[folded] = true
			var next reflect.Type
			if fields != nil {
				ft, ok := fields[key]
				if !ok {
					for name := range fields {
						if foldKey(name) == folded {
							return at, "must be spelled " + strconv.Quote(name) + " (keys are case-sensitive)", nil
						}
					}
				}
				next = ft
			} else if t != nil && t.Kind() == reflect.Map {
				next = t.Elem()
			}
			if field, detail, err := tokenWalkKeys(dec, next, at); err != nil || detail != "" {
				return field, detail, err
			}
		}
		_, err := dec.Token()
		return "", "", err
	case json.Delim('['):
		var elem reflect.Type
		if t != nil && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) {
			elem = t.Elem()
		}
		for i := 0; dec.More(); i++ {
			if field, detail, err := tokenWalkKeys(dec, elem, path+"["+strconv.Itoa(i)+"]"); err != nil || detail != "" {
				return field, detail, err
			}
		}
		_, err := dec.Token()
		return "", "", err
	}
	return "", "", nil
}

// foldKey's fast way for ASCII keys gives what its rune-by-rune way gives:
// the least rune of each character's case-folding orbit.
func TestFoldKeyOfASCIIIsItsRuneByRuneFold(t *testing.T) {
	t.Parallel()
	for c := range 128 {
		for _, s := range []string{string(rune(c)), "sku_" + string(rune(c)), "Customer_ID" + string(rune(c))} {
			var want []rune
			for _, r := range s {
				least := r
				for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
					least = min(least, f)
				}
				want = append(want, least)
			}
			if got := foldKey(s); got != string(want) {
				t.Fatalf("foldKey(%q) = %q, want %q", s, got, string(want))
			}
		}
	}
}
