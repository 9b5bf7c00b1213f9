package query

import (
	"testing"
	"time"

	"github.com/google/uuid"
)

func TestChangesWakesOnlyTheNamedOrders(t *testing.T) {
	t.Parallel()
	c := NewChanges()
	a, b := uuid.New(), uuid.New()
	chA, releaseA := c.Changed(a)
	chB, releaseB := c.Changed(b)
	c.Notify("order_views:" + a.String())
	select {
	case <-chA:
	case <-time.After(time.Second):
		t.Fatal("the reader of a was not woken")
	}
	select {
	case <-chB:
		t.Fatal("the reader of b was woken by a's change")
	default:
	}
	releaseA()
	c.Notify("") // after a reconnect: everyone
	select {
	case <-chB:
	case <-time.After(time.Second):
		t.Fatal("a reconnect did not wake every reader")
	}
	releaseB()
	_, release := c.Changed(a)
	release()
	if len(c.waiters) != 0 {
		t.Fatalf("%d waiter entries outlive their readers", len(c.waiters))
	}
}
