package query

import (
	"errors"
	"fmt"
	"math/big"

	"github.com/jackc/pgx/v5/pgtype"
)

// Amount is a read-model sum of money in integer minor units: a customer's
// paid or refunded total, a day's paid or refunded amount. Those sums are
// numeric(38,0) columns, exact up to 10^38 - 1, and can pass the int64 range
// (orders placed before domain.MaxAmount existed could carry ~2^63 each), so
// Amount holds every digit. Its zero value is 0. It marshals to a JSON number
// with every digit; clients that parse numbers as 64-bit integers or doubles
// must expect values past 2^63 there (never a wrapped or rounded one from us).
type Amount struct{ v *big.Int }

var _ pgtype.NumericScanner = (*Amount)(nil)

// AmountOf returns n as an Amount.
func AmountOf(n int64) Amount { return Amount{big.NewInt(n)} }

// ParseAmount returns the Amount of a decimal integer such as
// "18446744073709551616".
func ParseAmount(s string) (Amount, error) {
	v, ok := new(big.Int).SetString(s, 10)
	if !ok {
		return Amount{}, fmt.Errorf("parse amount %q: not a decimal integer", s)
	}
	return Amount{v}, nil
}

// String returns a in decimal, without separators.
func (a Amount) String() string {
	if a.v == nil {
		return "0"
	}
	return a.v.String()
}

// Int64 returns a as an int64, and false if it does not fit in one.
func (a Amount) Int64() (int64, bool) {
	if a.v == nil {
		return 0, true
	}
	return a.v.Int64(), a.v.IsInt64()
}

// Cmp compares a and b: -1, 0 or +1 as a is less than, equal to or greater than b.
func (a Amount) Cmp(b Amount) int { return a.big().Cmp(b.big()) }

func (a Amount) big() *big.Int {
	if a.v == nil {
		return new(big.Int)
	}
	return a.v
}

// MarshalJSON writes a as a JSON number with every digit.
func (a Amount) MarshalJSON() ([]byte, error) { return a.big().Append(nil, 10), nil }

// ScanNumeric implements pgtype.NumericScanner. It refuses NULL, NaN,
// infinities and fractions: a money sum is always a whole number of minor
// units.
func (a *Amount) ScanNumeric(n pgtype.Numeric) error {
	switch {
	case !n.Valid:
		return errors.New("scan amount: NULL")
	case n.NaN || n.InfinityModifier != pgtype.Finite:
		return errors.New("scan amount: not a finite number")
	}
	v := new(big.Int)
	if n.Int != nil {
		v.Set(n.Int)
	}
	if n.Exp != 0 {
		p := new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(max(n.Exp, -n.Exp))), nil)
		if n.Exp > 0 {
			v.Mul(v, p)
		} else if _, r := v.QuoRem(v, p, new(big.Int)); r.Sign() != 0 {
			return fmt.Errorf("scan amount: %s × 10^%d is not a whole number of minor units", n.Int, n.Exp)
		}
	}
	a.v = v
	return nil
}
