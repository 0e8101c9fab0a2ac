package main

import (
	"path/filepath"
	"slices"
	"testing"
)

// TestTargetsSuiteCostSubscriptions runs the cost-growth phases of many
// subscriptions at a small scale (50) against real in-process brokers:
// both sends moved messages, every one of the 50 groups pulled its own
// copy, and both of their targets are in the table.
func TestTargetsSuiteCostSubscriptions(t *testing.T) {
	res := runTargetsSuite(t, t.TempDir(), "-phases", `^cost-subs`, "-cost-subs", "50",
		"-duration", "300ms", "-warmup", "100ms", "-quiet", "-format", "json", "-tracing=false")
	var ran []string
	for _, p := range res.Phases {
		ran = append(ran, p.Name)
		if p.Report == nil || p.Report.Sent == 0 || len(p.Errors) > 0 {
			t.Errorf("phase %s: report %v, errors %v: want messages sent, no errors", p.Name, p.Report != nil, p.Errors)
		}
		want := map[string]int{"cost-subs1-batch100-p16-1KiB": 1, "cost-subs50-batch100-p16-1KiB": 50}[p.Name]
		if x := p.Cost; x == nil || x.Subscriptions != want || x.GroupsWithCopy != want || x.Pulled < int64(want) {
			t.Errorf("phase %s: cost %+v: want %d subscriptions, each with a copy pulled", p.Name, x, want)
		}
	}
	slices.Sort(ran)
	if want := []string{"cost-subs1-batch100-p16-1KiB", "cost-subs50-batch100-p16-1KiB"}; !slices.Equal(ran, want) {
		t.Fatalf("phases run %v, want %v", ran, want)
	}
	var targets []string
	for _, tg := range res.Targets {
		targets = append(targets, tg.Name)
	}
	want := []string{
		"cost: 50 subscriptions on one topic: batch send, 100 msgs/request, 16 producers, 1 KiB, against one subscription",
		"cost: 50 subscriptions on one topic: each group pulls its copy",
	}
	if !slices.Equal(targets, want) {
		t.Fatalf("targets %q, want %q", targets, want)
	}
	if tg := res.Targets[1]; !tg.Pass || tg.Ratio != 1 {
		t.Errorf("%s: ratio %g, pass %v: want every group", tg.Name, tg.Ratio, tg.Pass)
	}
}

// TestTargetsSuiteCostBrokerProcesses runs the cost-growth phases that
// start the broker as a child process, at a small scale (100 topics, 100
// polls): the fresh broker's, the many-topics broker's with its restart,
// and the parked polls' with their wake-ups. Each hot-topic phase moved
// messages, the restart came back with the topics, the polls were parked
// and every wake-up got its message; the brokers' data dirs are gone at
// the end.
func TestTargetsSuiteCostBrokerProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("builds ./cmd/tidemq and runs it for ~20 s")
	}
	dir := t.TempDir()
	res := runTargetsSuite(t, dir, "-phases", `^cost-(fresh|topics|polls)`, "-cost-topics", "100", "-cost-polls", "100",
		"-duration", "300ms", "-warmup", "100ms", "-quiet", "-format", "json", "-tracing=false")
	ran := map[string]phase{}
	for _, p := range res.Phases {
		ran[p.Name] = p
	}
	for _, env := range []string{"cost-fresh", "cost-topics100", "cost-polls100"} {
		for _, name := range []string{"single-p16-1KiB", "batch100-p16-1KiB"} {
			p, ok := ran[env+"-"+name]
			if !ok || p.Report == nil || p.Report.Sent == 0 || len(p.Errors) > 0 {
				t.Errorf("%s-%s: ran %v, want messages sent and no errors (%+v)", env, name, ok, p.Errors)
			}
		}
		p, ok := ran[env+"-pull256-c4-1KiB"]
		if !ok || p.Report == nil || p.Report.Acked == 0 || len(p.Errors) > 0 {
			t.Errorf("%s-pull256-c4-1KiB: ran %v, want messages acked and no errors (%+v)", env, ok, p.Errors)
		}
	}
	if p := ran["cost-topics100-restart"]; p.Cost == nil || p.Cost.Topics != 100 || p.Cost.Ready <= 0 || p.Cost.HWM <= 0 || p.Cost.RSSAtReady <= 0 {
		t.Errorf("cost-topics100-restart: %+v: want 100 topics, a restart timed and RSS read", p.Cost)
	}
	if p := ran["cost-polls100-wake"]; p.Cost == nil || p.Cost.Parked < int64(idlePolls(100)) || p.Cost.WakeFromReply.Count == 0 || p.Cost.Missed > 0 || p.Cost.RSSLoaded <= 0 {
		t.Errorf("cost-polls100-wake: %+v: want %d polls parked, wake-ups none missed, RSS read", p.Cost, idlePolls(100))
	}
	// The hot-topic targets, the RSS, restart and wake-up targets: all
	// there, whether they pass or not (that is speed, not this test's).
	if len(res.Targets) != 10 {
		var names []string
		for _, tg := range res.Targets {
			names = append(names, tg.Name)
		}
		t.Errorf("targets %q: want 10", names)
	}
	left, err := filepath.Glob(filepath.Join(dir, "tidemq-load-*"))
	if err != nil || len(left) > 0 {
		t.Errorf("left behind: %v (%v)", left, err)
	}
}
