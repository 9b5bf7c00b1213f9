package faults

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/acme/orders/internal/harness"
)

// stack is the system under test, every part a real process (PostgreSQL,
// nats-server, the api and projector binaries) except the network proxies,
// which run in this process (toxiproxy as a library) on 127.0.0.1.
type stack struct {
	root, dir string // repo root; state directory
	log       *slog.Logger
	pgPort    int
	natsPort  int
	bin       string // directory of the built binaries
	toxi      *toxiproxy.ApiServer
	proxies   map[string]*toxiproxy.Proxy
	token     string

	pspPort int // fakepsp's HTTP port (kept across its restarts)

	mu    sync.Mutex
	procs map[string]*proc
	// lostResponses sums fakepsp's lost_responses over its past lives (read
	// just before each restart-psp kill); add pspStats() for the total.
	lostResponses int64
	// windowCrashes counts workers that killed themselves between a
	// provider answer and its recording (kill-payment-worker's crash hook).
	windowCrashes int
}

// commonEnv is the environment of every service process, before its own.
var commonEnv = []string{"LOG_FORMAT=json", "IDEMPOTENCY_WAIT=2s"}

// proc is one service process the harness runs (and kills, and restarts).
type proc struct {
	name     string
	bin      string // binary name (default: the name up to its first "-")
	args     []string
	env      []string
	port     int    // its HTTP port
	health   string // path that answers 200 when ready (default /readyz)
	cmd      *exec.Cmd
	exited   chan struct{}
	killedBy bool   // the harness killed it on purpose
	crashes  int    // exits the harness did not cause
	lastExit string // how the last of them ended, and its log's last line
}

// crashReport is the violation p's crashes make, or "" if it had none.
// Callers hold s.mu.
func (p *proc) crashReport() string {
	if p.crashes == 0 {
		return ""
	}
	return fmt.Sprintf("%s exited %d times without being killed, last %s (see %s.log)", p.name, p.crashes, p.lastExit, p.name)
}

// lastLine is the last non-empty line of the file at path (from its last
// 4 KiB), or "" if it cannot be read.
func lastLine(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	buf := make([]byte, 4096)
	if fi, err := f.Stat(); err == nil && fi.Size() > int64(len(buf)) {
		_, _ = f.Seek(fi.Size()-int64(len(buf)), io.SeekStart)
	}
	n, _ := io.ReadFull(f, buf)
	lines := strings.Split(strings.TrimSpace(string(buf[:n])), "\n")
	line := strings.TrimSpace(lines[len(lines)-1])
	if len(line) > 300 {
		line = line[:300] + "…"
	}
	return line
}

// run runs a command in the module's root, its output to the log file
// logName in dir.
func (s *stack) run(ctx context.Context, logName string, name string, args ...string) error {
	return harness.Run(ctx, s.root, filepath.Join(s.dir, logName), name, args...)
}

// up builds the binaries and starts PostgreSQL, NATS, the proxies and the
// services.
func (s *stack) up(ctx context.Context) error {
	s.bin = filepath.Join(s.dir, "bin")
	if err := harness.BuildServices(ctx, s.root, s.bin, filepath.Join(s.dir, "build.log")); err != nil {
		return err
	}
	var err error
	if s.pgPort, err = harness.FreePort(); err != nil {
		return err
	}
	if s.natsPort, err = harness.FreePort(); err != nil {
		return err
	}
	if err := s.startPostgres(ctx); err != nil {
		return err
	}
	if err := s.startNATS(ctx); err != nil {
		return err
	}

	// Proxies: api→PostgreSQL, relay→NATS, projector→NATS, and one in front
	// of each api for the clients (to lose responses after the server did
	// the work).
	s.toxi = toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	s.proxies = map[string]*toxiproxy.Proxy{}
	addProxy := func(name string, upstream int) (int, error) {
		p := toxiproxy.NewProxy(s.toxi, name, "127.0.0.1:0", fmt.Sprintf("127.0.0.1:%d", upstream))
		if err := p.Start(); err != nil {
			return 0, fmt.Errorf("proxy %s: %w", name, err)
		}
		s.proxies[name] = p
		_, port, _ := net.SplitHostPort(p.Listen)
		var n int
		fmt.Sscan(port, &n)
		return n, nil
	}
	apiPG, err := addProxy("api-postgres", s.pgPort)
	if err != nil {
		return err
	}
	relayNATS, err := addProxy("relay-nats", s.natsPort)
	if err != nil {
		return err
	}
	projNATS, err := addProxy("projector-nats", s.natsPort)
	if err != nil {
		return err
	}

	natsURL := func(port int) string { return fmt.Sprintf("nats://127.0.0.1:%d", port) }

	s.procs = map[string]*proc{}
	services := []struct {
		name string
		args []string
		env  func(port int) []string
	}{
		{"api", []string{"-relay=false"}, func(port int) []string {
			return []string{"DATABASE_URL=" + pgURL(apiPG), "NATS_URL=" + natsURL(relayNATS), fmt.Sprintf("HTTP_ADDR=127.0.0.1:%d", port)}
		}},
		{"relay", nil, func(port int) []string { // an api process that gets no traffic
			return []string{"DATABASE_URL=" + pgURL(apiPG), "NATS_URL=" + natsURL(relayNATS), fmt.Sprintf("HTTP_ADDR=127.0.0.1:%d", port)}
		}},
		{"projector", nil, func(port int) []string {
			return []string{"DATABASE_URL=" + pgURL(s.pgPort), "NATS_URL=" + natsURL(projNATS),
				fmt.Sprintf("PROJECTOR_HTTP_ADDR=127.0.0.1:%d", port)}
		}},
	}
	for _, svc := range services {
		for i := 1; i <= 2; i++ {
			port, err := harness.FreePort()
			if err != nil {
				return err
			}
			name := fmt.Sprintf("%s-%d", svc.name, i)
			bin := svc.name
			if bin == "relay" {
				bin = "api" // an api process that gets no traffic
			}
			s.procs[name] = &proc{name: name, bin: bin, args: svc.args, port: port, env: append(append([]string{}, commonEnv...), svc.env(port)...)}
		}
	}
	// The payment provider (fakepsp, its ledger in its own database on the
	// same server) and two payment workers, reaching PostgreSQL and NATS
	// directly. Every process keeps its default ack wait, so the suite
	// shows how soon a killed process's messages come back as shipped.
	if s.pspPort, err = harness.FreePort(); err != nil {
		return err
	}
	s.procs["fakepsp"] = &proc{name: "fakepsp", bin: "fakepsp", port: s.pspPort, health: "/healthz",
		env: append(append([]string{}, commonEnv...), "DATABASE_URL="+pgURL(s.pgPort), fmt.Sprintf("FAKEPSP_ADDR=127.0.0.1:%d", s.pspPort))}
	for i := 1; i <= 2; i++ {
		port, err := harness.FreePort()
		if err != nil {
			return err
		}
		name := fmt.Sprintf("worker-%d", i)
		s.procs[name] = &proc{name: name, bin: "worker", port: port, env: append(append([]string{}, commonEnv...),
			"DATABASE_URL="+pgURL(s.pgPort), "NATS_URL="+natsURL(s.natsPort), s.pspURL("PAYMENT_PROVIDER_URL="),
			"PAYMENT_PROVIDER_KEY=sk_test_local", "PAYMENT_PROVIDER_SEARCH_LAG=0s", fmt.Sprintf("WORKER_HTTP_ADDR=127.0.0.1:%d", port),
			fmt.Sprintf("WORKER_MAX_DELIVER=%d", workerMaxDeliver),
			fmt.Sprintf("WORKER_TENANT_SHARE_PERCENT=%d", workerSharePercent[i-1]))}
	}
	for _, p := range s.procs {
		if err := s.start(p, nil, false); err != nil {
			return err
		}
	}
	for _, p := range s.procs {
		if err := s.waitReady(ctx, p, 60*time.Second); err != nil {
			return err
		}
		if strings.HasPrefix(p.name, "api-") {
			if _, err := addProxy("client-"+p.name, p.port); err != nil {
				return err
			}
		}
	}
	s.token, err = s.createToken(ctx, "faults")
	return err
}

// workerMaxDeliver is the suite's WORKER_MAX_DELIVER: high enough that no
// intent is dead-lettered by the provider faults (a dead letter would leave
// its order payment_pending and fail the drain); dead letters have their
// own tests in settle.
const workerMaxDeliver = 1000

// workerSharePercent is each worker's WORKER_TENANT_SHARE_PERCENT: the
// second holds a tenant to 3 of its 32 slots, so that under the suite's
// load it parks intents out of the window and re-drives them (settle/park.go)
// through every fault, beside a worker that mostly settles them as
// delivered.
var workerSharePercent = [2]int{50, 10}

// pspURL is fakepsp's base URL, after prefix.
func (s *stack) pspURL(prefix string) string {
	return fmt.Sprintf("%shttp://127.0.0.1:%d", prefix, s.pspPort)
}

// pgURL is the URL of the stack's database on port (PostgreSQL's own, or
// a proxy's).
func pgURL(port int) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/orders?sslmode=disable", port)
}

// createToken runs `api token create` for tenant and returns the token.
func (s *stack) createToken(ctx context.Context, tenant string) (string, error) {
	out, err := exec.CommandContext(ctx, filepath.Join(s.bin, "api"), "token", "create", "-tenant", tenant,
		"-database-url", pgURL(s.pgPort)).Output()
	if err != nil {
		return "", fmt.Errorf("create token of tenant %s: %w", tenant, err)
	}
	return strings.TrimSpace(string(out)), nil
}

func (s *stack) startPostgres(ctx context.Context) error {
	return s.run(ctx, "scripts.log", "scripts/pg.sh", "start", filepath.Join(s.dir, "pg"), fmt.Sprint(s.pgPort))
}

// crashPostgres stops PostgreSQL the way a crash does (immediate: no
// checkpoint, crash recovery at the next start).
func (s *stack) crashPostgres(ctx context.Context) error {
	return s.run(ctx, "scripts.log", "scripts/pg.sh", "crash", filepath.Join(s.dir, "pg"))
}

func (s *stack) startNATS(ctx context.Context) error {
	return s.run(ctx, "scripts.log", "scripts/nats.sh", "start", filepath.Join(s.dir, "nats"), fmt.Sprint(s.natsPort))
}

// killNATS kills nats-server with SIGKILL (its store syncs every write).
func (s *stack) killNATS() error {
	b, err := os.ReadFile(filepath.Join(s.dir, "nats", "nats.pid"))
	if err != nil {
		return err
	}
	var pid int
	fmt.Sscan(string(b), &pid)
	return syscall.Kill(pid, syscall.SIGKILL)
}

// start starts p with its environment plus extraEnv; expectExit says the
// process is meant to end by itself (the worker's crash hook), so its exit
// is not counted as a crash.
func (s *stack) start(p *proc, extraEnv []string, expectExit bool) error {
	bin := p.bin
	if bin == "" {
		bin, _, _ = strings.Cut(p.name, "-")
	}
	f, err := os.OpenFile(filepath.Join(s.dir, p.name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(filepath.Join(s.bin, bin), p.args...)
	cmd.Env = append(append(os.Environ(), p.env...), extraEnv...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	s.mu.Lock()
	p.cmd, p.exited, p.killedBy = cmd, make(chan struct{}), expectExit
	s.mu.Unlock()
	go func(exited chan struct{}) {
		_ = cmd.Wait()
		f.Close()
		last := lastLine(f.Name()) // before the lock: a file read
		s.mu.Lock()
		if !p.killedBy {
			p.crashes++
			p.lastExit = fmt.Sprintf("%s: %q", cmd.ProcessState, last)
			s.log.Error("process exited on its own", "process", p.name, "state", cmd.ProcessState.String())
		}
		s.mu.Unlock()
		close(exited)
	}(p.exited)
	return nil
}

// kill9 kills p with SIGKILL and waits until it is gone.
func (s *stack) kill9(p *proc) {
	s.mu.Lock()
	p.killedBy = true
	cmd, exited := p.cmd, p.exited
	s.mu.Unlock()
	_ = cmd.Process.Kill()
	<-exited
}

// stop ends p with SIGTERM (graceful), SIGKILL after 15 s.
func (s *stack) stop(p *proc) {
	s.mu.Lock()
	p.killedBy = true
	cmd, exited := p.cmd, p.exited
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(15 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
	}
}

// alive restarts any process that has exited (a crash the harness did not
// cause is counted by start's waiter).
func (s *stack) restartDead() error {
	for _, p := range s.procs {
		select {
		case <-p.exited:
			if err := s.start(p, nil, false); err != nil {
				return err
			}
		default:
		}
	}
	return nil
}

func (s *stack) waitReady(ctx context.Context, p *proc, within time.Duration) error {
	path := p.health
	if path == "" {
		path = "/readyz"
	}
	return harness.WaitOK(ctx, fmt.Sprintf("http://127.0.0.1:%d%s", p.port, path), within,
		fmt.Sprintf("%s (see %s)", p.name, filepath.Join(s.dir, p.name+".log")))
}

// down stops everything the stack started.
func (s *stack) down() {
	for _, p := range s.procs {
		if p.cmd != nil {
			s.stop(p)
		}
	}
	for _, p := range s.proxies {
		p.Stop()
	}
	ctx := context.Background()
	_ = s.run(ctx, "scripts.log", "scripts/nats.sh", "stop", filepath.Join(s.dir, "nats"))
	_ = s.run(ctx, "scripts.log", "scripts/pg.sh", "stop", filepath.Join(s.dir, "pg"))
}
