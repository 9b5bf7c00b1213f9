package app

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"

	"github.com/acme/orders/internal/testenv"
	"github.com/acme/orders/projection"
)

// Two scrapes reading the lags at once each get their own slice: a later
// reading never rewrites the slice an earlier scrape is still rendering (run
// with -race to see the concurrent case).
func TestLagCacheReadingsDoNotShareMemory(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.DB(t)
	js := testenv.JetStream(t)
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	var runners []*projection.Runner
	for _, p := range projections() {
		r, err := projection.NewRunner(pool, js, p, logger, projection.Config{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := r.Consumer(ctx); err != nil {
			t.Fatal(err)
		}
		runners = append(runners, r)
	}
	c := &lagCache{ctx: ctx, runners: runners, logger: logger, maxAge: 0} // re-read every time

	a := c.get()
	if len(a) != len(runners) {
		t.Fatalf("%d lags, want %d", len(a), len(runners))
	}
	want := make([]string, len(a))
	for i, l := range a {
		want[i] = l.Projection
	}
	b := c.get()
	if &a[0] == &b[0] {
		t.Fatal("two readings share one backing array: the second rewrote the first's slice")
	}

	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for range 20 {
				for i, l := range c.get() {
					if l.Projection != want[i] {
						t.Errorf("lag %d names %q, want %q", i, l.Projection, want[i])
					}
				}
			}
		})
	}
	wg.Wait()
}
