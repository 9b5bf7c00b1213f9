package app_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/acme/orders/fakepsp"
	"github.com/acme/orders/fakepsp/fakepsptest"
	"github.com/acme/orders/internal/app"
	"github.com/acme/orders/internal/testenv"
)

// getWaiting is a GET that waits up to 10 s for the read model (Prefer:
// wait=10): the tests check what the order becomes, on a machine that may be
// busy (the race detector, parallel tests); how fast is make bench's job.
func getWaiting(t *testing.T, url, token string) reply {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Prefer", "wait=10")
	return do(t, req)
}

func waitReady(t *testing.T, base string) {
	t.Helper()
	waitReadyz(t, base, http.StatusOK, 10*time.Second)
}

// waitReadyz waits up to within for base's /readyz to answer status.
func waitReadyz(t *testing.T, base string, status int, within time.Duration) {
	t.Helper()
	testenv.Eventually(t, within, fmt.Sprintf("%s/readyz is %d", base, status), func() bool {
		res, err := http.Get(base + "/readyz")
		if err != nil {
			t.Fatalf("GET %s/readyz: %v", base, err)
		}
		res.Body.Close()
		return res.StatusCode == status
	})
}

// The whole flow with the real worker and the local provider over HTTP:
// pay answers 202 and the order reads paid; a second pay
// under another key makes no second attempt; cancelling refunds it once.
func TestPayEndsPaidThroughTheWorker(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	psp, hs := fakepsptest.Start(t, fakepsptest.DatabaseURL(t), fakepsp.Config{})
	env["PAYMENT_PROVIDER_URL"], env["PAYMENT_PROVIDER_KEY"] = hs.URL, fakepsptest.SecretKey
	api := start(t, "api", app.RunAPI, env)
	start(t, "projector", app.RunProjector, env)
	worker := start(t, "worker", app.RunWorker, env)
	token := newToken(t, env, "acme")
	waitReady(t, worker)

	created := call(t, http.MethodPost, api+"/v1/orders", token, "w-1", orderBody("c-w"))
	if created.status != http.StatusCreated {
		t.Fatalf("create: %d %s", created.status, created.body)
	}
	location := created.header.Get("Location")
	if paying := call(t, http.MethodPost, api+location+"/pay", token, "w-pay-1", ""); paying.status != http.StatusAccepted {
		t.Fatalf("pay: %d %s", paying.status, paying.body)
	}
	if again := call(t, http.MethodPost, api+location+"/pay", token, "w-pay-2", ""); again.status != http.StatusOK && again.status != http.StatusAccepted {
		t.Fatalf("pay under another key: %d %s", again.status, again.body)
	}
	paid := getWaiting(t, api+location+"?min_version=3", token)
	if paid.status != http.StatusOK || !strings.Contains(paid.body, `"status":"paid"`) {
		t.Fatalf("GET ?min_version=3 within 1s: %d %s", paid.status, paid.body)
	}
	l := fakepsptest.Ledger(t, psp)
	if len(l.Charges) != 1 || l.Charges[0].Status != "succeeded" || l.Charges[0].Amount != 3998 || l.Charges[0].Currency != "eur" && l.Charges[0].Currency != "EUR" {
		t.Fatalf("the provider's ledger: %+v, want one charge of 3998 EUR", l.Charges)
	}

	if c := call(t, http.MethodPost, api+location+"/cancel", token, "w-cancel", `{"reason":"changed my mind"}`); c.status != http.StatusOK {
		t.Fatalf("cancel: %d %s", c.status, c.body)
	}
	refunded := getWaiting(t, api+location+"?min_version=6", token)
	if refunded.status != http.StatusOK || !strings.Contains(refunded.body, `"refund":"succeeded"`) {
		t.Fatalf("GET ?min_version=6: %d %s", refunded.status, refunded.body)
	}
	if l := fakepsptest.Ledger(t, psp); len(l.Refunds) != 1 || l.Refunds[0].Amount != 3998 {
		t.Fatalf("refunds at the provider: %+v, want one of 3998", l.Refunds)
	}
	res, err := http.Get(worker + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	for _, want := range []string{`orders_payment_charges_total{outcome="succeeded"} 1`, `orders_payment_refunds_total{outcome="succeeded"} 1`} {
		if !strings.Contains(string(b), want) {
			t.Fatalf("worker /metrics lacks %q:\n%s", want, b)
		}
	}
}

// With the provider down the worker's /readyz says so and the order stays
// payment_pending; once the provider answers, the same intent is charged.
func TestWorkerWaitsOutAProviderOutage(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing answers there until the provider starts below
	env := newEnv(t)
	env["PAYMENT_PROVIDER_URL"], env["PAYMENT_PROVIDER_KEY"] = "http://"+addr, fakepsptest.SecretKey
	api := start(t, "api", app.RunAPI, env)
	start(t, "projector", app.RunProjector, env)
	worker := start(t, "worker", app.RunWorker, env)
	token := newToken(t, env, "acme")

	var ready reply
	testenv.Eventually(t, 10*time.Second, "worker /readyz answers", func() bool {
		req, _ := http.NewRequest(http.MethodGet, worker+"/readyz", nil)
		ready = do(t, req)
		return ready.status != 0 && strings.Contains(ready.body, "provider")
	})
	if ready.status != http.StatusServiceUnavailable {
		t.Fatalf("worker /readyz with the provider down: %d %s", ready.status, ready.body)
	}
	created := call(t, http.MethodPost, api+"/v1/orders", token, "out-1", orderBody("c-out"))
	location := created.header.Get("Location")
	if paying := call(t, http.MethodPost, api+location+"/pay", token, "out-pay", ""); paying.status != http.StatusAccepted {
		t.Fatalf("pay: %d %s", paying.status, paying.body)
	}
	time.Sleep(2 * time.Second)
	if got := getWaiting(t, api+location+"?min_version=2", token); !strings.Contains(got.body, `"status":"payment_pending"`) {
		t.Fatalf("order during the outage: %d %s", got.status, got.body)
	}

	// The provider comes up on its address.
	pool, err := pgxpool.New(context.Background(), fakepsptest.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := fakepsp.Migrate(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	psp, err := fakepsp.New(fakepsp.Config{Pool: pool})
	if err != nil {
		t.Fatal(err)
	}
	ln, err = net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen on %s again: %v", addr, err)
	}
	srv := &http.Server{Handler: psp}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })

	waitReady(t, worker)
	testenv.Eventually(t, 30*time.Second, "the order is paid", func() bool {
		return strings.Contains(getWaiting(t, fmt.Sprintf("%s%s?min_version=3", api, location), token).body, `"status":"paid"`)
	})
	if l := fakepsptest.Ledger(t, psp); len(l.Charges) != 1 {
		t.Fatalf("charges at the provider: %+v, want 1", l.Charges)
	}
}

// The provider's readiness check takes the URL as the adapter does: with a
// trailing slash too (it asked for //healthz, 404, and the worker stayed
// unready for good while payments worked).
func TestProviderReadyTakesATrailingSlash(t *testing.T) {
	t.Parallel()
	_, hs := fakepsptest.Start(t, fakepsptest.DatabaseURL(t), fakepsp.Config{})
	for _, u := range []string{hs.URL, hs.URL + "/"} {
		check, err := app.ProviderReady(u, fakepsptest.SecretKey)
		if err != nil {
			t.Fatalf("ProviderReady(%q): %v", u, err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = check(ctx)
		cancel()
		if err != nil {
			t.Fatalf("readiness of %q: %v", u, err)
		}
	}
}
