package mirror_test

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tidemq/tidemq/core"
	"github.com/tidemq/tidemq/mirror"
	"github.com/tidemq/tidemq/pebblestore"
)

func newBroker(t *testing.T) *core.Broker {
	t.Helper()
	store, err := pebblestore.Open("db", pebblestore.Options{FS: vfs.NewMem()})
	if err != nil {
		t.Fatal(err)
	}
	b, err := core.New(store, core.Options{AutoCreate: true, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Error(err)
		}
		if err := store.Close(); err != nil {
			t.Error(err)
		}
	})
	return b
}

// A source that answers every request with a 503 makes the mirror failing
// with that error, and is asked again with growing waits behind the
// breaker: never a tight loop.
func TestFailingSourceIsRetriedWithBackoff(t *testing.T) {
	var requests atomic.Int64
	src := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(`{"type":"about:blank","title":"Not ready","status":503,"code":"not_ready","detail":"shutting down"}`))
	}))
	t.Cleanup(src.Close)
	b := newBroker(t)
	if _, _, err := b.PutMirror(t.Context(), "m", core.MirrorConfig{Source: core.MirrorSource{URL: src.URL, Topic: "orders"}, Topic: "copies"}); err != nil {
		t.Fatal(err)
	}
	r, err := mirror.New(b, mirror.Options{Region: "sg", Reconcile: 10 * time.Millisecond, MinBackoff: 40 * time.Millisecond,
		MaxBackoff: 160 * time.Millisecond, FailuresToOpen: 3, OpenFor: 200 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() }) // idempotent; before the broker's cleanup
	start := time.Now()
	deadline := start.Add(5 * time.Second)
	for {
		info, err := b.GetMirror("m")
		if err != nil {
			t.Fatal(err)
		}
		if info.State == core.MirrorFailing && strings.Contains(info.LastError, "not_ready") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("mirror %+v, want failing with the source's not_ready", info)
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(time.Second)
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	elapsed := time.Since(start)
	n := requests.Load()
	// Each wait is at least half of MinBackoff: a tight loop would have
	// made thousands of requests.
	if limit := int64(elapsed/(20*time.Millisecond)) + 1; n > limit || n < 3 {
		t.Logf("requests: %d", n)
		t.Errorf("%d requests to a failing source in %v, want 3..%d", n, elapsed, limit)
	}
	// A request the client sent just before Close may reach the handler
	// a moment later; none starts after that.
	time.Sleep(50 * time.Millisecond)
	after := requests.Load()
	time.Sleep(200 * time.Millisecond)
	if requests.Load() != after {
		t.Error("requests after Close")
	}
}
