package postgres

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultNotifyInterval is NotifierConfig.Interval by default: the shortest
// time between two notifications of one Notifier.
const DefaultNotifyInterval = 5 * time.Millisecond

// MaxNotifyPayload is the longest NOTIFY payload PostgreSQL accepts, in
// bytes, less one.
const MaxNotifyPayload = 7999

// NotifySQL sends one NOTIFY per payload, in one autocommit statement.
const NotifySQL = `SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p`

// NotifierConfig configures a Notifier.
type NotifierConfig struct {
	// Channel is the channel notified; required.
	Channel string
	// Interval is the shortest time between two sends: what is signalled
	// within it goes out in one statement; default DefaultNotifyInterval.
	Interval time.Duration
}

// Notifier wakes the listeners of a channel in other processes after
// commits, without a NOTIFY inside any write transaction (which would take
// PostgreSQL's cluster-wide notify lock through the commit's WAL flush and
// serialise every commit): a writer signals it after its commit (Notify,
// NotifyIDs), and Run sends what was signalled as one autocommit statement
// on a pooled connection, at most once per Interval. A signal after a quiet
// spell goes out at once. A notification that fails to go out is logged and
// dropped: the listeners poll as a fallback, so a lost wake-up costs them at
// most their poll interval. Notify and NotifyIDs never block and are safe
// for concurrent use.
type Notifier struct {
	db       DB
	logger   *slog.Logger
	channel  string
	interval time.Duration
	signal   chan struct{}

	mu      sync.Mutex
	bare    bool                           // an empty payload is due
	pending map[string]map[string]struct{} // prefix → ids due

	sends, payloads, failures atomic.Int64
}

// NewNotifier returns a Notifier sending through db, or an error naming the
// field of cfg that is invalid.
func NewNotifier(db DB, logger *slog.Logger, cfg NotifierConfig) (*Notifier, error) {
	if cfg.Interval == 0 {
		cfg.Interval = DefaultNotifyInterval
	}
	switch {
	case cfg.Channel == "":
		return nil, fmt.Errorf("notifier: Channel is required")
	case cfg.Interval < 0:
		return nil, fmt.Errorf("notifier: Interval must not be negative, got %s", cfg.Interval)
	}
	return &Notifier{db: db, logger: logger.With("channel", cfg.Channel), channel: cfg.Channel, interval: cfg.Interval,
		signal: make(chan struct{}, 1), pending: map[string]map[string]struct{}{}}, nil
}

// Notify asks for one notification with an empty payload ("look now").
func (n *Notifier) Notify() {
	n.mu.Lock()
	n.bare = true
	n.mu.Unlock()
	n.wake()
}

// NotifyIDs asks for notifications whose payloads are "prefix:id,id,…",
// naming ids (with those of other calls of the same prefix in the same
// interval, each once), split under PostgreSQL's payload limit.
func (n *Notifier) NotifyIDs(prefix string, ids []string) {
	if len(ids) == 0 {
		return
	}
	n.mu.Lock()
	set := n.pending[prefix]
	if set == nil {
		set = map[string]struct{}{}
		n.pending[prefix] = set
	}
	for _, id := range ids {
		set[id] = struct{}{}
	}
	n.mu.Unlock()
	n.wake()
}

func (n *Notifier) wake() {
	select {
	case n.signal <- struct{}{}:
	default:
	}
}

// NotifierStats counts what a Notifier sent since start.
type NotifierStats struct {
	Sends    int64 // statements sent
	Payloads int64 // notifications in them
	Failures int64 // statements that failed (their notifications dropped)
}

// Stats returns the counters.
func (n *Notifier) Stats() NotifierStats {
	return NotifierStats{Sends: n.sends.Load(), Payloads: n.payloads.Load(), Failures: n.failures.Load()}
}

// Run sends the signalled notifications until ctx ends, then sends what is
// still due (bounded by a second) and returns.
func (n *Notifier) Run(ctx context.Context) {
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			n.send(fctx)
			cancel()
			return
		case <-n.signal:
		}
		if wait := n.interval - time.Since(last); wait > 0 {
			t := time.NewTimer(wait) // coalesce what commits meanwhile
			select {
			case <-ctx.Done():
			case <-t.C:
			}
			t.Stop()
		}
		last = time.Now()
		n.send(ctx)
	}
}

// send sends every due notification in one statement.
func (n *Notifier) send(ctx context.Context) {
	payloads := n.take()
	if len(payloads) == 0 {
		return
	}
	n.sends.Add(1)
	if _, err := n.db.Exec(ctx, NotifySQL, n.channel, payloads); err != nil {
		n.failures.Add(1)
		n.logger.WarnContext(ctx, "notify failed; the listeners' poll fallback covers it", "payloads", len(payloads), "err", err)
		return
	}
	n.payloads.Add(int64(len(payloads)))
}

// take empties the due notifications into payloads.
func (n *Notifier) take() []string {
	n.mu.Lock()
	bare, pending := n.bare, n.pending
	n.bare, n.pending = false, map[string]map[string]struct{}{}
	n.mu.Unlock()
	var out []string
	if bare {
		out = append(out, "")
	}
	for prefix, set := range pending {
		ids := make([]string, 0, len(set))
		for id := range set {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		out = append(out, Payloads(prefix, ids)...)
	}
	return out
}

// Payloads renders "prefix:id,id,…" payloads naming every id once, each at
// most MaxNotifyPayload bytes (an id longer than that alone is dropped).
func Payloads(prefix string, ids []string) []string {
	var out []string
	var b strings.Builder
	for _, id := range ids {
		if len(prefix)+1+len(id) > MaxNotifyPayload {
			continue
		}
		if b.Len() > 0 && b.Len()+1+len(id) > MaxNotifyPayload {
			out = append(out, b.String())
			b.Reset()
		}
		if b.Len() == 0 {
			b.WriteString(prefix)
			b.WriteByte(':')
		} else {
			b.WriteByte(',')
		}
		b.WriteString(id)
	}
	if b.Len() > 0 {
		out = append(out, b.String())
	}
	return out
}
