package main

import (
	"context"
	"encoding/json"
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
	if res.PeakRSS <= 0 || res.RSSAfter <= 0 || res.SampledPeakRSS > res.PeakRSS {
		t.Errorf("RSS: peak %d, after %d, sampled peak %d: want the peak above every sample", res.PeakRSS, res.RSSAfter, res.SampledPeakRSS)
	}
	if res.MaxRequest <= 0 || res.MaxRequest > spec.Timeout || res.CreatedLatency.Count != res.count("201") {
		t.Errorf("longest request %s (timeout %s), %d 201 latencies of %d", res.MaxRequest, spec.Timeout, res.CreatedLatency.Count, res.count("201"))
	}
	if res.BrokerLog != "" {
		t.Errorf("broker log kept (%s) after a flood that went well", res.BrokerLog)
	}
}
