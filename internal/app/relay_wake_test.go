package app_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/acme/orders/internal/app"
	"github.com/acme/orders/internal/testenv"
)

// With two apis, each relay publishes only the outbox partitions it owns,
// so a command committed through one api must wake the other's relay too:
// before, only its own relay was woken, and an order on a partition of the
// other waited for that relay's poll (a second by default; here a minute,
// so that only a wake-up publishes anything within the test's 20 s).
func TestACommitWakesTheRelayOfAnotherAPI(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	env["RELAY_PARTITIONS"] = "8"
	env["RELAY_POLL_INTERVAL"] = "1m" // longer than the test waits
	api1 := start(t, "api-1", app.RunAPI, env)
	api2 := start(t, "api-2", app.RunAPI, env)
	testenv.Eventually(t, 30*time.Second, "each api's relay owns 8 partitions", func() bool {
		return scrape(t, api1, "relay_partitions_owned") == 8 && scrape(t, api2, "relay_partitions_owned") == 8
	})
	token := newToken(t, env, "acme")
	db := testenv.Pool(t, env["DATABASE_URL"])
	for i := range 16 {
		if r := call(t, http.MethodPost, api1+"/v1/orders", token, fmt.Sprintf("wake-%d", i), orderBody("c-1")); r.status != http.StatusCreated {
			t.Fatalf("create %d: %d %s", i, r.status, r.body)
		}
	}
	var partitions int
	if err := db.QueryRow(t.Context(), `SELECT count(DISTINCT partition) FROM outbox`).Scan(&partitions); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, "every order's event published", func() bool {
		var unpublished int
		if err := db.QueryRow(t.Context(), `SELECT count(*) FROM outbox WHERE published_at IS NULL`).Scan(&unpublished); err != nil {
			t.Fatal(err)
		}
		return unpublished == 0
	})
	t.Logf("16 orders over %d partitions, all published", partitions)
}
