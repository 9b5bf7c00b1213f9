package app_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/acme/orders/internal/app"
	"github.com/acme/orders/internal/testenv"
)

// start runs a program (RunAPI or RunProjector) until the test ends and
// returns the address it listens on.
func start(t *testing.T, name string, run func(context.Context, []string, func(string) string, io.Writer) error, env map[string]string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out, w := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{name, "-http-addr", "127.0.0.1:0"}, func(k string) string { return env[k] }, w)
		w.Close()
	}()
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var line struct{ Msg, Addr string }
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "listening" {
				addr <- line.Addr
			}
			if testing.Verbose() {
				t.Logf("[%s] %s", name, sc.Text())
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%s returned %v", name, err)
			}
		case <-time.After(15 * time.Second):
			t.Errorf("%s did not shut down within 15s", name)
		}
	})
	select {
	case a := <-addr:
		return "http://" + a
	case err := <-done:
		t.Fatalf("%s exited early: %v", name, err)
	case <-time.After(30 * time.Second):
		t.Fatalf("%s did not listen within 30s", name)
	}
	return ""
}

func TestEndToEnd(t *testing.T) {
	t.Parallel()
	env := map[string]string{
		"DATABASE_URL": testenv.DatabaseURL(t),
		"NATS_URL":     testenv.NATS(t).ClientURL(),
		"LOG_FORMAT":   "json",
	}
	api := start(t, "api", app.RunAPI, env)
	projector := start(t, "projector", app.RunProjector, env)

	for _, base := range []string{api, projector} {
		res, err := http.Get(base + "/readyz")
		if err != nil || res.StatusCode != http.StatusOK {
			t.Fatalf("GET %s/readyz: %v %v", base, res, err)
		}
		res.Body.Close()
	}

	req, _ := http.NewRequest(http.MethodPost, api+"/v1/orders", strings.NewReader(
		`{"customer_id":"c-42","currency":"EUR","items":[{"sku":"book","quantity":2,"unit_price":1999}]}`))
	req.Header.Set("Idempotency-Key", "e2e-1")
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	created := time.Now()
	var order map[string]any
	if err := json.NewDecoder(res.Body).Decode(&order); err != nil || res.StatusCode != http.StatusCreated {
		t.Fatalf("POST: status %d, err %v", res.StatusCode, err)
	}
	res.Body.Close()
	location := res.Header.Get("Location")

	// The projector makes the order visible through the query side.
	deadline := time.Now().Add(10 * time.Second)
	for {
		res, err := http.Get(api + location)
		if err != nil {
			t.Fatal(err)
		}
		if res.StatusCode == http.StatusOK {
			var view map[string]any
			if err := json.NewDecoder(res.Body).Decode(&view); err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			t.Logf("create → visible in %s", time.Since(created).Round(time.Millisecond))
			a, _ := json.Marshal(order)
			b, _ := json.Marshal(view)
			if string(a) != string(b) {
				t.Fatalf("view differs from the created order:\n created %s\n view    %s", a, b)
			}
			if res.Header.Get("ETag") != `"1"` {
				t.Fatalf("view ETag = %q", res.Header.Get("ETag"))
			}
			return
		}
		res.Body.Close()
		if res.StatusCode != http.StatusNotFound || time.Now().After(deadline) {
			t.Fatalf("GET %s: status %d", location, res.StatusCode)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
