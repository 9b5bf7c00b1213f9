package testenv

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"testing"
	"time"
)

// Program is the shape of every process of the service (app.RunAPI,
// app.RunProjector, app.RunWorker): it serves until ctx ends.
type Program func(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error

// StartProgram runs program name with env as its whole environment, on a
// port of its own, until tb's cleanup (which waits up to 15 s for it to
// return, and reports an error it returned), and returns the base URL it
// serves on, read from its "listening" log line.
func StartProgram(tb testing.TB, name string, run Program, env map[string]string) string {
	tb.Helper()
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
				select {
				case addr <- line.Addr:
				default: // a later listener (e.g. profiles) is not the one asked for
				}
			}
		}
	}()
	tb.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				tb.Errorf("%s returned %v", name, err)
			}
		case <-time.After(15 * time.Second):
			tb.Errorf("%s did not shut down within 15s", name)
		}
	})
	select {
	case a := <-addr:
		return "http://" + a
	case err := <-done:
		tb.Fatalf("%s exited early: %v", name, err)
	case <-time.After(30 * time.Second):
		tb.Fatalf("%s did not listen within 30s", name)
	}
	return ""
}
