package bench

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

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
}
