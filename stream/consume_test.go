package stream_test

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/acme/orders/internal/testenv"
	"github.com/acme/orders/stream"
)

// A pull request the server lost (here: one the network dropped on its way)
// costs a consumer with work waiting about two heartbeats, not the 30 s of
// nats.go's default expiry: the server's heartbeats stop, Consume notices
// and pulls again. Without stream.ConsumeOptions the message would wait
// 30 s, and this test fails after 10.
func TestALostPullRequestIsReplacedWithinSeconds(t *testing.T) {
	ns := testenv.NATS(t)
	proxy := newPullDropper(t, ns.Addr().String())
	nc, err := nats.Connect("nats://"+proxy.addr, nats.NoReconnect())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "LOST", Subjects: []string{"lost.>"}, Storage: jetstream.MemoryStorage}); err != nil {
		t.Fatal(err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, "LOST", jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "lost.one", []byte("waiting")); err != nil {
		t.Fatal(err)
	}

	proxy.drop.Store(1) // the consumer's first pull request never arrives
	got := make(chan string, 1)
	cc, err := cons.Consume(func(m jetstream.Msg) {
		_ = m.Ack()
		got <- string(m.Data())
	}, stream.ConsumeOptions(jetstream.PullMaxMessages(10))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()

	select {
	case data := <-got:
		if data != "waiting" {
			t.Fatalf("got %q", data)
		}
	case <-time.After(4*stream.PullHeartbeat + 6*time.Second):
		t.Fatalf("the message waiting since before the lost pull request was not delivered within %s", 4*stream.PullHeartbeat+6*time.Second)
	}
	if n := proxy.dropped.Load(); n != 1 {
		t.Fatalf("the proxy dropped %d pull requests, want 1: the test did not test a lost pull", n)
	}
}

// pullDropper forwards NATS connections to a server, dropping the next
// drop pull requests ($JS.API.CONSUMER.MSG.NEXT.…) a client publishes.
type pullDropper struct {
	addr          string
	drop, dropped atomic.Int64
}

func newPullDropper(t *testing.T, server string) *pullDropper {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	p := &pullDropper{addr: ln.Addr().String()}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", server)
			if err != nil {
				_ = c.Close()
				continue
			}
			t.Cleanup(func() { _ = c.Close(); _ = s.Close() })
			go func() { _, _ = io.Copy(c, s) }()
			go p.forward(s, c)
		}
	}()
	return p
}

// forward copies the client's protocol to the server line by line,
// leaving out the pull requests it is told to drop.
func (p *pullDropper) forward(to io.Writer, from io.Reader) {
	r := bufio.NewReader(from)
	for {
		line, err := r.ReadBytes('\n')
		if err != nil {
			return
		}
		msg := line
		fields := bytes.Fields(line)
		if len(fields) > 1 && (string(fields[0]) == "PUB" || string(fields[0]) == "HPUB") {
			size, err := strconv.Atoi(string(fields[len(fields)-1]))
			if err != nil {
				return
			}
			payload := make([]byte, size+2) // and its \r\n
			if _, err := io.ReadFull(r, payload); err != nil {
				return
			}
			msg = append(append([]byte{}, line...), payload...)
			if bytes.HasPrefix(fields[1], []byte("$JS.API.CONSUMER.MSG.NEXT.")) && p.drop.Load() > 0 {
				p.drop.Add(-1)
				p.dropped.Add(1)
				continue
			}
		}
		if _, err := to.Write(msg); err != nil {
			return
		}
	}
}
