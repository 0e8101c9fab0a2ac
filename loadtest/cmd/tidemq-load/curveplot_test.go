package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"image/png"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tidemq/tidemq/loadtest"
)

// syntheticCurve is a targets report with the single-send curve at 1, 2,
// 4 and 8 producers for the lean and plain clients, two rounds; the
// second round's rates are 3 times the first's, and the pebble phase of 4
// writers is missing.
func syntheticCurve(scale float64) suiteResult {
	var r suiteResult
	r.Machine.Start = time.Date(2026, 12, 2, 1, 0, 0, 0, time.UTC)
	for round := 1; round <= 2; round++ {
		for _, n := range []int{1, 2, 4, 8} {
			f := float64(n) * scale * float64(2*round-1)
			add := func(name, kind, client string, rate float64, p50 time.Duration) {
				r.Phases = append(r.Phases, phase{Name: name, Round: round, Kind: kind, Client: client, MsgsPerSec: rate, Latency: loadtest.Latency{P50: p50}})
			}
			if n != 4 {
				add(fmt.Sprintf("pebble-b1-w%d-1KiB", n), "pebble", "", 3000*f, 2*time.Millisecond)
			}
			add(fmt.Sprintf("noop-c%d-1KiB", n), "noop", "lean", 20000*f, 50*time.Microsecond)
			add(fmt.Sprintf("single-p%d-1KiB", n), "broker", "lean", 1000*f, 3*time.Millisecond)
			add(fmt.Sprintf("noop-c%d-1KiB@plain", n), "noop", "plain", 10000*f, 80*time.Microsecond)
			add(fmt.Sprintf("single-p%d-1KiB@plain", n), "broker", "plain", 800*f, 4*time.Millisecond)
		}
	}
	r.Phases = append(r.Phases, phase{Name: "batch100-p16-1KiB", Round: 1, Kind: "broker", Client: "lean", MsgsPerSec: 1e6})
	return r
}

// TestCurveLines: the report's curve phases become one line per kind and
// client, in producer order, each point the median of its rounds; other
// phases are left out.
func TestCurveLines(t *testing.T) {
	lines := curveLines("", syntheticCurve(1))
	var names []string
	for _, l := range lines {
		names = append(names, l.name())
	}
	want := []string{"broker, lean client", "broker, plain client", "no-op handler, lean client (ceiling)", "no-op handler, plain client (ceiling)", "raw Pebble synced puts (ceiling)"}
	if !slices.Equal(names, want) {
		t.Fatalf("lines %q, want %q", names, want)
	}
	b := lines[0]
	// Rounds at 1000n and 3000n: the median of two is their mean.
	if !slices.Equal(b.n, []int{1, 2, 4, 8}) || !slices.Equal(b.rate, []float64{2000, 4000, 8000, 16000}) || b.p50[0] != 3 {
		t.Errorf("broker lean: n %v, rate %v, p50 %v", b.n, b.rate, b.p50)
	}
	if p := lines[4]; !slices.Equal(p.n, []int{1, 2, 8}) {
		t.Errorf("raw Pebble at %v: want the points that ran", p.n)
	}
}

// TestPlotCurveFromJSON draws two saved reports' curves with -plot-curve
// into one PNG of the plot's size; a report without the curve is refused.
func TestPlotCurveFromJSON(t *testing.T) {
	dir := t.TempDir()
	var paths []string
	for i, scale := range []float64{1, 1.5} {
		p := filepath.Join(dir, fmt.Sprintf("run%d.json", i))
		raw, err := json.Marshal(syntheticCurve(scale))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, raw, 0o644); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, p)
	}
	out := filepath.Join(dir, "curve.png")
	c, err := parseFlags([]string{"-plot-curve", strings.Join(paths, ","), "-o", out})
	if err != nil {
		t.Fatal(err)
	}
	if err := run(t.Context(), c, &bytes.Buffer{}, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	checkCurvePNG(t, out)

	empty := filepath.Join(dir, "empty.json")
	if err := os.WriteFile(empty, []byte(`{"phases":[{"name":"batch100-p16-1KiB","msgsPerSec":5}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := plotCurveFiles([]string{empty}, filepath.Join(dir, "none.png")); err == nil || !strings.Contains(err.Error(), "no phases of the single-send curve") {
		t.Errorf("a report without the curve: %v, want it refused", err)
	}
	if _, err := parseFlags([]string{"-plot-curve", paths[0]}); err == nil {
		t.Error("-plot-curve without -o: want an error")
	}
}

// TestTargetsSuiteCurvePlot runs one point of the curve with -curve-plot:
// the suite draws it.
func TestTargetsSuiteCurvePlot(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "curve.png")
	res := runTargetsSuite(t, dir, "-phases", `^(pebble-b1-w2|noop-c2|single-p2)-1KiB$`, "-duration", "300ms", "-curve-duration", "300ms",
		"-warmup", "100ms", "-quiet", "-format", "json", "-tracing=false", "-curve-plot", out)
	if len(res.Phases) != 3 {
		t.Fatalf("%d phases, want 3", len(res.Phases))
	}
	checkCurvePNG(t, out)
}

func checkCurvePNG(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if b := img.Bounds(); b.Dx() != 960 || b.Dy() != 768 {
		t.Errorf("%s is %dx%d, want 960x768 (10 x 8 inches at 96 dpi)", path, b.Dx(), b.Dy())
	}
}
