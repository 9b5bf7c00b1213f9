package settle

import "sync/atomic"

// Stats counts what a Worker did since it started.
type Stats struct {
	ChargesSucceeded, ChargesDeclined int64 // charges recorded, by outcome
	RefundsSucceeded, RefundsFailed   int64 // refunds recorded, by outcome
	// ChargeTransient and RefundTransient count provider failures a retry
	// may cure (each retried with the same key).
	ChargeTransient, RefundTransient int64
	// ChargeDeadLettered and RefundDeadLettered count intents dead-lettered.
	ChargeDeadLettered, RefundDeadLettered int64
	// Duplicates counts deliveries of intents already recorded (acked
	// without calling the provider).
	Duplicates int64
	// Deferred counts deliveries deferred because their tenant held its
	// share of the slots or had intents parked; Parked those of them
	// parked out of the consumer's window (the rest were handed back: the
	// park failed), and Redriven the leases of parked intents tried.
	Deferred, Parked, Redriven int64
	// RetryParked counts delivered intents that failed transiently and
	// were parked on their backoff out of the consumer's window (the
	// re-drive retries them), rather than handed back into it.
	RetryParked int64
}

type counters struct {
	chargesOK, chargesDeclined, refundsOK, refundsFailed atomic.Int64
	chargeTransient, refundTransient                     atomic.Int64
	chargeDead, refundDead, duplicates                   atomic.Int64
	deferred, parked, redriven, retryParked              atomic.Int64
}

func (c *counters) charged(ok bool) {
	if ok {
		c.chargesOK.Add(1)
	} else {
		c.chargesDeclined.Add(1)
	}
}

func (c *counters) refunded(ok bool) {
	if ok {
		c.refundsOK.Add(1)
	} else {
		c.refundsFailed.Add(1)
	}
}

func (c *counters) transient(consumer string) {
	if consumer == ChargeConsumer {
		c.chargeTransient.Add(1)
	} else {
		c.refundTransient.Add(1)
	}
}

func (c *counters) deadLettered(consumer string) {
	if consumer == ChargeConsumer {
		c.chargeDead.Add(1)
	} else {
		c.refundDead.Add(1)
	}
}

func (c *counters) duplicate(string) { c.duplicates.Add(1) }

// Stats returns the worker's counters.
func (w *Worker) Stats() Stats {
	c := &w.stats
	return Stats{
		ChargesSucceeded: c.chargesOK.Load(), ChargesDeclined: c.chargesDeclined.Load(),
		RefundsSucceeded: c.refundsOK.Load(), RefundsFailed: c.refundsFailed.Load(),
		ChargeTransient: c.chargeTransient.Load(), RefundTransient: c.refundTransient.Load(),
		ChargeDeadLettered: c.chargeDead.Load(), RefundDeadLettered: c.refundDead.Load(),
		Duplicates: c.duplicates.Load(), Deferred: c.deferred.Load(),
		Parked: c.parked.Load(), Redriven: c.redriven.Load(), RetryParked: c.retryParked.Load(),
	}
}
