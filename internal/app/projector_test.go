package app_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

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

// A mistyped subcommand is refused; it used to start a projector (or a
// worker) that joined the durable consumers. Help after a subcommand
// group prints the usage.
func TestAMistypedSubcommandStartsNothing(t *testing.T) {
	t.Parallel()
	env := map[string]string{"DATABASE_URL": "postgres://127.0.0.1:1/none?connect_timeout=1", "NATS_URL": "nats://127.0.0.1:1"}
	getenv := func(k string) string { return env[k] }
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, tt := range []struct {
		run  func(context.Context, []string, func(string) string, io.Writer) error
		args []string
	}{
		{app.RunProjector, []string{"projector", "rebiuld", "customer_summaries"}},
		{app.RunProjector, []string{"projector", "bogus"}},
		{app.RunProjector, []string{"projector", "status", "extra"}},
		{app.RunWorker, []string{"worker", "dead-lettres", "list"}},
		{app.RunWorker, []string{"worker", "dead-letters", "list", "extra"}},
	} {
		err := tt.run(ctx, tt.args, getenv, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "unexpected argument") {
			t.Errorf("%q: err %v; want unexpected argument", tt.args, err)
		}
	}
	// A projection mistyped among others is refused, not left to no process.
	if err := app.RunProjector(ctx, []string{"projector", "-projections", "order_views,customer_summary"}, getenv, io.Discard); err == nil ||
		!strings.Contains(err.Error(), `no projection "customer_summary"`) {
		t.Errorf("-projections with a typo: err %v; want it named", err)
	}
	for _, tt := range []struct {
		run  func(context.Context, []string, func(string) string, io.Writer) error
		args []string
	}{
		{app.RunProjector, []string{"projector", "dead-letters", "-h"}},
		{app.RunWorker, []string{"worker", "dead-letters", "-h"}},
		{app.RunAPI, []string{"api", "token", "-h"}},
	} {
		if err := tt.run(ctx, tt.args, getenv, io.Discard); err != nil {
			t.Errorf("%q: err %v; want the usage, no error", tt.args, err)
		}
	}
}
