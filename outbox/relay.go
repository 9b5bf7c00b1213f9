// Package outbox relays committed events from the outbox table to JetStream.
//
// The relay claims the oldest unpublished rows with FOR UPDATE SKIP LOCKED,
// publishes them asynchronously with Nats-Msg-Id set to the event id, waits
// for every PubAck, and marks the acknowledged rows published, all in one
// transaction. A crash between publish and mark republishes on the next
// round: the stream's duplicate window drops the copy, and past the window the
// projectors' inbox does. Nothing committed is ever skipped: a row stays
// unpublished until JetStream has acknowledged it.
package outbox

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/acme/orders/postgres"
	"github.com/acme/orders/stream"
)

// Config tunes a Relay. Zero values take the defaults.
type Config struct {
	BatchSize    int           // rows per claim; default 500
	PollInterval time.Duration // fallback when no NOTIFY arrives; default 1s
	AckTimeout   time.Duration // wait for all PubAcks of a batch; default 10s
	// StreamReplicas is the stream's replication (3 on a cluster); default 1.
	StreamReplicas int
}

// Relay moves events from the outbox to the stream. Run it in one goroutine.
type Relay struct {
	db     *pgxpool.Pool
	js     jetstream.JetStream
	logger *slog.Logger
	cfg    Config
	wake   chan struct{}

	published  atomic.Int64
	duplicates atomic.Int64
}

// NewRelay returns a relay from db to the stream on js.
func NewRelay(db *pgxpool.Pool, js jetstream.JetStream, logger *slog.Logger, cfg Config) *Relay {
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = 500
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = time.Second
	}
	if cfg.AckTimeout <= 0 {
		cfg.AckTimeout = 10 * time.Second
	}
	return &Relay{db: db, js: js, logger: logger, cfg: cfg, wake: make(chan struct{}, 1)}
}

// Stats are the relay's counters since start.
type Stats struct {
	Published  int64 // rows marked published
	Duplicates int64 // PubAcks that reported a duplicate Nats-Msg-Id
}

// Stats returns the relay's counters.
func (r *Relay) Stats() Stats {
	return Stats{Published: r.published.Load(), Duplicates: r.duplicates.Load()}
}

// Run relays until ctx ends. It ensures the stream exists first (retrying
// while NATS is unreachable), wakes on NOTIFY outbox and polls as a fallback.
// Failures are logged and retried with a backoff; Run returns only when ctx
// ends.
func (r *Relay) Run(ctx context.Context) {
	for ctx.Err() == nil {
		if _, err := stream.Ensure(ctx, r.js, r.cfg.StreamReplicas); err != nil {
			r.logger.ErrorContext(ctx, "relay cannot ensure stream; retrying", "err", err)
			sleep(ctx, 2*time.Second)
			continue
		}
		break
	}
	go postgres.Listen(ctx, r.db, "outbox", r.logger, r.Wake)

	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		n, err := r.RelayBatch(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			r.logger.ErrorContext(ctx, "relay batch failed; retrying", "err", err, "backoff", backoff)
			sleep(ctx, backoff)
			backoff = min(2*backoff, 10*time.Second)
			continue
		case n == r.cfg.BatchSize:
			continue // more is waiting
		}
		backoff = 100 * time.Millisecond
		select {
		case <-ctx.Done():
		case <-r.wake:
		case <-time.After(r.cfg.PollInterval):
		}
	}
}

// Wake makes a waiting Run look at the outbox now. It never blocks.
func (r *Relay) Wake() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

const (
	outboxClaimSQL = `
SELECT id, event_type, payload
FROM outbox
WHERE published_at IS NULL
ORDER BY id
LIMIT $1
FOR UPDATE SKIP LOCKED`

	outboxMarkPublishedSQL = `UPDATE outbox SET published_at = now() WHERE id = ANY($1)`
)

type outboxRow struct {
	ID        uuid.UUID
	EventType string
	Payload   []byte
}

// RelayBatch publishes one batch of unpublished events, in id order, and
// marks published the longest prefix of it that JetStream acknowledged, so
// that a failure never lets a later event of an aggregate overtake an earlier
// one in the stream. It returns how many rows it claimed.
func (r *Relay) RelayBatch(ctx context.Context) (claimed int, err error) {
	var publishErr error
	err = postgres.InTx(ctx, r.db, func(tx pgx.Tx) error {
		rows, _ := tx.Query(ctx, outboxClaimSQL, r.cfg.BatchSize)
		events, err := pgx.CollectRows(rows, pgx.RowToStructByPos[outboxRow])
		if err != nil {
			return fmt.Errorf("claim outbox rows: %w", err)
		}
		claimed = len(events)
		if claimed == 0 {
			return nil
		}
		acked, duplicates, perr := r.publish(ctx, events)
		publishErr = perr
		if acked == 0 {
			return nil
		}
		ids := make([]uuid.UUID, acked)
		for i := range ids {
			ids[i] = events[i].ID
		}
		if _, err := tx.Exec(ctx, outboxMarkPublishedSQL, ids); err != nil {
			return fmt.Errorf("mark outbox rows published: %w", err)
		}
		r.published.Add(int64(acked))
		r.duplicates.Add(int64(duplicates))
		return nil
	})
	if err == nil && publishErr != nil {
		err = publishErr
	}
	return claimed, err
}

// publish sends events asynchronously and waits for their PubAcks. It returns
// the length of the acknowledged prefix and how many of those JetStream
// reported as duplicates, and the first error that cut the prefix short.
func (r *Relay) publish(ctx context.Context, events []outboxRow) (acked, duplicates int, err error) {
	futures := make([]jetstream.PubAckFuture, 0, len(events))
	var sendErr error
	for _, e := range events {
		msg := nats.NewMsg(stream.Subject(e.EventType))
		msg.Data = e.Payload
		f, err := r.js.PublishMsgAsync(msg, jetstream.WithMsgID(e.ID.String()))
		if err != nil {
			sendErr = fmt.Errorf("publish event %s: %w", e.ID, err)
			break // wait for what was sent; the rest goes next round
		}
		futures = append(futures, f)
	}
	timeout := time.NewTimer(r.cfg.AckTimeout)
	defer timeout.Stop()
	for i, f := range futures {
		select {
		case ack := <-f.Ok():
			if ack.Duplicate {
				duplicates++
			}
			acked++
		case err := <-f.Err():
			return acked, duplicates, fmt.Errorf("publish event %s: %w", events[i].ID, err)
		case <-timeout.C:
			return acked, duplicates, fmt.Errorf("no PubAck for event %s within %s", events[i].ID, r.cfg.AckTimeout)
		case <-ctx.Done():
			return acked, duplicates, ctx.Err()
		}
	}
	return acked, duplicates, sendErr
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
