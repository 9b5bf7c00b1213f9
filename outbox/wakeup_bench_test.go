package outbox_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/acme/orders/internal/testenv"
	"github.com/acme/orders/outbox"
	"github.com/acme/orders/postgres"
	"github.com/acme/orders/stream"
)

// BenchmarkCrossProcessWakeUp measures, per event committed by a writer
// without a relay of its own, the time from its commit to its row published,
// with the two wake-ups issue #12 names: a coalesced NOTIFY sent after the
// commit (postgres.Notifier; the relay never polls) and short polling (no
// notification). Polling also costs Workers / PollInterval empty claims per
// second while idle (200/s at 10 ms with 2 workers); the notifier nothing.
//
//	go test -run '^$' -bench CrossProcessWakeUp -benchtime 200x ./outbox/
func BenchmarkCrossProcessWakeUp(b *testing.B) {
	for _, c := range []struct {
		name   string
		poll   time.Duration
		notify bool
	}{
		{"notifier", time.Hour, true},
		{"poll=10ms", 10 * time.Millisecond, false},
		{"poll=50ms", 50 * time.Millisecond, false},
	} {
		b.Run(c.name, func(b *testing.B) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			db, js := testenv.DB(b), testenv.JetStream(b)
			if _, err := stream.Ensure(ctx, js, stream.Settings{}); err != nil {
				b.Fatal(err)
			}
			logger := slog.New(slog.NewTextHandler(io.Discard, nil))
			relay, err := outbox.NewRelay(db, js, logger, outbox.Config{PollInterval: c.poll})
			if err != nil {
				b.Fatal(err)
			}
			notifier, err := postgres.NewNotifier(db, logger, postgres.NotifierConfig{Channel: "outbox"})
			if err != nil {
				b.Fatal(err)
			}
			done := make(chan struct{}, 2)
			go func() { relay.Run(ctx); done <- struct{}{} }()
			go func() { notifier.Run(ctx); done <- struct{}{} }()
			defer func() { cancel(); <-done; <-done }()
			testenv.Eventually(b, 10*time.Second, "the relay owns every partition", func() bool {
				return relay.Stats().Partitions == outbox.Partitions
			})
			b.ResetTimer()
			for i := range b.N {
				createOrders(b, db, 1, fmt.Sprintf("%s-%d", c.name, i))
				if c.notify {
					notifier.Notify()
				}
				for relay.Stats().Published < int64(i+1) {
					time.Sleep(100 * time.Microsecond)
				}
			}
			b.StopTimer()
		})
	}
}
