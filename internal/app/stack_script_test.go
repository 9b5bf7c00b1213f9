package app_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/acme/orders/internal/harness"
)

// stackReservedPorts are the default ports of `make run`, `make test` and the
// shared test server; the tests of scripts/stack.sh never use them.
var stackReservedPorts = map[int]bool{8080: true, 8081: true, 14222: true, 54329: true, 54349: true, 55432: true}

// stackRepoRoot returns the module's root folder (where go.mod is).
func stackRepoRoot(tb testing.TB) string {
	tb.Helper()
	dir, err := os.Getwd()
	if err != nil {
		tb.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			tb.Fatal("go.mod not found above the test's folder")
		}
		dir = parent
	}
}

// stackFreePorts returns n distinct free ports, none of them reserved.
func stackFreePorts(tb testing.TB, n int) []int {
	tb.Helper()
	seen := map[int]bool{}
	var ports []int
	for len(ports) < n {
		p, err := harness.FreePort()
		if err != nil {
			tb.Fatalf("free port: %v", err)
		}
		if seen[p] || stackReservedPorts[p] {
			continue
		}
		seen[p] = true
		ports = append(ports, p)
	}
	return ports
}

// stackEnv is the environment of scripts/stack.sh: this process's, without
// anything that would make the script use other servers or addresses, plus
// the given overrides.
func stackEnv(overrides map[string]string) []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		switch name {
		case "DATABASE_URL", "NATS_URL", "HTTP_ADDR", "PROJECTOR_HTTP_ADDR", "STACK_DIR",
			"PG_PORT", "NATS_PORT", "API_PORT", "PROJECTOR_PORT", "WORKER_PORT", "FAKEPSP_PORT",
			"PAYMENT_PROVIDER_URL", "WORKER_HTTP_ADDR", "READY_TIMEOUT", "BASE_URL", "MAKEFLAGS":
			continue
		}
		env = append(env, kv)
	}
	for k, v := range overrides {
		env = append(env, k+"="+v)
	}
	return env
}

// stackOutputLines returns the lines of s that are not blank.
func stackOutputLines(s string) []string {
	var lines []string
	for _, l := range strings.Split(s, "\n") {
		if strings.TrimSpace(l) != "" {
			lines = append(lines, l)
		}
	}
	return lines
}

// stackReady reports whether GET url answers 200.
func stackReady(url string) bool {
	c := http.Client{Timeout: 3 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// A second `make run` while one is up refuses with one line that says how to
// reach or stop the first, and leaves the first stack serving; the first one
// still stops everything it started when it is told to. The stacks run the
// real script on free ports in a temporary folder.
func TestStackScriptRefusesASecondRun(t *testing.T) {
	t.Parallel()
	root := stackRepoRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// nats-server is built (or found in the build cache) now, so the stack
	// below must not announce a compilation.
	if out, err := exec.CommandContext(ctx, "go", "tool", "-n", "nats-server").CombinedOutput(); err != nil {
		t.Fatalf("go tool -n nats-server: %v\n%s", err, out)
	}

	state := t.TempDir()
	ports := stackFreePorts(t, 6)
	apiURL := fmt.Sprintf("http://127.0.0.1:%d", ports[2])
	projURL := fmt.Sprintf("http://127.0.0.1:%d", ports[3])
	overrides := map[string]string{
		"STACK_DIR":      state,
		"PG_PORT":        strconv.Itoa(ports[0]),
		"NATS_PORT":      strconv.Itoa(ports[1]),
		"API_PORT":       strconv.Itoa(ports[2]),
		"PROJECTOR_PORT": strconv.Itoa(ports[3]),
		"WORKER_PORT":    strconv.Itoa(ports[4]),
		"FAKEPSP_PORT":   strconv.Itoa(ports[5]),
		"READY_TIMEOUT":  "60",
	}
	script := filepath.Join(root, "scripts", "stack.sh")

	// The first stack, in the background; its output goes to a file.
	outPath := filepath.Join(t.TempDir(), "first.out")
	outFile, err := os.Create(outPath)
	if err != nil {
		t.Fatal(err)
	}
	defer outFile.Close()
	first := exec.Command(script, "run")
	first.Dir, first.Env = root, stackEnv(overrides)
	first.Stdout, first.Stderr = outFile, outFile
	first.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := first.Start(); err != nil {
		t.Fatalf("start the first stack: %v", err)
	}
	// exited is closed when the first stack's script has ended, with its
	// error in firstErr: every waiter sees it, however many there are.
	exited := make(chan struct{})
	var firstErr error
	go func() { firstErr = first.Wait(); close(exited) }()
	firstOut := func() string {
		b, _ := os.ReadFile(outPath)
		return string(b)
	}
	stopped := false
	stop := func() error {
		if stopped {
			return nil
		}
		stopped = true
		_ = first.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
			return firstErr
		case <-time.After(45 * time.Second):
			_ = syscall.Kill(-first.Process.Pid, syscall.SIGKILL)
			<-exited
			return errors.New("the first stack did not stop within 45s of SIGTERM")
		}
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("stop the first stack: %v", err)
		}
		// Whatever happened, leave no server behind.
		for _, c := range [][]string{{"scripts/nats.sh", "stop", state}, {"scripts/pg.sh", "wipe", state}} {
			cmd := exec.Command(c[0], c[1:]...)
			cmd.Dir = root
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Errorf("%s: %v\n%s", strings.Join(c, " "), err, out)
			}
		}
	})

	deadline := time.Now().Add(2 * time.Minute)
	for !strings.Contains(firstOut(), "orders stack is up") {
		select {
		case <-exited:
			t.Fatalf("the first stack exited (%v) before it was up:\n%s", firstErr, firstOut())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the first stack was not up within 2m:\n%s", firstOut())
		}
		time.Sleep(200 * time.Millisecond)
	}
	if !stackReady(apiURL+"/readyz") || !stackReady(projURL+"/readyz") {
		t.Fatalf("the first stack said it was up, but its api or projector is not ready:\n%s", firstOut())
	}
	if out := firstOut(); strings.Contains(out, "compil") {
		t.Errorf("the stack announced a nats-server compilation although the binary was built already:\n%s", out)
	}

	second := func(t *testing.T, overrides map[string]string, want string) {
		t.Helper()
		cctx, ccancel := context.WithTimeout(ctx, time.Minute)
		defer ccancel()
		cmd := exec.CommandContext(cctx, script, "run")
		cmd.Dir, cmd.Env = root, stackEnv(overrides)
		cmd.WaitDelay = 5 * time.Second
		out, err := cmd.CombinedOutput()
		t.Logf("second stack: %v: %s", err, out)
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() == 0 {
			t.Errorf("second stack: got %v, want a non-zero exit; output:\n%s", err, out)
		}
		if lines := stackOutputLines(string(out)); len(lines) != 1 || !strings.Contains(lines[0], want) {
			t.Errorf("second stack: want one line containing %q, got %d lines:\n%s", want, len(lines), out)
		}
		select {
		case <-exited:
			t.Fatalf("the first stack exited (%v) after the second invocation:\n%s", firstErr, firstOut())
		default:
		}
		if !stackReady(apiURL+"/readyz") || !stackReady(projURL+"/readyz") {
			t.Fatalf("the first stack no longer answers /readyz after the second invocation:\n%s", firstOut())
		}
	}

	t.Run("same folder", func(t *testing.T) {
		// The one line says where the running stack answers.
		second(t, overrides, fmt.Sprintf("http://localhost:%d", ports[2]))
	})
	t.Run("same ports, another folder", func(t *testing.T) {
		other := map[string]string{}
		for k, v := range overrides {
			other[k] = v
		}
		other["STACK_DIR"] = filepath.Join(t.TempDir(), "new") // not there yet
		t.Cleanup(func() {
			cmd := exec.Command("scripts/pg.sh", "wipe", other["STACK_DIR"])
			cmd.Dir = root
			_ = cmd.Run() // nothing was started there; best effort for a failed assertion
		})
		// The one line names a port that is taken, and the refused run
		// leaves no folder behind.
		second(t, other, "already in use")
		if _, err := os.Stat(other["STACK_DIR"]); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the refused run left its new folder %s behind (stat: %v)", other["STACK_DIR"], err)
		}
	})

	// The first stack still stops everything it started.
	if err := stop(); err != nil {
		t.Fatalf("the first stack did not end cleanly on SIGTERM: %v\n%s", err, firstOut())
	}
	status := exec.Command("scripts/pg.sh", "status", state)
	status.Dir = root
	if status.Run() == nil {
		t.Errorf("the first stack left its PostgreSQL running in %s", state)
	}
	if stackReady(apiURL + "/readyz") {
		t.Errorf("the api still answers after the stack stopped")
	}
}

// `make http` with nothing listening says so in one line instead of running
// httpyac.
func TestMakeHTTPSaysWhenNothingAnswers(t *testing.T) {
	t.Parallel()
	root := stackRepoRoot(t)
	base := fmt.Sprintf("http://127.0.0.1:%d", stackFreePorts(t, 1)[0])
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "make", "-s", "http", "BASE_URL="+base)
	cmd.Dir, cmd.Env = root, stackEnv(nil)
	cmd.WaitDelay = 5 * time.Second
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() == 0 {
		t.Errorf("make http: got %v, want a non-zero exit", err)
	}
	lines := stackOutputLines(string(out))
	// make adds its own "*** [Makefile:…] Error 1" line.
	if len(lines) == 0 || len(lines) > 2 || !strings.Contains(lines[0], "nothing answers on "+base) || !strings.Contains(lines[0], "make run") {
		t.Errorf("make http: want one line saying nothing answers on %s and how to start it, got %d lines:\n%s", base, len(lines), out)
	}
}
