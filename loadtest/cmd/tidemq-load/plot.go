package main

import (
	"errors"
	"fmt"
	"image/color"
	"math"
	"os"
	"strconv"
	"strings"
	"unicode/utf8"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// The backlog suite's plot: three panels over the run's time (seconds
// from the start): throughput (messages sent and acked per second), p99
// latency per second (send per batch request, pull; log scale), and the
// broker's RSS against the 1 GiB target. Dashed vertical lines mark where
// each phase starts and the restarts; a gap in a line is time with no
// such traffic.

var (
	sentColor  = color.RGBA{R: 31, G: 119, B: 180, A: 255}
	ackedColor = color.RGBA{R: 214, G: 39, B: 40, A: 255}
	rssColor   = color.RGBA{R: 44, G: 160, B: 44, A: 255}
	markColor  = color.Gray{Y: 150}
)

// writePlot draws the result's series as a PNG at path.
func writePlot(path string, r backlogResult) (err error) {
	if len(r.Series) == 0 {
		return errors.New("plot: no samples")
	}
	tput, lat, mem := plot.New(), plot.New(), plot.New()
	tput.Title.Text = fmt.Sprintf("tidemq backlog of %s messages of %d B: %s", thousands(float64(r.Messages)), r.MessageBytes, r.Machine.Start.Format("2006-01-02 15:04 MST"))
	tput.Y.Label.Text = "msg/s: sent (blue), acked (red)"
	lat.Y.Label.Text = "p99 per second (ms, log)"
	lat.Y.Scale = plot.LogScale{}
	lat.Y.Tick.Marker = ticks125{}
	mem.Y.Label.Text = "broker RSS (MiB)"
	mem.X.Label.Text = "seconds from the start"
	for _, p := range []*plot.Plot{lat, mem} {
		p.Legend.Top = true
		p.Legend.Left = true
	}
	for _, p := range []*plot.Plot{tput, lat, mem} {
		p.X.Min = 0
		p.Add(plotter.NewGrid())
	}
	tput.Y.Min, mem.Y.Min = 0, 0

	// Lines, one per run of consecutive samples of one phase, so that
	// nothing is drawn across the gaps between phases.
	segments := splitSegments(r.Series)
	series := []struct {
		p      *plot.Plot
		name   string
		col    color.Color
		dashed bool
		y      func(sample) (float64, bool)
	}{
		{tput, "sent", sentColor, false, func(s sample) (float64, bool) { return s.SentRate, s.Producing }},
		{tput, "acked", ackedColor, false, func(s sample) (float64, bool) { return s.AckedRate, s.Consuming }},
		{lat, "send p99 (batch)", sentColor, false, func(s sample) (float64, bool) { return s.SendP99, s.SendP99 > 0 }},
		{lat, "pull p99", ackedColor, false, func(s sample) (float64, bool) { return s.PullP99, s.PullP99 > 0 }},
		{mem, "VmRSS", rssColor, false, func(s sample) (float64, bool) { return float64(s.RSS) / (1 << 20), s.RSS > 0 }},
	}
	for _, sr := range series {
		legend := false
		for _, seg := range segments {
			var xys plotter.XYs
			for _, s := range seg {
				if y, ok := sr.y(s); ok {
					xys = append(xys, plotter.XY{X: s.T, Y: y})
				}
			}
			if len(xys) == 0 {
				continue
			}
			l, sc, err := plotter.NewLinePoints(xys)
			if err != nil {
				return err
			}
			l.Color, l.Width = sr.col, vg.Points(1)
			sc.Color, sc.Radius, sc.Shape = sr.col, vg.Points(1), draw.CircleGlyph{}
			sr.p.Add(l, sc)
			if !legend && sr.p != tput {
				sr.p.Legend.Add(sr.name, l)
				legend = true
			}
		}
	}
	last := r.Series[len(r.Series)-1].T
	limit, err := plotter.NewLine(plotter.XYs{{X: 0, Y: rssLimit >> 20}, {X: last, Y: rssLimit >> 20}})
	if err != nil {
		return err
	}
	limit.Color, limit.Dashes = ackedColor, []vg.Length{vg.Points(4), vg.Points(3)}
	mem.Add(limit)
	mem.Legend.Add("1 GiB target", limit)

	// Phase marks: a dashed vertical line at the first sample of each
	// phase (its time minus its length), labelled at the top of the
	// throughput panel.
	marks := phaseMarks(segments)
	yTop := maxOf(r.Series, func(s sample) float64 { return math.Max(s.SentRate, s.AckedRate) })
	if yTop <= 0 {
		yTop = 1
	}
	tput.Y.Max = yTop * 1.6 // the top is for the phase labels
	latMin, latMax := 1e300, 0.0
	for _, s := range r.Series {
		for _, v := range []float64{s.SendP99, s.PullP99} {
			if v > 0 {
				latMin, latMax = math.Min(latMin, v), math.Max(latMax, v)
			}
		}
	}
	if latMax == 0 {
		latMin, latMax = 0.1, 1
	}
	// Headroom for the legends.
	lat.Y.Min, lat.Y.Max = latMin/1.5, latMax*4
	memTop := math.Max(maxOf(r.Series, func(s sample) float64 { return float64(s.RSS) / (1 << 20) }), rssLimit>>20) * 1.3
	mem.Y.Max = memTop
	var labels plotter.XYLabels
	for _, m := range marks {
		for _, pl := range []struct {
			p      *plot.Plot
			lo, hi float64
		}{{tput, 0, tput.Y.Max}, {lat, lat.Y.Min, lat.Y.Max}, {mem, 0, memTop}} {
			v, err := plotter.NewLine(plotter.XYs{{X: m.t, Y: pl.lo}, {X: m.t, Y: pl.hi}})
			if err != nil {
				return err
			}
			v.Color, v.Dashes, v.Width = markColor, []vg.Length{vg.Points(2), vg.Points(2)}, vg.Points(0.5)
			pl.p.Add(v)
		}
		labels.XYs = append(labels.XYs, plotter.XY{X: m.t, Y: tput.Y.Max})
		labels.Labels = append(labels.Labels, " "+m.label)
	}
	if len(labels.Labels) > 0 {
		lb, err := plotter.NewLabels(labels)
		if err != nil {
			return err
		}
		for i := range lb.TextStyle {
			lb.TextStyle[i].Rotation = -math.Pi / 2
			lb.TextStyle[i].Font.Size = vg.Points(7)
			lb.TextStyle[i].XAlign = draw.XLeft
			lb.TextStyle[i].YAlign = draw.YCenter
			lb.TextStyle[i].Color = color.Gray{Y: 90}
		}
		tput.Add(lb)
	}
	for _, p := range []*plot.Plot{tput, lat, mem} {
		p.X.Max = last * 1.01
	}

	return writePanels(path, vg.Inch*11, vg.Inch*9, tput, lat, mem)
}

// writePanels draws panels one above the other, their X axes aligned, as
// a PNG of width × height at path.
func writePanels(path string, width, height vg.Length, panels ...*plot.Plot) (err error) {
	img := vgimg.New(width, height)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: len(panels), Cols: 1, PadX: vg.Millimeter, PadY: vg.Millimeter * 3,
		PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 4}
	plots := make([][]*plot.Plot, len(panels))
	for i, p := range panels {
		plots[i] = []*plot.Plot{p}
	}
	canvases := plot.Align(plots, tiles, dc)
	for i := range plots {
		plots[i][0].Draw(canvases[i][0])
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, f.Close()) }()
	_, err = vgimg.PngCanvas{Canvas: img}.WriteTo(f)
	return err
}

// splitSegments cuts the series into runs of consecutive samples of one
// phase ("x warm-up" is a phase of its own).
func splitSegments(ss []sample) [][]sample {
	var out [][]sample
	for i, s := range ss {
		if i == 0 || s.Phase != ss[i-1].Phase {
			out = append(out, nil)
		}
		out[len(out)-1] = append(out[len(out)-1], s)
	}
	return out
}

type mark struct {
	t      float64
	merged []string // the names of the phases that begin here
	label  string
}

// phaseMarks is where each phase began (warm-ups are folded into the
// phase they warm up) and when each restart was ready; marks closer than
// 1.5% of the run share a line and a label.
func phaseMarks(segments [][]sample) []mark {
	if len(segments) == 0 {
		return nil
	}
	last := segments[len(segments)-1]
	span := last[len(last)-1].T
	var marks []mark
	prev := ""
	for _, seg := range segments {
		name := strings.TrimSuffix(seg[0].Phase, " warm-up")
		if name == prev {
			continue
		}
		prev = name
		t := seg[0].T - seg[0].Seconds
		if strings.HasSuffix(name, "restart") {
			t = seg[0].T // the moment it was ready
		}
		t = math.Max(t, 0)
		if n := len(marks); n > 0 && t-marks[n-1].t < span*0.015 {
			marks[n-1].merged = append(marks[n-1].merged, name)
			continue
		}
		marks = append(marks, mark{t: t, merged: []string{name}})
	}
	for i := range marks {
		marks[i].label = markLabel(marks[i].merged)
	}
	return marks
}

// markLabel names the phases that share a mark; when their names together
// are too long for the panel ("a / b / c" or "a +2"), the first stands for
// all. A rotated label taller than its panel made plot.Align lay the
// panels out with a NaN height, and the rasterizer then never finished
// (a 100M run, whose last four phases fall within 1.5% of it).
func markLabel(names []string) string {
	label := strings.Join(names, " / ")
	if utf8.RuneCountInString(label) <= maxMarkLabel {
		return label
	}
	return fmt.Sprintf("%s +%d", names[0], len(names)-1)
}

const maxMarkLabel = 32

// ticks125 marks 1, 2 and 5 times the powers of ten on a log axis.
type ticks125 struct{}

func (ticks125) Ticks(lo, hi float64) []plot.Tick {
	var ts []plot.Tick
	for e := math.Floor(math.Log10(lo)); e <= math.Ceil(math.Log10(hi)); e++ {
		for _, m := range []float64{1, 2, 5} {
			v := m * math.Pow(10, e)
			if v >= lo && v <= hi {
				ts = append(ts, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'g', -1, 64)})
			}
		}
	}
	return ts
}

func maxOf(ss []sample, f func(sample) float64) float64 {
	m := 0.0
	for _, s := range ss {
		m = math.Max(m, f(s))
	}
	return m
}
