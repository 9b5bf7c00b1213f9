package app_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/acme/orders/internal/app"
	"github.com/acme/orders/internal/testenv"
)

// The api and the projector log their shutdown steps, in order, each with
// its duration: they stop taking work, finish what is in flight (requests;
// relay and projector batches committed and acked), and close their
// connections.
func TestShutdownLogsItsSteps(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	for _, tc := range []struct {
		name  string
		run   testenv.Program
		steps []string
	}{
		{"api", app.RunAPI, []string{
			"shutdown: stop taking work",
			"shutdown: in-flight requests finished",
			"relay stopped",
			"shutdown: background work stopped",
			"shutdown: NATS connection closed",
			"shutdown: database connections closed",
		}},
		{"projector", app.RunProjector, []string{
			"shutdown: stop taking work",
			"shutdown: in-flight requests finished",
			"shutdown: projections stopped",
			"shutdown: NATS connection closed",
			"shutdown: database connections closed",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			out, w := io.Pipe()
			done := make(chan error, 1)
			go func() {
				done <- tc.run(ctx, []string{tc.name, "-http-addr", "127.0.0.1:0"}, func(k string) string { return env[k] }, w)
				w.Close()
			}()
			var msgs []string
			read := make(chan struct{})
			go func() {
				defer close(read)
				sc := bufio.NewScanner(out)
				for sc.Scan() {
					var line struct {
						Msg      string
						Duration *json.RawMessage
					}
					if json.Unmarshal(sc.Bytes(), &line) != nil {
						continue
					}
					if line.Msg == "listening" {
						cancel() // up: now stop it
					}
					if strings.HasPrefix(line.Msg, "shutdown: ") && !strings.HasPrefix(line.Msg, "shutdown: stop taking work") && line.Duration == nil {
						t.Errorf("%q has no duration", line.Msg)
					}
					msgs = append(msgs, line.Msg)
				}
			}()
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("%s returned %v", tc.name, err)
				}
			case <-time.After(30 * time.Second):
				t.Fatalf("%s did not start and stop within 30s", tc.name)
			}
			<-read
			next := 0
			for _, m := range msgs {
				if next < len(tc.steps) && strings.HasPrefix(m, tc.steps[next]) {
					next++
				}
			}
			if next < len(tc.steps) {
				t.Fatalf("missing shutdown step %q (in this order: %q); logged:\n%s", tc.steps[next], tc.steps, strings.Join(msgs, "\n"))
			}
		})
	}
}
