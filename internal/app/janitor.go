package app

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"
)

// expiredKeyDeleter is the part of command.Idempotency the janitor uses.
type expiredKeyDeleter interface {
	DeleteExpired(ctx context.Context, batch int) (int64, error)
}

// keyJanitor deletes expired idempotency keys: every interval, in batches of
// janitorBatch rows (each its own short transaction, so it never holds many
// locks), until none is left. Every api replica runs one; they skip each
// other's rows.
type keyJanitor struct {
	keys    expiredKeyDeleter
	every   time.Duration
	logger  *slog.Logger
	deleted atomic.Int64
}

const janitorBatch = 1000

func (j *keyJanitor) run(ctx context.Context) {
	if j.every <= 0 {
		return
	}
	t := time.NewTicker(j.every)
	defer t.Stop()
	for {
		j.sweep(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// sweep deletes expired keys until a batch comes back short.
func (j *keyJanitor) sweep(ctx context.Context) {
	for ctx.Err() == nil {
		n, err := j.keys.DeleteExpired(ctx, janitorBatch)
		if err != nil {
			if ctx.Err() == nil {
				j.logger.WarnContext(ctx, "delete expired idempotency keys", "err", err)
			}
			return
		}
		j.deleted.Add(n)
		if n < janitorBatch {
			return
		}
	}
}
