package main

import (
	"slices"
	"strings"
	"testing"
)

// TestTargetsSuiteTransactions runs the transactional phase beside its
// plain twin and checks counts only: both ran, every transaction was
// committed (the messages count as sent only then), and the comparison is a
// target. No rate is asserted.
func TestTargetsSuiteTransactions(t *testing.T) {
	res := runTargetsSuite(t, t.TempDir(), "-phases", `^(tx-)?single-p16-1KiB$`,
		"-duration", "300ms", "-warmup", "100ms", "-curve-duration", "300ms", "-quiet", "-format", "json", "-tracing=false")
	var ran []string
	for _, p := range res.Phases {
		ran = append(ran, p.Name)
		rep := p.Report
		if rep == nil || rep.Sent == 0 || rep.Send.Requests != rep.Sent || len(p.Errors) > 0 {
			t.Errorf("phase %s: report %+v, errors %v: want messages sent, one per request, no errors", p.Name, rep, p.Errors)
			continue
		}
		if got := rep.Scenario.Producers.Transactional; got != strings.HasPrefix(p.Name, "tx-") {
			t.Errorf("phase %s: transactional %v", p.Name, got)
		}
	}
	slices.Sort(ran)
	if want := []string{"single-p16-1KiB", "tx-single-p16-1KiB"}; !slices.Equal(ran, want) {
		t.Fatalf("phases run %v, want %v", ran, want)
	}
	found := false
	for _, tg := range res.Targets {
		if strings.HasPrefix(tg.Name, "half message + commit, 1 msg/transaction") {
			found = tg.Ratio > 0
		}
	}
	if !found {
		t.Errorf("targets %+v: want the transactional comparison with a ratio", res.Targets)
	}
}
