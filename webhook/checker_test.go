package webhook_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sony/gobreaker/v2"

	"github.com/tidemq/tidemq/core"
	"github.com/tidemq/tidemq/webhook"
)

func TestCheckerPostsTheCheckAndReadsTheStatus(t *testing.T) {
	var mu sync.Mutex
	var got map[string]any
	reply := `{"status":"commit"}`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if r.Method != http.MethodPost || r.Header.Get("Content-Type") != "application/json" {
			http.Error(w, "want a JSON POST", http.StatusBadRequest)
			return
		}
		_ = json.NewDecoder(r.Body).Decode(&got)
		w.Write([]byte(reply))
	}))
	t.Cleanup(srv.Close)
	c := webhook.NewChecker(webhook.CheckerOptions{})
	tc := core.TransactionCheck{Topic: "orders", TransactionID: "tx1", MessageIDs: []string{"m1", "m2"}, ProducerGroup: "pg", Check: 3}
	status, err := c.CheckTransaction(t.Context(), srv.URL, tc)
	if err != nil || status != core.CheckCommit {
		t.Fatalf("check: %q, %v", status, err)
	}
	mu.Lock()
	body, _ := json.Marshal(got)
	mu.Unlock()
	if want := `{"check":3,"messageIds":["m1","m2"],"producerGroup":"pg","topic":"orders","transactionId":"tx1"}`; string(body) != want {
		t.Errorf("check body %s, want %s", body, want)
	}
	for r, wantErr := range map[string]bool{`{"status":"rollback"}`: false, `{"status":"unknown"}`: false, `{"status":"maybe"}`: true, `not json`: true} {
		mu.Lock()
		reply = r
		mu.Unlock()
		if _, err := c.CheckTransaction(t.Context(), srv.URL, tc); (err != nil) != wantErr {
			t.Errorf("reply %s: err %v, want an error: %t", r, err, wantErr)
		}
	}
}

// A producer that is down opens its URL's breaker: later checks fail at
// once without a request, until a probe after OpenFor finds it back.
func TestCheckerBreakerPerURL(t *testing.T) {
	var up atomic.Bool
	var requests atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		if !up.Load() {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte(`{"status":"commit"}`))
	}))
	t.Cleanup(srv.Close)
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{"status":"rollback"}`))
	}))
	t.Cleanup(other.Close)
	c := webhook.NewChecker(webhook.CheckerOptions{OpenFor: 200 * time.Millisecond})
	tc := core.TransactionCheck{Topic: "t", TransactionID: "x", Check: 1}
	for range 3 {
		if _, err := c.CheckTransaction(t.Context(), srv.URL, tc); err == nil {
			t.Fatal("a check of a down producer succeeded")
		}
	}
	if _, err := c.CheckTransaction(t.Context(), srv.URL, tc); !errors.Is(err, gobreaker.ErrOpenState) {
		t.Fatalf("fourth check: %v, want the breaker open", err)
	}
	if n := requests.Load(); n != 3 {
		t.Fatalf("%d requests, want 3 (the open breaker sends none)", n)
	}
	if s, err := c.CheckTransaction(t.Context(), other.URL, tc); err != nil || s != core.CheckRollback {
		t.Fatalf("another URL's check: %q, %v; its breaker is its own", s, err)
	}
	up.Store(true)
	deadline := time.Now().Add(5 * time.Second)
	for {
		s, err := c.CheckTransaction(t.Context(), srv.URL, tc)
		if err == nil && s == core.CheckCommit {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the breaker never let a probe through: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
