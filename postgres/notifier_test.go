package postgres_test

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/acme/orders/internal/testenv"
	"github.com/acme/orders/postgres"
)

// Signals within one Interval go out as one statement whose payloads name
// every id once; the first signal after a quiet spell goes out at once.
func TestNotifierCoalesces(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	db := testenv.DB(t)
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	got, listening := make(chan string, 100), make(chan struct{}, 1)
	go postgres.Listen(ctx, db, "test_channel", logger, func(p string) {
		if p == "" { // the listener's (re)connect: it is listening
			select {
			case listening <- struct{}{}:
			default:
			}
			return
		}
		got <- p
	})
	select {
	case <-listening:
	case <-time.After(10 * time.Second):
		t.Fatal("the listener did not connect within 10 s")
	}

	n, err := postgres.NewNotifier(db, logger, postgres.NotifierConfig{Channel: "test_channel", Interval: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); n.Run(ctx) }()
	defer func() { cancel(); <-done }()

	n.NotifyIDs("p", []string{"a"})
	next := func() string {
		t.Helper()
		select {
		case p := <-got:
			return p
		case <-time.After(10 * time.Second):
			t.Fatal("no notification within 10 s")
			return ""
		}
	}
	if p := next(); p != "p:a" {
		t.Fatalf("first payload %q; want p:a", p)
	}
	n.NotifyIDs("p", []string{"b", "c"})
	n.NotifyIDs("p", []string{"c", "d"})
	if p := next(); p != "p:b,c,d" {
		t.Fatalf("coalesced payload %q; want p:b,c,d", p)
	}
	// The listener may hear the second statement before Exec has returned
	// to the notifier and counted it.
	deadline := time.Now().Add(5 * time.Second)
	st := n.Stats()
	for st.Payloads < 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
		st = n.Stats()
	}
	if st.Sends != 2 || st.Payloads != 2 || st.Failures != 0 {
		t.Fatalf("stats %+v; want 2 sends of 1 payload each", st)
	}
}

// Payloads stay under PostgreSQL's limit and name every id once.
func TestPayloadsSplitUnderTheLimit(t *testing.T) {
	t.Parallel()
	ids := make([]string, 1000)
	for i := range ids {
		ids[i] = strings.Repeat("x", 35) + string(rune('a'+i%26))
	}
	var n int
	for _, p := range postgres.Payloads("order_views", ids) {
		if len(p) > postgres.MaxNotifyPayload {
			t.Fatalf("payload of %d bytes; want at most %d", len(p), postgres.MaxNotifyPayload)
		}
		prefix, list, _ := strings.Cut(p, ":")
		if prefix != "order_views" {
			t.Fatalf("payload prefix %q", prefix)
		}
		n += len(strings.Split(list, ","))
	}
	if n != len(ids) {
		t.Fatalf("%d ids in the payloads; want %d", n, len(ids))
	}
}
