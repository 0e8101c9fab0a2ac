package sdk_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidemq/tidemq/core"
	"github.com/tidemq/tidemq/gateway"
	"github.com/tidemq/tidemq/pebblestore"
	"github.com/tidemq/tidemq/sdk"
	"github.com/tidemq/tidemq/webhook"
)

// The tests drive the SDK against the real server: Pebble in t.TempDir(),
// core and gateway wired as cmd/tidemq does, served on 127.0.0.1:0.

type testServer struct {
	URL  string
	logs *syncBuffer
}

func startServer(t testing.TB) *testServer {
	t.Helper()
	logs := &syncBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	store, err := pebblestore.Open(t.TempDir(), pebblestore.Options{Logger: log, CacheBytes: 8 << 20, MemTableBytes: 8 << 20})
	if err != nil {
		t.Fatalf("pebblestore.Open: %v", err)
	}
	// The check-back's caller as cmd/tidemq wires it (internal/node).
	b, err := core.New(store, core.Options{AutoCreate: true, Logger: log, TransactionChecker: webhook.NewChecker(webhook.CheckerOptions{Logger: log})})
	if err != nil {
		_ = store.Close()
		t.Fatalf("core.New: %v", err)
	}
	gw, err := gateway.New(b, gateway.Options{Logger: log})
	if err != nil {
		_ = b.Close()
		_ = store.Close()
		t.Fatalf("gateway.New: %v", err)
	}
	srv := httptest.NewServer(gw)
	t.Cleanup(func() {
		b.StopPolling() // parked long polls answer now
		srv.Close()
		if err := b.Close(); err != nil {
			t.Errorf("broker Close: %v", err)
		}
		if err := store.Close(); err != nil {
			t.Errorf("store Close: %v", err)
		}
		if t.Failed() {
			s := logs.String()
			if len(s) > 8<<10 {
				s = "…" + s[len(s)-8<<10:]
			}
			t.Logf("server log (end):\n%s", s)
		}
	})
	return &testServer{URL: srv.URL, logs: logs}
}

func newClient(t testing.TB, url string) *sdk.Client {
	t.Helper()
	c, err := sdk.NewClient(url, sdk.ClientOptions{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// topicName is a fresh topic name for t.
var topicSeq atomic.Int64

func topicName(prefix string) string {
	return fmt.Sprintf("%s-%d", prefix, topicSeq.Add(1))
}

// waitFor polls cond until it holds or timeout passes.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, err := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s (last error: %v)", timeout, what, err)
		}
		time.Sleep(20 * time.Millisecond) // polling interval, not synchronisation
	}
}

// runConsumer runs cs.Run in a goroutine owned by the test; the returned
// stop cancels it and returns Run's error.
func runConsumer(t testing.TB, cs *sdk.Consumer, h sdk.Handler) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- cs.Run(ctx, h) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-done:
			case <-time.After(30 * time.Second):
				err = fmt.Errorf("Run did not return 30s after its ctx ended")
			}
		})
		return err
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("consumer Run: %v", err)
		}
	})
	return stop
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
