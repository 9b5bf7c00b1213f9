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

// A reader whose notification is lost still answers once the row is there:
// it reads again every PollInterval.
func TestAwaitVersionWithoutNotificationPolls(t *testing.T) {
	t.Parallel()
	c, err := NewChangesConfig(ChangesConfig{PollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	reads := 0
	err = awaitVersion(context.Background(), c, uuid.New(), 2, 10*time.Second, func() (int64, error) {
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
