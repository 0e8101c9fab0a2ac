package main

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"testing"
	"time"
)

// TestTargetsSuitePhases runs -suite targets with -phases picking the three
// phases of the single-producer latency target: only those run (against a
// real in-process broker, raw Pebble and the no-op handler), and the table
// holds that target alone, with a ratio worked out from them. Two of them
// are profiled and traced, each into its own file.
func TestTargetsSuitePhases(t *testing.T) {
	dir := t.TempDir()
	jsonPath := filepath.Join(dir, "targets.json")
	c, err := parseFlags([]string{"-suite", "targets", "-inprocess", "-phases", `^(pebble-b1-w1|noop-c1|single-p1)-1KiB$`,
		"-duration", "400ms", "-warmup", "100ms", "-dir", dir, "-json", jsonPath, "-quiet", "-format", "json",
		"-profile-phase", "noop-c1-1KiB,single-p1-1KiB", "-cpuprofile", filepath.Join(dir, "cpu.pprof"), "-trace", filepath.Join(dir, "run.trace")})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	if err := run(ctx, c, &stdout, &stderr); err != nil {
		t.Fatalf("run: %v\nstderr:\n%s", err, stderr.String())
	}
	raw, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var res suiteResult
	if err := json.Unmarshal(raw, &res); err != nil {
		t.Fatal(err)
	}
	var ran []string
	for _, p := range res.Phases {
		ran = append(ran, p.Name)
		if p.MsgsPerSec <= 0 || p.Latency.P50 <= 0 || len(p.Errors) > 0 {
			t.Errorf("phase %s: %g msg/s, p50 %v, errors %v", p.Name, p.MsgsPerSec, p.Latency.P50, p.Errors)
		}
		// One producer (or Pebble writer) waits on every reply: Ps sit
		// idle, never more of them than there are.
		if procs := float64(runtime.GOMAXPROCS(0)); p.IdlePs <= 0 || p.IdlePs > procs {
			t.Errorf("phase %s: Ps idle %.3f cores, want some, at most %g", p.Name, p.IdlePs, procs)
		}
	}
	slices.Sort(ran)
	if want := []string{"noop-c1-1KiB", "pebble-b1-w1-1KiB", "single-p1-1KiB"}; !slices.Equal(ran, want) {
		t.Fatalf("phases run %v, want %v", ran, want)
	}
	if len(res.Targets) != 1 || res.Targets[0].Name != "single send, 1 producer, 1 KiB: p50" {
		t.Fatalf("targets %+v: want the single-producer latency target alone", res.Targets)
	}
	if r := res.Targets[0].Ratio; r <= 0 || r > 100 {
		t.Errorf("ratio %g: want a positive share of the bound", r)
	}
	for _, name := range []string{"cpu-noop-c1-1KiB.pprof", "cpu-single-p1-1KiB.pprof", "run-noop-c1-1KiB.trace", "run-single-p1-1KiB.trace"} {
		if fi, err := os.Stat(filepath.Join(dir, name)); err != nil || fi.Size() == 0 {
			t.Errorf("%s: want a non-empty file (%v)", name, err)
		}
	}
	for _, name := range []string{"cpu.pprof", "run.trace", "cpu-pebble-b1-w1-1KiB.pprof", "run-pebble-b1-w1-1KiB.trace"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err == nil {
			t.Errorf("%s: written, but no such phase was to be profiled", name)
		}
	}
}

func TestTargetsSuiteRefusesABadPhasesPattern(t *testing.T) {
	c, err := parseFlags([]string{"-suite", "targets", "-inprocess", "-phases", "(", "-quiet"})
	if err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	if err := run(t.Context(), c, &stdout, &stderr); err == nil {
		t.Fatal("run with -phases \"(\": no error")
	}
}

func TestMedianOf(t *testing.T) {
	for _, c := range []struct {
		xs   []float64
		want float64
	}{
		{[]float64{0.4}, 0.4},
		{[]float64{0.52, 0.47}, 0.495},
		{[]float64{0.3, 0.9, 0.5}, 0.5},
		{[]float64{1.04, 0.98, 0.2, 2}, 1.01},
	} {
		if got := medianOf(c.xs); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("medianOf(%v) = %v, want %v", c.xs, got, c.want)
		}
	}
}
