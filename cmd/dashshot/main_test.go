package main

import (
	"bytes"
	"context"
	"image/png"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/acme/orders/fakepsp"
	"github.com/acme/orders/fakepsp/fakepsptest"
	"github.com/acme/orders/internal/app"
	"github.com/acme/orders/internal/testenv"
)

// start runs a program of the service until the test ends and returns the
// base URL it serves on.
func start(t *testing.T, name string, run testenv.Program, env map[string]string) string {
	t.Helper()
	return testenv.StartProgram(t, name, run, env)
}

// Against a real api, projector and payment worker (real PostgreSQL,
// embedded NATS, fakepsp), a short run drives journeys through client/
// without an unexpected failure, scrapes all three processes without a
// failed scrape, evaluates every query of the real docs/grafana-dashboard.json
// without an error and writes a PNG of the width asked for.
func TestRunDrawsTheDashboardFromARealStack(t *testing.T) {
	t.Parallel()
	env := map[string]string{
		"DATABASE_URL": testenv.DatabaseURL(t),
		"NATS_URL":     testenv.NATS(t).ClientURL(),
		"LOG_FORMAT":   "json",
	}
	_, hs := fakepsptest.Start(t, fakepsptest.DatabaseURL(t), fakepsp.Config{})
	env["PAYMENT_PROVIDER_URL"], env["PAYMENT_PROVIDER_KEY"] = hs.URL, fakepsptest.SecretKey
	api := start(t, "api", app.RunAPI, env)
	projector := start(t, "projector", app.RunProjector, env)
	worker := start(t, "worker", app.RunWorker, env)
	var tok bytes.Buffer
	if err := app.RunAPI(context.Background(), []string{"api", "token", "create", "-tenant", "dash"}, func(k string) string { return env[k] }, &tok); err != nil {
		t.Fatalf("api token create: %v", err)
	}
	token := strings.TrimSpace(tok.String())

	out := filepath.Join(t.TempDir(), "dashboard.png")
	var stdout bytes.Buffer
	err := run(context.Background(), []string{"dashshot",
		"-api", api, "-projector", projector, "-worker", worker,
		"-duration", "4s", "-settle", "1s", "-rate", "5",
		"-dashboard", "../../docs/grafana-dashboard.json", "-out", out, "-width", "1200",
	}, func(k string) string {
		if k == "TOKEN" {
			return token
		}
		return ""
	}, &stdout)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, stdout.String())
	}
	report := stdout.String()
	journeys := regexp.MustCompile(`(\d+) journeys, \d+ calls \((\d+) bad requests on purpose\), 0 unexpected failures`).FindStringSubmatch(report)
	if journeys == nil || !strings.Contains(report, "scrapes (0 failed)") {
		t.Fatalf("report: %q; want no failed scrape and no unexpected failure", report)
	}
	if n, _ := strconv.Atoi(journeys[1]); n < 10 {
		t.Errorf("%d journeys in 4 s at 5/s, want at least 10", n)
	}
	if n, _ := strconv.Atoi(journeys[2]); n == 0 {
		t.Errorf("no bad requests on purpose: the error panels would show nothing")
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cfg, err := png.DecodeConfig(f)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Width != 1200 || cfg.Height < 600 {
		t.Errorf("PNG is %dx%d, want 1200 wide and the dashboard's rows tall", cfg.Width, cfg.Height)
	}
}
