package httpapi

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"unicode"

	"github.com/acme/orders/domain"
)

// FuzzCheckKeys holds checkKeys' byte walker to what encoding/json's token
// reader found before it (tokenCheckKeys, kept here as the reference): for
// any body the api would go on to check (valid JSON in UTF-8, no lone
// surrogate), both name the same first bad key with the same complaint,
// whatever type the body is checked against. Only a body nested past
// maxBodyDepth, which the reference took, is refused instead.
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
		`{"":{"a":1,"a":2}}`,
		`{"note":{"x":[{"y":1,"Y":2}]},"shipping_address":null}`,
		`{"x":[1,-2.5e3,true,false,null,"s\"}"],"y":{}}`,
		`null`,
		`[null]`,
		`{"customer_id":null,"currency":"EUR"}`,
		`{"items":[{"sku":"s","quantity":1,"unit_price":null}]}`,
		`{"items":null}`,
		`{"shipping_address":null,"note":null,"name":null}`,
		`{"p":null,"a":null,"r":null,"m":{"k":null},"s":[null],"ps":[null],"pm":{"k":null}}`,
		`{"a":{"b":null,"B":1}}`,
	} {
		f.Add([]byte(seed))
	}
	types := []reflect.Type{nil, reflect.TypeFor[createOrderRequest](), reflect.TypeFor[domain.Address](),
		reflect.TypeFor[map[string]any](), reflect.TypeFor[[]createOrderRequest](), reflect.TypeFor[*struct {
			ShippingAddress json.RawMessage `json:"shipping_address"`
			Note            json.RawMessage `json:"note"`
		}](), reflect.TypeFor[nullables]()}
	f.Fuzz(func(t *testing.T, body []byte) {
		if !json.Valid(body) || checkUnicode(body) != nil {
			return // refused before checkKeys runs
		}
		deep := nesting(body) > maxBodyDepth
		for _, typ := range types {
			for _, path := range []string{"", "shipping_address"} {
				var gotField, gotDetail string
				if p := checkKeys(body, typ, path); p != nil {
					gotField, gotDetail = p.Errors[0].Field, p.Errors[0].Detail
				}
				if deep {
					if gotDetail != tooDeep {
						t.Fatalf("%s nests %d levels, checked against %v: got %q %q", body, nesting(body), typ, gotField, gotDetail)
					}
					continue
				}
				wantField, wantDetail := tokenCheckKeys(body, typ, path)
				if gotField != clip(wantField, maxFieldPath) || gotDetail != wantDetail {
					t.Fatalf("%s against %v at %q: got %q %q, the token reader %q %q", body, typ, path, gotField, gotDetail, wantField, wantDetail)
				}
			}
		}
	})
}

// nullables has a field of each kind that does or does not take null.
type nullables struct {
	P  *string           `json:"p"`
	A  any               `json:"a"`
	R  json.RawMessage   `json:"r"`
	M  map[string]int    `json:"m"`
	S  []int             `json:"s"`
	PS []*int            `json:"ps"`
	PM map[string]*int   `json:"pm"`
	N  *struct{ B int }  `json:"n"`
	X  map[string]string `json:"x"`
}

// nesting is how deeply the valid JSON text body nests objects and arrays.
func nesting(body []byte) int {
	dec := json.NewDecoder(bytes.NewReader(body))
	depth, most := 0, 0
	for {
		tok, err := dec.Token()
		if err != nil {
			return most
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			depth++
			most = max(most, depth)
		case json.Delim('}'), json.Delim(']'):
			depth--
		}
	}
}

// A body nested past maxBodyDepth is refused with the path to where it
// went too deep; one at the bound is checked as usual. A duplicate key
// under a long path of long keys is named by a clipped path (the walker
// builds it once: it used to be rebuilt at every level on the way up).
func TestKeysOfDeeplyNestedBodies(t *testing.T) {
	t.Parallel()
	nest := func(levels int, inner string) []byte {
		return []byte(strings.Repeat(`{"a":`, levels) + inner + strings.Repeat("}", levels))
	}
	if p := checkKeys(nest(maxBodyDepth-1, `{"b":1}`), nil, ""); p != nil {
		t.Fatalf("%d levels refused: %+v", maxBodyDepth, p.Errors)
	}
	p := checkKeys(nest(maxBodyDepth, `{"b":1}`), nil, "")
	want := strings.TrimPrefix(strings.Repeat(".a", maxBodyDepth), ".")
	if p == nil || p.Errors[0].Detail != tooDeep || p.Errors[0].Field != want {
		t.Fatalf("%d levels: %+v, want %q refused as too deep", maxBodyDepth+1, p, want)
	}
	long := strings.Repeat("k", 1000)
	body := []byte(strings.Repeat(`{"`+long+`":`, 40) + `{"a":1,"a":2}` + strings.Repeat("}", 40))
	p = checkKeys(body, nil, "note")
	if p == nil || !strings.HasPrefix(p.Errors[0].Field, "note."+long[:100]) || len(p.Errors[0].Field) > maxFieldPath ||
		!strings.HasSuffix(p.Errors[0].Field, "…") {
		t.Fatalf("duplicate under 40 long keys: %+v", p)
	}
}

// tokenCheckKeys is checkKeys as it was until 2026-11-24, on
// encoding/json's token reader: the reference for FuzzCheckKeys. (It
// dropped an empty key from a path when the path so far was empty, as in
// {"":{"a":1,"a":2}}; the walker names ".a", and so does this now. Since
// the walker refuses a null for a type that takes none, so does this,
// with the rule spelled out again rather than calling nullable.)
func tokenCheckKeys(body []byte, t reflect.Type, path string) (field, detail string) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	field, detail, _ = tokenWalkKeys(dec, t, path)
	if path == "" {
		field = strings.TrimPrefix(field, ".") // keys joined below "" start with "."
	}
	return field, detail
}

func tokenWalkKeys(dec *json.Decoder, t reflect.Type, path string) (field, detail string, err error) {
	null := t == nil || t == rawMessageType || t.Kind() == reflect.Pointer || t.Kind() == reflect.Interface
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
	join := func(path, key string) string { return path + "." + key } // an empty key is a segment too
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
	case nil: // null
		if !null {
			return path, nullDetail(t), nil
		}
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

// A null is refused where the field's type takes none (encoding/json would
// leave its zero value) and taken where it does: a pointer, an interface,
// json.RawMessage. Slices and maps take none.
func TestCheckKeysRefusesNullWhereTheTypeTakesNone(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ body, field, detail string }{
		{`{"p":null,"a":null,"r":null,"n":null,"ps":[null],"pm":{"k":null},"x":{}}`, "", ""},
		{`{"m":null}`, "m", "must be an object, got null"},
		{`{"s":null}`, "s", "must be an array, got null"},
		{`{"s":[1,null]}`, "s[1]", "must be an integer (within 64 bits), got null"},
		{`{"m":{"k":null}}`, "m.k", "must be an integer (within 64 bits), got null"},
		{`{"x":{"k":null}}`, "x.k", "must be a string, got null"},
		{`{"n":{"B":null}}`, "n.B", "must be an integer (within 64 bits), got null"},
		{`{"a":{"k":null},"r":[null]}`, "", ""},
	} {
		p := checkKeys([]byte(tt.body), reflect.TypeFor[*nullables](), "")
		switch {
		case tt.field == "" && p != nil:
			t.Errorf("%s: refused: %+v", tt.body, p.Errors)
		case tt.field != "" && (p == nil || p.Errors[0].Field != tt.field || p.Errors[0].Detail != tt.detail || p.Detail != "A field has the wrong type."):
			t.Errorf("%s: %+v, want %s refused with %q", tt.body, p, tt.field, tt.detail)
		}
	}
}
