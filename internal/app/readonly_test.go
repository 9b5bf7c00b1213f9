package app_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/acme/orders/fakepsp"
	"github.com/acme/orders/fakepsp/fakepsptest"
	"github.com/acme/orders/internal/app"
	"github.com/acme/orders/internal/testenv"
)

// A database that takes no writes (a standby after a failover, or
// default_transaction_read_only) makes every process unready, not only the
// api: the projector cannot commit a batch, and the worker would charge and
// then fail to record the outcome. Their /readyz said "postgres: ok" while
// a Ping went through.
func TestEveryProcessIsUnreadyOnAReadOnlyDatabase(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	_, hs := fakepsptest.Start(t, fakepsptest.DatabaseURL(t), fakepsp.Config{})
	env["PAYMENT_PROVIDER_URL"], env["PAYMENT_PROVIDER_KEY"] = hs.URL, fakepsptest.SecretKey
	procs := map[string]string{
		"api":       start(t, "api", app.RunAPI, env),
		"projector": start(t, "projector", app.RunProjector, env),
		"worker":    start(t, "worker", app.RunWorker, env),
	}
	for _, base := range procs {
		waitReady(t, base)
	}
	db := testenv.Pool(t, env["DATABASE_URL"])
	if _, err := db.Exec(context.Background(), `DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET default_transaction_read_only = on', current_database()); END $$`); err != nil {
		t.Fatal(err)
	}
	// The setting reaches a session when it starts: the processes' pooled
	// connections keep writing until they are replaced.
	if _, err := db.Exec(context.Background(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`); err != nil {
		t.Fatal(err)
	}
	for _, base := range procs {
		waitReadyz(t, base, http.StatusServiceUnavailable, 20*time.Second)
	}
}
