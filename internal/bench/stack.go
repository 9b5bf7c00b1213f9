package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/acme/orders/internal/app"
	"github.com/acme/orders/internal/harness"
)

// stack is PostgreSQL, nats-server, one api (relay on), one projector, the
// payment provider (fakepsp) and one payment worker, each a separate
// process, with state under dir.
type stack struct {
	root, dir           string
	pgPort, natsPort    int
	apiPort, projPort   int
	pspPort, workerPort int
	api, projector      *exec.Cmd
	psp, worker         *exec.Cmd
	databaseURL, token  string
	socketDir           string // PostgreSQL's Unix socket directory
	natsSync            string // NATS_SYNC_INTERVAL; "" for always
}

// sh runs a command in the module's root, its output to scripts.log.
func (s *stack) sh(ctx context.Context, name string, args ...string) error {
	return harness.Run(ctx, s.root, filepath.Join(s.dir, "scripts.log"), name, args...)
}

func (s *stack) up(ctx context.Context) error {
	if err := harness.BuildServices(ctx, s.root, filepath.Join(s.dir, "bin"), filepath.Join(s.dir, "scripts.log")); err != nil {
		return err
	}
	for _, port := range []*int{&s.pgPort, &s.natsPort, &s.apiPort, &s.projPort, &s.pspPort, &s.workerPort} {
		var err error
		if *port, err = harness.FreePort(); err != nil {
			return err
		}
	}
	// PostgreSQL with its durable defaults: the numbers are those of a real
	// deployment's commit path.
	if err := s.sh(ctx, "scripts/pg.sh", "start", filepath.Join(s.dir, "pg"), fmt.Sprint(s.pgPort)); err != nil {
		return err
	}
	if s.natsSync != "" {
		os.Setenv("NATS_SYNC_INTERVAL", s.natsSync)
	}
	if os.Getenv("BENCH_PPROF") == "1" {
		os.Setenv("NATS_PROF_PORT", "6064") // nats-server's profiles, beside the Go processes' (startProcess)
	}
	if err := s.sh(ctx, "scripts/nats.sh", "start", filepath.Join(s.dir, "nats"), fmt.Sprint(s.natsPort)); err != nil {
		return err
	}
	var err error
	if s.socketDir, err = socketDir(ctx, s.pgPort); err != nil {
		return err
	}
	s.databaseURL = fmt.Sprintf("postgres://postgres@/orders?host=%s&port=%d&sslmode=disable", url.QueryEscape(s.socketDir), s.pgPort)
	if err := s.startAPI(); err != nil {
		return err
	}
	if err := s.startProjector(); err != nil {
		return err
	}
	if err := harness.WaitReady(ctx, s.apiPort, 60*time.Second, "api"); err != nil {
		return err
	}
	if err := harness.WaitReady(ctx, s.projPort, 60*time.Second, "projector"); err != nil {
		return err
	}
	// The payment provider keeps its ledger in its own database on the same
	// server; the worker is ready once the provider answers.
	if s.psp, err = s.startProcess("fakepsp", fmt.Sprintf("FAKEPSP_ADDR=127.0.0.1:%d", s.pspPort)); err != nil {
		return err
	}
	if err := harness.WaitOK(ctx, fmt.Sprintf("http://127.0.0.1:%d/healthz", s.pspPort), 60*time.Second, "fakepsp"); err != nil {
		return err
	}
	if s.worker, err = s.startProcess("worker", fmt.Sprintf("PAYMENT_PROVIDER_URL=http://127.0.0.1:%d", s.pspPort),
		fmt.Sprintf("WORKER_HTTP_ADDR=127.0.0.1:%d", s.workerPort)); err != nil {
		return err
	}
	if err := harness.WaitReady(ctx, s.workerPort, 60*time.Second, "worker"); err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, filepath.Join(s.dir, "bin", "api"), "token", "create", "-tenant", "bench", "-database-url", s.databaseURL).Output()
	if err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return fmt.Errorf("create token: %w: %s", err, bytes.TrimSpace(exit.Stderr))
		}
		return fmt.Errorf("create token: %w", err)
	}
	s.token = strings.TrimSpace(string(out))
	return nil
}

func (s *stack) env() []string {
	return append(os.Environ(), "DATABASE_URL="+s.databaseURL, fmt.Sprintf("NATS_URL=nats://127.0.0.1:%d", s.natsPort),
		"LOG_FORMAT=json", "LOG_LEVEL=warn")
}

func (s *stack) startProcess(bin string, env ...string) (*exec.Cmd, error) {
	f, err := os.OpenFile(filepath.Join(s.dir, bin+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(filepath.Join(s.dir, "bin", bin))
	cmd.Env = append(s.env(), env...)
	// BENCH_PPROF=1 serves each Go process's profiles on a port of its own
	// (api 6061, projector 6062, worker 6063; nats-server 6064), to profile a
	// phase while it runs.
	if os.Getenv("BENCH_PPROF") == "1" {
		if port, ok := map[string]int{"api": 6061, "projector": 6062, "worker": 6063}[bin]; ok {
			cmd.Env = append(cmd.Env, fmt.Sprintf("PPROF_ADDR=127.0.0.1:%d", port))
		}
	}
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return cmd, cmd.Start()
}

// startAPI starts the api with env added to its environment (RELAY=false
// for an api without its relay).
func (s *stack) startAPI(env ...string) (err error) {
	// One tenant drives the whole api: its per-tenant limits step aside
	// (the rate effectively off, in flight one below the global limit, the
	// whole pool its share).
	pool := os.Getenv("DB_POOL_SIZE")
	if pool == "" {
		pool = strconv.Itoa(app.DefaultAPIPoolSize)
	}
	s.api, err = s.startProcess("api", append([]string{fmt.Sprintf("HTTP_ADDR=127.0.0.1:%d", s.apiPort),
		"TENANT_RATE=1000000", "TENANT_BURST=1000000", "TENANT_MAX_IN_FLIGHT=511", "TENANT_MAX_WAITING=511",
		"TENANT_DB_SHARE=" + pool}, env...)...)
	return err
}

func (s *stack) startProjector(env ...string) (err error) {
	s.projector, err = s.startProcess("projector", append(env, fmt.Sprintf("PROJECTOR_HTTP_ADDR=127.0.0.1:%d", s.projPort))...)
	return err
}

// stopProcess ends cmd gracefully and waits for it.
func stopProcess(cmd *exec.Cmd) {
	if cmd == nil || cmd.Process == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

// peakRSS is the high-water mark of a process's resident memory, in MiB.
func peakRSS(cmd *exec.Cmd) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", cmd.Process.Pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "VmHWM:") {
			var kb float64
			fmt.Sscan(strings.TrimSpace(strings.TrimSuffix(strings.TrimPrefix(line, "VmHWM:"), "kB")), &kb)
			return kb / 1024
		}
	}
	return 0
}

func (s *stack) down() {
	stopProcess(s.api)
	stopProcess(s.projector)
	stopProcess(s.worker)
	stopProcess(s.psp)
	ctx := context.Background()
	_ = s.sh(ctx, "scripts/nats.sh", "stop", filepath.Join(s.dir, "nats"))
	_ = s.sh(ctx, "scripts/pg.sh", "stop", filepath.Join(s.dir, "pg"))
}

// clients connects to the stack's database and JetStream; done closes both.
func (s *stack) clients(ctx context.Context) (*pgx.Conn, jetstream.JetStream, func(), error) {
	conn, err := pgx.Connect(ctx, s.databaseURL)
	if err != nil {
		return nil, nil, nil, err
	}
	nc, err := nats.Connect(fmt.Sprintf("nats://127.0.0.1:%d", s.natsPort))
	if err != nil {
		conn.Close(ctx)
		return nil, nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		conn.Close(ctx)
		return nil, nil, nil, err
	}
	return conn, js, func() { nc.Close(); conn.Close(context.WithoutCancel(ctx)) }, nil
}

// socketDir asks the PostgreSQL server on 127.0.0.1:port where its Unix
// socket is. Every process of the stack (and pgbench) connects through it:
// all run on this machine, where a round trip over loopback TCP cost
// PostgreSQL more in the kernel's TCP stack (tcp_sendmsg and the softirq of
// the receiving end: 10% of all CPU samples at 233 pays/s) than any of
// its statements.
func socketDir(ctx context.Context, port int) (string, error) {
	conn, err := pgx.Connect(ctx, fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port))
	if err != nil {
		return "", err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var dirs string
	if err := conn.QueryRow(ctx, "SHOW unix_socket_directories").Scan(&dirs); err != nil {
		return "", err
	}
	// The first absolute directory (scripts/pg.sh sets one, unquoted; a
	// comma in it would break the connection strings anyway).
	for dir := range strings.SplitSeq(dirs, ",") {
		if dir = strings.Trim(strings.TrimSpace(dir), `"`); filepath.IsAbs(dir) {
			return dir, nil
		}
	}
	return "", fmt.Errorf("PostgreSQL listens on no Unix socket directory the bench can use (unix_socket_directories = %q)", dirs)
}
