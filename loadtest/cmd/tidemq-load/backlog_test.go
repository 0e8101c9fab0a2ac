package main

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestBacklogSuite runs -suite backlog end to end at a tiny size: the
// broker built with go build and run as a child process, 20,000 messages,
// phases of a second, both restarts. It checks the outputs are there and
// sane, and that no broker process outlives the suite.
func TestBacklogSuite(t *testing.T) {
	if testing.Short() {
		t.Skip("builds ./cmd/tidemq and runs it for ~15 s")
	}
	dir := t.TempDir()
	plotPath, jsonPath := filepath.Join(dir, "backlog.png"), filepath.Join(dir, "backlog.json")
	c, err := parseFlags([]string{"-suite", "backlog", "-messages", "20000", "-size", "512", "-duration", "1s", "-warmup", "200ms",
		"-dir", dir, "-plot", plotPath, "-json", jsonPath, "-quiet"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	runErr := run(ctx, c, &stdout, &stderr)
	res := readBacklogJSON(t, jsonPath)
	checkNoBroker(t, res.BrokerPids)
	if runErr != nil {
		t.Fatalf("run: %v\nstderr:\n%s", runErr, stderr.String())
	}
	t.Logf("report:\n%s", stdout.String())

	for _, want := range []string{"| target |", "restart to ready after SIGKILL", "### Fill", "the idle broker finished the fill's", "| backlog-pull |"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("markdown lacks %q", want)
		}
	}
	if len(res.BrokerPids) != 3 {
		t.Errorf("broker pids %v: want the first process and two restarts", res.BrokerPids)
	}
	f := res.Fill
	if f.Sent != 20000 || f.Lag < 20000 || f.Topic < 20000 || f.DiskBytes <= 0 || f.MsgsPerSec <= 0 {
		t.Errorf("fill: sent %d, lag %d, topic messages %d, disk %d B, %g msg/s", f.Sent, f.Lag, f.Topic, f.DiskBytes, f.MsgsPerSec)
	}
	if f.Settled <= 0 || f.SettledOut {
		t.Errorf("fill: settled after %v (gave up: %v): want the idle broker within the bound", f.Settled, f.SettledOut)
	}
	var names []string
	for _, p := range res.Phases {
		names = append(names, p.Name)
		if p.MsgsPerSec <= 0 || p.Latency.Count == 0 || len(p.Errors) != 0 {
			t.Errorf("phase %s: %g msg/s, latency %v, errors %v", p.Name, p.MsgsPerSec, p.Latency, p.Errors)
		}
	}
	if got := strings.Join(names, ","); got != "empty-send,empty-pull,backlog-send,backlog-pull" {
		t.Errorf("phases %s", got)
	}
	if len(res.Restarts) != 2 {
		t.Fatalf("restarts: %+v", res.Restarts)
	}
	for _, r := range res.Restarts {
		if r.Ready <= 0 || r.Ready > time.Minute || r.Lost != 0 || r.LagAfter < r.LagBefore || r.RSSAtReady <= 0 {
			t.Errorf("restart %+v", r)
		}
	}
	if r := res.Restarts[0]; r.Kind != "SIGTERM" || r.StopTook <= 0 || r.LagAfter != r.LagBefore {
		t.Errorf("SIGTERM restart %+v: want a clean stop and the same lag", r)
	}
	if r := res.Restarts[1]; r.Kind != "SIGKILL" || r.Accepted <= 0 {
		t.Errorf("SIGKILL restart %+v: want sends accepted before the kill", r)
	}
	if res.PeakRSS <= 0 || res.PeakRSS > 8<<30 {
		t.Errorf("peak RSS %d", res.PeakRSS)
	}
	if len(res.Targets) != 6 {
		t.Errorf("%d targets: %+v", len(res.Targets), res.Targets)
	}
	for _, tg := range res.Targets {
		if tg.Measured == "" || tg.Want == "" || tg.Ratio < 0 {
			t.Errorf("target %+v", tg)
		}
	}

	// The time series: in the JSON, as CSV next to the plot, and drawn.
	if len(res.Series) < 5 {
		t.Errorf("%d samples", len(res.Series))
	}
	var rss bool
	for _, s := range res.Series {
		rss = rss || s.RSS > 0
	}
	if !rss {
		t.Error("no sample has the broker's RSS")
	}
	if res.SeriesFile != strings.TrimSuffix(plotPath, ".png")+".csv" || res.Plot != plotPath {
		t.Errorf("series file %q, plot %q", res.SeriesFile, res.Plot)
	}
	cf, err := os.Open(res.SeriesFile)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(cf).ReadAll()
	cf.Close()
	if err != nil || len(rows) != len(res.Series)+1 || rows[0][0] != "t_seconds" {
		t.Errorf("CSV: %v, %d rows for %d samples", err, len(rows), len(res.Series))
	}
	pf, err := os.Open(plotPath)
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(pf)
	pf.Close()
	if err != nil {
		t.Fatalf("plot is not a PNG: %v", err)
	}
	if b := img.Bounds(); b.Dx() < 500 || b.Dy() < 400 {
		t.Errorf("plot is %v", b)
	}

	// Nothing left behind: the work dir (data, binary, log) is gone.
	left, _ := filepath.Glob(filepath.Join(dir, "tidemq-load-backlog-*"))
	if len(left) != 0 {
		t.Errorf("left behind: %v", left)
	}
}

// TestBacklogSuiteCancelled stops the suite in the middle of its fill: the
// broker process must be gone when run returns, and the broker's log kept.
func TestBacklogSuiteCancelled(t *testing.T) {
	if testing.Short() {
		t.Skip("builds ./cmd/tidemq and runs it")
	}
	dir := t.TempDir()
	jsonPath := filepath.Join(dir, "backlog.json")
	c, err := parseFlags([]string{"-suite", "backlog", "-messages", "5000000", "-size", "128", "-duration", "500ms", "-warmup", "0",
		"-dir", dir, "-json", jsonPath, "-quiet"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	c.quiet = false // progress lines tell when the fill started
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	done := make(chan error, 1)
	var stdout bytes.Buffer
	go func() {
		done <- run(ctx, c, &stdout, pw)
		pw.Close()
	}()
	// Cancel once the fill is under way (or after a minute, whatever
	// happened).
	fillStarted := make(chan struct{})
	go func() {
		buf := make([]byte, 4096)
		var seen strings.Builder
		for {
			n, err := pr.Read(buf)
			seen.Write(buf[:n])
			if strings.Contains(seen.String(), "== fill:") {
				close(fillStarted)
				_, _ = bytes.NewBuffer(nil).ReadFrom(pr) // drain the rest
				return
			}
			if err != nil {
				return
			}
		}
	}()
	select {
	case <-fillStarted:
		time.Sleep(500 * time.Millisecond)
	case <-time.After(time.Minute):
		t.Error("the fill did not start within a minute")
	case err := <-done:
		logs, _ := filepath.Glob(filepath.Join(dir, "tidemq-load-backlog-*", "broker.log"))
		for _, l := range logs {
			t.Logf("%s ends:\n%s", l, logTail(l))
		}
		t.Fatalf("run ended before the fill: %v", err)
	}
	cancel()
	var runErr error
	select {
	case runErr = <-done:
	case <-time.After(time.Minute):
		t.Fatal("run did not return within a minute of the cancellation")
	}
	if !errors.Is(runErr, context.Canceled) {
		t.Errorf("run: %v, want context.Canceled among its errors", runErr)
	}
	res := readBacklogJSON(t, jsonPath)
	if len(res.BrokerPids) != 1 {
		t.Errorf("broker pids %v", res.BrokerPids)
	}
	checkNoBroker(t, res.BrokerPids)
	if res.BrokerLog == "" {
		t.Error("no broker log named after a failed run")
	} else if _, err := os.Stat(res.BrokerLog); err != nil {
		t.Errorf("broker log: %v", err)
	}
	if data := filepath.Join(filepath.Dir(res.BrokerLog), "data"); fileExists(data) {
		t.Errorf("data dir %s left behind", data)
	}
}

func readBacklogJSON(t *testing.T, path string) backlogResult {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("JSON report: %v", err)
	}
	var res backlogResult
	if err := json.Unmarshal(raw, &res); err != nil {
		t.Fatalf("JSON report does not parse: %v\n%s", err, raw)
	}
	return res
}

// checkNoBroker fails when one of pids is still a process.
func checkNoBroker(t *testing.T, pids []int) {
	t.Helper()
	for _, pid := range pids {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("broker pid %d still there (kill -0: %v)", pid, err)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// A 100M run's last four phases fall within 1.5% of it and share one mark;
// their names in one rotated label were taller than the throughput panel,
// plot.Align then gave the panels a NaN height and the rasterizer never
// finished filling it. The plot of such a run must come out.
func TestPlotOfALongRunWithCrowdedPhases(t *testing.T) {
	var r backlogResult
	r.Messages, r.MessageBytes = 100_000_000, 128
	now := 0.0
	add := func(phase string, n int, producing, consuming bool) {
		for range n {
			now++
			s := sample{T: now, Seconds: 1, Phase: phase, Producing: producing, Consuming: consuming, RSS: 330 << 20}
			if producing {
				s.SentRate, s.SendP99 = 90_000, 50
			}
			if consuming {
				s.AckedRate, s.PullP99 = 40_000, 30
			}
			r.Series = append(r.Series, s)
		}
	}
	add("empty-send warm-up", 1, true, false)
	add("empty-send", 5, true, false)
	add("empty-pull warm-up", 1, false, true)
	add("empty-pull", 5, false, true)
	add("fill", 1149, true, false)
	add("backlog-send warm-up", 1, true, false)
	add("backlog-send", 5, true, false)
	add("backlog-pull warm-up", 1, false, true)
	add("backlog-pull", 5, false, true)
	add("SIGTERM restart", 1, false, false)
	add("load, SIGKILL", 5, true, false)
	add("SIGKILL restart", 1, false, false)

	for _, m := range phaseMarks(splitSegments(r.Series)) {
		if n := len([]rune(m.label)); n > maxMarkLabel+4 {
			t.Errorf("mark label %q is %d characters", m.label, n)
		}
	}
	path := filepath.Join(t.TempDir(), "plot.png")
	done := make(chan error, 1)
	go func() { done <- writePlot(path, r) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		t.Fatal("writePlot did not finish in a minute")
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := png.Decode(f); err != nil {
		t.Fatalf("the plot is not a PNG: %v", err)
	}
}
