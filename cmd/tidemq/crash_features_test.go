package main

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"syscall"
	"testing"
	"time"
)

// TestCrashKeepsRetriesDelaysAndDLQ: parked retries, delayed sends and
// the DLQ are durable. With the real binary: delayed sends, nacked
// messages waiting for a retry and dead-lettered ones (by hand and by
// maxRetries) are all where they were after SIGKILL and a restart, and
// the timers keep their times.
func TestCrashKeepsRetriesDelaysAndDLQ(t *testing.T) {
	dir := t.TempDir()
	p := startTidemq(t, dir)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	hc := &http.Client{Timeout: 10 * time.Second}
	base := func() string { return p.base + "/v1/topics/feat" }
	do := func(method, path string, body, out any) {
		t.Helper()
		if _, err := call(ctx, hc, method, base()+path, body, out); err != nil {
			t.Fatal(err)
		}
	}
	do("PUT", "", map[string]any{"queues": 2}, nil)
	do("PUT", "/subscriptions/g", map[string]any{"maxRetries": 1, "retryDelays": []string{"1s"}}, nil)

	delayedAt := time.Now()
	for i := range 3 {
		var r struct{ Offset *uint64 }
		do("POST", "/messages", map[string]any{"body": fmt.Sprintf("d%d", i), "delaySeconds": 3}, &r)
		if r.Offset != nil {
			t.Fatalf("delayed send answered offset %d, want null", *r.Offset)
		}
	}
	for i := range 6 {
		do("POST", "/messages", map[string]any{"body": fmt.Sprintf("n%d", i)}, nil)
	}
	var got pulled
	do("POST", "/subscriptions/g/pull", map[string]any{"maxMessages": 10}, &got)
	h := map[string]string{}
	for _, m := range got.Messages {
		h[m.Body] = m.ReceiptHandle
	}
	if len(h) != 6 {
		t.Fatalf("pulled %v, want n0…n5 (the delayed ones are not due)", got.Messages)
	}
	nackedAt := time.Now()
	do("POST", "/subscriptions/g/nack", map[string]any{"receiptHandles": []string{h["n0"], h["n1"]}, "delaySeconds": 30, "reason": "later"}, nil)
	do("POST", "/subscriptions/g/deadletter", map[string]any{"receiptHandles": []string{h["n2"], h["n3"]}, "reason": "poison"}, nil)
	do("POST", "/subscriptions/g/ack", map[string]any{"receiptHandles": []string{h["n5"]}}, nil)
	// n4 fails twice: with maxRetries 1 that sends it to the DLQ.
	do("POST", "/subscriptions/g/nack", map[string]any{"receiptHandles": []string{h["n4"]}, "reason": "first failure"}, nil)
	var retry pulled
	do("POST", "/subscriptions/g/pull", map[string]any{"waitSeconds": 5}, &retry)
	if len(retry.Messages) != 1 || retry.Messages[0].Body != "n4" {
		t.Fatalf("retry of n4: %+v", retry.Messages)
	}
	do("POST", "/subscriptions/g/nack", map[string]any{"receiptHandles": []string{retry.Messages[0].ReceiptHandle}, "reason": "second failure"}, nil)

	type stats struct{ Lag, Retrying, Dlq int64 }
	var before stats
	do("GET", "/subscriptions/g", nil, &before)
	if before.Retrying != 2 || before.Dlq != 3 {
		t.Fatalf("before the kill: %+v, want retrying 2 (n0 n1) and dlq 3 (n2 n3 n4)", before)
	}
	parkedBeforeKill := time.Since(delayedAt) < 2500*time.Millisecond
	if parkedBeforeKill {
		var topic struct{ Messages int64 }
		do("GET", "", nil, &topic)
		if topic.Messages != 6 {
			t.Errorf("topic holds %d messages before the delayed ones are due, want 6", topic.Messages)
		}
	}

	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := p.waitExit(t, 10*time.Second); err == nil {
		t.Fatal("tidemq exited cleanly after SIGKILL?")
	}
	p = startTidemq(t, dir)

	var after stats
	do("GET", "/subscriptions/g", nil, &after)
	if after.Retrying != before.Retrying || after.Dlq != before.Dlq {
		t.Errorf("after SIGKILL and restart: %+v, before: %+v", after, before)
	}
	var dlq struct {
		Messages []struct {
			Body, Reason    string
			DeliveryAttempt int
		}
	}
	do("GET", "/subscriptions/g/dlq", nil, &dlq)
	var dead []string
	for _, m := range dlq.Messages {
		dead = append(dead, fmt.Sprintf("%s/%d/%s", m.Body, m.DeliveryAttempt, m.Reason))
	}
	slices.Sort(dead)
	if want := []string{"n2/1/poison", "n3/1/poison", "n4/2/second failure"}; !slices.Equal(dead, want) {
		t.Errorf("DLQ after restart %v, want %v", dead, want)
	}

	// The delayed messages come when due (at once if that passed during
	// the restart), the retrying ones not before their 30 s.
	var delivered []string
	deadline := time.Now().Add(15 * time.Second)
	for len(delivered) < 3 && time.Now().Before(deadline) {
		var got pulled
		do("POST", "/subscriptions/g/pull", map[string]any{"waitSeconds": 1, "maxMessages": 10}, &got)
		for _, m := range got.Messages {
			if time.Since(nackedAt) < 30*time.Second && (m.Body == "n0" || m.Body == "n1") {
				t.Errorf("%s delivered %v after its nack, before its 30 s delay", m.Body, time.Since(nackedAt))
			}
			delivered = append(delivered, m.Body)
			do("POST", "/subscriptions/g/ack", map[string]any{"receiptHandles": []string{m.ReceiptHandle}}, nil)
		}
	}
	slices.Sort(delivered)
	if want := []string{"d0", "d1", "d2"}; !slices.Equal(delivered, want) {
		t.Fatalf("after restart delivered %v, want the delayed %v", delivered, want)
	}
	if at := time.Since(delayedAt); at < 3*time.Second {
		t.Errorf("delayed messages delivered %v after the send, before their 3 s", at)
	}
	t.Logf("delayed messages parked across the kill: %v", parkedBeforeKill)
	var still struct {
		Subscriptions []struct {
			State           string
			DeliveryAttempt int
			LastReason      string
		}
	}
	var nList struct {
		Messages []struct{ MessageID, Body string }
	}
	if _, err := call(ctx, hc, "GET", base()+"/messages?from="+nackedAt.Add(-time.Minute).UTC().Format(time.RFC3339)+"&limit=100", nil, &nList); err != nil {
		t.Fatal(err)
	}
	var n0 string
	for _, m := range nList.Messages {
		if m.Body == "n0" {
			n0 = m.MessageID
		}
	}
	if n0 == "" {
		t.Errorf("a query by time after restart did not find n0: %+v", nList.Messages)
	} else {
		do("GET", "/messages/"+n0, nil, &still)
		if len(still.Subscriptions) != 1 || still.Subscriptions[0].State != "retrying" || still.Subscriptions[0].LastReason != "later" {
			t.Errorf("n0 after restart: %+v, want retrying with reason \"later\"", still.Subscriptions)
		}
	}
	if time.Since(nackedAt) < 29*time.Second {
		var s stats
		do("GET", "/subscriptions/g", nil, &s)
		if s.Retrying != 2 {
			t.Errorf("retrying %d before the 30 s delay ended, want 2", s.Retrying)
		}
	}
}
