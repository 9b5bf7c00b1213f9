package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/acme/orders/internal/mono"
	"github.com/acme/orders/stream"
)

// This file is the publish side of a relay batch: JetStream atomic batches
// (ADR-50) and the message-by-message fallback.

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

// publish publishes events, in order, and waits for JetStream to acknowledge
// them: as atomic batches when there are Config.MinAtomicBatch or more and
// the stream takes them, else (or when JetStream refuses a batch) message
// by message. It returns the length of the acknowledged prefix, how many of
// those JetStream reported as duplicates, and the first error that cut the
// prefix short.
func (r *Relay) publish(ctx context.Context, events []outboxRow) (acked, duplicates int, err error) {
	if end := tracePublish(ctx, events); end != nil {
		defer func() { end(acked, err) }()
	}
	// A small batch goes out message by message: an atomic batch would
	// cost nats-server a staging file store created, synced and deleted,
	// more than the few syncs it saves (BenchmarkPublishBatch; at 75 pays/s,
	// where most claims held one to four events, 77% of nats-server's CPU
	// was in the kernel: fsync, open, unlink).
	for len(events) > 0 {
		if len(events) < r.cfg.MinAtomicBatch || !r.atomicAllowed(ctx) {
			more, dups, err := r.publishEach(ctx, events)
			return acked + more, dups, err
		}
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
	if mode == atomicUnknown || mode == atomicOff && mono.Since(r.atomicChecked.Load()) > atomicRecheck {
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
	r.atomicChecked.Store(mono.Now())
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
		setTraceHeaders(msgs[i], e)
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
		setTraceHeaders(msg, e)
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
