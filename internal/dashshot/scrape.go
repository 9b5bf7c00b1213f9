package dashshot

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/textparse"
)

// Defaults of ScrapeConfig.
const (
	// DefaultScrapeInterval is how often each target is scraped.
	DefaultScrapeInterval = time.Second
	// DefaultScrapeTimeout bounds one scrape.
	DefaultScrapeTimeout = 5 * time.Second
)

// maxScrapeBytes bounds the body of one scrape.
const maxScrapeBytes = 16 << 20

// Target is a process to scrape: Job becomes the job label of its series,
// the host:port of URL (the full /metrics URL) their instance label.
type Target struct {
	Job string
	URL string
}

// ScrapeConfig holds the settings of Scrape. Zero durations take the
// defaults.
type ScrapeConfig struct {
	Targets  []Target
	Interval time.Duration
	Timeout  time.Duration
	// HTTPClient sends the scrapes; nil means http.DefaultClient (each
	// scrape is bounded by Timeout through its context).
	HTTPClient *http.Client
}

func (c *ScrapeConfig) validate() error {
	if c.Interval == 0 {
		c.Interval = DefaultScrapeInterval
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultScrapeTimeout
	}
	if c.HTTPClient == nil {
		c.HTTPClient = http.DefaultClient
	}
	switch {
	case len(c.Targets) == 0:
		return errors.New("dashshot: ScrapeConfig.Targets is empty")
	case c.Interval < 0:
		return fmt.Errorf("dashshot: ScrapeConfig.Interval must be positive, got %s", c.Interval)
	case c.Timeout < 0:
		return fmt.Errorf("dashshot: ScrapeConfig.Timeout must be positive, got %s", c.Timeout)
	}
	for _, t := range c.Targets {
		u, err := url.Parse(t.URL)
		if t.Job == "" || err != nil || u.Host == "" {
			return fmt.Errorf("dashshot: ScrapeConfig.Targets: target %q at %q needs a job and an absolute URL", t.Job, t.URL)
		}
	}
	return nil
}

// ScrapeStats counts what Scrape did.
type ScrapeStats struct {
	Scrapes, Failures, Samples int
	// LastErr is the last scrape failure, if any.
	LastErr error
}

// Scrape scrapes every target once per interval into store until ctx ends,
// as Prometheus would: one timestamp per scrape (the time it started),
// labels job and instance added, and up{job,instance} set to 1 or 0; but
// without staleness markers, so a series that vanishes (a restarted
// process) still shows for the engine's 5-minute lookback. A
// failed scrape is counted, not fatal; Scrape returns when ctx is done,
// with the counts, or at once with an error naming a bad setting.
func Scrape(ctx context.Context, store *Store, cfg ScrapeConfig) (ScrapeStats, error) {
	if err := cfg.validate(); err != nil {
		return ScrapeStats{}, err
	}
	var (
		mu    sync.Mutex
		stats ScrapeStats
		wg    sync.WaitGroup
	)
	tick := time.NewTicker(cfg.Interval)
	defer tick.Stop()
	for {
		now := time.Now()
		for _, t := range cfg.Targets {
			wg.Add(1)
			go func() {
				defer wg.Done()
				n, err := ScrapeOnce(ctx, store, cfg.HTTPClient, cfg.Timeout, t, now)
				mu.Lock()
				defer mu.Unlock()
				stats.Scrapes++
				stats.Samples += n
				if err != nil && ctx.Err() == nil {
					stats.Failures++
					stats.LastErr = err
				}
			}()
		}
		wg.Wait()
		select {
		case <-ctx.Done():
			return stats, nil
		case <-tick.C:
		}
	}
}

// ScrapeOnce scrapes target (text exposition format) into store at time
// at and returns the number of samples stored, up included. On failure it
// stores up=0 and returns the error.
func ScrapeOnce(ctx context.Context, store *Store, hc *http.Client, timeout time.Duration, target Target, at time.Time) (int, error) {
	u, err := url.Parse(target.URL)
	if err != nil {
		return 0, fmt.Errorf("scrape %s: %w", target.URL, err)
	}
	extra := labels.FromStrings("job", target.Job, "instance", u.Host)
	ts := at.UnixMilli()
	n, err := scrape(ctx, store, hc, timeout, target.URL, extra, ts)
	up := 1.0
	if err != nil {
		up = 0
	}
	b := labels.NewBuilder(extra)
	b.Set(labels.MetricName, "up")
	if store.Append(b.Labels(), ts, up) {
		n++
	}
	return n, err
}

func scrape(ctx context.Context, store *Store, hc *http.Client, timeout time.Duration, u string, extra labels.Labels, ts int64) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, fmt.Errorf("scrape %s: %w", u, err)
	}
	// The classic text format: histograms as _bucket/_sum/_count series,
	// as the dashboard's queries expect them.
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	res, err := hc.Do(req)
	if err != nil {
		return 0, fmt.Errorf("scrape %s: %w", u, err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("scrape %s: status %d", u, res.StatusCode)
	}
	body, err := io.ReadAll(io.LimitReader(res.Body, maxScrapeBytes))
	if err != nil {
		return 0, fmt.Errorf("scrape %s: read: %w", u, err)
	}
	return parseInto(store, body, res.Header.Get("Content-Type"), extra, ts)
}

// parseInto stores every series of the exposition body at ts (or at the
// sample's own timestamp, if it has one), with the labels of extra added,
// and returns how many samples it stored.
func parseInto(store *Store, body []byte, contentType string, extra labels.Labels, ts int64) (int, error) {
	p, err := textparse.New(body, contentType, false, labels.NewSymbolTable())
	if err != nil {
		return 0, fmt.Errorf("parse exposition (%s): %w", contentType, err)
	}
	n := 0
	var lset labels.Labels
	for {
		et, err := p.Next()
		if errors.Is(err, io.EOF) {
			return n, nil
		}
		if err != nil {
			return n, fmt.Errorf("parse exposition: %w", err)
		}
		if et != textparse.EntrySeries {
			continue
		}
		_, own, v := p.Series()
		p.Metric(&lset)
		b := labels.NewBuilder(lset)
		extra.Range(func(l labels.Label) { b.Set(l.Name, l.Value) })
		t := ts
		if own != nil {
			t = *own
		}
		if store.Append(b.Labels(), t, v) {
			n++
		}
	}
}
