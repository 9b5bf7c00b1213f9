// Package harness holds what the bench (internal/bench), the fault suite
// (internal/faults) and the tests share to run the service's processes on
// this machine: free ports, the service binaries, and commands whose output
// goes to a log file.
package harness

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Run runs name with args in dir to completion, appending its output to
// logFile; an error names the log to read.
func Run(ctx context.Context, dir, logFile, name string, args ...string) error {
	f, err := os.OpenFile(logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir, cmd.Stdout, cmd.Stderr = dir, f, f
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w (see %s)", name, strings.Join(args, " "), err, logFile)
	}
	return nil
}

// BuildServices builds the api, projector, worker and fakepsp binaries of
// the module in root into binDir, logging to logFile.
func BuildServices(ctx context.Context, root, binDir, logFile string) error {
	for _, c := range []string{"api", "projector", "worker", "fakepsp"} {
		if err := Run(ctx, root, logFile, "go", "build", "-o", filepath.Join(binDir, c), "./cmd/"+c); err != nil {
			return err
		}
	}
	return nil
}

// WaitReady polls http://127.0.0.1:port/readyz every 200 ms until it answers
// 200, ctx ends (ctx.Err()) or within passes (an error naming what, which
// should say where to look).
func WaitReady(ctx context.Context, port int, within time.Duration, what string) error {
	return WaitOK(ctx, fmt.Sprintf("http://127.0.0.1:%d/readyz", port), within, what)
}

// WaitOK polls url every 200 ms until it answers 200, ctx ends (ctx.Err())
// or within passes (an error naming what). fakepsp, for one, is ready when
// its /healthz answers 200.
func WaitOK(ctx context.Context, url string, within time.Duration, what string) error {
	deadline := time.Now().Add(within)
	for {
		res, err := http.Get(url)
		if err == nil {
			_, _ = io.Copy(io.Discard, res.Body)
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready within %s", what, within)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}
