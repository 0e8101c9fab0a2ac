package main

import (
	"os"
	"strings"
	"testing"
	"time"
)

// TestBrokerProcessSplitsCPU runs the pull phase with -broker-process: the
// broker is a real child process, and the phase reports its CPU and the
// load tester's apart, the two adding up to the phase's CPU per message,
// and the markdown shows them.
func TestBrokerProcessSplitsCPU(t *testing.T) {
	if testing.Short() {
		t.Skip("builds ./cmd/tidemq and runs it for a few seconds")
	}
	dir := t.TempDir()
	res, stdout := runSuiteJSON(t, dir, 3*time.Minute, "-broker-process", "-quiet",
		"-phases", `^pull256-c4-1KiB$`, "-duration", "400ms", "-warmup", "100ms")
	if len(res.Phases) != 1 {
		t.Fatalf("phases %+v: want the pull phase alone", res.Phases)
	}
	p := res.Phases[0]
	if p.MsgsPerSec <= 0 || p.ServerCPUPerMsg <= 0 || p.ClientCPUPerMsg <= 0 || p.CPUPerMsg != p.ServerCPUPerMsg+p.ClientCPUPerMsg {
		t.Errorf("%s: %g msg/s, CPU/msg %v: server %v + client %v", p.Name, p.MsgsPerSec, p.CPUPerMsg, p.ServerCPUPerMsg, p.ClientCPUPerMsg)
	}
	if !strings.Contains(stdout, "### CPU per message, server and client") || !strings.Contains(stdout, "| pull256-c4-1KiB | 1 | lean |") {
		t.Errorf("markdown lacks the CPU split:\n%s", stdout)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "tidemq-load-brokers-") {
			t.Errorf("%s left behind", e.Name())
		}
	}
}

// TestBrokerProcessFlags: -broker-process replaces -inprocess and -url, and
// goes with the targets suite only. (-broker-bin alone goes with -inprocess
// too: the flood and cost-growth phases run it.)
func TestBrokerProcessFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-suite", "targets", "-broker-process", "-inprocess"},
		{"-suite", "targets", "-broker-process", "-url", "http://127.0.0.1:1"},
		{"-broker-process"},
	} {
		if _, err := parseFlags(args); err == nil {
			t.Errorf("%v: accepted", args)
		}
	}
	if _, err := parseFlags([]string{"-suite", "targets", "-broker-process", "-broker-bin", "/bin/true"}); err != nil {
		t.Errorf("-broker-process with -broker-bin: %v", err)
	}
}
