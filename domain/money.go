package domain

import (
	"math"
	"strings"
)

// Money amounts are integer minor units (cents for EUR, yen for JPY) of one
// ISO 4217 currency; there are no floats anywhere in the service.

// MaxAmount is the largest amount, in minor units, that a unit price, a line
// total (quantity × unit price) or an order total may hold: 10^12, ten
// billion in a currency with two decimals. NewOrder.Validate refuses an order
// above it, naming the field. The bound keeps every single amount far inside
// int64 (and PostgreSQL bigint), so that the sums built from amounts can be
// checked rather than trusted: a customer's or a day's sum reaches 2^63 only
// after 9.2 million orders at the maximum.
const MaxAmount int64 = 1_000_000_000_000

// MaxChargeAmount is the largest amount, in minor units, one provider charge
// can be: Stripe's limit of eight digits (999,999.99 in a currency with two
// decimals), which the local provider enforces too. An order may total more
// (up to MaxAmount), but Order.Pay refuses to ask for its payment (see
// ErrAmountNotChargeable): the provider would refuse the charge, and the
// order would wait in payment_pending for an outcome that never comes.
const MaxChargeAmount int64 = 99_999_999

// chargeScale lists the currencies whose amounts a provider speaking
// Stripe's API counts in other units than ISO 4217's minor units: ISK in
// hundredths of a króna (ISO: whole krónur; Stripe keeps ISK a
// two-decimal currency in its API, "an ISK amount of 100 represents 1
// króna", and takes only whole krónur), MGA in whole ariary (ISO:
// hundredths; a zero-decimal currency at Stripe). A positive scale
// multiplies ours, a negative one divides it (and ours must divide
// evenly).
var chargeScale = map[string]int64{"ISK": 100, "MGA": -100}

// tenths lists the three-decimal currencies, which Stripe takes only in
// multiples of 10 (its payment partners' rule: the last digit is 0).
var tenths = map[string]bool{"BHD": true, "JOD": true, "KWD": true, "OMR": true, "TND": true}

// ChargeUnits converts amount, in minor units of currency, to the units a
// provider speaking Stripe's API counts it in, and reports whether one
// charge (or refund) can be of it: 1 to MaxChargeAmount of those units,
// whole in them, and a multiple of 10 in a three-decimal currency. For most
// currencies the two units are the same.
func ChargeUnits(currency string, amount int64) (int64, bool) {
	units := amount
	switch scale := chargeScale[currency]; {
	case scale > 0:
		if amount > MaxChargeAmount/scale {
			return 0, false
		}
		units = amount * scale
	case scale < 0:
		if amount%-scale != 0 {
			return 0, false
		}
		units = amount / -scale
	}
	if units < 1 || units > MaxChargeAmount || tenths[currency] && units%10 != 0 {
		return 0, false
	}
	return units, true
}

// FromChargeUnits converts units, an amount of currency as a provider
// speaking Stripe's API counts it, to minor units, and reports whether it
// is a whole number of them.
func FromChargeUnits(currency string, units int64) (int64, bool) {
	switch scale := chargeScale[currency]; {
	case scale > 0:
		return units / scale, units%scale == 0
	case scale < 0:
		if units > math.MaxInt64/-scale || units < math.MinInt64/-scale {
			return 0, false
		}
		return units * -scale, true
	}
	return units, true
}

// iso4217 holds the active ISO 4217 alphabetic codes (list one of the standard,
// less funds and precious metals).
var iso4217 = func() map[string]bool {
	const codes = `AED AFN ALL AMD ANG AOA ARS AUD AWG AZN BAM BBD BDT BGN BHD BIF BMD BND BOB BRL
BSD BTN BWP BYN BZD CAD CDF CHF CLP CNY COP CRC CUC CUP CVE CZK DJF DKK DOP DZD EGP ERN ETB EUR
FJD FKP GBP GEL GHS GIP GMD GNF GTQ GYD HKD HNL HTG HUF IDR ILS INR IQD IRR ISK JMD JOD JPY KES
KGS KHR KMF KPW KRW KWD KYD KZT LAK LBP LKR LRD LSL LYD MAD MDL MGA MKD MMK MNT MOP MRU MUR MVR
MWK MXN MYR MZN NAD NGN NIO NOK NPR NZD OMR PAB PEN PGK PHP PKR PLN PYG QAR RON RSD RUB RWF SAR
SBD SCR SDG SEK SGD SHP SLE SOS SRD SSP STN SVC SYP SZL THB TJS TMT TND TOP TRY TTD TWD TZS UAH
UGX USD UYU UZS VES VED VND VUV WST XAF XCD XCG XOF XPF YER ZAR ZMW ZWG`
	m := make(map[string]bool)
	for _, c := range strings.Fields(codes) {
		m[c] = true
	}
	return m
}()

// ValidCurrency reports whether code is an active ISO 4217 code, in upper case.
func ValidCurrency(code string) bool { return iso4217[code] }

// mulAmount returns a*b, or ok=false if the product of two non-negative
// amounts does not fit in an int64.
func mulAmount(a, b int64) (int64, bool) {
	if a != 0 && b > math.MaxInt64/a {
		return 0, false
	}
	return a * b, true
}

// addAmount returns a+b, or ok=false if the sum of two non-negative amounts
// does not fit in an int64.
func addAmount(a, b int64) (int64, bool) {
	if a > math.MaxInt64-b {
		return 0, false
	}
	return a + b, true
}
