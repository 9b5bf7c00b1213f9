package query

import (
	"encoding/json"
	"math/big"
	"testing"

	"github.com/jackc/pgx/v5/pgtype"
)

func TestAmountScanNumeric(t *testing.T) {
	t.Parallel()
	big1 := func(s string) *big.Int {
		v, _ := new(big.Int).SetString(s, 10)
		return v
	}
	tests := []struct {
		name string
		n    pgtype.Numeric
		want string // "" for an error
	}{
		{"zero", pgtype.Numeric{Int: big.NewInt(0), Valid: true}, "0"},
		{"past 2^63", pgtype.Numeric{Int: big1("18446744073710151600"), Valid: true}, "18446744073710151600"},
		{"10^38 - 1", pgtype.Numeric{Int: big1("99999999999999999999999999999999999999"), Valid: true}, "99999999999999999999999999999999999999"},
		{"positive exponent", pgtype.Numeric{Int: big.NewInt(15), Exp: 3, Valid: true}, "15000"},
		{"whole with negative exponent", pgtype.Numeric{Int: big.NewInt(1500), Exp: -2, Valid: true}, "15"},
		{"fraction", pgtype.Numeric{Int: big.NewInt(1501), Exp: -2, Valid: true}, ""},
		{"NULL", pgtype.Numeric{}, ""},
		{"NaN", pgtype.Numeric{NaN: true, Valid: true}, ""},
		{"infinity", pgtype.Numeric{InfinityModifier: pgtype.Infinity, Valid: true}, ""},
	}
	for _, tt := range tests {
		var a Amount
		err := a.ScanNumeric(tt.n)
		if tt.want == "" {
			if err == nil {
				t.Errorf("%s: ScanNumeric = nil, want an error", tt.name)
			}
			continue
		}
		if err != nil || a.String() != tt.want {
			t.Errorf("%s: ScanNumeric = %s, %v; want %s", tt.name, a, err, tt.want)
		}
		if b, err := json.Marshal(a); err != nil || string(b) != tt.want {
			t.Errorf("%s: json = %s, %v; want %s", tt.name, b, err, tt.want)
		}
	}
	if n, ok := AmountOf(42).Int64(); n != 42 || !ok {
		t.Errorf("AmountOf(42).Int64() = %d, %v", n, ok)
	}
	past, _ := ParseAmount("18446744073710151600")
	if _, ok := past.Int64(); ok || past.Cmp(AmountOf(1)) != 1 || (Amount{}).String() != "0" {
		t.Errorf("Amount past int64: Int64 ok %v, Cmp %d", ok, past.Cmp(AmountOf(1)))
	}
}
