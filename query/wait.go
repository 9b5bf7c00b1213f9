package query

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
)

// Changes tells waiting readers that a projection applied events of their
// order. The projector sends NOTIFY projection_applied, naming the orders,
// in every transaction that changed a read model; the api LISTENs
// (postgres.Listen) and calls Notify, which wakes only the readers of those
// orders. No polling, and no herd: a reader wakes only when its order moved.
type Changes struct {
	mu      sync.Mutex
	waiters map[uuid.UUID]*waiter
}

// waiter is the wake-up channel of one order's readers, and how many there are.
type waiter struct {
	ch      chan struct{}
	readers int
}

// NewChanges returns a Changes with no waiters.
func NewChanges() *Changes { return &Changes{waiters: map[uuid.UUID]*waiter{}} }

// Notify handles one payload: "projection:id,id,…" wakes the readers of
// those orders; anything else (such as "" after a reconnect) wakes every
// reader, since anything may have changed.
func (c *Changes) Notify(payload string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, list, ok := strings.Cut(payload, ":")
	if !ok {
		for id, w := range c.waiters {
			close(w.ch)
			delete(c.waiters, id)
		}
		return
	}
	for s := range strings.SplitSeq(list, ",") {
		id, err := uuid.Parse(s)
		if err != nil {
			continue
		}
		if w, ok := c.waiters[id]; ok {
			close(w.ch)
			delete(c.waiters, id)
		}
	}
}

// Changed returns a channel that is closed the next time order id is
// applied (or everything may have changed), and a release the reader calls
// when it stops waiting, so that no entry outlives its readers.
func (c *Changes) Changed(id uuid.UUID) (<-chan struct{}, func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	w, ok := c.waiters[id]
	if !ok {
		w = &waiter{ch: make(chan struct{})}
		c.waiters[id] = w
	}
	w.readers++
	return w.ch, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		w.readers--
		if w.readers == 0 && c.waiters[id] == w {
			delete(c.waiters, id)
		}
	}
}

// BehindError is returned when a read model did not reach the version a
// reader asked for within the time it was willing to wait.
type BehindError struct {
	Want, Have int64
}

func (e *BehindError) Error() string {
	return fmt.Sprintf("the read model is at version %d, not yet at %d", e.Have, e.Want)
}

// awaitVersion calls read until it reports a version of order id of at
// least min, or returns a *BehindError after wait. With min ≤ 0 it reads
// once. Each retry waits for a Notify naming the order, so an idle system,
// and other orders' traffic, cost it nothing.
func awaitVersion(ctx context.Context, changes *Changes, id uuid.UUID, min int64, wait time.Duration, read func() (int64, error)) error {
	if min <= 0 || changes == nil {
		_, err := read()
		return err
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		changed, release := changes.Changed(id) // before reading, so no Notify is missed
		have, err := read()
		if err != nil || have >= min {
			release()
			return err
		}
		select {
		case <-changed:
			release()
		case <-timer.C:
			release()
			return &BehindError{Want: min, Have: have}
		case <-ctx.Done():
			release()
			return ctx.Err()
		}
	}
}
