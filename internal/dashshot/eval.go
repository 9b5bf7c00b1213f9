package dashshot

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/storage"
)

// Dashboard is the part of a Grafana dashboard JSON that rendering needs.
type Dashboard struct {
	Title  string  `json:"title"`
	Panels []Panel `json:"panels"`
}

// Panel is one panel of a Dashboard.
type Panel struct {
	ID      int     `json:"id"`
	Type    string  `json:"type"` // timeseries, stat, row, …
	Title   string  `json:"title"`
	GridPos GridPos `json:"gridPos"`
	Targets []struct {
		RefID        string `json:"refId"`
		Expr         string `json:"expr"`
		LegendFormat string `json:"legendFormat"`
	} `json:"targets"`
	FieldConfig struct {
		Defaults struct {
			Unit string `json:"unit"`
		} `json:"defaults"`
	} `json:"fieldConfig"`
}

// GridPos places a panel on Grafana's grid: 24 columns, rows of a fixed
// height.
type GridPos struct {
	H int `json:"h"`
	W int `json:"w"`
	X int `json:"x"`
	Y int `json:"y"`
}

// ParseDashboard decodes a Grafana dashboard JSON and checks that every
// panel sits on the 24-column grid.
func ParseDashboard(b []byte) (*Dashboard, error) {
	var d Dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, fmt.Errorf("decode dashboard: %w", err)
	}
	if len(d.Panels) == 0 {
		return nil, errors.New("decode dashboard: no panels")
	}
	for _, p := range d.Panels {
		g := p.GridPos
		if g.W <= 0 || g.H <= 0 || g.X < 0 || g.Y < 0 || g.X+g.W > 24 {
			return nil, fmt.Errorf("decode dashboard: panel %q: gridPos %+v is off the 24-column grid", p.Title, g)
		}
	}
	return &d, nil
}

// Defaults of EvalConfig.
const (
	// DefaultRateInterval stands for Grafana's $__rate_interval: with a
	// 1 s scrape interval, Grafana would pick max(4 × 1 s, step + 1 s); a
	// longer window smooths the lines of a short run, at the price of a
	// ramp that long where a series starts.
	DefaultRateInterval = 15 * time.Second
	// DefaultMaxSeriesPerPanel bounds the series drawn in one panel (the
	// first ones by legend order are kept).
	DefaultMaxSeriesPerPanel = 12
)

// EvalConfig holds the settings of Evaluate.
type EvalConfig struct {
	// Start and End bound the range evaluated; Step is the resolution
	// (Grafana's $__interval).
	Start, End time.Time
	Step       time.Duration
	// RateInterval replaces $__rate_interval; zero means
	// DefaultRateInterval.
	RateInterval time.Duration
	// MaxSeriesPerPanel; zero means DefaultMaxSeriesPerPanel.
	MaxSeriesPerPanel int
}

func (c *EvalConfig) validate() error {
	if c.RateInterval == 0 {
		c.RateInterval = DefaultRateInterval
	}
	if c.MaxSeriesPerPanel == 0 {
		c.MaxSeriesPerPanel = DefaultMaxSeriesPerPanel
	}
	switch {
	case !c.End.After(c.Start):
		return fmt.Errorf("dashshot: EvalConfig.End (%s) must be after Start (%s)", c.End, c.Start)
	case c.Step <= 0:
		return fmt.Errorf("dashshot: EvalConfig.Step must be positive, got %s", c.Step)
	case c.RateInterval < 0:
		return fmt.Errorf("dashshot: EvalConfig.RateInterval must be positive, got %s", c.RateInterval)
	case c.MaxSeriesPerPanel < 0:
		return fmt.Errorf("dashshot: EvalConfig.MaxSeriesPerPanel must be positive, got %d", c.MaxSeriesPerPanel)
	}
	return nil
}

// Point is one value of a series at T (milliseconds since the epoch).
type Point struct {
	T int64
	V float64
}

// Series is one line of a panel: its legend and its points (a missing
// step has no point).
type Series struct {
	Legend string
	Points []Point
}

// PanelData is what a panel shows: its series over [Start, End].
type PanelData struct {
	Panel      Panel
	Series     []Series
	Start, End time.Time
	// Dropped counts the series left out beyond MaxSeriesPerPanel.
	Dropped int
}

// Evaluate runs every query of every panel of d (rows excepted) as a range
// query over q with Prometheus's PromQL engine, after substituting
// Grafana's variables ($__rate_interval, $__interval, $__range and their
// _ms forms), and names each series by its target's legendFormat. A query
// that does not parse or fails returns an error naming the panel.
func Evaluate(ctx context.Context, q storage.Queryable, d *Dashboard, cfg EvalConfig) ([]PanelData, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	engine := promql.NewEngine(promql.EngineOpts{
		MaxSamples:    50_000_000,
		Timeout:       time.Minute,
		LookbackDelta: 5 * time.Minute,
	})
	vars := strings.NewReplacer(
		"$__rate_interval", model.Duration(cfg.RateInterval).String(),
		"${__rate_interval}", model.Duration(cfg.RateInterval).String(),
		"$__interval_ms", fmt.Sprint(cfg.Step.Milliseconds()),
		"$__interval", model.Duration(cfg.Step).String(),
		"${__interval}", model.Duration(cfg.Step).String(),
		"$__range_ms", fmt.Sprint(cfg.End.Sub(cfg.Start).Milliseconds()),
		"$__range", model.Duration(cfg.End.Sub(cfg.Start)).String(),
		"${__range}", model.Duration(cfg.End.Sub(cfg.Start)).String(),
	)
	var out []PanelData
	for _, p := range d.Panels {
		if p.Type == "row" {
			continue
		}
		pd := PanelData{Panel: p, Start: cfg.Start, End: cfg.End}
		for _, t := range p.Targets {
			expr := vars.Replace(t.Expr)
			err := rangeQuery(ctx, engine, q, expr, cfg, func(s promql.Series) {
				pd.Series = append(pd.Series, Series{Legend: legend(t.LegendFormat, s.Metric), Points: points(s)})
			})
			if err != nil {
				return nil, fmt.Errorf("panel %q, query %s: %w", p.Title, t.RefID, err)
			}
		}
		if n := len(pd.Series); n > cfg.MaxSeriesPerPanel {
			pd.Dropped = n - cfg.MaxSeriesPerPanel
			pd.Series = pd.Series[:cfg.MaxSeriesPerPanel]
		}
		out = append(out, pd)
	}
	return out, nil
}

// rangeQuery evaluates expr over cfg's range and hands each result series,
// in label order, to each. The series are only valid inside each: the
// engine returns their points to its pool when the query is closed (read
// after Close, they raced with the next query's evaluation).
func rangeQuery(ctx context.Context, engine *promql.Engine, q storage.Queryable, expr string, cfg EvalConfig, each func(promql.Series)) error {
	qry, err := engine.NewRangeQuery(ctx, q, nil, expr, cfg.Start, cfg.End, cfg.Step)
	if err != nil {
		return fmt.Errorf("%q: %w", expr, err)
	}
	defer qry.Close()
	res := qry.Exec(ctx)
	if res.Err != nil {
		return fmt.Errorf("%q: %w", expr, res.Err)
	}
	m, err := res.Matrix()
	if err != nil {
		return fmt.Errorf("%q: %w", expr, err)
	}
	sort.Slice(m, func(i, j int) bool { return labels.Compare(m[i].Metric, m[j].Metric) < 0 })
	for _, s := range m {
		each(s)
	}
	return nil
}

func points(s promql.Series) []Point {
	out := make([]Point, 0, len(s.Floats))
	for _, f := range s.Floats {
		if math.IsNaN(f.F) || math.IsInf(f.F, 0) {
			continue
		}
		out = append(out, Point{T: f.T, V: f.F})
	}
	return out
}

var legendVar = regexp.MustCompile(`\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}`)

// legend renders a Grafana legendFormat ({{label}} replaced by the
// series' value of label); an empty format gives the series' labels, as
// Grafana shows them.
func legend(format string, lset labels.Labels) string {
	if strings.TrimSpace(format) == "" || format == "__auto" {
		if lset.IsEmpty() {
			return "value"
		}
		return lset.String()
	}
	s := legendVar.ReplaceAllStringFunc(format, func(m string) string {
		return lset.Get(legendVar.FindStringSubmatch(m)[1])
	})
	return strings.Join(strings.Fields(s), " ")
}
