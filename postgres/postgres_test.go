package postgres_test

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/acme/orders/internal/testenv"
	"github.com/acme/orders/postgres"
)

// Open's session settings hold on every connection, and the URL can
// override each of them.
func TestOpenSessionSettings(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testenv.DatabaseURL(t)
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, c := range []struct {
		url              string
		timeout, planned string
	}{
		{url, "1min", "auto"},
		{url + sep + "statement_timeout=5s&plan_cache_mode=force_custom_plan", "5s", "force_custom_plan"},
	} {
		pool, err := postgres.Open(ctx, c.url, 2, 10*time.Second, logger)
		if err != nil {
			t.Fatal(err)
		}
		var timeout, planned string
		err = pool.QueryRow(ctx, `SELECT current_setting('statement_timeout'), current_setting('plan_cache_mode')`).Scan(&timeout, &planned)
		pool.Close()
		if err != nil {
			t.Fatal(err)
		}
		if timeout != c.timeout || planned != c.planned {
			t.Errorf("%s: statement_timeout %s, plan_cache_mode %s; want %s and %s", c.url, timeout, planned, c.timeout, c.planned)
		}
	}
}
