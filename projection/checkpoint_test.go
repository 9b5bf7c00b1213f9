package projection

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
)

// The checkpoint is written by the runner's checkpoint loop, not by the
// batches: it reaches the highest stream sequence applied within an
// interval, never goes back for an older event applied later, and what
// was committed before a shutdown is written on the way out.
func TestCheckpointFollowsTheCommitsOutsideTheBatches(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, Config{CheckpointInterval: 20 * time.Millisecond})
	checkpoint := func() int64 {
		l, err := f.runner.Lag(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return l.Checkpoint
	}

	// A committed batch alone writes no checkpoint row.
	e := &event{env: createdEvent(t, uuid.Must(uuid.NewV7())), seq: 2, deliveries: 1}
	if err := f.runner.commit(ctx, []*event{e}); err != nil {
		t.Fatal(err)
	}
	if got := checkpoint(); got != 0 {
		t.Fatalf("checkpoint after a batch and before the loop ran = %d; want 0 (written by the loop, not the batch)", got)
	}

	for i := range 3 {
		f.publish(t, createdEvent(t, uuid.Must(uuid.NewV7())), fmt.Sprint("cp-", i))
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- f.runner.Run(runCtx) }()
	eventually(t, "the checkpoint reaches the third message's sequence", func() bool { return checkpoint() == 3 })

	// An event of an older sequence, committed later, does not lower it.
	old := &event{env: createdEvent(t, uuid.Must(uuid.NewV7())), seq: 1, deliveries: 1}
	if err := f.runner.commit(ctx, []*event{old}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // five intervals
	if got := checkpoint(); got != 3 {
		t.Fatalf("checkpoint after an older event = %d; want 3", got)
	}
	// One committed just before the shutdown is written on the way out.
	last := &event{env: createdEvent(t, uuid.Must(uuid.NewV7())), seq: 40, deliveries: 1}
	if err := f.runner.commit(ctx, []*event{last}); err != nil {
		t.Fatal(err)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := checkpoint(); got != 40 {
		t.Fatalf("checkpoint after shutdown = %d; want 40", got)
	}
}
