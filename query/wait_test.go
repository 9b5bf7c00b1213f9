package query

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
)

func TestChangesWakesOnlyTheNamedOrders(t *testing.T) {
	t.Parallel()
	c := NewChanges()
	a, b := uuid.New(), uuid.New()
	chA, releaseA := c.Changed("order_views", "t1", a, 1)
	chB, releaseB := c.Changed("order_views", "t1", b, 1)
	c.Notify("order_views:" + a.String() + "@1")
	woken(t, chA, "the reader of a")
	notWoken(t, chB, "the reader of b, by a's change")
	releaseA()
	c.Notify("") // after a reconnect: everyone
	woken(t, chB, "every reader, after a reconnect")
	releaseB()
	_, release := c.Changed("order_views", "t1", a, 1)
	release()
	if len(c.waiters) != 0 {
		t.Fatalf("%d waiter entries outlive their readers", len(c.waiters))
	}
}

// A reader wakes only when its projection reached the version it waits
// for: not for another projection's row of its order, nor for an earlier
// version (a pay's payment.requested while it waits for paid). A payload
// without versions (an older projector's) or without a projection (a
// rebuild's swap) still wakes it.
func TestChangesWakesOnlyAtTheVersionOfTheProjection(t *testing.T) {
	t.Parallel()
	c := NewChanges()
	id := uuid.New()
	views, releaseViews := c.Changed("order_views", "t1", id, 3)
	defer releaseViews()
	summaries, releaseSummaries := c.Changed("customer_summaries", "t1", id, 3)
	defer releaseSummaries()

	c.Notify("customer_summaries:" + id.String() + "@2")
	c.Notify("order_views:" + id.String() + "@2,not-an-id@3," + id.String() + "@x")
	notWoken(t, views, "order_views' reader, by version 2 or by customer_summaries")
	notWoken(t, summaries, "customer_summaries' reader, by version 2")
	c.Notify("customer_summaries:" + id.String() + "@3")
	woken(t, summaries, "customer_summaries' reader, at version 3")
	notWoken(t, views, "order_views' reader, by customer_summaries at version 3")
	c.Notify("order_views:" + id.String() + "@4")
	woken(t, views, "order_views' reader, past its version")

	old, releaseOld := c.Changed("order_views", "t1", id, 9)
	defer releaseOld()
	c.Notify("order_views:" + id.String())
	woken(t, old, "a reader, by a payload without versions")
	swap, releaseSwap := c.Changed("daily_sales", "t1", id, 9)
	defer releaseSwap()
	c.Notify("daily_sales")
	woken(t, swap, "a reader, by a payload without a projection")
}

// Readers of one order waiting for different versions share a wake-up:
// the lowest version they wait for wakes them all (the others read and
// wait again), even after the reader of that version left.
func TestChangesSharedWakeUpIsAtTheLowestVersion(t *testing.T) {
	t.Parallel()
	c := NewChanges()
	id := uuid.New()
	high, releaseHigh := c.Changed("order_views", "t1", id, 5)
	defer releaseHigh()
	low, releaseLow := c.Changed("order_views", "t1", id, 2)
	c.Notify("order_views:" + id.String() + "@1")
	notWoken(t, low, "the reader of version 2, by version 1")
	releaseLow()
	c.Notify("order_views:" + id.String() + "@2")
	woken(t, high, "the readers sharing the wake-up, at the lowest version one waited for")
}

// A reader of another tenant that waits on the same order id (it cannot
// see the order, but may ask for it) keeps its own wake-up: its lower
// version wakes only itself, not the tenant whose order it is, and each
// entry is gone once its readers are.
func TestChangesKeepTenantsWakeUpsApart(t *testing.T) {
	t.Parallel()
	c := NewChanges()
	id := uuid.New()
	owner, releaseOwner := c.Changed("order_views", "owner", id, 5)
	other, releaseOther := c.Changed("order_views", "other", id, 1)
	c.Notify("order_views:" + id.String() + "@2")
	woken(t, other, "the other tenant's reader, at its version")
	notWoken(t, owner, "the owner's reader, by the version the other tenant waits for")
	releaseOther()
	c.Notify("order_views:" + id.String() + "@5")
	woken(t, owner, "the owner's reader, at its version")
	releaseOwner()
	if len(c.waiters) != 0 {
		t.Fatalf("%d waiter entries outlive their readers", len(c.waiters))
	}
	_, release := c.Changed("order_views", "owner", id, 1)
	_, releaseToo := c.Changed("order_views", "other", id, 1)
	release()
	if n := len(c.waiters[waitKey{"order_views", id}]); n != 1 {
		t.Fatalf("%d tenants wait after one left, want 1", n)
	}
	releaseToo()
	if len(c.waiters) != 0 {
		t.Fatalf("%d waiter entries outlive their readers", len(c.waiters))
	}
}

func woken(t *testing.T, ch <-chan struct{}, who string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(time.Second):
		t.Fatalf("%s was not woken", who)
	}
}

func notWoken(t *testing.T, ch <-chan struct{}, who string) {
	t.Helper()
	select {
	case <-ch:
		t.Fatalf("%s was woken", who)
	default:
	}
}

// A reader whose notification is lost still answers once the row is there:
// it reads again every PollInterval.
func TestAwaitVersionWithoutNotificationPolls(t *testing.T) {
	t.Parallel()
	c, err := NewChangesConfig(ChangesConfig{PollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	reads := 0
	err = awaitVersion(context.Background(), c, "order_views", "t1", uuid.New(), 2, 10*time.Second, func() (int64, error) {
		reads++
		if reads < 3 {
			return 1, nil
		}
		return 2, nil // the projector applied it; its NOTIFY was lost
	})
	if err != nil || reads != 3 {
		t.Fatalf("awaitVersion = %v after %d reads; want nil after 3", err, reads)
	}
}
