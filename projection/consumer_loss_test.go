package projection

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/acme/orders/internal/testenv"
	"github.com/acme/orders/stream"
)

// A runner whose consumer is deleted (by an operator, say) creates it again
// and applies what comes next. Before, its Consume stopped with "consumer
// deleted", nothing created the consumer again, and no event was applied
// until the projector restarted. The new consumer delivers the stream from
// its start again: the event applied before is a no-op, not applied twice.
func TestRunnerCreatesItsDeletedConsumerAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, Config{})
	f.run(t)
	first := createdEvent(t, uuid.Must(uuid.NewV7()))
	f.publish(t, first, first.ID.String())
	eventually(t, "the first event is applied", func() bool { return f.viewCount(t, first.AggregateID) == 1 })

	if err := f.js.DeleteConsumer(ctx, stream.Name, f.runner.Name()); err != nil {
		t.Fatal(err)
	}
	second := createdEvent(t, uuid.Must(uuid.NewV7()))
	f.publish(t, second, second.ID.String())
	testenv.Eventually(t, 20*time.Second, "the event published after the consumer was deleted is applied", func() bool {
		return f.viewCount(t, second.AggregateID) == 1
	})
	f.waitDelivered(t, 2)
	if st := f.runner.Stats(); st.Applied != 2 {
		t.Fatalf("stats %+v: want 2 events applied (the first one once, though delivered twice)", st)
	}
}

// A runner whose stream is deleted, and created again (by a relay, or by
// NATS restarted on an empty store and the relay), applies the events
// published on the new stream. Their sequences start again at 1: a late
// settlement of a message of the lost consumer must not settle the new
// consumer's message of the same sequence (stream.ErrConsumerLost).
func TestRunnerAppliesTheEventsOfAStreamDeletedAndCreatedAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, Config{})
	f.run(t)
	first := createdEvent(t, uuid.Must(uuid.NewV7()))
	f.publish(t, first, first.ID.String())
	eventually(t, "the first event is applied", func() bool { return f.viewCount(t, first.AggregateID) == 1 })

	if err := f.js.DeleteStream(ctx, stream.Name); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Ensure(ctx, f.js, stream.Settings{}); err != nil { // as the relay does
		t.Fatal(err)
	}
	var events []uuid.UUID
	for range 3 {
		e := createdEvent(t, uuid.Must(uuid.NewV7()))
		f.publish(t, e, e.ID.String())
		events = append(events, e.AggregateID)
	}
	testenv.Eventually(t, 20*time.Second, "the events published on the new stream are applied", func() bool {
		for _, id := range events {
			if f.viewCount(t, id) != 1 {
				return false
			}
		}
		return true
	})
	f.waitDelivered(t, 3)
}

// A projection whose consumer is missing is not reported as having nothing
// pending: Lag says the consumer is missing and counts the stream's events
// past the checkpoint (before, it reported zero lag, so `projector status`
// and projection_pending_events showed nothing pending while nothing was
// applied).
func TestLagOfAMissingConsumerCountsTheEventsPastTheCheckpoint(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, Config{CheckpointInterval: 20 * time.Millisecond})
	lag := func() Lag {
		t.Helper()
		l, err := f.runner.Lag(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	for range 2 {
		e := createdEvent(t, uuid.Must(uuid.NewV7()))
		f.publish(t, e, e.ID.String())
	}
	if l := lag(); !l.ConsumerMissing || l.Pending != 2 || l.OldestUnapplied <= 0 {
		t.Fatalf("lag before the projector ever ran = %+v; want the consumer missing, 2 pending and an oldest unapplied age", l)
	}

	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- f.runner.Run(runCtx) }()
	eventually(t, "both events are applied and checkpointed", func() bool { return lag().Checkpoint == 2 })
	if l := lag(); l.ConsumerMissing || l.Pending != 0 {
		t.Fatalf("lag of the running projector = %+v; want its consumer found and nothing pending", l)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	if err := f.js.DeleteConsumer(ctx, stream.Name, f.runner.Name()); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		e := createdEvent(t, uuid.Must(uuid.NewV7()))
		f.publish(t, e, e.ID.String())
	}
	if l := lag(); !l.ConsumerMissing || l.Pending != 3 || l.OldestUnapplied <= 0 || l.Checkpoint != 2 {
		t.Fatalf("lag after the consumer was deleted = %+v; want it missing, the 3 events past checkpoint 2 pending", l)
	}

	if err := f.js.DeleteStream(ctx, stream.Name); err != nil {
		t.Fatal(err)
	}
	if l := lag(); !l.ConsumerMissing || l.Pending != 0 {
		t.Fatalf("lag without a stream = %+v; want the consumer missing and nothing pending", l)
	}
	if _, err := stream.Ensure(ctx, f.js, stream.Settings{}); err != nil {
		t.Fatal(err)
	}
	e := createdEvent(t, uuid.Must(uuid.NewV7()))
	f.publish(t, e, e.ID.String())
	if l := lag(); !l.ConsumerMissing || l.Pending != 1 {
		t.Fatalf("lag on a stream created anew, behind the old checkpoint = %+v; want the consumer missing and its 1 event pending", l)
	}
}

// viewCount counts the order views of order id.
func (f fixture) viewCount(t *testing.T, id uuid.UUID) int {
	t.Helper()
	return f.count(t, `SELECT count(*) FROM order_views WHERE order_id = $1`, id)
}

// waitDelivered waits until the projection's consumer exists again, has
// delivered the stream's n messages, and has all of them acked.
func (f fixture) waitDelivered(t *testing.T, n uint64) {
	t.Helper()
	testenv.Eventually(t, 20*time.Second, "the consumer acked every message of the stream", func() bool {
		c, err := f.js.Consumer(context.Background(), stream.Name, f.runner.Name())
		if err != nil {
			return false
		}
		info := c.CachedInfo()
		return info.Delivered.Stream == n && info.AckFloor.Stream == n && info.NumPending == 0 && info.NumAckPending == 0
	})
}
