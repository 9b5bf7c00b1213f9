package projection

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/acme/orders/internal/testenv"
	"github.com/acme/orders/stream"
)

// A limit set on the stream (here max_msgs) deletes events whether or not
// the projection has them. Those it had not applied are lost to its read
// model; that used to leave no trace (every lag gauge at 0, nothing
// logged). Lag counts them while the consumer is behind, and the runner
// logs them when it (re)creates its consumer, naming the fix.
func TestEventsDeletedByAStreamLimitBeforeTheyWereAppliedAreReported(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Config{Workers: 1})
	ctx := context.Background()
	if _, err := f.runner.Consumer(ctx); err != nil { // the projector ran once, then stopped
		t.Fatal(err)
	}
	s, err := f.js.Stream(ctx, stream.Name)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.MaxMsgs = 3
	if _, err := f.js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	for range 6 {
		env := createdEvent(t, uuid.Must(uuid.NewV7()))
		f.publish(t, env, env.ID.String())
	}
	l, err := f.runner.Lag(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if l.DeletedUnapplied != 3 || l.Pending != 3 {
		t.Fatalf("lag %+v; want 3 deleted before they were applied, 3 pending", l)
	}
	var logs testenv.LogBuffer
	f.runner.logger = slog.New(slog.NewTextHandler(&logs, nil))
	if _, err := f.runner.Consumer(ctx); err != nil { // the projector starts again
		t.Fatal(err)
	}
	if got := logs.String(); !strings.Contains(got, "events were deleted from the stream before this projection applied them") || !strings.Contains(got, "events=3") {
		t.Fatalf("log on start:\n%s\nwant the 3 deleted events reported", got)
	}
	f.run(t)
	eventually(t, "the 3 left applied", func() bool { return f.count(t, `SELECT count(*) FROM order_views`) == 3 })
}
