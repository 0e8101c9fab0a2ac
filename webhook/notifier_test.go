package webhook_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tidemq/tidemq/core"
	"github.com/tidemq/tidemq/pebblestore"
	"github.com/tidemq/tidemq/webhook"
)

// receiver is a webhook endpoint that can be down (503) or up.
type receiver struct {
	up       atomic.Bool
	requests atomic.Int64
	mu       sync.Mutex
	got      []map[string]any
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rc.requests.Add(1)
	if !rc.up.Load() {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	var body map[string]any
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	rc.mu.Lock()
	rc.got = append(rc.got, body)
	rc.mu.Unlock()
}

func (rc *receiver) alerts() []map[string]any {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]map[string]any(nil), rc.got...)
}

func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestDLQAlertReachesWebhookAfterOutage(t *testing.T) {
	rc := &receiver{}
	srv := httptest.NewServer(rc)
	defer srv.Close()

	n := webhook.New(webhook.Options{OpenFor: 300 * time.Millisecond})
	store, err := pebblestore.Open("db", pebblestore.Options{FS: vfs.NewMem()})
	if err != nil {
		t.Fatal(err)
	}
	b, err := core.New(store, core.Options{AutoCreate: true, Notifier: n, AlertInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Error(err)
		}
		if err := n.Close(); err != nil {
			t.Error(err)
		}
		if err := store.Close(); err != nil {
			t.Error(err)
		}
	})
	ctx := context.Background()
	zero := int64(0)
	_, _, err = b.PutSubscription(ctx, "orders", "billing", core.SubscriptionConfig{
		Alerts: &core.AlertConfig{MaxDLQ: &zero, WebhookURL: srv.URL},
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Send(ctx, "orders", []*core.Message{{Body: []byte("poison")}}); err != nil {
		t.Fatal(err)
	}
	got, err := b.Pull(ctx, "orders", "billing", core.PullRequest{MaxMessages: 1})
	if err != nil || len(got) != 1 {
		t.Fatalf("pull: %v, %d messages", err, len(got))
	}
	if _, _, err := b.DeadLetter(ctx, "orders", "billing", []string{got[0].ReceiptHandle}, "bad"); err != nil {
		t.Fatal(err)
	}

	// Down: the breaker opens after three failures and then lets one probe
	// through per OpenFor, instead of a retry every backoff step.
	waitFor(t, 5*time.Second, "the breaker to open", func() bool { return rc.requests.Load() >= 3 })
	time.Sleep(time.Second)
	if n := rc.requests.Load(); n > 8 {
		t.Fatalf("%d requests to a down webhook in about a second: the breaker did not hold them back", n)
	}
	rc.up.Store(true)
	waitFor(t, 5*time.Second, "the firing alert", func() bool { return len(rc.alerts()) >= 1 })
	first := rc.alerts()[0]
	if first["status"] != "firing" || first["alert"] != "dlq" || first["topic"] != "orders" || first["group"] != "billing" ||
		first["value"] != float64(1) || first["max"] != float64(0) {
		t.Fatalf("firing alert body %v", first)
	}

	// Redriving empties the DLQ: the alert resolves, once.
	if _, err := b.Redrive(ctx, "orders", "billing", core.RedriveFilter{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the resolved alert", func() bool { return len(rc.alerts()) >= 2 })
	time.Sleep(200 * time.Millisecond)
	all := rc.alerts()
	if len(all) != 2 || all[1]["status"] != "resolved" || all[1]["value"] != float64(0) {
		t.Fatalf("alerts after redrive: %v (want exactly one resolved after the firing one)", all)
	}
}
