// Command dashshot makes docs/dashboard.png: while it drives a running
// stack through the client package, it scrapes the api's, projector's and
// worker's /metrics every second into memory; then it evaluates every
// query of docs/grafana-dashboard.json with Prometheus's PromQL engine and
// draws the panels in the dashboard's layout (internal/dashshot). It is
// not a Grafana screenshot: the drawing is its own. `make dashboard-png`
// starts a stack, runs it and stops the stack.
//
//	go run ./cmd/dashshot -api http://127.0.0.1:8080 -projector http://127.0.0.1:8081 \
//	    -worker http://127.0.0.1:8082 -token-file .local/run/dev-token -duration 90s
package main

import (
	"context"
	"flag"
	"fmt"
	"image"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/acme/orders/client"
	"github.com/acme/orders/internal/dashshot"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args, os.Getenv, os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "dashshot:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
	api := fs.String("api", "http://127.0.0.1:8080", "the api's base URL (load goes there; /metrics is scraped)")
	projector := fs.String("projector", "http://127.0.0.1:8081", "the projector's base URL (/metrics is scraped; empty: none)")
	worker := fs.String("worker", "http://127.0.0.1:8082", "the payment worker's base URL (/metrics is scraped; empty: none)")
	tokenFile := fs.String("token-file", "", "file holding an API token (else $TOKEN); needed with -load")
	load := fs.Bool("load", true, "drive the api while scraping (else only scrape)")
	loadRate := fs.Float64("rate", dashshot.DefaultLoadRate, "order journeys started per second")
	workers := fs.Int("workers", dashshot.DefaultLoadWorkers, "journeys under way at once at most")
	duration := fs.Duration("duration", 90*time.Second, "how long to drive and scrape")
	settle := fs.Duration("settle", 5*time.Second, "how long to keep scraping after the load stops")
	interval := fs.Duration("scrape-interval", dashshot.DefaultScrapeInterval, "scrape interval")
	rateInterval := fs.Duration("rate-interval", dashshot.DefaultRateInterval, "what $__rate_interval stands for")
	step := fs.Duration("step", time.Second, "resolution of the range queries ($__interval)")
	dashboardPath := fs.String("dashboard", "docs/grafana-dashboard.json", "the Grafana dashboard")
	out := fs.String("out", "docs/dashboard.png", "the PNG to write")
	width := fs.Int("width", dashshot.DefaultWidth, "the PNG's width in pixels")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}

	b, err := os.ReadFile(*dashboardPath)
	if err != nil {
		return fmt.Errorf("read dashboard: %w", err)
	}
	d, err := dashshot.ParseDashboard(b)
	if err != nil {
		return fmt.Errorf("%s: %w", *dashboardPath, err)
	}
	var c *client.Client
	if *load {
		token := strings.TrimSpace(getenv("TOKEN"))
		if *tokenFile != "" {
			tb, err := os.ReadFile(*tokenFile)
			if err != nil {
				return fmt.Errorf("read token: %w", err)
			}
			token = strings.TrimSpace(string(tb))
		}
		if c, err = client.New(*api, token); err != nil {
			return fmt.Errorf("-load: %w", err)
		}
	}
	targets := []dashshot.Target{{Job: "api", URL: strings.TrimSuffix(*api, "/") + "/metrics"}}
	for _, t := range []struct{ job, base string }{{"projector", *projector}, {"worker", *worker}} {
		if t.base != "" {
			targets = append(targets, dashshot.Target{Job: t.job, URL: strings.TrimSuffix(t.base, "/") + "/metrics"})
		}
	}

	store := dashshot.NewStore()
	scrapeCtx, stopScrape := context.WithCancel(context.WithoutCancel(ctx))
	defer stopScrape()
	type scrapeResult struct {
		stats dashshot.ScrapeStats
		err   error
	}
	scraped := make(chan scrapeResult, 1)
	start := time.Now()
	go func() {
		st, err := dashshot.Scrape(scrapeCtx, store, dashshot.ScrapeConfig{Targets: targets, Interval: *interval})
		scraped <- scrapeResult{st, err}
	}()
	fmt.Fprintf(stdout, "dashshot: scraping %d targets every %s for %s", len(targets), *interval, *duration+*settle)
	if c != nil {
		fmt.Fprintf(stdout, ", driving %s at %g journeys/s for %s", *api, *loadRate, *duration)
	}
	fmt.Fprintln(stdout)

	runCtx, cancel := context.WithTimeout(ctx, *duration)
	var ls dashshot.LoadStats
	if c != nil {
		ls, err = dashshot.Load(runCtx, c, dashshot.LoadConfig{Rate: *loadRate, Workers: *workers})
	} else {
		<-runCtx.Done()
	}
	cancel()
	if err != nil {
		return err
	}
	if ctx.Err() == nil {
		select {
		case <-time.After(*settle):
		case <-ctx.Done():
		}
	}
	stopScrape()
	sr := <-scraped
	if sr.err != nil {
		return sr.err
	}
	if ctx.Err() != nil {
		return fmt.Errorf("interrupted: %w", ctx.Err())
	}
	end := time.Now()
	series, samples := store.Len()
	fmt.Fprintf(stdout, "dashshot: %d scrapes (%d failed), %d series, %d samples\n", sr.stats.Scrapes, sr.stats.Failures, series, samples)
	if c != nil {
		fmt.Fprintf(stdout, "dashshot: %d journeys, %d calls (%d bad requests on purpose), %d unexpected failures\n", ls.Journeys, ls.Calls, ls.BadRequests, ls.Failures)
	}
	if sr.stats.Failures > sr.stats.Scrapes/10 {
		return fmt.Errorf("%d of %d scrapes failed (last: %w): the picture would have holes", sr.stats.Failures, sr.stats.Scrapes, sr.stats.LastErr)
	}
	if ls.Failures > ls.Journeys/10 {
		return fmt.Errorf("%d of %d journeys failed (last: %w): the picture would not show a healthy run", ls.Failures, ls.Journeys, ls.LastFailure)
	}

	data, err := dashshot.Evaluate(ctx, store, d, dashshot.EvalConfig{Start: start, End: end, Step: *step, RateInterval: *rateInterval})
	if err != nil {
		return err
	}
	what := "no load"
	if c != nil {
		what = fmt.Sprintf("%d order journeys at %g/s through client/", ls.Journeys, *loadRate)
	}
	img, err := dashshot.Render(data, dashshot.RenderConfig{
		Width: *width,
		Title: d.Title + "  -  " + start.UTC().Format("2006-01-02 15:04:05") + " to " + end.UTC().Format("15:04:05") + " UTC",
		Subtitle: fmt.Sprintf("Drawn by cmd/dashshot, not Grafana: a real local stack (api, projector, worker, fakepsp), %s; /metrics scraped every %s; "+
			"each panel's PromQL evaluated by Prometheus's engine, $__rate_interval = %s.", what, *interval, *rateInterval),
	})
	if err != nil {
		return err
	}
	if err := writeFile(*out, img); err != nil {
		return err
	}
	fi, err := os.Stat(*out)
	if err != nil {
		return fmt.Errorf("stat %s: %w", *out, err)
	}
	fmt.Fprintf(stdout, "dashshot: wrote %s (%dx%d, %d KB)\n", *out, img.Bounds().Dx(), img.Bounds().Dy(), fi.Size()/1024)
	return nil
}

// writeFile writes img as a PNG to path through a temporary file in the
// same folder, so a failed run leaves the old picture as it was.
func writeFile(path string, img image.Image) error {
	f, err := os.CreateTemp(filepath.Dir(path), ".dashshot-*.png")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(f.Name()) // after the rename, a no-op
	if err := dashshot.WritePNG(f, img); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Chmod(f.Name(), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
