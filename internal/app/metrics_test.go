package app_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/prometheus/promql/parser"

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

	// The dashboard imports into Grafana, its every query parses as PromQL
	// and names only metrics some process serves.
	b, err := os.ReadFile("../../docs/grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	for _, problem := range dashboardProblems(b, all) {
		t.Error("docs/grafana-dashboard.json: " + problem)
	}
}

// dashboard is the part of a Grafana dashboard JSON that an import needs.
type dashboard struct {
	Title         string `json:"title"`
	UID           string `json:"uid"`
	SchemaVersion int    `json:"schemaVersion"`
	Templating    struct {
		List []struct {
			Name  string `json:"name"`
			Type  string `json:"type"`
			Query string `json:"query"`
		} `json:"list"`
	} `json:"templating"`
	Panels []struct {
		ID         *int   `json:"id"`
		Type       string `json:"type"`
		Title      string `json:"title"`
		Datasource *struct {
			Type string `json:"type"`
			UID  string `json:"uid"`
		} `json:"datasource"`
		GridPos *struct{ H, W, X, Y int } `json:"gridPos"`
		Targets []struct {
			RefID string `json:"refId"`
			Expr  string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

// dashboardProblems checks a Grafana dashboard JSON as an import would
// need it (title, uid, schemaVersion, a Prometheus datasource variable,
// panels with unique ids, a type, a place on the 24-column grid and
// queries with unique refIds on that datasource), parses every query with
// Prometheus's own PromQL parser, and names each metric a query selects
// that served (the metric names the processes expose) lacks.
func dashboardProblems(b []byte, served map[string]bool) []string {
	var out []string
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		return []string{"not JSON: " + err.Error()}
	}
	if d.Title == "" || d.UID == "" || len(d.UID) > 40 || d.SchemaVersion < 30 {
		out = append(out, fmt.Sprintf("title %q, uid %q, schemaVersion %d: want a title, a uid of 1–40 characters and schemaVersion ≥ 30", d.Title, d.UID, d.SchemaVersion))
	}
	hasDatasource := false
	for _, v := range d.Templating.List {
		hasDatasource = hasDatasource || v.Name == "datasource" && v.Type == "datasource" && v.Query == "prometheus"
	}
	if !hasDatasource {
		out = append(out, `no templating variable "datasource" of type datasource querying prometheus`)
	}
	ids := map[int]bool{}
	queries := 0
	for i, p := range d.Panels {
		name := fmt.Sprintf("panel %d %q", i, p.Title)
		switch {
		case p.ID == nil || *p.ID <= 0 || ids[*p.ID]:
			out = append(out, name+": missing, non-positive or repeated id")
		case p.Type == "" || p.Title == "":
			out = append(out, name+": no type or title")
		case p.GridPos == nil || p.GridPos.W <= 0 || p.GridPos.H <= 0 || p.GridPos.X < 0 || p.GridPos.Y < 0 || p.GridPos.X+p.GridPos.W > 24:
			out = append(out, name+": gridPos missing or off the 24-column grid")
		}
		if p.ID != nil {
			ids[*p.ID] = true
		}
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || p.Datasource.Type != "prometheus" || p.Datasource.UID != "${datasource}" {
			out = append(out, name+`: datasource is not {"type":"prometheus","uid":"${datasource}"}`)
		}
		if len(p.Targets) == 0 {
			out = append(out, name+": no query")
		}
		refs := map[string]bool{}
		for _, target := range p.Targets {
			queries++
			if target.RefID == "" || refs[target.RefID] {
				out = append(out, fmt.Sprintf("%s: query %q has a missing or repeated refId", name, target.Expr))
			}
			refs[target.RefID] = true
			// Grafana substitutes its range variables before Prometheus sees
			// the query.
			expr := strings.NewReplacer("$__rate_interval", "1m", "$__interval", "15s", "$__range", "1h").Replace(target.Expr)
			parsed, err := parser.ParseExpr(expr)
			if err != nil {
				out = append(out, fmt.Sprintf("%s: %q does not parse: %v", name, target.Expr, err))
				continue
			}
			metrics := 0
			parser.Inspect(parsed, func(n parser.Node, _ []parser.Node) error {
				vs, ok := n.(*parser.VectorSelector)
				if !ok {
					return nil
				}
				metrics++
				if !served[vs.Name] {
					out = append(out, fmt.Sprintf("%s: %q selects %s, which no process serves", name, target.Expr, vs.Name))
				}
				return nil
			})
			if metrics == 0 {
				out = append(out, fmt.Sprintf("%s: %q selects no metric", name, target.Expr))
			}
		}
	}
	if queries < 5 {
		out = append(out, fmt.Sprintf("%d queries, want at least 5", queries))
	}
	return out
}

// The dashboard check catches what would break an import or a panel: a
// query that is not PromQL, a metric no process serves, a panel without a
// place or a datasource, a missing uid. It needs no stack: the served
// names are given.
func TestDashboardProblemsCatchBrokenDashboards(t *testing.T) {
	t.Parallel()
	served := map[string]bool{"orders_http_requests_total": true}
	good := `{"title":"t","uid":"u","schemaVersion":39,
		"templating":{"list":[{"name":"datasource","type":"datasource","query":"prometheus"}]},
		"panels":[{"id":1,"type":"timeseries","title":"p","gridPos":{"h":8,"w":12,"x":0,"y":0},
			"datasource":{"type":"prometheus","uid":"${datasource}"},
			"targets":[%s]}]}`
	q := func(expr string) string { return `{"refId":"A","expr":` + strconv.Quote(expr) + `}` }
	ok := strings.Repeat(q("sum(rate(orders_http_requests_total[$__rate_interval]))")+",", 4) + q("orders_http_requests_total")
	p := dashboardProblems([]byte(fmt.Sprintf(good, ok)), served)
	if len(p) == 0 {
		t.Fatal("repeated refIds: no problem found")
	}
	for _, problem := range p {
		if !strings.Contains(problem, "repeated refId") {
			t.Fatalf("repeated refIds: %q; want only that problem", p)
		}
	}
	distinct := func(exprs ...string) string {
		var ts []string
		for i, e := range exprs {
			ts = append(ts, `{"refId":"`+string(rune('A'+i))+`","expr":`+strconv.Quote(e)+`}`)
		}
		return strings.Join(ts, ",")
	}
	five := []string{"orders_http_requests_total", "orders_http_requests_total", "orders_http_requests_total", "orders_http_requests_total"}
	if p := dashboardProblems([]byte(fmt.Sprintf(good, distinct(append(five, "sum(rate(orders_http_requests_total[$__rate_interval]))")...))), served); len(p) != 0 {
		t.Fatalf("a good dashboard: %q", p)
	}
	for _, tc := range []struct{ name, json, want string }{
		{"bad PromQL", fmt.Sprintf(good, distinct(append(five, "sum(rate(orders_http_requests_total[5m])")...)), "does not parse"},
		{"unserved metric", fmt.Sprintf(good, distinct(append(five, "rate(orders_no_such_total[1m])")...)), "orders_no_such_total, which no process serves"},
		{"no uid", strings.Replace(fmt.Sprintf(good, distinct(append(five, "up")...)), `"uid":"u",`, "", 1), "uid"},
		{"no gridPos", strings.Replace(fmt.Sprintf(good, distinct(five...)), `"gridPos":{"h":8,"w":12,"x":0,"y":0},`, "", 1), "gridPos"},
		{"no datasource variable", strings.Replace(fmt.Sprintf(good, distinct(five...)), `"type":"datasource"`, `"type":"custom"`, 1), "templating"},
		{"not JSON", "{", "not JSON"},
	} {
		p := dashboardProblems([]byte(tc.json), served)
		if !strings.Contains(strings.Join(p, "\n"), tc.want) {
			t.Errorf("%s: problems %q; want one saying %q", tc.name, p, tc.want)
		}
	}
}
