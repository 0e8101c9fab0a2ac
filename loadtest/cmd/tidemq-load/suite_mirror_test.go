package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestMirrorSuite runs -suite mirror at a tiny scale on two real broker
// processes (./cmd/tidemq built once): every message the source
// acknowledged is stored there and copied to the destination exactly
// once, every copy's delay was measured, the mirror was caught up, the
// markdown went to stdout, and no work dir is left. Counts only: the
// rates and delays of a loaded test machine say nothing.
func TestMirrorSuite(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	bin, work, err := childBrokers(ctx, dir, "")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(work)
	if out, err := exec.Command(bin, "--help").CombinedOutput(); err != nil || !bytes.Contains(out, []byte("-region ")) {
		t.Skipf("tidemq has no --region flag (%v): no mirrors to load", err)
	}
	jsonPath := filepath.Join(dir, "mirror.json")
	const messages = 3000
	c, err := parseFlags([]string{"-suite", "mirror", "-dir", dir, "-broker-bin", bin, "-json", jsonPath, "-quiet", "-tracing=false",
		"-warmup", "200ms", "-messages", "3000", "-duration", "30s"})
	if err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	if err := run(ctx, c, &stdout, &stderr); err != nil {
		t.Fatalf("run: %v\nstderr:\n%s", err, stderr.String())
	}
	raw, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var res mirrorResult
	if err := json.Unmarshal(raw, &res); err != nil {
		t.Fatal(err)
	}
	p, m := res.Source, res.Mirror
	if p == nil || m == nil || p.Report == nil {
		t.Fatalf("no source phase or mirror report: %s", raw)
	}
	if p.Name != mirrorPhaseName || len(p.Errors) != 0 || p.Report.Sent != messages || m.Acked != messages {
		t.Errorf("source phase %s: %d sent, %d acked, errors %v; want %d, none", p.Name, p.Report.Sent, m.Acked, p.Errors, messages)
	}
	if m.SourceStored != messages || m.Copies != messages || m.Missing != 0 || m.Duplicates != 0 || m.Delay.Count != messages {
		t.Errorf("mirror: source stores %d, %d copies, %d missing, %d twice, %d delays; want %d copies of %d, each with its delay",
			m.SourceStored, m.Copies, m.Missing, m.Duplicates, m.Delay.Count, messages, messages)
	}
	if m.Status.State != "running" || m.Status.Lag != 0 || m.Status.Copied != messages {
		t.Errorf("the mirror once caught up: %+v; want running, lag 0, copied %d", m.Status, messages)
	}
	if m.CopiedUnderLoad < 0 || m.CopiedUnderLoad > m.Copies || len(p.NodeCPUPerMsg) != 2 {
		t.Errorf("copied under load %d of %d; per-broker CPU %v", m.CopiedUnderLoad, m.Copies, p.NodeCPUPerMsg)
	}
	if md := stdout.String(); !strings.Contains(md, "copy delay (source storedAt → copy storedAt)") || !strings.Contains(md, mirrorPhaseName) {
		t.Errorf("markdown report:\n%s", md)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() != filepath.Base(work) && strings.HasPrefix(e.Name(), "tidemq-load-brokers-") {
			t.Errorf("work dir %s left behind", e.Name())
		}
	}
}

// TestMirrorSuiteFlags: the suite starts its own brokers, so the flags of
// another broker are refused.
func TestMirrorSuiteFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-suite", "mirror", "-url", "http://127.0.0.1:1"},
		{"-suite", "mirror", "-inprocess"},
		{"-suite", "mirror", "-broker-process"},
		{"-suite", "mirror", "-phases", "x"},
	} {
		if _, err := parseFlags(args); err == nil {
			t.Errorf("%v: accepted", args)
		}
	}
	if _, err := parseFlags([]string{"-suite", "mirror", "-messages", "1000"}); err != nil {
		t.Errorf("-suite mirror -messages 1000: %v", err)
	}
}
