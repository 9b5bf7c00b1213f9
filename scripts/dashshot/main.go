// Command dashshot makes docs/dashboard.png from a real run (make
// dashboard-png drives it; it is a doc tool, not part of the service):
//
//	dashshot load   -api URL -token T -duration 90s   puts orders load on an api through package client
//	dashshot render -prom URL -start T -end T -out F  evaluates every panel of docs/grafana-dashboard.json
//	                                                  over [start, end] with Prometheus's query_range API
//	                                                  and writes the panels, in the dashboard's grid, as HTML
//	dashshot shrink -in F -out F                      re-encodes a screenshot with a 256-colour palette
//
// The HTML (inline SVG, no scripts) is then screenshot by headless
// Chromium.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"math"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/acme/orders/client"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: dashshot load|render|shrink [flags]")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	var err error
	switch os.Args[1] {
	case "load":
		err = load(ctx, os.Args[2:])
	case "render":
		err = render(ctx, os.Args[2:])
	case "shrink":
		err = shrink(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q (load, render or shrink)", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "dashshot:", err)
		os.Exit(1)
	}
}

// load runs workers that create orders, pay most of them (one in eight with
// the declining card), read them back (WaitForVersion), ship or cancel
// some, list and read summaries, with a pause between steps so that the
// load stays light on a shared machine.
func load(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("load", flag.ExitOnError)
	api := fs.String("api", "", "api base URL")
	token := fs.String("token", "", "bearer token")
	duration := fs.Duration("duration", 90*time.Second, "how long to load")
	workers := fs.Int("workers", 4, "concurrent workers")
	pause := fs.Duration("pause", 40*time.Millisecond, "pause between a worker's calls")
	_ = fs.Parse(args)
	c, err := client.New(*api, *token, client.WithMaxAttempts(4))
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, *duration)
	defer cancel()
	var calls, failed atomic.Int64
	note := func(err error) {
		calls.Add(1)
		if err != nil && client.AsProblem(err) == nil && ctx.Err() == nil {
			failed.Add(1) // a refusal is part of the load; a transport failure is not
			fmt.Fprintln(os.Stderr, "dashshot load:", err)
		}
	}
	var wg sync.WaitGroup
	for w := range *workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			sleep := func() {
				select {
				case <-ctx.Done():
				case <-time.After(*pause):
				}
			}
			for n := 0; ctx.Err() == nil; n++ {
				customer := fmt.Sprintf("c-%d-%d", w, rng.IntN(20))
				o, err := c.CreateOrder(ctx, client.NewOrder{CustomerID: customer, Currency: []string{"EUR", "USD"}[rng.IntN(2)],
					Items: []client.NewItem{{SKU: fmt.Sprintf("sku-%d", rng.IntN(50)), Quantity: 1 + rng.Int64N(3), UnitPrice: 100 + rng.Int64N(5000)}}})
				note(err)
				if err != nil {
					sleep()
					continue
				}
				sleep()
				if rng.IntN(10) == 0 { // a refusal: only a paid order ships
					_, err = c.ShipOrder(ctx, o.ID)
					note(err)
				}
				if rng.IntN(5) == 0 {
					_, err = c.CancelOrder(ctx, o.ID, "changed my mind")
					note(err)
					continue
				}
				method := ""
				if rng.IntN(8) == 0 {
					method = "pm_card_chargeDeclined"
				}
				paying, err := c.PayOrder(ctx, o.ID, method)
				note(err)
				if err != nil {
					continue
				}
				wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
				got, err := c.WaitForVersion(wctx, o.ID, paying.Version+1)
				wcancel()
				note(err)
				sleep()
				if err == nil && got.Status == "paid" {
					switch rng.IntN(3) {
					case 0:
						_, err = c.ShipOrder(ctx, o.ID)
						note(err)
					case 1:
						_, err = c.CancelOrder(ctx, o.ID, "refund please")
						note(err)
					}
				}
				if n%5 == 0 {
					_, err = c.ListOrders(ctx, client.ListOptions{CustomerID: customer, Limit: 10})
					note(err)
					_, err = c.CustomerSummary(ctx, customer, nil)
					note(err)
				}
				sleep()
			}
		}()
	}
	wg.Wait()
	fmt.Fprintf(os.Stderr, "dashshot load: %d calls, %d failed without an answer\n", calls.Load(), failed.Load())
	if n := failed.Load(); n > calls.Load()/100 {
		return fmt.Errorf("%d of %d calls failed without an answer", n, calls.Load())
	}
	return nil
}

// dashboard is the part of the Grafana JSON model rendered.
type dashboard struct {
	Title  string  `json:"title"`
	Panels []panel `json:"panels"`
}

type panel struct {
	ID          int    `json:"id"`
	Title       string `json:"title"`
	Type        string `json:"type"`
	GridPos     struct{ H, W, X, Y int }
	FieldConfig struct {
		Defaults struct {
			Unit string `json:"unit"`
		} `json:"defaults"`
		Overrides []struct {
			Matcher struct {
				ID      string `json:"id"`
				Options string `json:"options"`
			} `json:"matcher"`
			Properties []struct {
				ID    string `json:"id"`
				Value any    `json:"value"`
			} `json:"properties"`
		} `json:"overrides"`
	} `json:"fieldConfig"`
	Targets []struct {
		RefID        string `json:"refId"`
		Expr         string `json:"expr"`
		LegendFormat string `json:"legendFormat"`
	} `json:"targets"`
}

// axis returns the unit of the target refID and whether it is drawn on
// the right axis (a byFrameRefID override), as Grafana would.
func (p panel) axis(refID string) (unit string, right bool) {
	unit = p.FieldConfig.Defaults.Unit
	for _, o := range p.FieldConfig.Overrides {
		if o.Matcher.ID != "byFrameRefID" || o.Matcher.Options != refID {
			continue
		}
		for _, prop := range o.Properties {
			switch prop.ID {
			case "unit":
				unit, _ = prop.Value.(string)
			case "custom.axisPlacement":
				right = prop.Value == "right"
			}
		}
	}
	return unit, right
}

// series is one line of a panel.
type series struct {
	name   string
	unit   string
	right  bool         // on the right axis
	points [][2]float64 // unix seconds, value
}

func render(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("render", flag.ExitOnError)
	prom := fs.String("prom", "", "Prometheus base URL")
	dashPath := fs.String("dashboard", "docs/grafana-dashboard.json", "Grafana dashboard JSON")
	startS := fs.String("start", "", "start (unix seconds)")
	endS := fs.String("end", "", "end (unix seconds)")
	step := fs.Duration("step", 2*time.Second, "query step")
	rateInterval := fs.String("rate-interval", "10s", "what $__rate_interval stands for (4 scrape intervals)")
	width := fs.Int("width", 1600, "page width in pixels")
	out := fs.String("out", "", "HTML file to write")
	_ = fs.Parse(args)
	b, err := os.ReadFile(*dashPath)
	if err != nil {
		return err
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		return fmt.Errorf("%s: %w", *dashPath, err)
	}
	start, err1 := strconv.ParseFloat(*startS, 64)
	end, err2 := strconv.ParseFloat(*endS, 64)
	if err := errors.Join(err1, err2); err != nil || end <= start {
		return fmt.Errorf("-start and -end must be unix seconds, start before end: %v", err)
	}
	vars := strings.NewReplacer("$__rate_interval", *rateInterval, "$__interval", step.String())
	var html strings.Builder
	col := float64(*width-16) / 24
	const rowH = 30.0
	maxY := 0
	for _, p := range d.Panels {
		maxY = max(maxY, p.GridPos.Y+p.GridPos.H)
	}
	fmt.Fprintf(&html, `<!doctype html><html><head><meta charset="utf-8"><style>
body{margin:0;background:#111217;font-family:Inter,Helvetica,Arial,sans-serif;color:#ccccdc}
h1{font-size:16px;font-weight:500;margin:0;padding:10px 12px;height:20px}
.p{position:absolute;background:#181b1f;border:1px solid #2c3235;border-radius:3px;box-sizing:border-box;overflow:hidden}
.t{font-size:12px;font-weight:500;padding:5px 8px;white-space:nowrap}
svg text{fill:#9fa7b3;font-size:10px}
</style></head><body style="width:%dpx;height:%dpx;position:relative">
<h1>%s — %s to %s UTC (a real run: make dashboard-png)</h1>
`, *width, int(float64(maxY)*rowH)+48, escape(d.Title),
		time.Unix(int64(start), 0).UTC().Format("2006-01-02 15:04:05"), time.Unix(int64(end), 0).UTC().Format("15:04:05"))
	for _, p := range d.Panels {
		var lines []series
		for _, t := range p.Targets {
			got, err := queryRange(ctx, *prom, vars.Replace(t.Expr), start, end, *step)
			if err != nil {
				return fmt.Errorf("panel %q: %w", p.Title, err)
			}
			unit, right := p.axis(t.RefID)
			for _, s := range got {
				s.name, s.unit, s.right = legend(t.LegendFormat, s.name), unit, right
				lines = append(lines, s)
			}
		}
		x, y := 8+float64(p.GridPos.X)*col, 40+float64(p.GridPos.Y)*rowH
		w, h := float64(p.GridPos.W)*col-6, float64(p.GridPos.H)*rowH-6
		fmt.Fprintf(&html, `<div class="p" style="left:%.0fpx;top:%.0fpx;width:%.0fpx;height:%.0fpx"><div class="t">%s</div>%s</div>`+"\n",
			x, y, w, h, escape(p.Title), chart(lines, w, h-24, start, end))
	}
	html.WriteString("</body></html>\n")
	return os.WriteFile(*out, []byte(html.String()), 0o644)
}

// queryRange evaluates expr over [start, end]; each series' name is its
// labels as JSON (legend fills them in).
func queryRange(ctx context.Context, prom, expr string, start, end float64, step time.Duration) ([]series, error) {
	q := url.Values{"query": {expr}, "start": {strconv.FormatFloat(start, 'f', 3, 64)},
		"end": {strconv.FormatFloat(end, 'f', 3, 64)}, "step": {strconv.FormatFloat(step.Seconds(), 'f', 3, 64)}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, prom+"/api/v1/query_range?"+q.Encode(), nil)
	if err != nil {
		return nil, err
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("query_range %q: %w", expr, err)
	}
	defer res.Body.Close()
	var body struct {
		Status, Error string
		Data          struct {
			Result []struct {
				Metric map[string]string `json:"metric"`
				Values [][2]any          `json:"values"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(res.Body).Decode(&body); err != nil {
		return nil, fmt.Errorf("query_range %q: %d: %w", expr, res.StatusCode, err)
	}
	if body.Status != "success" {
		return nil, fmt.Errorf("query_range %q: %s", expr, body.Error)
	}
	var out []series
	for _, r := range body.Data.Result {
		labels, _ := json.Marshal(r.Metric)
		s := series{name: string(labels)}
		for _, v := range r.Values {
			t, _ := v[0].(float64)
			f, err := strconv.ParseFloat(fmt.Sprint(v[1]), 64)
			if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
				continue
			}
			s.points = append(s.points, [2]float64{t, f})
		}
		if len(s.points) > 0 {
			out = append(out, s)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out, nil
}

var legendVar = regexp.MustCompile(`\{\{\s*(\w+)\s*\}\}`)

// legend fills in a Grafana legendFormat with a series' labels (JSON).
func legend(format, labelsJSON string) string {
	var labels map[string]string
	_ = json.Unmarshal([]byte(labelsJSON), &labels)
	if format == "" {
		return labelsJSON
	}
	return strings.TrimSpace(legendVar.ReplaceAllStringFunc(format, func(m string) string {
		return labels[legendVar.FindStringSubmatch(m)[1]]
	}))
}

// palette is Grafana's classic series palette.
var palette = []string{"#73bf69", "#f2cc0c", "#5794f2", "#ff780a", "#f2495c", "#b877d9", "#8ab8ff", "#37872d", "#fade2a", "#ff9830", "#96d98d", "#ca95e5"}

// chart renders lines as an SVG time series of w×h pixels with a legend
// (last and max per series) below; series on the right axis have their own
// scale and unit.
func chart(lines []series, w, h, start, end float64) string {
	const left, right, bottom = 52.0, 52.0, 16.0
	legendRows := min(len(lines), 6)
	plotH := h - bottom - float64(legendRows)*13 - 4
	plotW := w - left - right
	var b strings.Builder
	fmt.Fprintf(&b, `<svg width="%.0f" height="%.0f" xmlns="http://www.w3.org/2000/svg">`, w, h)
	if len(lines) == 0 {
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" text-anchor="middle">No data</text></svg>`, w/2, h/2)
		return b.String()
	}
	top := map[bool]float64{}
	unit := map[bool]string{}
	used := map[bool]bool{}
	for _, s := range lines {
		used[s.right], unit[s.right] = true, s.unit
		for _, p := range s.points {
			top[s.right] = max(top[s.right], p[1])
		}
	}
	for side := range top {
		if top[side] == 0 {
			top[side] = 1
		}
		top[side] = niceCeil(top[side])
	}
	px := func(t float64) float64 { return left + (t-start)/(end-start)*plotW }
	py := func(v float64, side bool) float64 { return 4 + plotH - v/top[side]*plotH }
	for i := 0; i <= 4; i++ {
		for _, side := range []bool{false, true} {
			if !used[side] {
				continue
			}
			v := top[side] * float64(i) / 4
			if side {
				fmt.Fprintf(&b, `<text x="%.0f" y="%.1f" text-anchor="start">%s</text>`, left+plotW+4, py(v, side)+3, format(v, unit[side]))
				continue
			}
			fmt.Fprintf(&b, `<text x="%.0f" y="%.1f" text-anchor="end">%s</text>`, left-4, py(v, side)+3, format(v, unit[side]))
		}
		y := 4 + plotH - plotH*float64(i)/4
		fmt.Fprintf(&b, `<line x1="%.0f" x2="%.0f" y1="%.1f" y2="%.1f" stroke="#2c3235"/>`, left, left+plotW, y, y)
	}
	for i := 0; i <= 4; i++ {
		t := start + (end-start)*float64(i)/4
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" text-anchor="middle">%s</text>`, px(t), 4+plotH+12, time.Unix(int64(t), 0).UTC().Format("15:04:05"))
	}
	for i, s := range lines {
		color := palette[i%len(palette)]
		var path strings.Builder
		for j, p := range s.points {
			cmd := "L"
			if j == 0 {
				cmd = "M"
			}
			fmt.Fprintf(&path, "%s%.1f %.1f", cmd, px(p[0]), py(p[1], s.right))
		}
		dash := ""
		if s.right {
			dash = ` stroke-dasharray="5 2"`
		}
		fmt.Fprintf(&b, `<path d="%s" fill="none" stroke="%s" stroke-width="1.5"%s/>`, path.String(), color, dash)
	}
	for i, s := range lines[:legendRows] {
		last, peak := s.points[len(s.points)-1][1], 0.0
		for _, p := range s.points {
			peak = max(peak, p[1])
		}
		y := 4 + plotH + bottom + 10 + float64(i)*13
		name := s.name
		if s.right {
			name += " (right axis, dashed)"
		}
		if i == legendRows-1 && len(lines) > legendRows {
			name += fmt.Sprintf("  (+%d more series)", len(lines)-legendRows)
		}
		fmt.Fprintf(&b, `<rect x="%.0f" y="%.0f" width="10" height="3" fill="%s"/><text x="%.0f" y="%.0f">%s  ·  last %s  ·  max %s</text>`,
			left-36, y-4, palette[i%len(palette)], left-20, y, escape(name), format(last, s.unit), format(peak, s.unit))
	}
	b.WriteString("</svg>")
	return b.String()
}

// niceCeil rounds v up to 1, 2 or 5 × a power of ten.
func niceCeil(v float64) float64 {
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}

// format writes v in a Grafana unit: s, reqps, ops, short.
func format(v float64, unit string) string {
	switch unit {
	case "s":
		switch {
		case v == 0:
			return "0"
		case v < 0.001:
			return strconv.FormatFloat(v*1e6, 'f', 0, 64) + " µs"
		case v < 1:
			return strconv.FormatFloat(v*1e3, 'g', 3, 64) + " ms"
		}
		return strconv.FormatFloat(v, 'g', 3, 64) + " s"
	case "reqps":
		return short(v) + " req/s"
	case "ops":
		return short(v) + " ops/s"
	}
	return short(v)
}

func short(v float64) string {
	switch {
	case math.Abs(v) >= 1e6:
		return strconv.FormatFloat(v/1e6, 'g', 3, 64) + "M"
	case math.Abs(v) >= 1e3:
		return strconv.FormatFloat(v/1e3, 'g', 3, 64) + "k"
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}

func escape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;").Replace(s)
}

// shrink re-encodes a PNG with a palette of its 256 most frequent colours
// (each other colour becomes the nearest of them): a flat dark dashboard
// has few colours beyond the anti-aliasing, and the file gets ~3× smaller.
func shrink(args []string) error {
	fs := flag.NewFlagSet("shrink", flag.ExitOnError)
	in := fs.String("in", "", "PNG to read")
	out := fs.String("out", "", "PNG to write")
	_ = fs.Parse(args)
	f, err := os.Open(*in)
	if err != nil {
		return err
	}
	img, err := png.Decode(f)
	f.Close()
	if err != nil {
		return fmt.Errorf("%s: %w", *in, err)
	}
	bounds := img.Bounds()
	counts := map[color.RGBA]int{}
	for y := bounds.Min.Y; y < bounds.Max.Y; y++ {
		for x := bounds.Min.X; x < bounds.Max.X; x++ {
			counts[color.RGBAModel.Convert(img.At(x, y)).(color.RGBA)]++
		}
	}
	colors := make([]color.RGBA, 0, len(counts))
	for c := range counts {
		colors = append(colors, c)
	}
	sort.Slice(colors, func(i, j int) bool {
		if counts[colors[i]] != counts[colors[j]] {
			return counts[colors[i]] > counts[colors[j]]
		}
		a, b := colors[i], colors[j]
		return uint32(a.R)<<16|uint32(a.G)<<8|uint32(a.B) < uint32(b.R)<<16|uint32(b.G)<<8|uint32(b.B)
	})
	pal := make(color.Palette, 0, 256)
	for _, c := range colors[:min(256, len(colors))] {
		pal = append(pal, c)
	}
	dst := image.NewPaletted(bounds, pal)
	index := map[color.RGBA]uint8{}
	for y := bounds.Min.Y; y < bounds.Max.Y; y++ {
		for x := bounds.Min.X; x < bounds.Max.X; x++ {
			c := color.RGBAModel.Convert(img.At(x, y)).(color.RGBA)
			i, ok := index[c]
			if !ok {
				i = uint8(pal.Index(c))
				index[c] = i
			}
			dst.SetColorIndex(x, y, i)
		}
	}
	var buf bytes.Buffer
	if err := (&png.Encoder{CompressionLevel: png.BestCompression}).Encode(&buf, dst); err != nil {
		return err
	}
	return os.WriteFile(*out, buf.Bytes(), 0o644)
}
