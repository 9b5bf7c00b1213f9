package projection

import (
	"time"

	"github.com/acme/orders/domain"
)

// legacyPay moves a pending order o straight to paid and returns the
// order.paid event as releases before payments went through the provider
// wrote it (from pending, no charge fields). The runner tests use it to keep
// their three-event orders; projections must still apply such events, which
// older streams hold.
func legacyPay(o *domain.Order, at time.Time) (domain.Event, error) {
	t := domain.Transition{CustomerID: o.CustomerID, Currency: o.Currency, Total: o.Total, From: o.Status, Status: domain.StatusPaid, At: at}
	o.Status, o.PaidAt, o.UpdatedAt = domain.StatusPaid, &at, at
	o.Version++
	return domain.OrderPaid{Transition: t}, nil
}
