package query

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Changes tells waiting readers that a projection applied something. The
// projector sends NOTIFY projection_applied in every transaction that
// changed a read model; the api LISTENs (postgres.Listen) and calls Notify,
// which wakes every waiter to look again. No polling.
type Changes struct {
	mu sync.Mutex
	ch chan struct{}
}

// NewChanges returns a Changes with no waiters.
func NewChanges() *Changes { return &Changes{ch: make(chan struct{})} }

// Notify wakes everyone waiting on the channel Changed returned before.
func (c *Changes) Notify() {
	c.mu.Lock()
	defer c.mu.Unlock()
	close(c.ch)
	c.ch = make(chan struct{})
}

// Changed returns a channel that is closed at the next Notify.
func (c *Changes) Changed() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ch
}

// BehindError is returned when a read model did not reach the version a
// reader asked for within the time it was willing to wait.
type BehindError struct {
	Want, Have int64
}

func (e *BehindError) Error() string {
	return fmt.Sprintf("the read model is at version %d, not yet at %d", e.Have, e.Want)
}

// awaitVersion calls read until it reports a version of at least min, or
// returns a *BehindError after wait. With min ≤ 0 it reads once. Each retry
// waits for a Notify, so an idle system costs nothing.
func awaitVersion(ctx context.Context, changes *Changes, min int64, wait time.Duration, read func() (int64, error)) error {
	if min <= 0 || changes == nil {
		_, err := read()
		return err
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		changed := changes.Changed() // before reading, so no Notify is missed
		have, err := read()
		if err != nil || have >= min {
			return err
		}
		select {
		case <-changed:
		case <-timer.C:
			return &BehindError{Want: min, Have: have}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
