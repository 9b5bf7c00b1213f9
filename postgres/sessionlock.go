package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Acquirer hands out a connection of its own (a *pgxpool.Pool).
type Acquirer interface {
	Acquire(ctx context.Context) (*pgxpool.Conn, error)
}

// TrySessionLock takes a session advisory lock, pg_try_advisory_lock(keys)
// with args (keys is its argument list, such as "$1, hashtext($2)"), on a
// connection of its own from db, for work that spans many transactions and
// must hold no transaction open meanwhile (a provider call). got is false,
// and nothing is held, when another session holds it. Otherwise release
// unlocks it and returns the connection; a connection whose unlock failed
// is closed, never returned to the pool still holding the lock. If the
// process dies, PostgreSQL ends the session and the lock with it.
func TrySessionLock(ctx context.Context, db Acquirer, keys string, args ...any) (conn *pgxpool.Conn, release func(), got bool, err error) {
	conn, err = db.Acquire(ctx)
	if err != nil {
		return nil, nil, false, err
	}
	if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock("+keys+")", args...).Scan(&got); err != nil {
		conn.Release()
		return nil, nil, false, fmt.Errorf("take advisory lock: %w", err)
	}
	if !got {
		conn.Release()
		return nil, nil, false, nil
	}
	return conn, func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		var released bool
		if err := conn.QueryRow(ctx, "SELECT pg_advisory_unlock("+keys+")", args...).Scan(&released); err != nil || !released {
			_ = conn.Conn().Close(ctx) // ends the session, and its lock
		}
		conn.Release()
	}, true, nil
}
