package projection

import (
	"fmt"
	"math"
)

// addMoney adds amount (minor units, from an event) to a batch's delta sum,
// or returns an error wrapping ErrPermanent if the sum would leave the int64
// range: Go's + wraps silently. what names the sum for the error. Amounts
// are bounded by domain.MaxAmount, so only events of orders placed before
// that bound can get here; the batch cannot apply however often it is
// retried, so the runner dead-letters it.
func addMoney(sum *int64, amount int64, what string) error {
	if (amount > 0 && *sum > math.MaxInt64-amount) || (amount < 0 && *sum < math.MinInt64-amount) {
		return fmt.Errorf("%w: %s: %d + %d overflows a 64-bit delta", ErrPermanent, what, *sum, amount)
	}
	*sum += amount
	return nil
}
