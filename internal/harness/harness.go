// Package harness holds what the bench (internal/bench), the fault suite
// (internal/faults) and the tests share to run the service's processes on
// this machine: free ports, the service binaries, and commands whose output
// goes to a log file.
package harness

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago,
// below the kernel's ephemeral range. The suites kill processes and start
// them again on the same port; a port from the ephemeral range (what
// listening on :0 gives) can meanwhile become the local end of any outgoing
// connection (a pool's reconnect, a proxy's dial), and the restarted
// process then fails with "address already in use" for as long as that
// connection lives. Ports below the range are never picked that way.
func FreePort() (int, error) {
	lo, hi := freePortRange()
	portsMu.Lock()
	defer portsMu.Unlock()
	var last error
	for range 100 {
		port := lo + rand.IntN(hi-lo)
		if portsGiven[port] {
			continue // free now, but another caller of this process has it
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			last = err
			continue
		}
		l.Close()
		portsGiven[port] = true
		return port, nil
	}
	return 0, fmt.Errorf("no free port in [%d, %d) after 100 tries: %v", lo, hi, last)
}

// portsGiven are the ports FreePort returned in this process: a stack
// asks for a dozen before it starts anything, so "free a moment ago" alone
// could hand one out twice.
var (
	portsMu    sync.Mutex
	portsGiven = map[int]bool{}
)

// freePortRange is where FreePort picks: a stretch of at least 1000 ports
// outside the ephemeral range (net.ipv4.ip_local_port_range): from 10000 up
// to its first port (32768 by default), else above its last.
func freePortRange() (lo, hi int) {
	first, last := ephemeralRange()
	switch {
	case first-10000 >= 1000:
		return 10000, first
	case 65536-(last+1) >= 1000:
		return last + 1, 65536
	}
	return 10000, 32768 // the range covers nearly everything: the best there is
}

// ephemeralRange is the kernel's range of local ports for outgoing
// connections (Linux's default when it cannot be read).
func ephemeralRange() (first, last int) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err == nil {
		if n, _ := fmt.Sscan(string(b), &first, &last); n == 2 && first > 0 && last >= first {
			return first, last
		}
	}
	return 32768, 60999
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
