package app_test

import (
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/acme/orders/internal/app"
	"github.com/acme/orders/internal/testenv"
)

// The pipeline on a 3-node JetStream cluster with the stream and consumers
// at three replicas: one node stops mid-run and nothing is lost. The orders
// per phase default to a short run (make test); CLUSTER_ORDERS raises it
// (make cluster-test).
func TestThreeNodeClusterSurvivesANodeLoss(t *testing.T) {
	t.Parallel()
	perPhase := 100
	if n, err := strconv.Atoi(os.Getenv("CLUSTER_ORDERS")); err == nil && n > 0 {
		perPhase = n
	}
	servers, urls := testenv.NATSCluster(t, 3)
	env := map[string]string{
		"DATABASE_URL":    testenv.DatabaseURL(t),
		"NATS_URL":        urls,
		"STREAM_REPLICAS": "3",
		"LOG_FORMAT":      "json",
		// Every batch of two or more goes out atomically, so that this short
		// run has some (a replicated stream stages them in memory).
		"RELAY_MIN_ATOMIC_BATCH": "2",
	}
	api := start(t, "api", app.RunAPI, env)
	start(t, "projector", app.RunProjector, env)
	token := newToken(t, env, "acme")
	db := testenv.Pool(t, env["DATABASE_URL"])

	workload(t, db, []string{api}, token, "one-", perPhase, 8, 11)
	done := make(chan struct{})
	go func() {
		defer close(done)
		workload(t, db, []string{api}, token, "two-", perPhase, 8, 12)
	}()
	time.Sleep(200 * time.Millisecond) // mid-run
	servers[0].Shutdown()
	t.Log("node-1 stopped")
	<-done
	workload(t, db, []string{api}, token, "three-", perPhase, 8, 13)
	converged(t, env, "3-node cluster with one node lost")
	if n := countRows(t, env, `SELECT count(*) FROM orders`); n != 3*perPhase {
		t.Fatalf("%d orders, want %d", n, 3*perPhase)
	}
	// The relay published in atomic batches on the replicated stream too.
	if n := scrape(t, api, "relay_atomic_batches_total"); n == 0 {
		t.Fatal("the relay published no atomic batch")
	}
	t.Logf("%v atomic batches, %v refused and sent message by message", scrape(t, api, "relay_atomic_batches_total"), scrape(t, api, "relay_atomic_fallbacks_total"))
}
