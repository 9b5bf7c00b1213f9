package dashshot

import (
	"errors"
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// Defaults of RenderConfig.
const (
	// DefaultWidth is the picture's width in pixels (24 grid columns).
	DefaultWidth = 1800
	// DefaultRowHeight is the height of one grid row in pixels (Grafana
	// uses 30; a little more leaves room for the legends).
	DefaultRowHeight = 36
	// DefaultLegendChars truncates legend entries to this many characters.
	DefaultLegendChars = 40
)

// RenderConfig holds the settings of Render. Zero values take the
// defaults.
type RenderConfig struct {
	Width, RowHeight int
	LegendChars      int
	// Title and Subtitle head the picture (the dashboard's title and how
	// the picture was made, say).
	Title, Subtitle string
}

func (c *RenderConfig) validate() error {
	if c.Width == 0 {
		c.Width = DefaultWidth
	}
	if c.RowHeight == 0 {
		c.RowHeight = DefaultRowHeight
	}
	if c.LegendChars == 0 {
		c.LegendChars = DefaultLegendChars
	}
	switch {
	case c.Width < 24*20:
		return fmt.Errorf("dashshot: RenderConfig.Width must be at least %d, got %d", 24*20, c.Width)
	case c.RowHeight < 16:
		return fmt.Errorf("dashshot: RenderConfig.RowHeight must be at least 16, got %d", c.RowHeight)
	case c.LegendChars < 8:
		return fmt.Errorf("dashshot: RenderConfig.LegendChars must be at least 8, got %d", c.LegendChars)
	}
	return nil
}

// The colours of Grafana's dark theme and its classic series palette.
var (
	colBackground = rgb(0x111217)
	colPanel      = rgb(0x181b1f)
	colBorder     = rgb(0x2c3235)
	colGrid       = rgb(0x24272c)
	colText       = rgb(0xccccdc)
	colDim        = rgb(0x8e8e9e)
	palette       = []color.RGBA{
		rgb(0x7eb26d), rgb(0xeab839), rgb(0x6ed0e0), rgb(0xef843c), rgb(0xe24d42),
		rgb(0x1f78c1), rgb(0xba43a9), rgb(0x705da0), rgb(0x508642), rgb(0xcca300),
		rgb(0xf9ba8f), rgb(0xb7dbab),
	}
)

func rgb(v uint32) color.RGBA {
	return color.RGBA{R: uint8(v >> 16), G: uint8(v >> 8), B: uint8(v), A: 0xff}
}

// Geometry of the drawing, in pixels.
const (
	headerHeight = 58
	gap          = 6  // between panels
	charW        = 7  // basicfont.Face7x13
	lineH        = 15 // one line of text
)

// Render draws the panels of data in their gridPos layout: timeseries
// panels with a title, a y axis with a few labels in the panel's unit, a
// time axis, one line per series and a legend (entries truncated to
// LegendChars); stat panels as a big number (the first series' last
// value). It returns an error for a bad setting or nothing to draw.
func Render(data []PanelData, cfg RenderConfig) (*image.RGBA, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if len(data) == 0 {
		return nil, errors.New("dashshot: render: no panels")
	}
	rows := 0
	for _, pd := range data {
		rows = max(rows, pd.Panel.GridPos.Y+pd.Panel.GridPos.H)
	}
	colW := float64(cfg.Width-gap) / 24
	img := image.NewRGBA(image.Rect(0, 0, cfg.Width, headerHeight+rows*cfg.RowHeight+gap))
	fill(img, img.Bounds(), colBackground)
	scaled(img, image.Pt(gap+4, 6), cfg.Title, colText, 2)
	text(img, gap+4, 48, cfg.Subtitle, colDim, false)
	for _, pd := range data {
		g := pd.Panel.GridPos
		r := image.Rect(
			gap+int(float64(g.X)*colW), headerHeight+g.Y*cfg.RowHeight,
			int(float64(g.X+g.W)*colW), headerHeight+(g.Y+g.H)*cfg.RowHeight-gap)
		fill(img, r, colBorder)
		fill(img, r.Inset(1), colPanel)
		text(img, r.Min.X+10, r.Min.Y+18, pd.Panel.Title, colText, true)
		switch pd.Panel.Type {
		case "stat", "gauge", "singlestat":
			drawStat(img, r, pd)
		default:
			drawTimeseries(img, r, pd, cfg.LegendChars)
		}
	}
	return img, nil
}

// WritePNG encodes img as a PNG, best compression.
func WritePNG(w io.Writer, img image.Image) error {
	enc := png.Encoder{CompressionLevel: png.BestCompression}
	if err := enc.Encode(w, img); err != nil {
		return fmt.Errorf("encode png: %w", err)
	}
	return nil
}

func drawStat(img *image.RGBA, r image.Rectangle, pd PanelData) {
	if len(pd.Series) == 0 || len(pd.Series[0].Points) == 0 {
		centred(img, r, "No data", colDim, 2)
		return
	}
	pts := pd.Series[0].Points
	centred(img, r, formatValue(pts[len(pts)-1].V, pd.Panel.FieldConfig.Defaults.Unit), palette[0], 4)
}

func drawTimeseries(img *image.RGBA, r image.Rectangle, pd PanelData, legendChars int) {
	unit := pd.Panel.FieldConfig.Defaults.Unit
	// The legend: entries flow left to right, wrapping, under the plot.
	type entry struct {
		label string
		col   color.RGBA
		w     int
	}
	var entries []entry
	for i, s := range pd.Series {
		l := truncate(ascii(s.Legend), legendChars)
		entries = append(entries, entry{l, palette[i%len(palette)], 22 + len(l)*charW + 16})
	}
	if pd.Dropped > 0 {
		l := fmt.Sprintf("(+%d more series)", pd.Dropped)
		entries = append(entries, entry{l, colDim, 22 + len(l)*charW})
	}
	legendW := r.Dx() - 20
	var lines [][]entry
	x := legendW
	for _, e := range entries {
		if x+e.w > legendW && x > 0 {
			lines = append(lines, nil)
			x = 0
		}
		lines[len(lines)-1] = append(lines[len(lines)-1], e)
		x += e.w
	}
	legendTop := r.Max.Y - 6 - len(lines)*lineH
	for i, line := range lines {
		x := r.Min.X + 10
		y := legendTop + i*lineH
		for _, e := range line {
			if e.col != colDim {
				fill(img, image.Rect(x, y+5, x+16, y+8), e.col)
			}
			text(img, x+22, y+11, e.label, colText, false)
			x += e.w
		}
	}

	// Scales.
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, s := range pd.Series {
		for _, p := range s.Points {
			lo, hi = math.Min(lo, p.V), math.Max(hi, p.V)
		}
	}
	plot := image.Rect(r.Min.X+10, r.Min.Y+30, r.Max.X-14, legendTop-22)
	if math.IsInf(lo, 1) {
		centred(img, plot, "No data", colDim, 2)
		return
	}
	ticks := niceTicks(math.Min(lo, 0), hi)
	labels := make([]string, len(ticks))
	labelW := 0
	for i, t := range ticks {
		labels[i] = formatValue(t, unit)
		labelW = max(labelW, len(labels[i])*charW)
	}
	plot.Min.X += labelW + 8
	ymin, ymax := ticks[0], ticks[len(ticks)-1]
	t0, t1 := pd.Start.UnixMilli(), pd.End.UnixMilli()
	px := func(t int64) int {
		return plot.Min.X + int(math.Round(float64(t-t0)/float64(t1-t0)*float64(plot.Dx())))
	}
	py := func(v float64) int {
		return plot.Max.Y - int(math.Round((v-ymin)/(ymax-ymin)*float64(plot.Dy())))
	}
	for i, t := range ticks {
		y := py(t)
		hline(img, plot.Min.X, plot.Max.X, y, colGrid)
		text(img, plot.Min.X-8-len(labels[i])*charW, y+4, labels[i], colDim, false)
	}
	step := timeStep(pd.End.Sub(pd.Start), plot.Dx())
	for t := pd.Start.Truncate(step); !t.After(pd.End); t = t.Add(step) {
		if t.Before(pd.Start) {
			continue
		}
		x := px(t.UnixMilli())
		vline(img, x, plot.Min.Y, plot.Max.Y, colGrid)
		l := t.UTC().Format("15:04:05")
		text(img, x-len(l)*charW/2, plot.Max.Y+15, l, colDim, false)
	}

	// One line per series; a gap of more than two steps breaks it.
	clip := img.SubImage(plot.Inset(-1)).(*image.RGBA)
	for i, s := range pd.Series {
		col := palette[i%len(palette)]
		var maxGap int64 = math.MaxInt64
		if len(s.Points) > 1 {
			maxGap = 3 * minGap(s.Points)
		}
		for j, p := range s.Points {
			x, y := px(p.T), py(p.V)
			if j > 0 && p.T-s.Points[j-1].T <= maxGap {
				q := s.Points[j-1]
				line(clip, px(q.T), py(q.V), x, y, col)
			} else {
				fill(clip, image.Rect(x-1, y-1, x+1, y+1), col)
			}
		}
	}
}

func minGap(ps []Point) int64 {
	g := int64(math.MaxInt64)
	for i := 1; i < len(ps); i++ {
		g = min(g, ps[i].T-ps[i-1].T)
	}
	return g
}

// niceTicks returns 3 to 6 evenly spaced round values that cover [lo, hi].
func niceTicks(lo, hi float64) []float64 {
	if hi <= lo {
		hi = lo + 1
		if lo > 0 {
			lo, hi = 0, lo*1.2
		}
	}
	raw := (hi - lo) / 4
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := 10 * mag
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*mag >= raw {
			step = m * mag
			break
		}
	}
	var out []float64
	for v := math.Floor(lo/step) * step; ; v += step {
		out = append(out, v)
		if v >= hi-step*1e-9 {
			break
		}
	}
	return out
}

// timeStep picks a round spacing for time labels, at least 90 px apart.
func timeStep(span time.Duration, width int) time.Duration {
	maxLabels := max(2, width/90)
	for _, s := range []time.Duration{time.Second, 2 * time.Second, 5 * time.Second, 10 * time.Second,
		15 * time.Second, 30 * time.Second, time.Minute, 2 * time.Minute, 5 * time.Minute,
		10 * time.Minute, 15 * time.Minute, 30 * time.Minute, time.Hour} {
		if int(span/s) < maxLabels {
			return s
		}
	}
	return span / time.Duration(maxLabels)
}

// formatValue renders v in a Grafana unit (reqps, ops, s, ms, bytes,
// percent, short and none; others as plain numbers), in ASCII.
func formatValue(v float64, unit string) string {
	switch unit {
	case "reqps":
		return si(v) + " req/s"
	case "ops":
		return si(v) + " ops/s"
	case "s", "ms":
		if unit == "ms" {
			v /= 1000
		}
		a := math.Abs(v)
		switch {
		case a == 0:
			return "0 s"
		case a < 1e-3:
			return num(v*1e6) + " us"
		case a < 1:
			return num(v*1e3) + " ms"
		case a < 120:
			return num(v) + " s"
		default:
			return num(v/60) + " min"
		}
	case "bytes":
		for _, u := range []string{"B", "KiB", "MiB", "GiB"} {
			if math.Abs(v) < 1024 || u == "GiB" {
				return num(v) + " " + u
			}
			v /= 1024
		}
	case "percent":
		return num(v) + "%"
	case "percentunit":
		return num(v*100) + "%"
	}
	return si(v)
}

// si renders v with a K, M or G suffix above a thousand.
func si(v float64) string {
	a := math.Abs(v)
	switch {
	case a >= 1e9:
		return num(v/1e9) + "G"
	case a >= 1e6:
		return num(v/1e6) + "M"
	case a >= 1e3:
		return num(v/1e3) + "K"
	}
	return num(v)
}

// num renders v with up to three significant digits (more for large
// integers), without trailing zeros.
func num(v float64) string {
	a := math.Abs(v)
	prec := 2
	switch {
	case a >= 100:
		prec = 0
	case a >= 10:
		prec = 1
	case a > 0 && a < 0.01:
		prec = 4
	}
	s := strconv.FormatFloat(v, 'f', prec, 64)
	if strings.Contains(s, ".") {
		s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	}
	if s == "-0" {
		s = "0"
	}
	return s
}

// ascii replaces what basicfont cannot draw.
func ascii(s string) string {
	s = strings.NewReplacer("→", "->", "←", "<-", "µ", "u", "–", "-", "—", "-", "≥", ">=", "≤", "<=", "…", "...").Replace(s)
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r > 0x7e {
			return '?'
		}
		return r
	}, s)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-2] + ".."
}

func fill(img *image.RGBA, r image.Rectangle, c color.RGBA) {
	draw.Draw(img, r, image.NewUniform(c), image.Point{}, draw.Src)
}

func hline(img *image.RGBA, x0, x1, y int, c color.RGBA) {
	for x := x0; x <= x1; x++ {
		img.SetRGBA(x, y, c)
	}
}

func vline(img *image.RGBA, x, y0, y1 int, c color.RGBA) {
	for y := y0; y <= y1; y++ {
		img.SetRGBA(x, y, c)
	}
}

// line draws a two-pixel-thick line (Bresenham, doubled vertically) within
// img's bounds.
func line(img *image.RGBA, x0, y0, x1, y1 int, c color.RGBA) {
	dx, dy := abs(x1-x0), -abs(y1-y0)
	sx, sy := sign(x1-x0), sign(y1-y0)
	e := dx + dy
	b := img.Bounds()
	for {
		for _, p := range []image.Point{{x0, y0}, {x0, y0 + 1}} {
			if p.In(b) {
				img.SetRGBA(p.X, p.Y, c)
			}
		}
		if x0 == x1 && y0 == y1 {
			return
		}
		if e2 := 2 * e; e2 >= dy {
			e += dy
			x0 += sx
		} else {
			e += dx
			y0 += sy
		}
	}
}

func abs(v int) int {
	if v < 0 {
		return -v
	}
	return v
}

func sign(v int) int {
	switch {
	case v < 0:
		return -1
	case v > 0:
		return 1
	}
	return 0
}

// text draws s (made ASCII) with its baseline at y; bold draws it twice,
// one pixel apart.
func text(img *image.RGBA, x, y int, s string, c color.RGBA, bold bool) {
	d := font.Drawer{Dst: img, Src: image.NewUniform(c), Face: basicfont.Face7x13}
	d.Dot = fixed.P(x, y)
	d.DrawString(ascii(s))
	if bold {
		d.Dot = fixed.P(x+1, y)
		d.DrawString(ascii(s))
	}
}

// centred draws s scaled up by scale in the middle of r.
func centred(img *image.RGBA, r image.Rectangle, s string, c color.RGBA, scale int) {
	w, h := len(ascii(s))*charW*scale, 13*scale
	scaled(img, image.Pt(r.Min.X+(r.Dx()-w)/2, r.Min.Y+(r.Dy()-h)/2+8), s, c, scale)
}

// scaled draws s (made ASCII) scaled up by scale (nearest neighbour) with
// its top left corner at at.
func scaled(img *image.RGBA, at image.Point, s string, c color.RGBA, scale int) {
	s = ascii(s)
	small := image.NewRGBA(image.Rect(0, 0, len(s)*charW, 13))
	d := font.Drawer{Dst: small, Src: image.NewUniform(c), Face: basicfont.Face7x13, Dot: fixed.P(0, 11)}
	d.DrawString(s)
	w, h := small.Bounds().Dx()*scale, small.Bounds().Dy()*scale
	for y := 0; y < h; y++ {
		for x := 0; x < w; x++ {
			if p := small.RGBAAt(x/scale, y/scale); p.A > 0x80 {
				img.SetRGBA(at.X+x, at.Y+y, c)
			}
		}
	}
}
