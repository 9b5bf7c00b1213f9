package domain_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/acme/orders/domain"
)

// orderIn returns an order brought to status through the lifecycle; a paid
// one was charged by provider charge "pi_1" on attempt 1.
func orderIn(t *testing.T, status domain.Status) domain.Order {
	t.Helper()
	now := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	o, _, err := domain.CreateOrder(uuid.Must(uuid.NewV7()), "t1", validOrder(), now)
	if err != nil {
		t.Fatal(err)
	}
	pay := func() (domain.Event, error) { return o.Pay(domain.DefaultPaymentMethod, now) }
	charge := func() (domain.Event, error) {
		return o.RecordCharge(o.Payment.Attempt, domain.ChargeOutcome{ChargeID: "pi_1", Amount: o.Total, Currency: o.Currency, Succeeded: true}, now)
	}
	decline := func() (domain.Event, error) {
		return o.RecordCharge(o.Payment.Attempt, domain.ChargeOutcome{Amount: o.Total, Currency: o.Currency, DeclineCode: "card_declined", Reason: "Your card was declined."}, now)
	}
	steps := map[domain.Status][]func() (domain.Event, error){
		domain.StatusPending:        nil,
		domain.StatusPaymentPending: {pay},
		domain.StatusPaymentFailed:  {pay, decline},
		domain.StatusPaid:           {pay, charge},
		domain.StatusShipped:        {pay, charge, func() (domain.Event, error) { return o.Ship(now) }},
		domain.StatusCancelled: {func() (domain.Event, error) {
			evs, err := o.Cancel("changed my mind", now)
			return evs[0], err
		}},
	}
	for _, step := range steps[status] {
		if _, err := step(); err != nil {
			t.Fatal(err)
		}
	}
	if o.Status != status {
		t.Fatalf("orderIn(%s) got %s", status, o.Status)
	}
	return o
}

func TestLifecycle(t *testing.T) {
	t.Parallel()
	later := time.Date(2026, 11, 22, 9, 30, 0, 0, time.UTC)
	type action struct {
		name string
		do   func(*domain.Order) ([]domain.Event, error)
	}
	one := func(e domain.Event, err error) ([]domain.Event, error) {
		if e == nil {
			return nil, err
		}
		return []domain.Event{e}, err
	}
	pay := action{"pay", func(o *domain.Order) ([]domain.Event, error) { return one(o.Pay("pm_card_visa", later)) }}
	charged := action{"charged", func(o *domain.Order) ([]domain.Event, error) {
		return one(o.RecordCharge(o.Payment.Attempt, domain.ChargeOutcome{ChargeID: "pi_2", Amount: o.Total, Currency: o.Currency, Succeeded: true}, later))
	}}
	declined := action{"declined", func(o *domain.Order) ([]domain.Event, error) {
		return one(o.RecordCharge(o.Payment.Attempt, domain.ChargeOutcome{Amount: o.Total, Currency: o.Currency, DeclineCode: "card_declined", Reason: "declined"}, later))
	}}
	ship := action{"ship", func(o *domain.Order) ([]domain.Event, error) { return one(o.Ship(later)) }}
	cancel := action{"cancel", func(o *domain.Order) ([]domain.Event, error) { return o.Cancel("out of stock", later) }}

	const (
		changes = "changes"
		noop    = "no-op"
		refused = "refused"
	)
	tests := []struct {
		from   domain.Status
		action action
		want   string
		to     domain.Status
		events string // event types, comma-separated
	}{
		{domain.StatusPending, pay, changes, domain.StatusPaymentPending, "payment.requested"},
		{domain.StatusPending, charged, noop, domain.StatusPending, ""},
		{domain.StatusPending, declined, noop, domain.StatusPending, ""},
		{domain.StatusPending, ship, refused, domain.StatusPending, ""},
		{domain.StatusPending, cancel, changes, domain.StatusCancelled, "order.cancelled"},
		{domain.StatusPaymentPending, pay, noop, domain.StatusPaymentPending, ""},
		{domain.StatusPaymentPending, charged, changes, domain.StatusPaid, "order.paid"},
		{domain.StatusPaymentPending, declined, changes, domain.StatusPaymentFailed, "order.payment_failed"},
		{domain.StatusPaymentPending, ship, refused, domain.StatusPaymentPending, ""},
		{domain.StatusPaymentPending, cancel, refused, domain.StatusPaymentPending, ""},
		{domain.StatusPaymentFailed, pay, changes, domain.StatusPaymentPending, "payment.requested"},
		{domain.StatusPaymentFailed, charged, noop, domain.StatusPaymentFailed, ""},
		{domain.StatusPaymentFailed, ship, refused, domain.StatusPaymentFailed, ""},
		{domain.StatusPaymentFailed, cancel, changes, domain.StatusCancelled, "order.cancelled"},
		{domain.StatusPaid, pay, noop, domain.StatusPaid, ""},
		{domain.StatusPaid, charged, noop, domain.StatusPaid, ""},
		{domain.StatusPaid, ship, changes, domain.StatusShipped, "order.shipped"},
		{domain.StatusPaid, cancel, changes, domain.StatusCancelled, "order.cancelled,refund.requested"},
		{domain.StatusShipped, pay, refused, domain.StatusShipped, ""},
		{domain.StatusShipped, ship, noop, domain.StatusShipped, ""},
		{domain.StatusShipped, cancel, refused, domain.StatusShipped, ""},
		{domain.StatusCancelled, pay, refused, domain.StatusCancelled, ""},
		{domain.StatusCancelled, charged, noop, domain.StatusCancelled, ""},
		{domain.StatusCancelled, ship, refused, domain.StatusCancelled, ""},
		{domain.StatusCancelled, cancel, noop, domain.StatusCancelled, ""},
	}
	for _, tt := range tests {
		t.Run(string(tt.from)+"/"+tt.action.name, func(t *testing.T) {
			t.Parallel()
			o := orderIn(t, tt.from)
			before := o
			evs, err := tt.action.do(&o)
			switch tt.want {
			case changes:
				var types []string
				for _, e := range evs {
					types = append(types, e.EventType())
				}
				if err != nil || strings.Join(types, ",") != tt.events {
					t.Fatalf("got events %v, err %v; want %s", types, err, tt.events)
				}
				if o.Version != before.Version+int64(len(evs)) || !o.UpdatedAt.Equal(later) {
					t.Fatalf("version %d→%d, updated_at %v: want +%d and %v", before.Version, o.Version, o.UpdatedAt, len(evs), later)
				}
			case noop:
				if err != nil || len(evs) != 0 || o.Version != before.Version {
					t.Fatalf("got events %v, err %v, version %d; want a no-op", evs, err, o.Version)
				}
			case refused:
				de, ok := err.(*domain.Error)
				if !ok || de.Kind != domain.KindConflict || de.State != string(tt.from) || !strings.Contains(de.Message, string(tt.from)) {
					t.Fatalf("err = %v; want a conflict naming %s", err, tt.from)
				}
				if len(evs) != 0 || o.Version != before.Version {
					t.Fatal("a refused step changed the order")
				}
			}
			if o.Status != tt.to {
				t.Fatalf("status %s, want %s", o.Status, tt.to)
			}
		})
	}
}

func TestPaymentAttemptsAndKeys(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 22, 9, 30, 0, 0, time.UTC)
	o := orderIn(t, domain.StatusPending)
	ev, err := o.Pay("pm_card_chargeDeclined", now)
	if err != nil {
		t.Fatal(err)
	}
	req := ev.(domain.PaymentRequested)
	key1 := "t1:order:" + o.ID.String() + ":charge:1"
	if req.Attempt != 1 || req.PaymentKey != key1 || req.Amount != o.Total || req.Currency != o.Currency ||
		req.PaymentMethod != "pm_card_chargeDeclined" || o.Payment.Key != key1 || o.Payment.Attempt != 1 {
		t.Fatalf("first attempt: %+v, order payment %+v", req, o.Payment)
	}
	if got := domain.ChargeKey("t1", o.ID, 1); got != key1 {
		t.Fatalf("ChargeKey = %q, want %q (derived, the same every time)", got, key1)
	}
	// A stale outcome (another attempt) changes nothing.
	if ev, err := o.RecordCharge(2, domain.ChargeOutcome{ChargeID: "pi_x", Amount: o.Total, Currency: o.Currency, Succeeded: true}, now); ev != nil || err != nil || o.Status != domain.StatusPaymentPending {
		t.Fatalf("stale outcome: %v %v %s", ev, err, o.Status)
	}
	ev, err = o.RecordCharge(1, domain.ChargeOutcome{Amount: o.Total, Currency: o.Currency, DeclineCode: "card_declined", Reason: "Your card was declined."}, now)
	if err != nil {
		t.Fatal(err)
	}
	if f := ev.(domain.OrderPaymentFailed); f.Attempt != 1 || f.DeclineCode != "card_declined" || f.Reason != "Your card was declined." || o.Payment.DeclineCode != "card_declined" {
		t.Fatalf("declined: %+v", f)
	}
	ev, err = o.Pay(domain.DefaultPaymentMethod, now.Add(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	key2 := "t1:order:" + o.ID.String() + ":charge:2"
	if r := ev.(domain.PaymentRequested); r.Attempt != 2 || r.PaymentKey != key2 || r.From != domain.StatusPaymentFailed {
		t.Fatalf("second attempt: %+v", r)
	}
	if o.Payment.DeclineCode != "" || o.Payment.FailureReason != "" {
		t.Fatalf("a new attempt clears the last decline: %+v", o.Payment)
	}
	// The outcome of the old attempt, arriving late, changes nothing.
	if ev, _ := o.RecordCharge(1, domain.ChargeOutcome{ChargeID: "pi_old", Amount: o.Total, Currency: o.Currency, Succeeded: true}, now); ev != nil {
		t.Fatalf("late outcome of attempt 1 applied: %v", ev)
	}
	// A succeeded charge of another amount is refused, not recorded.
	if _, err := o.RecordCharge(2, domain.ChargeOutcome{ChargeID: "pi_2", Amount: o.Total + 1, Currency: o.Currency, Succeeded: true}, now); domain.KindOf(err) != domain.KindConflict {
		t.Fatalf("wrong amount: err %v, want KindConflict", err)
	}
	ev, err = o.RecordCharge(2, domain.ChargeOutcome{ChargeID: "pi_2", Amount: o.Total, Currency: o.Currency, Succeeded: true}, now)
	if err != nil {
		t.Fatal(err)
	}
	if p := ev.(domain.OrderPaid); p.Attempt != 2 || p.ChargeID != "pi_2" || p.Amount != o.Total || o.Payment.ChargeID != "pi_2" || o.PaidAt == nil {
		t.Fatalf("paid: %+v", p)
	}
}

// An order paid before payments went through the provider has no charge
// (migration 009 left it payment {}): a refund.requested for it would carry
// no charge id, which the worker refuses as malformed, and the refund would
// stay pending for good. Its cancellation refunds it as releases before did.
func TestCancelOfAnOrderPaidBeforeTheProviderRefundsAtOnce(t *testing.T) {
	t.Parallel()
	now := time.Now().UTC()
	o := orderIn(t, domain.StatusPending)
	o.Status, o.PaidAt = domain.StatusPaid, &now // as migration 009 found it: paid, payment {}
	v := o.Version
	evs, err := o.Cancel("fraud", now)
	if err != nil || len(evs) != 1 {
		t.Fatalf("cancel: %v %v (want OrderCancelled alone)", evs, err)
	}
	if c := evs[0].(domain.OrderCancelled); c.Refunded != o.Total || c.From != domain.StatusPaid {
		t.Fatalf("cancelled: %+v (want the total refunded at the cancellation)", c)
	}
	if o.Version != v+1 || o.Status != domain.StatusCancelled || o.Refund.Status != domain.RefundNone {
		t.Fatalf("order after cancel: version %d (was %d), status %s, refund %+v", o.Version, v, o.Status, o.Refund)
	}
	if ev, err := o.RetryRefund(now); ev != nil || err != nil {
		t.Fatalf("refund asked again: %v %v (want nothing: refunded at the cancellation)", ev, err)
	}
}

func TestCancelOfPaidOrderRequestsRefund(t *testing.T) {
	t.Parallel()
	now := time.Now().UTC()
	o := orderIn(t, domain.StatusPaid)
	v := o.Version
	evs, err := o.Cancel("fraud", now)
	if err != nil || len(evs) != 2 {
		t.Fatalf("cancel: %v %v", evs, err)
	}
	c, r := evs[0].(domain.OrderCancelled), evs[1].(domain.RefundRequested)
	if c.Refunded != 0 || c.From != domain.StatusPaid || c.Reason != "fraud" || c.Total != 2500 {
		t.Fatalf("cancelled: %+v (nothing is refunded until the provider confirms it)", c)
	}
	key := "t1:order:" + o.ID.String() + ":refund:1"
	if r.Attempt != 1 || r.RefundKey != key || r.ChargeID != "pi_1" || r.Amount != 2500 || r.Currency != o.Currency || domain.RefundKey("t1", o.ID, 1) != key {
		t.Fatalf("refund requested: %+v", r)
	}
	if o.Version != v+2 || o.Refund.Status != domain.RefundPending || o.Refund.Key != key {
		t.Fatalf("order after cancel: version %d, refund %+v", o.Version, o.Refund)
	}
	if h := o.History(); h[len(h)-1].Status != domain.StatusCancelled || h[len(h)-1].Reason != "fraud" {
		t.Fatalf("history %+v", h)
	}
	if ev, _ := o.RecordRefund(2, domain.RefundOutcome{RefundID: "re_x", Amount: 2500, Currency: o.Currency, Succeeded: true}, now); ev != nil {
		t.Fatal("stale refund outcome applied")
	}
	ev, err := o.RecordRefund(1, domain.RefundOutcome{RefundID: "re_1", Amount: 2500, Currency: o.Currency, Succeeded: true}, now)
	if err != nil {
		t.Fatal(err)
	}
	if rf := ev.(domain.OrderRefunded); rf.RefundID != "re_1" || rf.Amount != 2500 || o.Refund.Status != domain.RefundSucceeded || o.Refund.ID != "re_1" {
		t.Fatalf("refunded: %+v, order refund %+v", rf, o.Refund)
	}
	if ev, _ := o.RecordRefund(1, domain.RefundOutcome{RefundID: "re_1", Amount: 2500, Currency: o.Currency, Succeeded: true}, now); ev != nil {
		t.Fatal("a second outcome of a settled refund applied")
	}

	failed := orderIn(t, domain.StatusPaid)
	if _, err := failed.Cancel("fraud", now); err != nil {
		t.Fatal(err)
	}
	ev, err = failed.RecordRefund(1, domain.RefundOutcome{Reason: "charge_disputed"}, now)
	if err != nil {
		t.Fatal(err)
	}
	if f := ev.(domain.OrderRefundFailed); f.Reason != "charge_disputed" || failed.Refund.Status != domain.RefundFailed {
		t.Fatalf("refund failed: %+v", f)
	}

	pending := orderIn(t, domain.StatusPending)
	evs, err = pending.Cancel("fraud", now)
	if err != nil || len(evs) != 1 || pending.Refund.Status != domain.RefundNone {
		t.Fatalf("cancel of a pending order: %v %v %+v", evs, err, pending.Refund)
	}
	for _, reason := range []string{"", strings.Repeat("r", 501), "bad\x00reason"} {
		o := orderIn(t, domain.StatusPending)
		if _, err := o.Cancel(reason, now); domain.KindOf(err) != domain.KindInvalid {
			t.Fatalf("Cancel(%q) err = %v, want KindInvalid", reason, err)
		}
	}
}

func TestValidatePaymentMethod(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"pm_card_visa", "pm_card_chargeDeclined", "pm_" + strings.Repeat("a", 64), "pm_1"} {
		if err := domain.ValidatePaymentMethod(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "pm_", "card_visa", "pm_card visa", "pm_" + strings.Repeat("a", 65), "pm_é", "PM_card"} {
		err := domain.ValidatePaymentMethod(bad)
		var de *domain.Error
		if !errors.As(err, &de) || de.Kind != domain.KindInvalid || len(de.Fields) != 1 || de.Fields[0].Field != "payment_method" {
			t.Errorf("%q: err %v, want KindInvalid naming payment_method", bad, err)
		}
	}
}

func TestUpdate(t *testing.T) {
	t.Parallel()
	now := time.Now()
	addr := &domain.Address{Name: "Ada", Line1: "1 Main St", City: "Berlin", PostalCode: "10115", Country: "DE"}
	setAddr := domain.Patch{SetShippingAddress: true, ShippingAddress: addr}

	o := orderIn(t, domain.StatusPending)
	ev, err := o.Update(setAddr, 1, now)
	if err != nil || ev == nil || o.Version != 2 || o.ShippingAddress.City != "Berlin" {
		t.Fatalf("update: %v %v %+v", ev, err, o)
	}
	if ev, err := o.Update(setAddr, 2, now); err != nil || ev != nil || o.Version != 2 {
		t.Fatalf("same values again: %v %v, version %d; want a no-op", ev, err, o.Version)
	}
	if _, err := o.Update(domain.Patch{SetNote: true, Note: "ring twice"}, 1, now); domain.KindOf(err) != domain.KindPreconditionFailed {
		t.Fatalf("stale version: err %v, want KindPreconditionFailed", err)
	}
	if ev, err := o.Update(domain.Patch{SetShippingAddress: true}, 2, now); err != nil || ev == nil || o.ShippingAddress != nil {
		t.Fatalf("clearing the address: %v %v %+v", ev, err, o.ShippingAddress)
	}

	shipped := orderIn(t, domain.StatusShipped)
	if _, err := shipped.Update(setAddr, shipped.Version, now); domain.KindOf(err) != domain.KindConflict {
		t.Fatalf("update of a shipped order: err %v, want KindConflict", err)
	}

	bad := []domain.Patch{
		{},
		{SetShippingAddress: true, ShippingAddress: &domain.Address{Name: "A", Line1: "x", City: "y", PostalCode: "1", Country: "de"}},
		{SetShippingAddress: true, ShippingAddress: &domain.Address{}},
		{SetNote: true, Note: strings.Repeat("n", 1001)},
		{SetNote: true, Note: "bell\a"},
	}
	for _, p := range bad {
		if err := p.Validate(); domain.KindOf(err) != domain.KindInvalid {
			t.Fatalf("Validate(%+v) = %v, want KindInvalid", p, err)
		}
	}
}

// Pay refuses an order whose total no provider charge can be (0, above
// MaxChargeAmount in the provider's units of its currency, or no whole
// number of them: the provider would refuse the charge and the order would
// stay payment_pending for good), changing nothing; the bounds pay.
func TestPayRefusesAnUnchargeableTotal(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 22, 9, 30, 0, 0, time.UTC)
	for _, tt := range []struct {
		currency string
		total    int64
		ok       bool
	}{
		{"EUR", 0, false}, {"EUR", 1, true}, {"EUR", domain.MaxChargeAmount, true}, {"EUR", domain.MaxChargeAmount + 1, false}, {"EUR", domain.MaxAmount, false},
		// The provider counts ISK in hundredths, MGA in whole ariary, and
		// the three-decimal currencies in tens of their minor units.
		{"ISK", domain.MaxChargeAmount / 100, true}, {"ISK", domain.MaxChargeAmount/100 + 1, false},
		{"MGA", 100, true}, {"MGA", 150, false}, {"MGA", 99, false},
		{"KWD", 1250, true}, {"KWD", 1255, false},
	} {
		for _, status := range []domain.Status{domain.StatusPending, domain.StatusPaymentFailed} {
			o := orderIn(t, status)
			o.Total, o.Currency = tt.total, tt.currency
			before := o
			ev, err := o.Pay(domain.DefaultPaymentMethod, now)
			if tt.ok {
				if err != nil || ev == nil || o.Status != domain.StatusPaymentPending {
					t.Fatalf("%s order of %d %s: pay %v %v, status %s", status, tt.total, tt.currency, ev, err, o.Status)
				}
				continue
			}
			if !errors.Is(err, domain.ErrAmountNotChargeable) || domain.KindOf(err) != domain.KindInvalid || ev != nil ||
				o.Status != status || o.Version != before.Version || o.Payment.Attempt != before.Payment.Attempt {
				t.Fatalf("%s order of %d %s: pay %v %v, status %s version %d attempt %d; want ErrAmountNotChargeable, nothing changed",
					status, tt.total, tt.currency, ev, err, o.Status, o.Version, o.Payment.Attempt)
			}
		}
	}
}

func TestRetryRefundStartsTheNextAttemptOnlyAfterAFailure(t *testing.T) {
	t.Parallel()
	now := time.Now().UTC()
	o := orderIn(t, domain.StatusPaid)
	if _, err := o.RetryRefund(now); domain.KindOf(err) != domain.KindConflict {
		t.Fatalf("refund of a paid order (not cancelled): err %v, want KindConflict", err)
	}
	if _, err := o.Cancel("fraud", now); err != nil {
		t.Fatal(err)
	}
	v := o.Version
	if ev, err := o.RetryRefund(now); ev != nil || err != nil || o.Version != v {
		t.Fatalf("refund while attempt 1 is pending: %v %v (version %d → %d), want nothing", ev, err, v, o.Version)
	}
	if _, err := o.RecordRefund(1, domain.RefundOutcome{Reason: "declined"}, now); err != nil {
		t.Fatal(err)
	}
	v = o.Version
	ev, err := o.RetryRefund(now)
	if err != nil {
		t.Fatal(err)
	}
	key := domain.RefundKey("t1", o.ID, 2)
	r := ev.(domain.RefundRequested)
	if r.Attempt != 2 || r.RefundKey != key || r.ChargeID != "pi_1" || r.Amount != o.Total || r.Currency != o.Currency {
		t.Fatalf("refund requested again: %+v", r)
	}
	if o.Version != v+1 || o.Refund.Status != domain.RefundPending || o.Refund.Attempt != 2 || o.Refund.Key != key || o.Refund.FailureReason != "" {
		t.Fatalf("order after the retry: version %d (was %d), refund %+v", o.Version, v, o.Refund)
	}
	if ev, _ := o.RecordRefund(1, domain.RefundOutcome{Reason: "declined"}, now); ev != nil {
		t.Fatal("a late outcome of attempt 1 applied to attempt 2")
	}
	if _, err := o.RecordRefund(2, domain.RefundOutcome{RefundID: "re_2", Amount: o.Total, Currency: o.Currency, Succeeded: true}, now); err != nil {
		t.Fatal(err)
	}
	if ev, err := o.RetryRefund(now); ev != nil || err != nil {
		t.Fatalf("refund of a refunded order: %v %v, want nothing", ev, err)
	}

	never := orderIn(t, domain.StatusPending)
	if _, err := never.Cancel("fraud", now); err != nil {
		t.Fatal(err)
	}
	if _, err := never.RetryRefund(now); domain.KindOf(err) != domain.KindConflict {
		t.Fatalf("refund of a cancelled order never paid: err %v, want KindConflict", err)
	}
}

// An intent is settled only for an order that awaits it: the charge of its
// current attempt for its total by its method, or the pending refund of
// the charge that paid it. Anything else is a KindConflict.
func TestAnOrderAwaitsOnlyTheIntentItAskedFor(t *testing.T) {
	t.Parallel()
	paying := orderIn(t, domain.StatusPaymentPending)
	charge := domain.PaymentRequested{Transition: domain.Transition{Currency: paying.Currency}, Attempt: 1, Amount: paying.Total, PaymentMethod: domain.DefaultPaymentMethod}
	if err := paying.AwaitsCharge(charge); err != nil {
		t.Fatalf("the charge asked for: %v", err)
	}
	refused := map[string]func(*domain.PaymentRequested){
		"another attempt":  func(r *domain.PaymentRequested) { r.Attempt = 2 },
		"another amount":   func(r *domain.PaymentRequested) { r.Amount++ },
		"another currency": func(r *domain.PaymentRequested) { r.Currency = "JPY" },
		"another method":   func(r *domain.PaymentRequested) { r.PaymentMethod = "pm_card_mastercard" },
	}
	for name, change := range refused {
		r := charge
		change(&r)
		if err := paying.AwaitsCharge(r); domain.KindOf(err) != domain.KindConflict {
			t.Errorf("a charge of %s: %v, want a conflict", name, err)
		}
	}
	for _, st := range []domain.Status{domain.StatusPending, domain.StatusPaymentFailed, domain.StatusPaid, domain.StatusCancelled} {
		if o := orderIn(t, st); domain.KindOf(o.AwaitsCharge(charge)) != domain.KindConflict {
			t.Errorf("a %s order awaits a charge", st)
		}
	}

	paid := orderIn(t, domain.StatusPaid)
	if domain.KindOf(paid.AwaitsRefund(domain.RefundRequested{Attempt: 1, ChargeID: "pi_1", Amount: paid.Total, Currency: paid.Currency})) != domain.KindConflict {
		t.Error("a paid order, never cancelled, awaits a refund")
	}
	evs, err := paid.Cancel("fraud", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	refund := evs[1].(domain.RefundRequested)
	if err := paid.AwaitsRefund(refund); err != nil {
		t.Fatalf("the refund asked for: %v", err)
	}
	other := refund
	other.ChargeID = "pi_of_another_order"
	if domain.KindOf(paid.AwaitsRefund(other)) != domain.KindConflict {
		t.Error("a refund of another order's charge is awaited")
	}
	other = refund
	other.Attempt = 2
	if domain.KindOf(paid.AwaitsRefund(other)) != domain.KindConflict {
		t.Error("a refund of another attempt is awaited")
	}
}

// The decline is stamped by the worker's clock, the request by the api's:
// a worker 20 ms behind declines 5 ms after the request at a time that
// reads 15 ms before it. The history still ends in payment_failed, as the
// order's status does.
func TestHistoryPutsADeclineAfterItsRequestWhateverTheClocksSay(t *testing.T) {
	t.Parallel()
	o := orderIn(t, domain.StatusPending)
	asked := o.CreatedAt.Add(time.Second)
	if _, err := o.Pay(domain.DefaultPaymentMethod, asked); err != nil {
		t.Fatal(err)
	}
	behind := asked.Add(5*time.Millisecond - 20*time.Millisecond)
	if _, err := o.RecordCharge(o.Payment.Attempt, domain.ChargeOutcome{Amount: o.Total, Currency: o.Currency, DeclineCode: "card_declined", Reason: "declined"}, behind); err != nil {
		t.Fatal(err)
	}
	h := o.History()
	if o.Status != domain.StatusPaymentFailed || len(h) != 3 || h[1].Status != domain.StatusPaymentPending || h[2].Status != domain.StatusPaymentFailed {
		t.Fatalf("status %s, history %+v: want pending, payment_pending, payment_failed", o.Status, h)
	}
	// Asked again: the new attempt has no decline yet.
	if _, err := o.Pay(domain.DefaultPaymentMethod, asked.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	if h := o.History(); len(h) != 2 || h[1].Status != domain.StatusPaymentPending || !h[1].At.Equal(asked.Add(time.Second)) {
		t.Fatalf("history after asking again: %+v: want pending, then the new attempt's payment_pending", h)
	}
}
