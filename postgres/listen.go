package postgres

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Listen calls notify with the payload of every NOTIFY on channel until ctx
// ends. It keeps one connection of pool for itself and, when that
// connection breaks, takes another after a pause, calling notify("") after
// each (re)connect: a notification may have been missed while it was away,
// and "" stands for "anything may have changed".
func Listen(ctx context.Context, pool *pgxpool.Pool, channel string, logger *slog.Logger, notify func(payload string)) {
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

func listenOnce(ctx context.Context, pool *pgxpool.Pool, channel string, notify func(payload string)) error {
	pconn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	conn := pconn.Hijack() // LISTEN state must not go back to the pool
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		return err
	}
	notify("")
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		notify(n.Payload)
	}
}
