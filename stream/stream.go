// Package stream defines the JetStream stream that carries the service's
// events from the outbox relay to the projectors, so that both sides agree on
// its name, subjects and settings.
package stream

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Name of the stream.
const Name = "ORDERS"

// subjectPrefix starts every event subject; the event type completes it, e.g.
// "orders.events.order.created".
const subjectPrefix = "orders.events."

// Subjects is the stream's subject filter: every event.
const Subjects = subjectPrefix + ">"

// DuplicateWindow is how long JetStream remembers a Nats-Msg-Id to drop a
// republished event. A republish after it is absorbed by the projectors' inbox.
const DuplicateWindow = 5 * time.Minute

// DefaultReplicas is the stream's replication on a single node; a cluster
// runs MaxReplicas at most (3, R3, is usual).
const (
	DefaultReplicas = 1
	MaxReplicas     = 5
)

// Subject returns the subject an event of eventType is published on.
func Subject(eventType string) string { return subjectPrefix + eventType }

// Settings are what a deployment chooses about the stream.
type Settings struct {
	// Replicas: 1 on a single node, 3 on a cluster (R3).
	Replicas int
	// DuplicateWindow overrides the default window (tests).
	DuplicateWindow time.Duration
}

// Ensure creates the stream, or updates it to the settings here. It is safe
// to call from every process at start-up, all at once. A stream that already
// has these settings is left alone (see apply).
func Ensure(ctx context.Context, js jetstream.JetStream, set Settings) (jetstream.Stream, error) {
	return ensure(ctx, js, set, true)
}

// Open returns the stream as it is, whatever its settings, or creates it
// with set if there is none yet. Consumers (the projectors) call Open: the
// relay, which writes to the stream, owns its settings through Ensure, and a
// projector started with other flags must not change them, not even when
// another process creates the stream at the same moment with other settings.
func Open(ctx context.Context, js jetstream.JetStream, set Settings) (jetstream.Stream, error) {
	s, err := js.Stream(ctx, Name)
	if err == nil {
		return s, nil
	}
	if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("look up stream %s: %w", Name, err)
	}
	return ensure(ctx, js, set, false)
}

func ensure(ctx context.Context, js jetstream.JetStream, set Settings, update bool) (jetstream.Stream, error) {
	window := DuplicateWindow
	if set.DuplicateWindow > 0 {
		window = set.DuplicateWindow
	}
	version := js.Conn().ConnectedServerVersion()
	cfg := jetstream.StreamConfig{
		Name:        Name,
		Description: "Order events from the outbox, in per-aggregate order",
		Subjects:    []string{Subjects},
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.LimitsPolicy,
		Duplicates:  window,
		Replicas:    max(set.Replicas, DefaultReplicas),
		// The relay publishes a large claim as one atomic batch: stored
		// all or not at all, and synced to disk once (see package outbox).
		// A server older than 2.12 does not know them: one that ignores
		// unknown fields would report the setting off after every update
		// (and the stream never up to date), one that refuses them would
		// refuse the whole request. The relay then publishes message by
		// message. (Not connected at this moment, the version is unknown:
		// ask for them; the caller retries what fails.)
		AllowAtomicPublish: version == "" || !olderThanAtomic(version),
	}
	s, err := apply(ctx, js, cfg, update)
	if err != nil {
		return nil, fmt.Errorf("create or update stream %s: %w", Name, err)
	}
	return s, nil
}

// apply makes the stream have cfg, or, without update, only creates it if
// it is missing. It creates a missing stream rather than asking for an
// update first: processes (and a projector's runners) that start together
// all find no stream, and an update that one of them sent after another had
// created it would change the stream while the first one's consumers are
// being created, which nats-server does not guard (a data race between
// fileStore.UpdateConfig and ConsumerStore). A create of an identical
// stream is a no-op on the server; only a stream that really has other
// settings is updated.
func apply(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig, update bool) (jetstream.Stream, error) {
	s, err := js.Stream(ctx, cfg.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		s, err = js.CreateStream(ctx, cfg)
		if !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return s, err
		}
		// Created at this moment by another process, with other
		// settings: look at it (and update it below, if we may).
		s, err = js.Stream(ctx, cfg.Name)
	}
	if err != nil {
		return nil, err
	}
	have := s.CachedInfo().Config
	if !update || upToDate(have, cfg) {
		return s, nil
	}
	return js.UpdateStream(ctx, withOurs(have, cfg))
}

// withOurs is the stream's config have with the settings this package owns
// taken from want (those upToDate compares), and every other one kept: the
// limits an operator set on the stream (MaxAge, MaxBytes, MaxMsgs, ...)
// survive a relay's start with other settings. An update sends a whole
// config, and a field left zero in it is reset to its default.
func withOurs(have, want jetstream.StreamConfig) jetstream.StreamConfig {
	have.Description = want.Description
	have.Subjects = want.Subjects
	have.Storage = want.Storage
	have.Retention = want.Retention
	have.Duplicates = want.Duplicates
	have.Replicas = want.Replicas
	have.AllowAtomicPublish = want.AllowAtomicPublish
	return have
}

// upToDate reports whether the stream's config has every setting of want.
func upToDate(have, want jetstream.StreamConfig) bool {
	return have.Description == want.Description &&
		slices.Equal(have.Subjects, want.Subjects) &&
		have.Storage == want.Storage &&
		have.Retention == want.Retention &&
		have.Duplicates == want.Duplicates &&
		have.Replicas == want.Replicas &&
		have.AllowAtomicPublish == want.AllowAtomicPublish
}

// olderThanAtomic reports whether a nats-server of version (such as
// "2.10.22") predates atomic batches (2.12). An unknown version is taken as
// older, as before the check existed.
func olderThanAtomic(version string) bool {
	var major, minor int
	if _, err := fmt.Sscanf(version, "%d.%d", &major, &minor); err != nil {
		return true
	}
	return major < 2 || major == 2 && minor < 12
}

// A pull request lives PullExpiry, and the server sends an idle heartbeat
// on it every PullHeartbeat. The client's Consume notices a pull request
// the server no longer serves after two missed heartbeats and sends a new
// one. With nats.go's defaults (30 s and 15 s) a pull the server lost
// stalled a consumer with a backlog for 30 s: once in five drains of
// `go run ./cmd/bench -only drain`, "nats: no heartbeat received" in the
// projector's log. A heartbeat a second bounds that stall at two seconds,
// for one small message a second per idle consumer.
const (
	PullExpiry    = 10 * time.Second
	PullHeartbeat = time.Second
)

// ConsumeOptions are the pull options every consumer of the stream runs
// with (the projectors' and the payment workers'): opts, then the expiry
// and heartbeat above, which override any of opts. A process that stalls
// for two heartbeats (a long GC or CPU starvation) also makes Consume pull
// again and log "no heartbeat received"; the extra pull is harmless, bounded
// by the consumer's MaxAckPending.
func ConsumeOptions(opts ...jetstream.PullConsumeOpt) []jetstream.PullConsumeOpt {
	return append(slices.Clip(opts), jetstream.PullExpiry(PullExpiry), jetstream.PullHeartbeat(PullHeartbeat))
}
