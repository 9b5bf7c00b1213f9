package domain_test

import (
	"testing"

	"github.com/acme/orders/domain"
)

func address(mod func(*domain.Address)) *domain.Address {
	a := &domain.Address{Name: "Ada", Line1: "1 Main St", City: "Berlin", PostalCode: "10115", Country: "DE"}
	mod(a)
	return a
}

// Text fields refuse bidi controls, line and paragraph separators, C0 and
// C1 controls and invalid UTF-8; only the note may hold line breaks and tabs.
func TestTextRefusesControlsAndBidi(t *testing.T) {
	t.Parallel()
	bad := map[string]string{
		"RLO U+202E": "evil\u202etxt.exe", "LRE U+202A": "a\u202ab", "LRI U+2066": "a\u2066b", "PDI U+2069": "a\u2069b",
		"LRM U+200E": "a\u200eb", "RLM U+200F": "a\u200fb", "ALM U+061C": "a\u061cb",
		"LS U+2028": "a\u2028b", "PS U+2029": "a\u2029b", "NUL": "a\x00b", "ESC": "a\x1bb", "DEL": "a\x7fb",
		"C1 NEL U+0085": "a\u0085b", "C1 CSI U+009B": "a\u009bb", "invalid UTF-8": "a\xffb",
	}
	for name, s := range bad {
		if domain.ValidateReason(s) == nil {
			t.Errorf("reason with %s accepted", name)
		}
		if (domain.Patch{SetNote: true, Note: s}).Validate() == nil {
			t.Errorf("note with %s accepted", name)
		}
		if (domain.Patch{SetShippingAddress: true, ShippingAddress: address(func(a *domain.Address) { a.City = s })}).Validate() == nil {
			t.Errorf("city with %s accepted", name)
		}
	}
	// Line breaks and tabs: the note is free text over several lines; a
	// reason and an address line are one line each.
	for _, s := range []string{"line one\nline two", "a\r\nb", "a\tb"} {
		if err := (domain.Patch{SetNote: true, Note: s}).Validate(); err != nil {
			t.Errorf("note %q refused: %v", s, err)
		}
		if domain.ValidateReason(s) == nil {
			t.Errorf("reason %q with a line break or tab accepted", s)
		}
		if (domain.Patch{SetShippingAddress: true, ShippingAddress: address(func(a *domain.Address) { a.Line1 = s })}).Validate() == nil {
			t.Errorf("line1 %q with a line break or tab accepted", s)
		}
	}
	for _, s := range []string{"Zoë Ünal", "東京都", "مرحبا", "O'Brien & Søn"} {
		if err := domain.ValidateReason(s); err != nil {
			t.Errorf("reason %q refused: %v", s, err)
		}
	}
}

// A country must be an assigned ISO 3166-1 alpha-2 code.
func TestCountryIsAnAssignedISO3166Code(t *testing.T) {
	t.Parallel()
	for _, c := range []string{"DE", "FR", "US", "JP", "AX", "BQ", "CW", "SS", "SX", "TL", "ZW"} {
		if err := (domain.Patch{SetShippingAddress: true, ShippingAddress: address(func(a *domain.Address) { a.Country = c })}).Validate(); err != nil {
			t.Errorf("country %s refused: %v", c, err)
		}
	}
	for _, c := range []string{"ZZ", "XK", "AA", "QM", "UK", "EU", "de", "D", "DEU", ""} {
		if (domain.Patch{SetShippingAddress: true, ShippingAddress: address(func(a *domain.Address) { a.Country = c })}).Validate() == nil {
			t.Errorf("country %q accepted", c)
		}
	}
}

func TestCountryListIsComplete(t *testing.T) {
	t.Parallel()
	n := 0
	for a := 'A'; a <= 'Z'; a++ {
		for b := 'A'; b <= 'Z'; b++ {
			if domain.ValidCountry(string([]rune{a, b})) {
				n++
			}
		}
	}
	if n != 249 {
		t.Fatalf("%d assigned codes, want the 249 of ISO 3166-1", n)
	}
}

func TestValidateCustomerID(t *testing.T) {
	t.Parallel()
	for _, id := range []string{"c-1", "a/b", "100%"} {
		if err := domain.ValidateCustomerID(id); err != nil {
			t.Errorf("%q refused: %v", id, err)
		}
	}
	for _, id := range []string{"", "a b", "é", string(make([]byte, 65))} {
		if domain.ValidateCustomerID(id) == nil {
			t.Errorf("%q accepted", id)
		}
	}
}
