package projection

import (
	"log/slog"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
)

// mustRunner is NewRunner for a config the test knows to be valid.
func mustRunner(tb testing.TB, db *pgxpool.Pool, js jetstream.JetStream, proj Projection, logger *slog.Logger, cfg Config) *Runner {
	tb.Helper()
	r, err := NewRunner(db, js, proj, logger, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	return r
}
