package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// TestCrashBetweenHalfMessageAndCommit: the real binary is SIGKILLed after
// two half messages are stored and before anyone decided them. After the
// restart both are still there and delivered to nobody; the check-back
// then asks the producer (an HTTP server here), which answers commit for
// one (its database change committed) and rollback for the other: the
// first is delivered once, the second never.
func TestCrashBetweenHalfMessageAndCommit(t *testing.T) {
	var mu sync.Mutex
	decided := map[string]string{} // transactionId → the producer's answer
	asked := map[string]int{}
	producer := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var check struct {
			TransactionID string
			Check         int
		}
		if err := json.NewDecoder(r.Body).Decode(&check); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		status := decided[check.TransactionID]
		asked[check.TransactionID]++
		mu.Unlock()
		if status == "" {
			status = "unknown"
		}
		fmt.Fprintf(w, `{"status":%q}`, status)
	}))
	t.Cleanup(producer.Close)

	dir := t.TempDir()
	p := startTidemq(t, dir)
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	hc := &http.Client{Timeout: 10 * time.Second}
	do := func(method, path string, body, out any) int {
		t.Helper()
		status, err := call(ctx, hc, method, p.base+"/v1/topics/tx"+path, body, out)
		if err != nil && status < 400 {
			t.Fatal(err)
		}
		return status
	}
	do("PUT", "", map[string]any{"queues": 2, "transactionCheckUrl": producer.URL}, nil)
	do("PUT", "/subscriptions/g", map[string]any{}, nil)
	const checkAfter = 4 * time.Second
	sentAt := time.Now()
	var committed, rolledBack struct{ MessageID, TransactionID string }
	do("POST", "/messages", map[string]any{"body": "commit-me", "transaction": map[string]any{"checkAfterSeconds": int(checkAfter / time.Second)}}, &committed)
	do("POST", "/messages", map[string]any{"body": "roll-me-back", "transaction": map[string]any{"checkAfterSeconds": int(checkAfter / time.Second)}}, &rolledBack)
	if committed.TransactionID == "" || rolledBack.TransactionID == "" {
		t.Fatalf("half message replies %+v %+v", committed, rolledBack)
	}

	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := p.waitExit(t, 10*time.Second); err == nil {
		t.Fatal("tidemq exited cleanly after SIGKILL?")
	}
	// The producer's transactions end while the broker is down: it never
	// heard of the outcome, so only its check can tell.
	mu.Lock()
	decided[committed.TransactionID], decided[rolledBack.TransactionID] = "commit", "rollback"
	mu.Unlock()
	p = startTidemq(t, dir)

	var topic struct{ HalfMessages, Messages int64 }
	do("GET", "", nil, &topic)
	var early pulled
	do("POST", "/subscriptions/g/pull", map[string]any{"maxMessages": 10}, &early)
	if beforeCheck := time.Since(sentAt) < checkAfter-500*time.Millisecond; beforeCheck {
		if topic.HalfMessages != 2 || topic.Messages != 0 || len(early.Messages) != 0 {
			t.Fatalf("after the restart, before the check: %+v, pulled %v; want 2 half messages, none delivered", topic, early.Messages)
		}
	} else {
		t.Logf("the restart took %v: the check may have come already", time.Since(sentAt))
	}

	var delivered []string
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		var got pulled
		do("POST", "/subscriptions/g/pull", map[string]any{"waitSeconds": 1, "maxMessages": 10}, &got)
		for _, m := range append(early.Messages, got.Messages...) {
			delivered = append(delivered, m.Body)
			do("POST", "/subscriptions/g/ack", map[string]any{"receiptHandles": []string{m.ReceiptHandle}}, nil)
		}
		early.Messages = nil
		do("GET", "", nil, &topic)
		if topic.HalfMessages == 0 && len(delivered) > 0 {
			break
		}
	}
	// One more look: nothing else comes.
	var late pulled
	do("POST", "/subscriptions/g/pull", map[string]any{"waitSeconds": 1, "maxMessages": 10}, &late)
	for _, m := range late.Messages {
		delivered = append(delivered, m.Body)
	}
	if len(delivered) != 1 || delivered[0] != "commit-me" || topic.HalfMessages != 0 {
		t.Fatalf("delivered %v with %d half messages left; want commit-me once, roll-me-back never", delivered, topic.HalfMessages)
	}
	if s := do("POST", "/transactions/"+committed.TransactionID+":commit", nil, nil); s != http.StatusOK {
		t.Errorf("commit of the transaction the check committed: %d", s)
	}
	if s := do("POST", "/transactions/"+rolledBack.TransactionID+":commit", nil, nil); s != http.StatusConflict {
		t.Errorf("commit of the transaction the check rolled back: %d, want 409", s)
	}
	mu.Lock()
	defer mu.Unlock()
	if asked[committed.TransactionID] != 1 || asked[rolledBack.TransactionID] != 1 {
		t.Errorf("checks asked %v, want one each", asked)
	}
}

// TestCrashDuringACheck: the process is SIGKILLed while the producer is
// still answering a check. The answer is lost with the process; after the
// restart the broker asks again (the transaction's check timer is put
// back at start), and the producer's commit delivers the message once.
func TestCrashDuringACheck(t *testing.T) {
	arrived := make(chan struct{}, 1)
	var answering atomic.Bool // false: the check hangs until the client goes
	producer := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Read to the end: the server then notices the client going away.
		_, _ = io.Copy(io.Discard, r.Body)
		if !answering.Load() {
			select {
			case arrived <- struct{}{}:
			default:
			}
			select {
			case <-r.Context().Done():
			case <-time.After(30 * time.Second):
			}
			return
		}
		fmt.Fprint(w, `{"status":"commit"}`)
	}))
	t.Cleanup(producer.Close)

	dir := t.TempDir()
	p := startTidemq(t, dir)
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	hc := &http.Client{Timeout: 10 * time.Second}
	do := func(method, path string, body, out any) {
		t.Helper()
		if _, err := call(ctx, hc, method, p.base+"/v1/topics/tx"+path, body, out); err != nil {
			t.Fatal(err)
		}
	}
	do("PUT", "", map[string]any{"queues": 1, "transactionCheckUrl": producer.URL}, nil)
	do("PUT", "/subscriptions/g", map[string]any{}, nil)
	var half struct{ MessageID, TransactionID string }
	do("POST", "/messages", map[string]any{"body": "checked", "transaction": map[string]any{"checkAfterSeconds": 1}}, &half)
	select {
	case <-arrived:
	case <-time.After(15 * time.Second):
		t.Fatal("no check within 15 s")
	}
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := p.waitExit(t, 10*time.Second); err == nil {
		t.Fatal("tidemq exited cleanly after SIGKILL?")
	}
	answering.Store(true)
	p = startTidemq(t, dir)
	var delivered []string
	deadline := time.Now().Add(20 * time.Second)
	for len(delivered) == 0 && time.Now().Before(deadline) {
		var got pulled
		do("POST", "/subscriptions/g/pull", map[string]any{"waitSeconds": 1, "maxMessages": 10}, &got)
		for _, m := range got.Messages {
			delivered = append(delivered, m.MessageID)
			do("POST", "/subscriptions/g/ack", map[string]any{"receiptHandles": []string{m.ReceiptHandle}}, nil)
		}
	}
	var late pulled
	do("POST", "/subscriptions/g/pull", map[string]any{"waitSeconds": 1, "maxMessages": 10}, &late)
	if len(delivered) != 1 || delivered[0] != half.MessageID || len(late.Messages) != 0 {
		t.Fatalf("delivered %v then %v; want %s once", delivered, late.Messages, half.MessageID)
	}
}
