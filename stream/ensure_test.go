package stream_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/acme/orders/internal/testenv"
	"github.com/acme/orders/stream"
)

// Processes (and a projector's runners) that start together all find no
// stream. None of them may send an update then: an update that lands while
// another's consumers are being created is a data race inside nats-server.
// Only a stream with other settings is updated.
func TestConcurrentFirstStartsCreateAndNeverUpdate(t *testing.T) {
	nc, err := nats.Connect(testenv.NATS(t).ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	// A subscriber on the API's subject sees every update request; the
	// requests go out on nc, so a flush of nc has them queued here.
	sub, err := nc.SubscribeSync("$JS.API.STREAM.UPDATE.>")
	if err != nil {
		t.Fatal(err)
	}
	updates := func() int {
		t.Helper()
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		n, _, err := sub.Pending()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for i := range 16 {
		wg.Go(func() {
			var err error
			if i%2 == 0 {
				_, err = stream.Ensure(ctx, js, stream.Settings{})
			} else {
				_, err = stream.Open(ctx, js, stream.Settings{})
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("ensure: %v", err)
		}
	}
	if n := updates(); n != 0 {
		t.Errorf("%d stream updates sent by 16 starts on a fresh server, want 0", n)
	}

	// Other settings are applied by an update.
	s, err := stream.Ensure(ctx, js, stream.Settings{DuplicateWindow: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if got := s.CachedInfo().Config.Duplicates; got != time.Minute {
		t.Errorf("duplicate window after Ensure with 1m = %v", got)
	}
	if n := updates(); n != 1 {
		t.Errorf("%d stream updates in all after a change of the window, want 1", n)
	}

	// Open (the consumers' call) takes the stream as it is.
	if s, err = stream.Open(ctx, js, stream.Settings{}); err != nil {
		t.Fatal(err)
	}
	if got := s.CachedInfo().Config.Duplicates; got != time.Minute || updates() != 1 {
		t.Errorf("after Open with the default settings: window %v, %d updates in all; want 1m and 1", got, updates())
	}
}

// An operator's limits on the stream survive an Ensure that updates it
// with other settings: an update sends a whole config, and the relay's
// used to reset every field it does not own (MaxAge to forever).
func TestEnsureKeepsTheOperatorsLimits(t *testing.T) {
	nc, err := nats.Connect(testenv.NATS(t).ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := stream.Ensure(ctx, js, stream.Settings{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.MaxAge, cfg.MaxBytes, cfg.MaxMsgs = 72*time.Hour, 1<<30, 5_000_000
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatalf("operator's update: %v", err)
	}

	if s, err = stream.Ensure(ctx, js, stream.Settings{DuplicateWindow: time.Minute}); err != nil {
		t.Fatal(err)
	}
	got := s.CachedInfo().Config
	if got.Duplicates != time.Minute {
		t.Errorf("duplicate window after Ensure with 1m = %v, want 1m", got.Duplicates)
	}
	if got.MaxAge != 72*time.Hour || got.MaxBytes != 1<<30 || got.MaxMsgs != 5_000_000 {
		t.Errorf("operator's limits after Ensure: MaxAge %v, MaxBytes %d, MaxMsgs %d; want 72h, %d, 5000000",
			got.MaxAge, got.MaxBytes, got.MaxMsgs, 1<<30)
	}
}
