package main

import (
	"cmp"
	"encoding/json"
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// The single-send curve's plot (-curve-plot with -suite targets, or
// -plot-curve from saved JSON reports): two panels against the number of
// producers on a log2 axis, the rate (msg/s) and the p50 per request (ms,
// log). Solid lines are the broker, one per client (and per report, when
// several are drawn together); dashed ones the no-op handler at the same
// concurrency with the same client, and dotted ones raw Pebble single
// synced puts from as many writers: the two ceilings. With several rounds
// a point is the median of its rounds.

// curveRun is one report to draw; label names it when several are drawn.
type curveRun struct {
	label string
	res   suiteResult
}

// curveLine is one line of the plot: a kind of phase (broker, noop,
// pebble) with one client, of one report.
type curveLine struct {
	run, kind, client string
	n                 []int
	rate, p50         []float64 // p50 in ms
}

var curvePhaseName = regexp.MustCompile(`^(single-p|noop-c|pebble-b1-w)(\d+)-1KiB(?:@(\w+))?$`)

// curveLines is the curve's lines in a report: the median of the rounds at
// each point, the points in order.
func curveLines(run string, res suiteResult) []curveLine {
	type key struct {
		kind, client string
		n            int
	}
	type vals struct{ rate, p50 []float64 }
	got := map[key]*vals{}
	for _, p := range res.Phases {
		m := curvePhaseName.FindStringSubmatch(p.Name)
		if m == nil || p.MsgsPerSec <= 0 {
			continue
		}
		n, err := strconv.Atoi(m[2])
		if err != nil || n < 1 {
			continue
		}
		k := key{kind: map[string]string{"single-p": "broker", "noop-c": "noop", "pebble-b1-w": "pebble"}[m[1]], n: n}
		if k.kind != "pebble" {
			k.client = cmp.Or(p.Client, m[3], "lean")
		}
		v := got[k]
		if v == nil {
			v = &vals{}
			got[k] = v
		}
		v.rate = append(v.rate, p.MsgsPerSec)
		v.p50 = append(v.p50, ms(p.Latency.P50))
	}
	keys := slices.SortedFunc(func(yield func(key) bool) {
		for k := range got {
			if !yield(k) {
				return
			}
		}
	}, func(a, b key) int {
		return cmp.Or(cmp.Compare(kindOrder(a.kind), kindOrder(b.kind)), cmp.Compare(a.client, b.client), cmp.Compare(a.n, b.n))
	})
	var lines []curveLine
	for _, k := range keys {
		if n := len(lines); n == 0 || lines[n-1].kind != k.kind || lines[n-1].client != k.client {
			lines = append(lines, curveLine{run: run, kind: k.kind, client: k.client})
		}
		l := &lines[len(lines)-1]
		v := got[k]
		l.n = append(l.n, k.n)
		l.rate = append(l.rate, medianOf(v.rate))
		l.p50 = append(l.p50, medianOf(v.p50))
	}
	return lines
}

func kindOrder(kind string) int { return slices.Index([]string{"broker", "noop", "pebble"}, kind) }

func (l curveLine) name() string {
	var s string
	switch l.kind {
	case "broker":
		s = "broker, " + l.client + " client"
	case "noop":
		s = "no-op handler, " + l.client + " client (ceiling)"
	default:
		s = "raw Pebble synced puts (ceiling)"
	}
	if l.run != "" {
		s = l.run + ": " + s
	}
	return s
}

var curveColors = []color.Color{
	color.RGBA{R: 31, G: 119, B: 180, A: 255},
	color.RGBA{R: 255, G: 127, B: 14, A: 255},
	color.RGBA{R: 148, G: 103, B: 189, A: 255},
	color.RGBA{R: 140, G: 86, B: 75, A: 255},
	color.RGBA{R: 23, G: 190, B: 207, A: 255},
	color.RGBA{R: 227, G: 119, B: 194, A: 255},
}

var pebbleColors = []color.Color{
	color.RGBA{R: 44, G: 160, B: 44, A: 255},
	color.RGBA{R: 127, G: 127, B: 127, A: 255},
	color.RGBA{R: 188, G: 189, B: 34, A: 255},
}

// Curve plot size: 10 × 8 inches at vgimg's default 96 dpi.
const curvePlotWidth, curvePlotHeight = 10 * vg.Inch, 8 * vg.Inch

// writeCurvePlot draws the runs' single-send curves as a PNG at path.
func writeCurvePlot(path string, runs []curveRun) error {
	var lines []curveLine
	var labels []string
	for _, r := range runs {
		ls := curveLines(r.label, r.res)
		if len(ls) == 0 {
			return fmt.Errorf("%s: no phases of the single-send curve (single-pN-1KiB, noop-cN-1KiB, pebble-b1-wN-1KiB) with a rate", cmp.Or(r.label, "the report"))
		}
		lines = append(lines, ls...)
		labels = append(labels, cmp.Or(r.label, r.res.Machine.Start.Format("2006-01-02 15:04 MST")))
	}
	rate, lat := plot.New(), plot.New()
	rate.Title.Text = "tidemq single send, 1 KiB: " + strings.Join(labels, " vs ")
	rate.Y.Label.Text = "msg/s"
	lat.Y.Label.Text = "p50 per request (ms, log)"
	lat.X.Label.Text = "producers (writers for raw Pebble; log2)"
	lat.Y.Scale, lat.Y.Tick.Marker = plot.LogScale{}, ticks125{}
	rate.Legend.Top, rate.Legend.Left = true, true
	rate.Legend.TextStyle.Font.Size = vg.Points(8)
	nMin, nMax, rateMax, latMin, latMax := math.MaxInt, 1, 0.0, math.MaxFloat64, 0.0
	for _, p := range []*plot.Plot{rate, lat} {
		p.X.Scale, p.X.Tick.Marker = plot.LogScale{}, pow2Ticks{}
		p.Add(plotter.NewGrid())
	}
	// One colour per report and client, the broker's and the no-op's
	// lines alike; raw Pebble's per report.
	colorOf := map[[2]string]color.Color{}
	clientColors, pebbles := 0, 0
	for _, l := range lines {
		key := [2]string{l.run, l.client}
		col := colorOf[key]
		if col == nil {
			if l.kind == "pebble" {
				col = pebbleColors[pebbles%len(pebbleColors)]
				pebbles++
			} else {
				col = curveColors[clientColors%len(curveColors)]
				clientColors++
			}
			colorOf[key] = col
		}
		var dashes []vg.Length
		switch l.kind {
		case "noop":
			dashes = []vg.Length{vg.Points(6), vg.Points(3)}
		case "pebble":
			dashes = []vg.Length{vg.Points(1.5), vg.Points(2.5)}
		}
		for _, pl := range []struct {
			p *plot.Plot
			y []float64
		}{{rate, l.rate}, {lat, l.p50}} {
			var xys plotter.XYs
			for i, n := range l.n {
				if y := pl.y[i]; y > 0 {
					xys = append(xys, plotter.XY{X: float64(n), Y: y})
				}
			}
			if len(xys) == 0 {
				continue
			}
			ln, sc, err := plotter.NewLinePoints(xys)
			if err != nil {
				return err
			}
			ln.Color, ln.Width, ln.Dashes = col, vg.Points(1.5), dashes
			sc.Color, sc.Radius, sc.Shape = col, vg.Points(2), draw.CircleGlyph{}
			if l.kind != "broker" {
				ln.Width, sc.Radius = vg.Points(1), vg.Points(1.5)
			}
			pl.p.Add(ln, sc)
			if pl.p == rate {
				rate.Legend.Add(l.name(), ln, sc)
			}
		}
		for i, n := range l.n {
			nMin, nMax = min(nMin, n), max(nMax, n)
			rateMax = math.Max(rateMax, l.rate[i])
			if p := l.p50[i]; p > 0 {
				latMin, latMax = math.Min(latMin, p), math.Max(latMax, p)
			}
		}
	}
	for _, p := range []*plot.Plot{rate, lat} {
		p.X.Min, p.X.Max = float64(nMin)/1.2, float64(nMax)*1.2
	}
	// Headroom above for the legend.
	rate.Y.Min, rate.Y.Max = 0, math.Max(rateMax, 1)*1.45
	if latMax == 0 {
		latMin, latMax = 0.1, 1
	}
	lat.Y.Min, lat.Y.Max = latMin/1.5, latMax*1.5

	return writePanels(path, curvePlotWidth, curvePlotHeight, rate, lat)
}

// plotCurveFiles draws the curves of saved -suite targets JSON reports
// into out; with several, each is named by its file.
func plotCurveFiles(paths []string, out string) error {
	var runs []curveRun
	for _, p := range paths {
		raw, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		var res suiteResult
		if err := json.Unmarshal(raw, &res); err != nil {
			return fmt.Errorf("%s: not a -suite targets JSON report: %w", p, err)
		}
		r := curveRun{res: res}
		if len(paths) > 1 {
			r.label = strings.TrimSuffix(filepath.Base(p), filepath.Ext(p))
		}
		runs = append(runs, r)
	}
	if err := writeCurvePlot(out, runs); err != nil {
		return fmt.Errorf("-plot-curve: %w", err)
	}
	return nil
}

// pow2Ticks marks the powers of two on a log axis, and the points between
// them that the curve has (12, 24, 48).
type pow2Ticks struct{}

func (pow2Ticks) Ticks(lo, hi float64) []plot.Tick {
	var ts []plot.Tick
	for v := 1.0; v <= hi; v *= 2 {
		if v >= lo {
			ts = append(ts, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'g', -1, 64)})
		}
		if m := v * 1.5; v >= 8 && m >= lo && m <= hi && slices.Contains(curvePoints, int(m)) {
			ts = append(ts, plot.Tick{Value: m, Label: strconv.FormatFloat(m, 'g', -1, 64)})
		}
	}
	return ts
}
