package query

import (
	"context"
	"fmt"
	"math"
	"strconv"
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
// projection_applied naming the projection and, for each order, the version
// it reached (postgres.Notifier, outside the transaction); the api LISTENs
// (postgres.Listen) and calls Notify, which wakes only the readers waiting
// for that projection of those orders, and only once the version they wait
// for is there. No herd, and no read in vain: a reader of order_views is not
// woken by customer_summaries applying its order, nor by an event short of
// its version (a pay's payment.requested while it waits for paid). As a
// fallback for a lost notification, a reader reads again every
// PollInterval.
//
// Readers are kept apart by tenant: the notification names no tenant (order
// ids are the server's UUIDv7s, unique across tenants), so it wakes every
// tenant's readers of that order id, but a reader of another tenant that
// asks for the same id (it learns nothing: its read finds no order) never
// joins the victim's wake-up and so cannot lower the version it wakes at.
type Changes struct {
	poll    time.Duration
	mu      sync.Mutex
	waiters map[waitKey]map[string]*waiter // by tenant
}

// waitKey is what readers wait for: a projection's row of one order.
type waitKey struct {
	projection string
	id         uuid.UUID
}

// waiter is the wake-up channel of one order's readers of one projection,
// how many there are, and the lowest version any of them waits for (it
// never rises while they share the channel, so a wake-up at or past it
// wakes every reader that could be satisfied; the others read and wait
// again).
type waiter struct {
	ch      chan struct{}
	readers int
	min     int64
}

// NewChanges returns a Changes with no waiters and the default
// configuration.
func NewChanges() *Changes {
	return &Changes{poll: DefaultWaitPollInterval, waiters: map[waitKey]map[string]*waiter{}}
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
	return &Changes{poll: cfg.PollInterval, waiters: map[waitKey]map[string]*waiter{}}, nil
}

// Notify handles one payload. "projection:id@version,…" wakes the readers
// of that projection's rows of those orders that wait for at most that
// version; an entry without a version ("id", as a projector before versions
// sends) wakes them whatever they wait for. Anything without a projection
// (such as "" after a reconnect, or a rebuild's swap) wakes every reader,
// since anything may have changed. Entries it cannot read are skipped.
func (c *Changes) Notify(payload string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	projection, list, ok := strings.Cut(payload, ":")
	if !ok {
		for k, byTenant := range c.waiters {
			for _, w := range byTenant {
				close(w.ch)
			}
			delete(c.waiters, k)
		}
		return
	}
	for s := range strings.SplitSeq(list, ",") {
		idText, versionText, hasVersion := strings.Cut(s, "@")
		id, err := uuid.Parse(idText)
		if err != nil {
			continue
		}
		version := int64(math.MaxInt64)
		if hasVersion {
			if version, err = strconv.ParseInt(versionText, 10, 64); err != nil {
				continue
			}
		}
		k := waitKey{projection, id}
		byTenant := c.waiters[k]
		for tenant, w := range byTenant {
			if version >= w.min {
				close(w.ch)
				delete(byTenant, tenant)
			}
		}
		if byTenant != nil && len(byTenant) == 0 {
			delete(c.waiters, k)
		}
	}
}

// Changed returns a channel that is closed once projection applied order
// id up to at least version m (or everything may have changed), for a
// reader of tenant, and a release the reader calls when it stops waiting,
// so that no entry outlives its readers.
func (c *Changes) Changed(projection, tenant string, id uuid.UUID, m int64) (<-chan struct{}, func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := waitKey{projection, id}
	byTenant := c.waiters[k]
	if byTenant == nil {
		byTenant = map[string]*waiter{}
		c.waiters[k] = byTenant
	}
	w, ok := byTenant[tenant]
	if !ok {
		w = &waiter{ch: make(chan struct{}), min: m}
		byTenant[tenant] = w
	}
	w.readers++
	w.min = min(w.min, m)
	return w.ch, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		w.readers--
		if byTenant := c.waiters[k]; w.readers == 0 && byTenant[tenant] == w {
			delete(byTenant, tenant)
			if len(byTenant) == 0 {
				delete(c.waiters, k)
			}
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

// NotWrittenError is returned when a reader waited for a version of an
// order that the write model was more than one version short of when the
// wait ended: only commands not yet sent could write it, so waiting
// longer does not help.
type NotWrittenError struct {
	Want, Written int64
}

func (e *NotWrittenError) Error() string {
	return fmt.Sprintf("version %d of the order was not written: the order is at version %d", e.Want, e.Written)
}

// awaitVersion calls read until it reports a version of projection's row
// of tenant's order id of at least min, or returns a *BehindError after wait. With min ≤ 0 it reads
// once. Each retry waits for a Notify naming the projection and the order
// at min or later, so other orders' traffic (and other projections', and
// earlier versions') costs it nothing; or for the poll interval, so a lost
// notification delays it by at most that.
func awaitVersion(ctx context.Context, changes *Changes, projection, tenant string, id uuid.UUID, min int64, wait time.Duration, read func() (int64, error)) error {
	if min <= 0 || changes == nil {
		_, err := read()
		return err
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	poll := time.NewTicker(changes.poll)
	defer poll.Stop()
	for {
		changed, release := changes.Changed(projection, tenant, id, min) // before reading, so no Notify is missed
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
