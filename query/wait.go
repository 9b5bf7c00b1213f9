package query

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
)

// DefaultWaitPollInterval is ChangesConfig.PollInterval by default.
const DefaultWaitPollInterval = time.Second

// ChangesConfig configures a Changes.
type ChangesConfig struct {
	// PollInterval is how often a waiting reader reads again without a
	// wake-up: a lost notification delays it by at most this much; default
	// DefaultWaitPollInterval.
	PollInterval time.Duration
}

// Changes tells waiting readers that a projection applied events of their
// order. After each batch commits, the projector sends a coalesced NOTIFY
// projection_applied naming the orders (postgres.Notifier, outside the
// transaction); the api LISTENs (postgres.Listen) and calls Notify, which
// wakes only the readers of those orders. No herd: a reader wakes when its
// order moved, or, as a fallback for a lost notification, every
// PollInterval.
type Changes struct {
	poll    time.Duration
	mu      sync.Mutex
	waiters map[uuid.UUID]*waiter
}

// waiter is the wake-up channel of one order's readers, and how many there are.
type waiter struct {
	ch      chan struct{}
	readers int
}

// NewChanges returns a Changes with no waiters and the default
// configuration.
func NewChanges() *Changes {
	return &Changes{poll: DefaultWaitPollInterval, waiters: map[uuid.UUID]*waiter{}}
}

// NewChangesConfig returns a Changes configured by cfg, or an error naming
// the field that is invalid.
func NewChangesConfig(cfg ChangesConfig) (*Changes, error) {
	if cfg.PollInterval == 0 {
		cfg.PollInterval = DefaultWaitPollInterval
	}
	if cfg.PollInterval < 0 {
		return nil, fmt.Errorf("changes config: PollInterval must not be negative, got %s", cfg.PollInterval)
	}
	return &Changes{poll: cfg.PollInterval, waiters: map[uuid.UUID]*waiter{}}, nil
}

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
// once. Each retry waits for a Notify naming the order, so other orders'
// traffic costs it nothing; or for the poll interval, so a lost
// notification delays it by at most that.
func awaitVersion(ctx context.Context, changes *Changes, id uuid.UUID, min int64, wait time.Duration, read func() (int64, error)) error {
	if min <= 0 || changes == nil {
		_, err := read()
		return err
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	poll := time.NewTicker(changes.poll)
	defer poll.Stop()
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
		case <-poll.C:
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
