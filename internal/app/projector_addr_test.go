package app_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"testing"
	"time"

	"github.com/acme/orders/internal/app"
)

// listenAddr runs the projector with env and no -http-addr flag until the
// test ends and returns the address it listens on.
func listenAddr(t *testing.T, env map[string]string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out, w := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- app.RunProjector(ctx, []string{"projector"}, func(k string) string { return env[k] }, w)
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
		}
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("projector returned %v", err)
		}
	})
	select {
	case a := <-addr:
		return a
	case err := <-done:
		t.Fatalf("projector exited early: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("projector did not listen within 30s")
	}
	return ""
}

// The projector takes its address from HTTP_ADDR like the api, unless
// PROJECTOR_HTTP_ADDR (set where both run with one environment) says
// otherwise; by default it listens on loopback only.
func TestProjectorListensWhereTheEnvironmentSays(t *testing.T) {
	t.Parallel()
	host, _, err := net.SplitHostPort(app.DefaultProjectorHTTPAddr)
	if err != nil {
		t.Fatal(err)
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		t.Errorf("default address %s is not a loopback address", app.DefaultProjectorHTTPAddr)
	}

	env := newEnv(t)
	env["HTTP_ADDR"] = "127.0.0.1:0"
	if got, _, _ := net.SplitHostPort(listenAddr(t, env)); got != "127.0.0.1" {
		t.Errorf("with HTTP_ADDR=127.0.0.1:0 the projector listens on %s, want 127.0.0.1", got)
	}

	env = newEnv(t)
	env["HTTP_ADDR"] = "127.0.0.1:0"
	env["PROJECTOR_HTTP_ADDR"] = "127.0.0.2:0"
	if got, _, _ := net.SplitHostPort(listenAddr(t, env)); got != "127.0.0.2" {
		t.Errorf("with PROJECTOR_HTTP_ADDR=127.0.0.2:0 the projector listens on %s, want 127.0.0.2", got)
	}
}
