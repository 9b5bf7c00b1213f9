package bench

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/acme/orders/internal/testenv"
	"github.com/acme/orders/outbox"
)

// Every pgbench script renders the production SQL into statements that
// PostgreSQL runs: one transaction of each, by pgbench, on a migrated
// database.
func TestScriptsRunInPgbench(t *testing.T) {
	t.Parallel()
	url := testenv.DatabaseURL(t)
	bin, err := pgbenchPath()
	if err != nil {
		t.Fatal(err)
	}
	scripts := map[string]string{
		"create": createOrderScript(),
		"relay":  publishScript(outbox.DefaultBatchSize, outbox.DefaultWorkers),
		// The minimal ceilings, on their own schema.
		"create-minimal":         minimalCreateScript(),
		"create-minimal-grouped": minimalGroupedCreateScript(4),
		"apply-minimal":          minimalApplyScript(10),
	}
	for _, name := range []string{"order_views", "customer_summaries", "daily_sales"} {
		s, err := applyScript(name, 10)
		if err != nil {
			t.Fatal(err)
		}
		scripts[name] = s
	}
	if _, err := applyScript("no_such_projection", 10); err == nil {
		t.Fatal("applyScript of an unknown projection: no error")
	}
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(context.Background(), minimalSchemaSQL); err != nil {
		t.Fatalf("create the minimal schema: %v", err)
	}
	for name, script := range scripts {
		file := filepath.Join(t.TempDir(), name+".pgbench")
		if err := os.WriteFile(file, []byte(script), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(bin, "-n", "-M", "prepared", "-f", file, "-t", "1", url).CombinedOutput()
		if err != nil {
			t.Errorf("pgbench %s: %v\n%s\nscript:\n%s", name, err, out, script)
		}
	}
	// The minimal create writes rows of realistic size: a stored response
	// and an envelope of several hundred bytes; the minimal apply a batch.
	// The create's pipeline committed its order (with its key and event).
	var response, envelope, inbox, views, orders int
	if err := conn.QueryRow(context.Background(), `SELECT
	    (SELECT count(*) FROM orders o JOIN idempotency_keys k ON k.key = o.creating_key JOIN outbox e ON e.aggregate_id = o.id),
	    (SELECT min(length(response)) FROM ceiling.idempotency_keys),
	    (SELECT min(length(payload::text)) FROM ceiling.outbox),
	    (SELECT count(*) FROM ceiling.inbox), (SELECT count(*) FROM ceiling.order_views)`).Scan(&orders, &response, &envelope, &inbox, &views); err != nil {
		t.Fatal(err)
	}
	if orders != 1 {
		t.Errorf("the create script committed %d orders with their key and event, want 1", orders)
	}
	if response < 400 || envelope < 500 || inbox != 10 || views != 10 {
		t.Errorf("minimal rows: response %d bytes, envelope %d bytes (want ≥ 400, ≥ 500); inbox %d, views %d rows (want 10 each)",
			response, envelope, inbox, views)
	}
}
