package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/tidemq/tidemq/loadtest"
)

// TestTargetsSuitePhases runs -suite targets with -phases picking the three
// phases of the single-producer latency target: only those run (against a
// real in-process broker, raw Pebble and the no-op handler), and the table
// holds that target alone, with a ratio worked out from them. Two of them
// are profiled and traced, each into its own file.
func TestTargetsSuitePhases(t *testing.T) {
	dir := t.TempDir()
	res := runTargetsSuite(t, dir, "-phases", `^(pebble-b1-w1|noop-c1|single-p1)-1KiB$`,
		"-duration", "400ms", "-warmup", "100ms", "-quiet", "-format", "json",
		"-profile-phase", "noop-c1-1KiB,single-p1-1KiB", "-cpuprofile", filepath.Join(dir, "cpu.pprof"), "-trace", filepath.Join(dir, "run.trace"))
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

// TestTargetsSuitePlainClient runs a single send and a pull phase of the
// targets suite with the plain client beside the lean one, picking the
// plain phases alone: they ran under their @plain names, with the plain
// client, and moved messages (sent; pulled and acked).
func TestTargetsSuitePlainClient(t *testing.T) {
	res := runTargetsSuite(t, t.TempDir(), "-client", "lean,plain", "-phases", `^(single-p1|pull256-c4)-1KiB@plain$`,
		"-duration", "300ms", "-warmup", "100ms", "-quiet", "-format", "json", "-tracing=false")
	var ran []string
	for _, p := range res.Phases {
		ran = append(ran, p.Name)
		if p.Client != "plain" || p.Report == nil || p.Report.Scenario.ClientKind != "plain" {
			t.Errorf("phase %s: client %q: want plain, in the phase and its report", p.Name, p.Client)
			continue
		}
		if p.MsgsPerSec <= 0 || len(p.Errors) > 0 {
			t.Errorf("phase %s: %g msg/s, errors %v", p.Name, p.MsgsPerSec, p.Errors)
		}
		rep := p.Report
		switch p.Name {
		case "single-p1-1KiB@plain":
			if rep.Sent == 0 || rep.Send.Requests != rep.Sent {
				t.Errorf("%s: sent %d in %d requests: want some, one each", p.Name, rep.Sent, rep.Send.Requests)
			}
		case "pull256-c4-1KiB@plain":
			if rep.Delivered == 0 || rep.Acked < rep.Delivered || rep.Stale != 0 {
				t.Errorf("%s: delivered %d, acked %d, stale %d: want some delivered, all acked, none stale", p.Name, rep.Delivered, rep.Acked, rep.Stale)
			}
		}
	}
	slices.Sort(ran)
	if want := []string{"pull256-c4-1KiB@plain", "single-p1-1KiB@plain"}; !slices.Equal(ran, want) {
		t.Fatalf("phases run %v, want %v", ran, want)
	}
}

func TestClientFlag(t *testing.T) {
	for _, args := range [][]string{
		{"-inprocess", "-client", "fancy"},
		{"-inprocess", "-client", "lean,plain"}, // several clients: the targets suite only
		{"-suite", "targets", "-inprocess", "-client", "plain,plain"},
		{"-suite", "backlog", "-client", "plain"},
	} {
		if _, err := parseFlags(args); err == nil {
			t.Errorf("parseFlags(%q): no error", args)
		}
	}
	c, err := parseFlags([]string{"-inprocess", "-client", "plain"})
	if err != nil || c.sc.ClientKind != "plain" {
		t.Errorf("-client plain: %v, scenario client %q", err, c.sc.ClientKind)
	}
	c, err = parseFlags([]string{"-suite", "targets", "-inprocess", "-client", "plain,lean", "-duration", "1s"})
	if err != nil || !slices.Equal(c.clients, []string{"plain", "lean"}) || c.curveDuration != time.Second {
		t.Errorf("-client plain,lean -duration 1s: %v, clients %q, curve duration %v", err, c.clients, c.curveDuration)
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

// TestCurveTargets checks the curve's targets on made-up phases: a point
// that dips below 90% of a lower one fails against it, a point under half
// the lower of its baselines fails, and a p50 past the bound fails.
func TestCurveTargets(t *testing.T) {
	g := map[string]phase{}
	put := func(name string, rate float64, p50 time.Duration) {
		g[name] = phase{Name: name, MsgsPerSec: rate, Latency: loadtest.Latency{P50: p50}}
	}
	for _, n := range []int{4, 8, 16} {
		put(fmt.Sprintf("noop-c%d-1KiB", n), 100_000, 100*time.Microsecond)
		put(fmt.Sprintf("pebble-b1-w%d-1KiB", n), 20_000, time.Millisecond)
	}
	put("single-p4-1KiB", 9_000, time.Millisecond)     // 45% of Pebble's 20,000
	put("single-p8-1KiB", 16_000, time.Millisecond)    // fine
	put("single-p16-1KiB", 14_000, 2*time.Millisecond) // 87.5% of p8's; p50 past 1.4 ms
	pass := map[string]bool{}
	add := func(name, want string, needs []string, ok func(float64) bool, one func(map[string]phase) (float64, string, string, bool)) {
		for _, n := range needs {
			if _, ran := g[n]; !ran {
				return
			}
		}
		r, _, _, errs := one(g)
		pass[name] = ok(r) && !errs
	}
	curveTargets(add, func(name string) bool { _, ok := g[name]; return ok }, "", "")
	want := map[string]bool{
		"curve: single send, 4 producers, 1 KiB":                                false,
		"curve: single send, 8 producers, 1 KiB":                                true,
		"curve: single send, 16 producers, 1 KiB":                               true,
		"curve: single send, 8 producers, 1 KiB, against the best lower point":  true,
		"curve: single send, 16 producers, 1 KiB, against the best lower point": false,
		"curve: single send, 4 producers, 1 KiB: p50":                           true,
		"curve: single send, 8 producers, 1 KiB: p50":                           true,
		"curve: single send, 16 producers, 1 KiB: p50":                          false,
	}
	if len(pass) != len(want) {
		t.Errorf("targets %v, want %v", pass, want)
	}
	for name, w := range want {
		if got, ok := pass[name]; !ok || got != w {
			t.Errorf("%s: pass %v (present %v), want %v", name, got, ok, w)
		}
	}
}

// runTargetsSuite runs -suite targets in process with args, its data in
// dir, and returns the result it wrote as -json.
func runTargetsSuite(t *testing.T, dir string, args ...string) suiteResult {
	t.Helper()
	res, _ := runSuiteJSON(t, dir, time.Minute, append([]string{"-inprocess"}, args...)...)
	return res
}

// runSuiteJSON runs -suite targets with args (which say where its brokers
// run), its data in dir, within timeout, and returns the result it wrote
// as -json and what it printed.
func runSuiteJSON(t *testing.T, dir string, timeout time.Duration, args ...string) (suiteResult, string) {
	t.Helper()
	jsonPath := filepath.Join(dir, "targets.json")
	c, err := parseFlags(append([]string{"-suite", "targets", "-dir", dir, "-json", jsonPath}, args...))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
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
	return res, stdout.String()
}
