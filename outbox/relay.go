// Package outbox relays committed events from the outbox table to JetStream.
//
// The outbox is split into 16 partitions by aggregate. A relay owns the
// partitions whose advisory locks it holds on its own connection; any number
// of relays may run, and the partitions a relay gives up (it stops, crashes
// or loses its connection, which drops its locks) are taken over by the
// others within TakeoverInterval. Only the owner publishes a partition, in
// seq order, so an aggregate's events leave in version order.
//
// In one transaction on that connection the relay claims the oldest
// unpublished rows of its partitions, publishes them with Nats-Msg-Id set to
// the event id, waits for JetStream's acknowledgement, and marks the
// acknowledged rows published. A crash between publish and mark republishes
// on the next round: the stream's duplicate window drops the copy, and past
// the window the projectors' inbox does. A row stays unpublished until
// JetStream has acknowledged it.
//
// A batch goes out as one JetStream atomic batch when the stream allows it
// (nats-server 2.12 and later): all of it is stored or none, and the server
// syncs it to disk once, where a `sync_interval: always` server syncs each
// message published alone (several times the throughput; BENCHMARKS.md).
// JetStream refuses a whole atomic batch if one of its messages is a
// duplicate, as after a crash between publish and mark; the relay then
// publishes that batch message by message, asynchronously, and the
// duplicate window drops the copies one by one.
package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
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

// Partitions is how many partitions the outbox has (see migration 004).
const Partitions = 16

// advisoryClass is the first key of the relay's advisory locks
// (pg_try_advisory_lock(advisoryClass, partition)).
const advisoryClass = 0x0a7b0c5

// Config tunes a Relay. Zero values take the defaults.
type Config struct {
	BatchSize    int           // rows per claim; default 500
	PollInterval time.Duration // fallback when no NOTIFY arrives; default 1s
	AckTimeout   time.Duration // wait for all PubAcks of a batch; default 10s
	// MaxPartitions caps how many partitions this relay owns (to spread
	// them over several relays); default all.
	MaxPartitions int
	// TakeoverInterval is how often a relay tries to take partitions nobody
	// owns; default 5s.
	TakeoverInterval time.Duration
	// Retention keeps published rows (the event log that rebuilds read)
	// this long before they are pruned; 0 keeps them for good.
	Retention time.Duration
	// StreamReplicas is the stream's replication (3 on a cluster); default 1.
	StreamReplicas int
	// DuplicateWindow overrides the stream's duplicate window (tests).
	DuplicateWindow time.Duration
}

// Relay moves events from the outbox to the stream. Run it in one goroutine.
type Relay struct {
	db     *pgxpool.Pool
	js     jetstream.JetStream
	logger *slog.Logger
	cfg    Config
	wake   chan struct{}

	mu       sync.Mutex // guards conn and owned
	conn     *pgx.Conn  // holds the partition locks
	owned    []int16
	lastTake time.Time

	published, duplicates, pruned atomic.Int64
	atomicBatches, fallbacks      atomic.Int64
	ownedCount                    atomic.Int64
	atomicMode                    atomic.Int32 // atomicUnknown, atomicOn or atomicOff
	atomicChecked                 atomic.Int64 // when atomicMode was last learned (unix ns)
}

// Whether the stream takes atomic batches (atomicMode).
const (
	atomicUnknown int32 = iota
	atomicOn
	atomicOff
)

// maxAtomicBatch is nats-server's default cap on the messages of one atomic
// batch (jetstream max_batch_size); a larger claim goes out in several.
const maxAtomicBatch = 1000

// The JetStream error codes the relay acts on.
const (
	errCodeAtomicPublishDisabled   = 10174 // the stream does not allow atomic batches
	errCodeAtomicBatchHasDuplicate = 10201 // a republished event inside: expected after a crash
)

// atomicRecheck is how often a relay that found the stream without atomic
// batches asks again (a newer process may have allowed them since).
const atomicRecheck = time.Minute

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
	if cfg.MaxPartitions <= 0 || cfg.MaxPartitions > Partitions {
		cfg.MaxPartitions = Partitions
	}
	if cfg.TakeoverInterval <= 0 {
		cfg.TakeoverInterval = 5 * time.Second
	}
	return &Relay{db: db, js: js, logger: logger, cfg: cfg, wake: make(chan struct{}, 1)}
}

// Stats are the relay's counters since start.
type Stats struct {
	Published  int64 // rows marked published
	Duplicates int64 // PubAcks that reported a duplicate Nats-Msg-Id
	// AtomicBatches counts batches stored by JetStream as one atomic batch;
	// Fallbacks those it refused (a duplicate inside, most often) and the
	// relay then published message by message.
	AtomicBatches int64
	Fallbacks     int64
	Pruned        int64 // published rows deleted after the retention
	Partitions    int64 // partitions owned now
}

// Stats returns the relay's counters.
func (r *Relay) Stats() Stats {
	return Stats{
		Published: r.published.Load(), Duplicates: r.duplicates.Load(), Pruned: r.pruned.Load(), Partitions: r.ownedCount.Load(),
		AtomicBatches: r.atomicBatches.Load(), Fallbacks: r.fallbacks.Load(),
	}
}

// Run relays until ctx ends. It ensures the stream exists first (retrying
// while NATS is unreachable), wakes on NOTIFY outbox and polls as a fallback.
// Failures are logged and retried with a backoff; Run returns only when ctx
// ends, and then releases its partitions.
func (r *Relay) Run(ctx context.Context) {
	defer r.release()
	for ctx.Err() == nil {
		s, err := stream.Ensure(ctx, r.js, stream.Settings{Replicas: r.cfg.StreamReplicas, DuplicateWindow: r.cfg.DuplicateWindow})
		if err != nil {
			r.logger.ErrorContext(ctx, "relay cannot ensure stream; retrying", "err", err)
			sleep(ctx, 2*time.Second)
			continue
		}
		r.setAtomicMode(s.CachedInfo().Config.AllowAtomicPublish)
		break
	}
	go postgres.Listen(ctx, r.db, "outbox", r.logger, func(string) { r.Wake() })

	backoff := 100 * time.Millisecond
	lastPrune := time.Time{}
	for ctx.Err() == nil {
		if r.cfg.Retention > 0 && time.Since(lastPrune) > time.Minute {
			lastPrune = time.Now()
			if err := r.Prune(ctx); err != nil && ctx.Err() == nil {
				r.logger.WarnContext(ctx, "prune published outbox rows", "err", err)
			}
		}
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
	partitionsTakeSQL = `
SELECT p::smallint FROM generate_series(0, $1 - 1) AS p
WHERE NOT p = ANY($2::int[]) AND pg_try_advisory_lock($3, p)
LIMIT $4`

	outboxClaimSQL = `
SELECT id, event_type, payload
FROM outbox
WHERE published_at IS NULL AND partition = ANY($2)
ORDER BY seq
LIMIT $1
FOR UPDATE SKIP LOCKED`

	outboxMarkPublishedSQL = `UPDATE outbox SET published_at = now() WHERE id = ANY($1)`

	// leaseSettingsSQL sets up the relay's own connection (see lease).
	leaseSettingsSQL = `SET enable_bitmapscan = off; SET synchronous_commit = off`

	outboxPruneSQL = `
DELETE FROM outbox WHERE id IN (
    SELECT id FROM outbox
    WHERE published_at < now() - make_interval(secs => $1)
    ORDER BY published_at
    LIMIT 1000
    FOR UPDATE SKIP LOCKED)`

	outboxBacklogSQL = `
SELECT count(*), coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8
FROM outbox WHERE published_at IS NULL`
)

// lease returns the connection that holds this relay's partition locks and
// the partitions it owns, taking free partitions every TakeoverInterval.
func (r *Relay) lease(ctx context.Context) (*pgx.Conn, []int16, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.conn == nil || r.conn.IsClosed() {
		pc, err := r.db.Acquire(ctx)
		if err != nil {
			return nil, nil, err
		}
		conn := pc.Hijack()
		// The claim walks the unpublished rows' index in seq order. A
		// bitmap scan of it (the planner's choice while the outbox's
		// statistics are stale) visits every entry of a row marked since
		// the last vacuum, each time; a plain index scan marks those dead
		// once and skips them after, so the claim stays fast between
		// vacuums.
		//
		// Its commits do not wait for the WAL flush either: a mark that a
		// crash of PostgreSQL loses only leaves its rows unpublished, and
		// they are published again, which JetStream's duplicate window (or
		// past it, the projectors' inbox) absorbs. That takes one fsync out
		// of every relay round. The connection runs nothing but the relay's
		// statements.
		if _, err := conn.Exec(ctx, leaseSettingsSQL); err != nil {
			_ = conn.Close(ctx)
			return nil, nil, fmt.Errorf("set up the relay's connection: %w", err)
		}
		r.conn, r.owned, r.lastTake = conn, nil, time.Time{}
	}
	if len(r.owned) < r.cfg.MaxPartitions && time.Since(r.lastTake) >= r.cfg.TakeoverInterval {
		r.lastTake = time.Now()
		owned := make([]int32, len(r.owned))
		for i, p := range r.owned {
			owned[i] = int32(p)
		}
		rows, _ := r.conn.Query(ctx, partitionsTakeSQL, Partitions, owned, advisoryClass, r.cfg.MaxPartitions-len(r.owned))
		taken, err := pgx.CollectRows(rows, pgx.RowTo[int16])
		if err != nil {
			r.dropLocked()
			return nil, nil, fmt.Errorf("take outbox partitions: %w", err)
		}
		if len(taken) > 0 {
			r.owned = append(r.owned, taken...)
			r.logger.InfoContext(ctx, "relay took outbox partitions", "taken", taken, "owned", len(r.owned))
		}
		r.ownedCount.Store(int64(len(r.owned)))
	}
	return r.conn, r.owned, nil
}

// dropLocked closes the lease connection, which releases its partitions.
func (r *Relay) dropLocked() {
	if r.conn != nil {
		_ = r.conn.Close(context.Background())
	}
	r.conn, r.owned = nil, nil
	r.ownedCount.Store(0)
}

func (r *Relay) release() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.dropLocked()
}

type outboxRow struct {
	ID        uuid.UUID
	EventType string
	Payload   []byte
}

// RelayBatch publishes one batch of unpublished events of the partitions
// this relay owns, in seq order, and marks published the longest prefix of
// it that JetStream acknowledged. It returns how many rows it claimed. If
// the lease connection fails, the relay gives up its partitions (they are
// free for any relay to take) and takes them anew on the next call.
func (r *Relay) RelayBatch(ctx context.Context) (claimed int, err error) {
	conn, owned, err := r.lease(ctx)
	if err != nil {
		return 0, err
	}
	if len(owned) == 0 {
		return 0, nil // a standby: another relay owns every partition
	}
	var publishErr error
	err = postgres.InTx(ctx, conn, func(tx pgx.Tx) error {
		rows, _ := tx.Query(ctx, outboxClaimSQL, r.cfg.BatchSize, owned)
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
	if err != nil && conn.IsClosed() {
		r.release()
	}
	if err == nil && publishErr != nil {
		err = publishErr
	}
	return claimed, err
}

// publish publishes events, in order, and waits for JetStream to acknowledge
// them: as atomic batches when the stream takes them, else (or when
// JetStream refuses a batch) message by message. It returns the length of
// the acknowledged prefix, how many of those JetStream reported as
// duplicates, and the first error that cut the prefix short.
func (r *Relay) publish(ctx context.Context, events []outboxRow) (acked, duplicates int, err error) {
	if !r.atomicAllowed(ctx) {
		return r.publishEach(ctx, events)
	}
	for len(events) > 0 {
		n := min(len(events), maxAtomicBatch)
		if err := r.publishAtomic(ctx, events[:n]); err != nil {
			r.fallbacks.Add(1)
			var apiErr *jetstream.APIError
			isAPIErr := errors.As(err, &apiErr)
			if isAPIErr && apiErr.ErrorCode == errCodeAtomicPublishDisabled {
				r.setAtomicMode(false)
			}
			level := slog.LevelWarn // unexpected: every refused batch costs a second publish
			if isAPIErr && apiErr.ErrorCode == errCodeAtomicBatchHasDuplicate {
				level = slog.LevelDebug
			}
			r.logger.Log(ctx, level, "atomic batch refused; publishing its events one by one", "events", n, "err", err)
			more, dups, err := r.publishEach(ctx, events)
			return acked + more, dups, err
		}
		r.atomicBatches.Add(1)
		acked += n
		events = events[n:]
	}
	return acked, 0, nil
}

// atomicAllowed says whether the stream takes atomic batches, asking
// JetStream when it does not know (Run learns it when it ensures the
// stream), and again every atomicRecheck while they are off. Only a stream
// whose server reports the setting gets them: an older server would store
// the batch's messages one by one without acknowledging each.
func (r *Relay) atomicAllowed(ctx context.Context) bool {
	mode := r.atomicMode.Load()
	if mode == atomicUnknown || mode == atomicOff && time.Since(time.Unix(0, r.atomicChecked.Load())) > atomicRecheck {
		s, err := r.js.Stream(ctx, stream.Name)
		if err != nil {
			return false // ask again next batch
		}
		r.setAtomicMode(s.CachedInfo().Config.AllowAtomicPublish)
	}
	return r.atomicMode.Load() == atomicOn
}

func (r *Relay) setAtomicMode(on bool) {
	mode := atomicOff
	if on {
		mode = atomicOn
	}
	r.atomicChecked.Store(time.Now().UnixNano())
	if r.atomicMode.Swap(mode) != mode {
		r.logger.Info("relay publish mode", "atomic_batches", on)
	}
}

// publishAtomic publishes events as one JetStream atomic batch.
func (r *Relay) publishAtomic(ctx context.Context, events []outboxRow) error {
	msgs := make([]*nats.Msg, len(events))
	for i, e := range events {
		msgs[i] = nats.NewMsg(stream.Subject(e.EventType))
		msgs[i].Data = e.Payload
		msgs[i].Header.Set(jetstream.MsgIDHeader, e.ID.String())
	}
	ctx, cancel := context.WithTimeout(ctx, r.cfg.AckTimeout)
	defer cancel()
	return PublishAtomic(ctx, r.js.Conn(), msgs)
}

// PublishAtomic publishes msgs, in order, as one JetStream atomic batch
// (ADR-50): every message carries the batch id and its sequence in the
// batch, the last one commits it, and the reply to the commit acknowledges
// the whole batch once JetStream has stored it (synced to disk on a
// `sync_interval: always` server). The messages before the commit need no
// reply: if one of them is lost or refused, JetStream abandons the batch
// and the reply to the commit says so (a *jetstream.APIError). At most
// maxAtomicBatch messages.
func PublishAtomic(ctx context.Context, nc *nats.Conn, msgs []*nats.Msg) error {
	if len(msgs) == 0 {
		return nil
	}
	batchID := uuid.NewString()
	for i, msg := range msgs {
		msg.Header.Set(batchIDHeader, batchID)
		msg.Header.Set(batchSeqHeader, strconv.Itoa(i+1))
		if i < len(msgs)-1 {
			if err := nc.PublishMsg(msg); err != nil {
				return fmt.Errorf("publish message %d of an atomic batch: %w", i+1, err)
			}
		}
	}
	commit := msgs[len(msgs)-1]
	commit.Header.Set(batchCommitHeader, "1")
	reply, err := nc.RequestMsgWithContext(ctx, commit)
	if err != nil {
		return fmt.Errorf("commit atomic batch of %d messages: %w", len(msgs), err)
	}
	var ack batchAck
	if err := json.Unmarshal(reply.Data, &ack); err != nil {
		return fmt.Errorf("commit atomic batch: unreadable PubAck %q: %w", reply.Data, err)
	}
	if ack.Error != nil {
		return fmt.Errorf("commit atomic batch of %d messages: %w", len(msgs), ack.Error)
	}
	if ack.Batch != batchID || ack.Count != len(msgs) {
		return fmt.Errorf("atomic batch %s of %d messages acknowledged as batch %q of %d", batchID, len(msgs), ack.Batch, ack.Count)
	}
	return nil
}

// batchAck is JetStream's reply to the commit of an atomic batch.
type batchAck struct {
	Error *jetstream.APIError `json:"error"`
	Batch string              `json:"batch"`
	Count int                 `json:"count"`
}

// The headers of a JetStream atomic batch (ADR-50).
const (
	batchIDHeader     = "Nats-Batch-Id"
	batchSeqHeader    = "Nats-Batch-Sequence"
	batchCommitHeader = "Nats-Batch-Commit"
)

// publishEach sends events asynchronously, one message each, and waits for
// their PubAcks. (Events after a failed one may have been stored; they are
// sent again with it and then dropped as duplicates, so the stream may hold
// an aggregate's events out of order. The projectors' version gate puts
// them right.)
func (r *Relay) publishEach(ctx context.Context, events []outboxRow) (acked, duplicates int, err error) {
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

// Prune deletes published rows older than the retention, in batches of
// 1,000 (each its own statement, skipping rows another relay is deleting).
func (r *Relay) Prune(ctx context.Context) error {
	for {
		tag, err := r.db.Exec(ctx, outboxPruneSQL, r.cfg.Retention.Seconds())
		if err != nil {
			return err
		}
		r.pruned.Add(tag.RowsAffected())
		if tag.RowsAffected() < 1000 {
			return nil
		}
	}
}

// Backlog is what waits to be published: how many rows and how old the
// oldest is.
type Backlog struct {
	Rows      int64
	OldestAge time.Duration
}

// ReadBacklog reads the outbox's backlog (of every relay, not just this one).
func ReadBacklog(ctx context.Context, db postgres.DB) (Backlog, error) {
	var b Backlog
	var age float64
	if err := db.QueryRow(ctx, outboxBacklogSQL).Scan(&b.Rows, &age); err != nil {
		return Backlog{}, fmt.Errorf("read outbox backlog: %w", err)
	}
	b.OldestAge = time.Duration(age * float64(time.Second))
	return b, nil
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// PublishBenchScript renders, as a pgbench script, the database side of one
// relay batch of n rows, from the same SQL constants: the claim (its
// payloads read out) and the mark of exactly the claimed rows. Like the
// relay's workers, pgbench client k of `workers` claims only its own share
// of the partitions. `make bench` measures its TPS × n, at `workers`
// clients, as the database ceiling of the relay's drain rate.
func PublishBenchScript(n, workers int) string {
	share := (Partitions + workers - 1) / workers
	owned := fmt.Sprintf("ARRAY(SELECT generate_series(:client_id * %d, :client_id * %d + %d))::smallint[]", share, share, share-1)
	claim := strings.ReplaceAll(strings.ReplaceAll(outboxClaimSQL, "$1", fmt.Sprint(n)), "$2", owned)
	oneLine := func(s string) string { return strings.Join(strings.Fields(s), " ") }
	return leaseSettingsSQL + ";\n" + // as on the relay's connection
		"BEGIN;\n" +
		// The ids go to the mark through a pgbench variable.
		"WITH claimed AS (" + oneLine(claim) + ") SELECT coalesce(array_agg(id), '{}') AS ids, sum(length(payload::text)) AS bytes FROM claimed\n\\gset\n" +
		oneLine(strings.ReplaceAll(outboxMarkPublishedSQL, "$1", ":ids::uuid[]")) + ";\n" +
		"COMMIT;\n"
}
