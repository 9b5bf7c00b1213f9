package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/acme/orders/postgres"
)

// Prune deletes published rows older than the retention, in batches of
// 1,000 (each its own statement, skipping rows another relay is deleting).
func (r *Relay) Prune(ctx context.Context) error {
	for {
		tag, err := r.db.Exec(ctx, OutboxPruneSQL, r.cfg.Retention.Seconds())
		if err != nil {
			return err
		}
		r.pruned.Add(tag.RowsAffected())
		if tag.RowsAffected() < 1000 {
			return nil
		}
	}
}

// Backlog is what waits to be published: how many rows and how old the
// oldest is.
type Backlog struct {
	Rows      int64
	OldestAge time.Duration
}

// ReadBacklog reads the outbox's backlog (of every relay, not just this one).
func ReadBacklog(ctx context.Context, db postgres.DB) (Backlog, error) {
	var b Backlog
	var age float64
	if err := db.QueryRow(ctx, OutboxBacklogSQL).Scan(&b.Rows, &age); err != nil {
		return Backlog{}, fmt.Errorf("read outbox backlog: %w", err)
	}
	b.OldestAge = time.Duration(age * float64(time.Second))
	return b, nil
}
