package postgres

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Listen calls notify for every NOTIFY on channel until ctx ends. It keeps
// one connection of pool for itself and, when that connection breaks, takes
// another after a pause, calling notify once more after each reconnect (a
// notification may have been missed while it was away).
func Listen(ctx context.Context, pool *pgxpool.Pool, channel string, logger *slog.Logger, notify func()) {
	for ctx.Err() == nil {
		err := listenOnce(ctx, pool, channel, notify)
		if ctx.Err() != nil {
			return
		}
		logger.WarnContext(ctx, "listen connection lost; reconnecting", "channel", channel, "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

func listenOnce(ctx context.Context, pool *pgxpool.Pool, channel string, notify func()) error {
	pconn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	conn := pconn.Hijack() // LISTEN state must not go back to the pool
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		return err
	}
	notify()
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return err
		}
		notify()
	}
}
