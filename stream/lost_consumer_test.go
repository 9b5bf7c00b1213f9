package stream_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/acme/orders/internal/harness"
	"github.com/acme/orders/internal/testenv"
	"github.com/acme/orders/stream"
)

// NATS restarted on an empty store has neither the stream nor the
// consumer: the pulls of nats.go's Consume get "no responders" for good.
// Consume sees that the consumer is gone, creates it (and the stream)
// again, and delivers what is published afterwards.
func TestConsumeCreatesItsConsumerAgainWhenNATSRestartsOnAnEmptyStore(t *testing.T) {
	t.Parallel()
	port, err := harness.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	ns := natsOn(t, port)
	nc, err := nats.Connect(ns.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan jetstream.Msg, 16)
	consume(t, js, got)
	publish(t, js, "before")
	if m := receive(t, got); string(m.Data()) != "before" {
		t.Fatalf("got %q, want before", m.Data())
	}

	ns.Shutdown()
	ns.WaitForShutdown()
	natsOn(t, port) // the same address, an empty store
	publish(t, js, "after")
	for {
		m := receive(t, got)
		if string(m.Data()) == "after" {
			break
		}
	}
}

// JetStream settles a message by its stream sequence alone. A stream
// created anew numbers its messages from 1 again, so the ack of a message
// delivered before the loss, sent late, would ack the new consumer's
// message of the same sequence: a nak of that one would then be ignored
// and the event never delivered again. The late ack is not sent.
func TestALateSettlementOfALostConsumersMessageIsNotSent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	js := testenv.JetStream(t)
	got := make(chan jetstream.Msg, 16)
	consume(t, js, got)
	publish(t, js, "old")
	old := receive(t, got) // in hand, not acked yet, when the stream is lost

	if err := js.DeleteStream(ctx, stream.Name); err != nil {
		t.Fatal(err)
	}
	publish(t, js, "new") // on the stream created again
	fresh := receive(t, got)
	if string(fresh.Data()) != "new" || seq(t, fresh) != seq(t, old) {
		t.Fatalf("got %q at sequence %d after the old message at %d; want the new one at the same sequence", fresh.Data(), seq(t, fresh), seq(t, old))
	}
	if err := old.Ack(); !errors.Is(err, stream.ErrConsumerLost) {
		t.Fatalf("ack of the lost consumer's message: %v; want ErrConsumerLost", err)
	}
	if err := fresh.Nak(); err != nil {
		t.Fatal(err)
	}
	if again := receive(t, got); string(again.Data()) != "new" {
		t.Fatalf("got %q, want the nak'ed new message again", again.Data())
	}
}

// consume runs stream.Consume on a durable consumer "c" of the stream, as
// the projector and the payment worker do, until the test ends; got receives
// each message unsettled.
func consume(t *testing.T, js jetstream.JetStream, got chan<- jetstream.Msg) {
	t.Helper()
	open := func(ctx context.Context) (jetstream.Consumer, error) {
		if _, err := stream.Open(ctx, js, stream.Settings{}); err != nil {
			return nil, err
		}
		return js.CreateOrUpdateConsumer(ctx, stream.Name, jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy})
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- stream.Consume(ctx, open, func(m jetstream.Msg) { got <- m }, slog.New(slog.DiscardHandler))
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Consume: %v", err)
		}
	})
}

// publish publishes data once the stream exists (Consume creates it).
func publish(t *testing.T, js jetstream.JetStream, data string) {
	t.Helper()
	testenv.Eventually(t, 20*time.Second, "the stream exists", func() bool {
		_, err := js.Stream(context.Background(), stream.Name)
		return err == nil
	})
	if _, err := js.Publish(context.Background(), stream.Subject("test"), []byte(data)); err != nil {
		t.Fatal(err)
	}
}

func receive(t *testing.T, got <-chan jetstream.Msg) jetstream.Msg {
	t.Helper()
	select {
	case m := <-got:
		return m
	case <-time.After(20 * time.Second):
		t.Fatal("no message within 20s")
		return nil
	}
}

func seq(t *testing.T, m jetstream.Msg) uint64 {
	t.Helper()
	md, err := m.Metadata()
	if err != nil {
		t.Fatal(err)
	}
	return md.Sequence.Stream
}

// natsOn starts an embedded JetStream server on port with an empty store,
// shut down when the test ends (or before, by the test).
func natsOn(t *testing.T, port int) *server.Server {
	t.Helper()
	dir, err := os.MkdirTemp("", "nats-store-")
	if err != nil {
		t.Fatal(err)
	}
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: port, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ns.Shutdown()
		ns.WaitForShutdown()
		_ = os.RemoveAll(dir)
	})
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("embedded nats server did not start within 10s")
	}
	return ns
}
