package outbox_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/acme/orders/outbox"
	"github.com/acme/orders/stream"
)

// BenchmarkPublishBatch measures, per batch of n events, a JetStream atomic
// batch against n asynchronous publishes awaited together, on a server
// that syncs every write (`sync_interval: always`, as `make run` and the
// bench run it) with its store on this machine's disk. An atomic batch is
// staged in a file store of its own that nats-server creates, syncs and
// deletes (R1 file storage): a fixed cost that only a large batch repays;
// a message published alone is synced alone. The relay picks the cheaper
// by the batch's length (outbox.Config.MinAtomicBatch).
//
//	go test -run '^$' -bench PublishBatch -count 3 ./outbox/
func BenchmarkPublishBatch(b *testing.B) {
	dir, err := os.MkdirTemp("", "nats-bench-")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(dir)
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir,
		SyncAlways: true, NoLog: true, NoSigs: true})
	if err != nil {
		b.Fatal(err)
	}
	go ns.Start()
	defer ns.Shutdown()
	if !ns.ReadyForConnections(10 * time.Second) {
		b.Fatal("nats-server did not start")
	}
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if _, err := stream.Ensure(ctx, js, stream.Settings{}); err != nil {
		b.Fatal(err)
	}
	payload := []byte(`{"order_id":"` + uuid.NewString() + `","items":[` + strings.Repeat(`{"sku":"SKU-1","quantity":1,"unit_price":1999},`, 8) + `{"sku":"SKU-2","quantity":2,"unit_price":500}]}`)
	msgs := func(n int) []*nats.Msg {
		out := make([]*nats.Msg, n)
		for i := range out {
			out[i] = nats.NewMsg(stream.Subject("order.created"))
			out[i].Data = payload
			out[i].Header.Set(jetstream.MsgIDHeader, uuid.NewString())
		}
		return out
	}
	for _, n := range []int{1, 4, 16, 32, 64, 256} {
		b.Run(fmt.Sprintf("atomic/n=%d", n), func(b *testing.B) {
			for b.Loop() {
				if err := outbox.PublishAtomic(ctx, nc, msgs(n)); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*n), "µs/event")
		})
		b.Run(fmt.Sprintf("each/n=%d", n), func(b *testing.B) {
			for b.Loop() {
				futures := make([]jetstream.PubAckFuture, 0, n)
				for _, m := range msgs(n) {
					f, err := js.PublishMsgAsync(m)
					if err != nil {
						b.Fatal(err)
					}
					futures = append(futures, f)
				}
				for _, f := range futures {
					select {
					case <-f.Ok():
					case err := <-f.Err():
						b.Fatal(err)
					}
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*n), "µs/event")
		})
	}
}
