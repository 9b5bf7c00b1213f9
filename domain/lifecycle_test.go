package domain_test

import (
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/acme/orders/domain"
)

// orderIn returns an order brought to status through the lifecycle.
func orderIn(t *testing.T, status domain.Status) domain.Order {
	t.Helper()
	now := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	o, _, err := domain.CreateOrder(uuid.Must(uuid.NewV7()), "t1", validOrder(), now)
	if err != nil {
		t.Fatal(err)
	}
	steps := map[domain.Status][]func() (domain.Event, error){
		domain.StatusPending:   nil,
		domain.StatusPaid:      {func() (domain.Event, error) { return o.Pay(now) }},
		domain.StatusShipped:   {func() (domain.Event, error) { return o.Pay(now) }, func() (domain.Event, error) { return o.Ship(now) }},
		domain.StatusCancelled: {func() (domain.Event, error) { return o.Cancel("changed my mind", now) }},
	}
	for _, step := range steps[status] {
		if _, err := step(); err != nil {
			t.Fatal(err)
		}
	}
	return o
}

func TestLifecycle(t *testing.T) {
	t.Parallel()
	later := time.Date(2026, 11, 22, 9, 30, 0, 0, time.UTC)
	type action struct {
		name string
		do   func(*domain.Order) (domain.Event, error)
	}
	pay := action{"pay", func(o *domain.Order) (domain.Event, error) { return o.Pay(later) }}
	ship := action{"ship", func(o *domain.Order) (domain.Event, error) { return o.Ship(later) }}
	cancel := action{"cancel", func(o *domain.Order) (domain.Event, error) { return o.Cancel("out of stock", later) }}

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
		event  string
	}{
		{domain.StatusPending, pay, changes, domain.StatusPaid, "order.paid"},
		{domain.StatusPending, ship, refused, domain.StatusPending, ""},
		{domain.StatusPending, cancel, changes, domain.StatusCancelled, "order.cancelled"},
		{domain.StatusPaid, pay, noop, domain.StatusPaid, ""},
		{domain.StatusPaid, ship, changes, domain.StatusShipped, "order.shipped"},
		{domain.StatusPaid, cancel, changes, domain.StatusCancelled, "order.cancelled"},
		{domain.StatusShipped, pay, noop, domain.StatusShipped, ""},
		{domain.StatusShipped, ship, noop, domain.StatusShipped, ""},
		{domain.StatusShipped, cancel, refused, domain.StatusShipped, ""},
		{domain.StatusCancelled, pay, refused, domain.StatusCancelled, ""},
		{domain.StatusCancelled, ship, refused, domain.StatusCancelled, ""},
		{domain.StatusCancelled, cancel, noop, domain.StatusCancelled, ""},
	}
	for _, tt := range tests {
		t.Run(string(tt.from)+"/"+tt.action.name, func(t *testing.T) {
			t.Parallel()
			o := orderIn(t, tt.from)
			before := o
			ev, err := tt.action.do(&o)
			switch tt.want {
			case changes:
				if err != nil || ev == nil || ev.EventType() != tt.event {
					t.Fatalf("got event %v, err %v; want %s", ev, err, tt.event)
				}
				if o.Version != before.Version+1 || !o.UpdatedAt.Equal(later) {
					t.Fatalf("version %d→%d, updated_at %v: want +1 and %v", before.Version, o.Version, o.UpdatedAt, later)
				}
			case noop:
				if err != nil || ev != nil || o.Version != before.Version {
					t.Fatalf("got event %v, err %v, version %d; want a no-op", ev, err, o.Version)
				}
			case refused:
				de, ok := err.(*domain.Error)
				if !ok || de.Kind != domain.KindConflict || de.State != string(tt.from) || !strings.Contains(de.Message, string(tt.from)) {
					t.Fatalf("err = %v; want a conflict naming %s", err, tt.from)
				}
				if ev != nil || o.Version != before.Version {
					t.Fatal("a refused step changed the order")
				}
			}
			if o.Status != tt.to {
				t.Fatalf("status %s, want %s", o.Status, tt.to)
			}
		})
	}
}

func TestCancelRefundsOnlyPaidOrders(t *testing.T) {
	t.Parallel()
	now := time.Now()
	for status, refund := range map[domain.Status]int64{domain.StatusPending: 0, domain.StatusPaid: 2500} {
		o := orderIn(t, status)
		ev, err := o.Cancel("fraud", now)
		if err != nil {
			t.Fatal(err)
		}
		c := ev.(domain.OrderCancelled)
		if c.Refunded != refund || c.From != status || c.Reason != "fraud" || c.Total != 2500 {
			t.Fatalf("cancel of a %s order: %+v", status, c)
		}
		if h := o.History(); h[len(h)-1].Status != domain.StatusCancelled || h[len(h)-1].Reason != "fraud" {
			t.Fatalf("history %+v", h)
		}
	}
	o := orderIn(t, domain.StatusPending)
	for _, reason := range []string{"", strings.Repeat("r", 501), "bad\x00reason"} {
		if _, err := o.Cancel(reason, now); domain.KindOf(err) != domain.KindInvalid {
			t.Fatalf("Cancel(%q) err = %v, want KindInvalid", reason, err)
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
