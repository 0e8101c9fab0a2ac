package main

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestFloodBatchIsAValidBatchUnderItsSize: the flood's body is a JSON
// batch of n messages of distinct letter bodies, as large as fits.
func TestFloodBatchIsAValidBatchUnderItsSize(t *testing.T) {
	const n, size = 1000, 15_000_000
	b, err := floodBatch(n, size)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > size || len(b) < size-2*n {
		t.Errorf("batch of %d bytes: want at most %d and within a message's rounding of it", len(b), size)
	}
	var batch struct {
		Messages []struct {
			Body string `json:"body"`
		} `json:"messages"`
	}
	if err := json.Unmarshal(b, &batch); err != nil {
		t.Fatal(err)
	}
	if len(batch.Messages) != n {
		t.Fatalf("%d messages, want %d", len(batch.Messages), n)
	}
	if a, z := batch.Messages[0].Body, batch.Messages[n-1].Body; a == z || len(a) != len(z) || len(a) < 14_000 {
		t.Errorf("bodies of %d and %d bytes, equal %v: want distinct bodies of about 15 kB", len(a), len(z), a == z)
	}
	if _, err := floodBatch(10, 100); err == nil {
		t.Error("10 messages in 100 bytes: want an error")
	}
}

// TestFloodSmoke floods a real broker process with a small body budget
// (2 MiB) from 4 connections posting 1 MB batches for 1 s: some are
// stored, the rest refused with 429 and Retry-After; nothing else comes
// back, every stored message is in the topic, the budget in use never
// passes its limit, and the broker process is gone afterwards.
func TestFloodSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("builds ./cmd/tidemq and floods it for 1 s")
	}
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	bin, err := buildBroker(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	const budget = 2 << 20
	spec := floodSpec{Connections: 4, BatchBytes: 1_000_000, BatchMessages: 100, Duration: time.Second, Timeout: 20 * time.Second,
		BrokerArgs: []string{"--body-budget-bytes", "2097152"}}
	res, err := runFlood(ctx, spec, bin, dir, t.Logf)
	if res.BrokerPid > 0 { // 0 (not started) would be this process's group to kill(2)
		checkNoBroker(t, []int{res.BrokerPid})
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s; peak RSS %s; budget peak %s of %s; longest %s", res.answers(), bytesIEC(res.PeakRSS), bytesIEC(res.BudgetUsedPeak), bytesIEC(res.BudgetLimit), res.MaxRequest)
	if res.count("201") == 0 || res.count("429") == 0 {
		t.Errorf("%s: want some 201 and some 429", res.answers())
	}
	if res.failures() != 0 || res.Requests != res.count("201")+res.count("429") {
		t.Errorf("%s: want only 201s and 429s with Retry-After", res.answers())
	}
	if res.Stored != res.count("201")*100 || res.TopicMessages != res.Stored {
		t.Errorf("%d messages in 201 batches, the topic holds %d", res.Stored, res.TopicMessages)
	}
	if res.BudgetLimit != budget || res.BudgetUsedPeak > budget {
		t.Errorf("budget: limit %d, used at most %d: want the limit %d, never passed", res.BudgetLimit, res.BudgetUsedPeak, budget)
	}
	// VmHWM lags the RSS a sample reads by up to the kernel's per-thread
	// counter batches (a few hundred KiB): 1 MiB of slack.
	if res.PeakRSS <= 0 || res.RSSAfter <= 0 || res.SampledPeakRSS > res.PeakRSS+1<<20 {
		t.Errorf("RSS: peak %d, after %d, sampled peak %d: want the peak above every sample", res.PeakRSS, res.RSSAfter, res.SampledPeakRSS)
	}
	if res.MaxRequest <= 0 || res.MaxRequest > spec.Timeout || res.CreatedLatency.Count != res.count("201") {
		t.Errorf("longest request %s (timeout %s), %d 201 latencies of %d", res.MaxRequest, spec.Timeout, res.CreatedLatency.Count, res.count("201"))
	}
	if res.BrokerLog != "" {
		t.Errorf("broker log kept (%s) after a flood that went well", res.BrokerLog)
	}
}

// TestFloodTargets: each flood target passes on a good flood and fails on
// the fault it is about, and none is there when the flood did not run.
func TestFloodTargets(t *testing.T) {
	good := func() *floodResult {
		return &floodResult{Spec: floodSuiteSpec(20 * time.Second), Requests: 100, Statuses: map[string]int64{"201": 10, "429": 90},
			Stored: 10_000, TopicMessages: 10_000, PeakRSS: 400 << 20, MaxRequest: 2 * time.Second}
	}
	verdicts := func(f *floodResult) map[string]bool {
		g := map[string]phase{}
		if f != nil {
			g[floodPhaseName] = phase{Name: floodPhaseName, Flood: f}
		}
		pass := map[string]bool{}
		floodTargets(func(name, want string, needs []string, ok func(float64) bool, one func(map[string]phase) (float64, string, string, bool)) {
			for _, n := range needs {
				if _, ran := g[n]; !ran {
					return
				}
			}
			r, _, _, errs := one(g)
			pass[strings.TrimPrefix(name, "producer flood, 48 connections, 15 MB batches: ")] = ok(r) && !errs
		})
		return pass
	}
	if v := verdicts(nil); len(v) != 0 {
		t.Errorf("without the flood phase: targets %v", v)
	}
	if v := verdicts(good()); len(v) != 3 || !v["broker peak RSS"] || !v["longest request"] || !v["answers"] {
		t.Errorf("a good flood: %v, want the three targets passed", v)
	}
	for _, c := range []struct {
		fault   string
		targets []string // those that fail
		spoil   func(*floodResult)
	}{
		{"peak RSS 513 MiB", []string{"broker peak RSS"}, func(f *floodResult) { f.PeakRSS = 513 << 20 }},
		{"a request past the timeout", []string{"longest request"}, func(f *floodResult) { f.MaxRequest = 31 * time.Second }},
		{"a client timeout (no answer)", []string{"longest request", "answers"}, func(f *floodResult) { f.Statuses["timeout"] = 1; f.Requests++ }},
		{"a 500", []string{"answers"}, func(f *floodResult) { f.Statuses["500"] = 1; f.Requests++ }},
		{"a 413", []string{"answers"}, func(f *floodResult) { f.Statuses["413"] = 1; f.Requests++ }},
		{"a 429 without Retry-After", []string{"answers"}, func(f *floodResult) { f.TooManyNoRetryAfter = 1 }},
		{"no 201", []string{"answers"}, func(f *floodResult) { f.Statuses = map[string]int64{"429": 100}; f.Stored, f.TopicMessages = 0, 0 }},
		{"stored messages missing from the topic", []string{"answers"}, func(f *floodResult) { f.TopicMessages-- }},
	} {
		f := good()
		c.spoil(f)
		v := verdicts(f)
		for name, pass := range v {
			if want := !slices.Contains(c.targets, name); pass != want {
				t.Errorf("%s: %s passed %v, want %v", c.fault, name, pass, want)
			}
		}
	}
}
