package app_test

import (
	"bufio"
	"encoding/json"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/acme/orders/fakepsp"
	"github.com/acme/orders/fakepsp/fakepsptest"
	"github.com/acme/orders/internal/app"
	"github.com/acme/orders/internal/testenv"
)

// exposition scrapes base/metrics and returns every series ("name{labels}"
// as served) with its value, and the set of series names.
func exposition(t *testing.T, base string) (series map[string]float64, names map[string]bool) {
	t.Helper()
	res, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("GET %s/metrics: %d", base, res.StatusCode)
	}
	series, names = map[string]float64{}, map[string]bool{}
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		sp := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[sp+1:], 64)
		if err != nil {
			t.Fatalf("%s/metrics: unparsable line %q", base, line)
		}
		series[line[:sp]] = v
		names[line[:strings.IndexAny(line, "{ ")]] = true
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return series, names
}

// After a few requests, each process's /metrics shows its latency and delay
// histograms with non-zero counts (the HTTP ones by route template, method
// and status), beside the Go runtime and process collectors; and every
// metric the Grafana dashboard queries is one of those served.
func TestScrapeShowsHistogramsAndTheDashboardMatches(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	_, hs := fakepsptest.Start(t, fakepsptest.DatabaseURL(t), fakepsp.Config{})
	env["PAYMENT_PROVIDER_URL"], env["PAYMENT_PROVIDER_KEY"] = hs.URL, fakepsptest.SecretKey
	api := start(t, "api", app.RunAPI, env)
	projector := start(t, "projector", app.RunProjector, env)
	worker := start(t, "worker", app.RunWorker, env)
	token := newToken(t, env, "acme")
	waitReady(t, worker)

	created := call(t, http.MethodPost, api+"/v1/orders", token, "m-1", orderBody("c-m"))
	if created.status != http.StatusCreated {
		t.Fatalf("create: %d %s", created.status, created.body)
	}
	location := created.header.Get("Location")
	if paying := call(t, http.MethodPost, api+location+"/pay", token, "m-pay", ""); paying.status != http.StatusAccepted {
		t.Fatalf("pay: %d %s", paying.status, paying.body)
	}
	if paid := getWaiting(t, api+location+"?min_version=3", token); paid.status != http.StatusOK {
		t.Fatalf("GET ?min_version=3: %d %s", paid.status, paid.body)
	}
	if nf := call(t, http.MethodGet, api+"/v1/no-such-thing/"+strings.Repeat("x", 40), token, "", ""); nf.status != http.StatusNotFound {
		t.Fatalf("GET an unknown path: %d", nf.status)
	}

	all := map[string]bool{}
	check := func(base string, want map[string]bool) {
		t.Helper()
		var series map[string]float64
		var names map[string]bool
		testenv.Eventually(t, 10*time.Second, base+"/metrics shows every histogram with a non-zero count", func() bool {
			series, names = exposition(t, base)
			for s, nonZero := range want {
				if v, ok := series[s]; !ok || nonZero && v == 0 {
					return false
				}
			}
			return true
		})
		for n := range names {
			all[n] = true
		}
		for s := range series {
			if strings.Contains(s, "no-such-thing") {
				t.Errorf("%s/metrics has a series named after an unknown path: %s", base, s)
			}
		}
	}
	check(api, map[string]bool{
		`orders_http_requests_total{method="POST",route="/v1/orders",status="201"}`:               true,
		`orders_http_requests_total{method="GET",route="/v1/orders/{id}",status="200"}`:           true,
		`orders_http_requests_total{method="GET",route="unmatched",status="404"}`:                 true,
		`orders_http_request_duration_seconds_count{method="POST",route="/v1/orders"}`:            true,
		`orders_http_request_duration_seconds_bucket{method="POST",route="/v1/orders",le="+Inf"}`: true,
		`orders_http_request_duration_seconds_count{method="POST",route="/v1/orders/{id}/pay"}`:   true,
		`orders_relay_publish_seconds_count`:                                                      true,
		`orders_relay_commit_to_published_seconds_count`:                                          true,
		`orders_idempotency_wait_seconds_count`:                                                   false,
		`orders_idempotency_keys_created_total`:                                                   true,
		`orders_outbox_backlog_events`:                                                            false,
		`go_goroutines`:                                                                           true,
		`process_resident_memory_bytes`:                                                           true,
	})
	check(projector, map[string]bool{
		`orders_projection_commit_to_applied_seconds_count{projection="order_views"}`: true,
		`orders_projection_batch_events_count{projection="customer_summaries"}`:       true,
		`orders_projection_batch_duration_seconds_count{projection="daily_sales"}`:    true,
		`orders_projection_events_applied_total{projection="order_views"}`:            true,
		`orders_projection_pending_events{projection="order_views"}`:                  false,
		`go_goroutines`: true,
	})
	check(worker, map[string]bool{
		`orders_payment_charges_total{outcome="succeeded"}`: true,
		`go_goroutines`: true,
	})

	// The dashboard is Grafana JSON whose every query names served metrics.
	b, err := os.ReadFile("../../docs/grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Title  string
		Panels []struct {
			Title   string
			Type    string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("docs/grafana-dashboard.json: %v", err)
	}
	metricName := regexp.MustCompile(`\b(?:orders|go|process)_[a-zA-Z0-9_:]*`)
	exprs := 0
	for _, p := range dash.Panels {
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, target := range p.Targets {
			exprs++
			found := metricName.FindAllString(target.Expr, -1)
			if len(found) == 0 {
				t.Errorf("panel %q: %q names no metric of ours", p.Title, target.Expr)
			}
			for _, n := range found {
				if !all[n] {
					t.Errorf("panel %q: %q queries %s, which no process serves", p.Title, target.Expr, n)
				}
			}
		}
	}
	if dash.Title == "" || exprs < 5 {
		t.Errorf("the dashboard has title %q and %d queries, want a title and at least 5", dash.Title, exprs)
	}
}
