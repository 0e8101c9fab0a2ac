package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// runBinary runs the binary to its end and returns its exit code and
// combined output.
func runBinary(t *testing.T, args ...string) (int, string) {
	t.Helper()
	bin := tidemqBinary(t)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("tidemq %v still running after 20 s:\n%s", args, out.String())
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), out.String()
	}
	if err != nil {
		t.Fatal(err)
	}
	return 0, out.String()
}

// TestStrayArgumentIsRefused: flag parsing stops at the first argument
// that is not a flag, so `tidemq bogus --addr X` would run on the default
// address and data with every flag after "bogus" dropped.
func TestStrayArgumentIsRefused(t *testing.T) {
	data := filepath.Join(t.TempDir(), "data")
	for _, args := range [][]string{
		{"bogus", "--addr", "127.0.0.1:0", "--data", data},
		{"--addr", "127.0.0.1:0", "--data", data, "bogus"},
	} {
		code, out := runBinary(t, args...)
		if code != 2 || !strings.Contains(out, `unexpected argument "bogus"`) {
			t.Errorf("tidemq %v: exit %d, output:\n%s\nwant exit 2 naming the argument", args, code, out)
		}
	}
	if _, err := os.Stat(data); !os.IsNotExist(err) {
		t.Errorf("a refused command line created the data directory: %v", err)
	}
}

// TestHelpListsTokenAndExitsZero: --help names the token subcommand, and
// asking either command for help exits 0 alike.
func TestHelpListsTokenAndExitsZero(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"--help"}, []string{"tidemq token", "-addr", "-span-pipeline", "-fsync-ring", "-wal-spares"}},
		{[]string{"-h"}, []string{"tidemq token"}},
		{[]string{"token", "-h"}, []string{"-actions", "-topics"}},
		{[]string{"token", "--help"}, []string{"-actions"}},
	} {
		code, out := runBinary(t, tc.args...)
		if code != 0 {
			t.Errorf("tidemq %v: exit %d, want 0:\n%s", tc.args, code, out)
		}
		for _, w := range tc.want {
			if !strings.Contains(out, w) {
				t.Errorf("tidemq %v does not mention %q:\n%s", tc.args, w, out)
			}
		}
	}
	// A mistake is still one: exit 2.
	if code, out := runBinary(t, "token", "-no-such-flag"); code != 2 {
		t.Errorf("tidemq token -no-such-flag: exit %d, want 2:\n%s", code, out)
	}
}

// TestMetricsHaveNoEmptyLabels: /metrics carries no label with an empty
// value (the exporter's otel_scope_version and otel_scope_schema_url were
// empty on every series) and keeps the metric names.
func TestMetricsHaveNoEmptyLabels(t *testing.T) {
	p := startTidemq(t, t.TempDir())
	hc := &http.Client{Timeout: 10 * time.Second}
	if code, err := call(t.Context(), hc, "POST", p.base+"/v1/topics/orders/messages", map[string]any{"body": "hello"}, nil); err != nil || code != 201 {
		t.Fatalf("send: %d %v", code, err)
	}
	resp, err := hc.Get(p.base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("/metrics: %d %v", resp.StatusCode, err)
	}
	metrics := string(body)
	for _, name := range []string{"tidemq_messages_in_total{", "tidemq_bytes_in_total{", "http_server_request_duration_seconds_bucket{", "tidemq_operation_duration_seconds_bucket{"} {
		if !strings.Contains(metrics, "\n"+name) {
			t.Errorf("/metrics has no %s series", name)
		}
	}
	empty := regexp.MustCompile(`[{,][a-zA-Z_][a-zA-Z0-9_]*=""`)
	if lines := empty.FindAllString(metrics, -1); len(lines) > 0 || strings.Contains(metrics, "otel_scope_") {
		t.Errorf("/metrics has %d empty labels (first: %v) or otel_scope_ labels", len(lines), lines[:min(len(lines), 3)])
	}
}

// TestRoutineRetentionLogsAtDebug: the retention run that cuts nothing
// but the log (here, at start over a store holding a message) logs at
// Debug, not Info every run.
func TestRoutineRetentionLogsAtDebug(t *testing.T) {
	dir := t.TempDir()
	p := startTidemq(t, dir)
	hc := &http.Client{Timeout: 10 * time.Second}
	if code, err := call(t.Context(), hc, "POST", p.base+"/v1/topics/orders/messages", map[string]any{"body": "hello"}, nil); err != nil || code != 201 {
		t.Fatalf("send: %d %v", code, err)
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := p.waitExit(t, 15*time.Second); err != nil {
		t.Fatal(err)
	}
	p = startTidemq(t, dir, "--log-level", "debug")
	line := regexp.MustCompile(`(?m)^.*msg="retention applied".*$`)
	deadline := time.Now().Add(10 * time.Second)
	for !line.MatchString(p.log.String()) {
		if time.Now().After(deadline) {
			t.Fatalf("no retention run logged in 10 s:\n%s", truncateLog(p.log.String()))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := line.FindString(p.log.String()); !strings.Contains(got, "level=DEBUG") || !strings.Contains(got, "queues_cut=0") {
		t.Errorf("a retention run that cut no queue logged %q, want level=DEBUG", got)
	}
}

// TestGitignoreKeepsTheDefaultDataOut: `go run ./cmd/tidemq` in the
// checkout writes ./data (the default --data), which git ignores; a
// directory named data elsewhere is not.
func TestGitignoreKeepsTheDefaultDataOut(t *testing.T) {
	git, err := exec.LookPath("git")
	if err != nil {
		t.Skip("no git")
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if err := exec.Command(git, "-C", root, "rev-parse", "--git-dir").Run(); err != nil {
		t.Skip("not a git checkout")
	}
	ignored := func(path string) bool {
		err := exec.Command(git, "-C", root, "check-ignore", "-q", "--no-index", path).Run()
		var ee *exec.ExitError
		if err != nil && !(errors.As(err, &ee) && ee.ExitCode() == 1) {
			t.Fatalf("git check-ignore %s: %v", path, err)
		}
		return err == nil
	}
	cfg, err := parseConfig(nil, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if p := filepath.Join(cfg.node.Data, "000001.log"); !ignored(p) {
		t.Errorf("%s (the default data directory) is not ignored by .gitignore", p)
	}
	if p := "internal/data/data.go"; ignored(p) {
		t.Errorf("%s is ignored: only the top-level data directory should be", p)
	}
}

// The warning about an open broker is for one without tokens beyond
// loopback, not for one that has tokens.
func TestOpenToAllWarnsOnlyWithoutTokens(t *testing.T) {
	for _, tc := range []struct {
		addr, tokens string
		want         bool
	}{
		{"0.0.0.0:8080", "", true},
		{"192.0.2.1:8080", "", true},
		{"0.0.0.0:8080", "tokens.yaml", false},
		{"127.0.0.1:8080", "", false},
		{"127.0.0.2:8080", "tokens.yaml", false},
	} {
		if got := openToAll(tc.addr, tc.tokens); got != tc.want {
			t.Errorf("openToAll(%q, %q) = %v, want %v", tc.addr, tc.tokens, got, tc.want)
		}
	}
}
