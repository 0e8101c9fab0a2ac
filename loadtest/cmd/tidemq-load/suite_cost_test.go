package main

import (
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
