package app_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/acme/orders/internal/app"
	"github.com/acme/orders/internal/testenv"
	"github.com/acme/orders/projection"
)

// A database error while the CLI looks a dead letter up is that error, with
// context, not "no such dead letter".
func TestDeadLetterCommandsReportDatabaseErrors(t *testing.T) {
	t.Parallel()
	url := testenv.DatabaseURL(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `ALTER TABLE dead_letters RENAME TO dead_letters_gone`); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"DATABASE_URL": url}
	for _, verb := range []string{"retry", "discard"} {
		var out bytes.Buffer
		err := app.RunProjector(ctx, []string{"projector", "dead-letters", verb, "1"}, func(k string) string { return env[k] }, &out)
		if err == nil || errors.Is(err, projection.ErrNoDeadLetter) || !strings.Contains(err.Error(), "dead_letters") {
			t.Errorf("dead-letters %s with the table gone: err %v; want the database error, not ErrNoDeadLetter", verb, err)
		}
	}
}
