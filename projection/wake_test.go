package projection

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
)

// A batch transaction sends no NOTIFY (it would serialise every commit in
// the cluster); the orders it applied are reported to Config.Applied after
// it committed, for the projector's coalesced notification, each once, at
// the last version the batch applied (so that only the readers waiting for
// that version wake).
func TestBatchSendsNoNotifyAndReportsAppliedOrdersAfterCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var mu sync.Mutex
	var reported []Reached
	var visibleAtReport bool
	var f fixture
	f = newFixture(t, Config{Applied: func(projection string, reached []Reached) {
		mu.Lock()
		defer mu.Unlock()
		reported = append(reported, reached...)
		// Called after the commit: another connection sees the rows, at
		// the versions reported.
		for _, r := range reached {
			var v int64
			err := f.db.QueryRow(context.Background(), `SELECT version FROM order_views WHERE order_id = $1`, r.Order).Scan(&v)
			visibleAtReport = err == nil && v == r.Version
			if !visibleAtReport {
				return
			}
		}
	}})
	pconn, err := f.db.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	conn := pconn.Hijack()
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "LISTEN projection_applied"); err != nil {
		t.Fatal(err)
	}

	lifecycle := lifecycleEvents(t, "c-1") // versions 1, 2, 3 of one order
	envs := append(lifecycle, createdEvent(t, uuid.Must(uuid.NewV7())))
	var events []*event
	for _, env := range envs {
		data, err := json.Marshal(env)
		if err != nil {
			t.Fatal(err)
		}
		events = append(events, &event{data: data, deliveries: 1})
	}
	if err := f.runner.commit(ctx, decode(events)); err != nil {
		t.Fatal(err)
	}

	mu.Lock()
	want := map[uuid.UUID]int64{lifecycle[0].AggregateID: 3, envs[3].AggregateID: 1}
	got := map[uuid.UUID]int64{}
	for _, r := range reported {
		got[r.Order] = r.Version
	}
	if len(reported) != 2 || !maps.Equal(got, want) || !visibleAtReport {
		t.Errorf("reported %v (rows visible at those versions: %v); want each order once at its last version %v, after the commit", reported, visibleAtReport, want)
	}
	mu.Unlock()
	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	n, err := conn.WaitForNotification(wctx)
	if err == nil {
		t.Fatalf("got NOTIFY %s %q from a batch transaction; want none", n.Channel, n.Payload)
	}
	if !errors.Is(err, context.DeadlineExceeded) && wctx.Err() == nil {
		t.Fatal(err)
	}
}

// collect lingers for more messages only when the stream is busy (the
// previous batch ended within 20 × wait): idle, it returns what it has.
func TestCollectLingersOnlyWhenBusy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	msgs := make(chan jetstream.Msg, 10)
	late := func() {
		msgs <- nil
		go func() { time.Sleep(50 * time.Millisecond); msgs <- nil }()
	}

	late()
	batch, lingered := collect(ctx, msgs, 10, time.Second, time.Time{}) // idle: no previous batch
	if len(batch) != 1 || lingered {
		t.Fatalf("idle: batch of %d (lingered %v); want 1, no linger", len(batch), lingered)
	}
	<-msgs // the late one

	late()
	batch, lingered = collect(ctx, msgs, 2, time.Second, time.Now()) // busy: the previous batch just ended
	if len(batch) != 2 || !lingered {
		t.Fatalf("busy: batch of %d (lingered %v); want 2 (the late message joined), lingered", len(batch), lingered)
	}
}
