package webhook_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
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

// pushEnv is a broker on in-memory Pebble with a pusher.
func pushEnv(t *testing.T, opts webhook.PusherOptions) *core.Broker {
	t.Helper()
	store, err := pebblestore.Open("db", pebblestore.Options{FS: vfs.NewMem()})
	if err != nil {
		t.Fatal(err)
	}
	b, err := core.New(store, core.Options{AutoCreate: true})
	if err != nil {
		t.Fatal(err)
	}
	opts.Reconcile = 20 * time.Millisecond
	p, err := webhook.NewPusher(b, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Error(err)
		}
		if err := b.Close(); err != nil {
			t.Error(err)
		}
		if err := store.Close(); err != nil {
			t.Error(err)
		}
	})
	return b
}

type pushed struct {
	MessageID       string `json:"messageId"`
	Body            string `json:"body"`
	ShardingKey     string `json:"shardingKey"`
	DeliveryAttempt int    `json:"deliveryAttempt"`
	ReceiptHandle   string `json:"receiptHandle"`
}

// sink is a push endpoint that records what it accepted.
type sink struct {
	fail     func(m pushed) int // status to answer; 0 accepts
	mu       sync.Mutex
	accepted map[string]int // body → times accepted
	order    []pushed
	calls    atomic.Int64
	headers  http.Header
	rawBody  []byte
}

func newSink(fail func(pushed) int) *sink { return &sink{fail: fail, accepted: map[string]int{}} }

func (s *sink) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.calls.Add(1)
	raw, _ := io.ReadAll(r.Body)
	var m pushed
	if err := json.Unmarshal(raw, &m); err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	if s.fail != nil {
		if code := s.fail(m); code != 0 {
			w.WriteHeader(code)
			return
		}
	}
	s.mu.Lock()
	s.accepted[m.Body]++
	s.order = append(s.order, m)
	s.headers, s.rawBody = r.Header.Clone(), raw
	s.mu.Unlock()
}

func (s *sink) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.accepted)
}

func waitUntil(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func sendN(t *testing.T, b *core.Broker, topic string, n int, key func(i int) string) {
	t.Helper()
	msgs := make([]*core.Message, n)
	for i := range msgs {
		msgs[i] = &core.Message{Body: fmt.Appendf(nil, "m-%04d", i)}
		if key != nil {
			msgs[i].ShardingKey = key(i)
		}
	}
	if _, err := b.Send(context.Background(), topic, msgs); err != nil {
		t.Fatal(err)
	}
}

func TestPushDeliversEveryMessageSigned(t *testing.T) {
	b := pushEnv(t, webhook.PusherOptions{})
	s := newSink(nil)
	srv := httptest.NewServer(s)
	defer srv.Close()
	const secret = "0123456789abcdef-secret"
	ctx := context.Background()
	_, _, err := b.PutSubscription(ctx, "orders", "hook", core.SubscriptionConfig{
		Push: &core.PushConfig{Endpoint: srv.URL, MaxInFlight: 8, Headers: map[string]string{"X-Team": "billing"}, Secret: secret},
	})
	if err != nil {
		t.Fatal(err)
	}
	sendN(t, b, "orders", 200, nil)
	// It failed once in a full .ci/run (session 8: not reproduced in 55
	// runs since, nothing logged); say where the messages were if it does.
	for deadline := time.Now().Add(10 * time.Second); s.count() != 200; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			info, _ := b.GetSubscription("orders", "hook")
			t.Fatalf("timed out waiting for 200 pushed messages: %d accepted of %d POSTs; subscription lag %d, inflight %d, retrying %d, dlq %d",
				s.count(), s.calls.Load(), info.Lag, info.Inflight, info.Retrying, info.DLQ)
		}
	}
	waitUntil(t, 5*time.Second, "lag 0", func() bool {
		info, _ := b.GetSubscription("orders", "hook")
		return info.Lag == 0 && info.Inflight == 0
	})
	s.mu.Lock()
	defer s.mu.Unlock()
	for body, n := range s.accepted {
		if n != 1 {
			t.Errorf("%s accepted %d times", body, n)
		}
	}
	if s.headers.Get("X-Team") != "billing" || s.headers.Get("X-Tidemq-Topic") != "orders" || s.headers.Get("X-Tidemq-Message-Id") == "" {
		t.Errorf("headers %v", s.headers)
	}
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write(s.rawBody)
	if got, want := s.headers.Get("X-Tidemq-Signature"), "sha256="+hex.EncodeToString(mac.Sum(nil)); got != want {
		t.Errorf("signature %q, want %q", got, want)
	}
	if _, err := b.Pull(ctx, "orders", "hook", core.PullRequest{}); !errorsIs(err, core.ErrModeConflict) {
		t.Errorf("pull from a push subscription: %v, want ErrModeConflict", err)
	}
}

// TestPushWithFlakyReceiver: 30% of POSTs fail; with maxRetries 10 and a
// short schedule every message still arrives, and the attempts it took
// match the nacks the receiver gave.
func TestPushWithFlakyReceiver(t *testing.T) {
	b := pushEnv(t, webhook.PusherOptions{FailuresToOpen: 1000})
	var failures sync.Map // body → failures given
	s := newSink(func(m pushed) int {
		if rand.Float64() < 0.3 {
			n, _ := failures.LoadOrStore(m.Body, new(atomic.Int64))
			n.(*atomic.Int64).Add(1)
			return http.StatusInternalServerError
		}
		return 0
	})
	srv := httptest.NewServer(s)
	defer srv.Close()
	ten := 10
	_, _, err := b.PutSubscription(context.Background(), "orders", "hook", core.SubscriptionConfig{
		MaxRetries: &ten, RetryDelays: []time.Duration{50 * time.Millisecond},
		Push: &core.PushConfig{Endpoint: srv.URL, MaxInFlight: 16},
	})
	if err != nil {
		t.Fatal(err)
	}
	sendN(t, b, "orders", 300, nil)
	waitUntil(t, 30*time.Second, "every message despite failures", func() bool { return s.count() == 300 })
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range s.order {
		var failed int64
		if n, ok := failures.Load(m.Body); ok {
			failed = n.(*atomic.Int64).Load()
		}
		if int64(m.DeliveryAttempt) != failed+1 {
			t.Errorf("%s accepted at attempt %d after %d failures", m.Body, m.DeliveryAttempt, failed)
		}
	}
	if info, _ := b.GetSubscription("orders", "hook"); info.DLQ != 0 {
		t.Errorf("dlq %d, want 0", info.DLQ)
	}
}

// TestPushReceiverDownTenSeconds: the endpoint is down for 10 s; the
// breaker pauses delivery instead of burning messages into the DLQ, and
// delivery resumes by itself.
func TestPushReceiverDownTenSeconds(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out a 10 s outage")
	}
	b := pushEnv(t, webhook.PusherOptions{OpenFor: time.Second})
	var down atomic.Bool
	down.Store(true)
	s := newSink(func(pushed) int {
		if down.Load() {
			return http.StatusServiceUnavailable
		}
		return 0
	})
	srv := httptest.NewServer(s)
	defer srv.Close()
	two := 2
	_, _, err := b.PutSubscription(context.Background(), "orders", "hook", core.SubscriptionConfig{
		MaxRetries: &two, RetryDelays: []time.Duration{100 * time.Millisecond},
		Push: &core.PushConfig{Endpoint: srv.URL, MaxInFlight: 4},
	})
	if err != nil {
		t.Fatal(err)
	}
	sendN(t, b, "orders", 50, nil)
	waitUntil(t, 5*time.Second, "the breaker to open", func() bool {
		info, _ := b.GetSubscription("orders", "hook")
		return info.PushState == "open"
	})
	time.Sleep(10 * time.Second)
	calls := s.calls.Load()
	if calls > 40 {
		t.Errorf("%d POSTs to an endpoint down for 10 s: the breaker did not pause delivery", calls)
	}
	down.Store(false)
	waitUntil(t, 15*time.Second, "delivery to resume", func() bool { return s.count() == 50 })
	info, _ := b.GetSubscription("orders", "hook")
	if info.DLQ != 0 {
		t.Fatalf("%d messages went to the DLQ during the outage", info.DLQ)
	}
	waitUntil(t, 5*time.Second, "the breaker to close", func() bool {
		info, _ := b.GetSubscription("orders", "hook")
		return info.PushState == "closed"
	})
}

// TestOrderlyPushKeepsKeyOrder: key k0 fails its first two attempts; its
// messages still arrive in order, and other keys flow meanwhile.
func TestOrderlyPushKeepsKeyOrder(t *testing.T) {
	b := pushEnv(t, webhook.PusherOptions{FailuresToOpen: 1000})
	var k0fails atomic.Int64
	s := newSink(func(m pushed) int {
		if m.ShardingKey == "k0" && m.Body == "m-0000" && k0fails.Add(1) <= 2 {
			return http.StatusInternalServerError
		}
		return 0
	})
	srv := httptest.NewServer(s)
	defer srv.Close()
	_, _, err := b.PutSubscription(context.Background(), "orders", "hook", core.SubscriptionConfig{
		Orderly: true, RetryDelays: []time.Duration{200 * time.Millisecond},
		Push: &core.PushConfig{Endpoint: srv.URL, MaxInFlight: 16},
	})
	if err != nil {
		t.Fatal(err)
	}
	sendN(t, b, "orders", 120, func(i int) string { return fmt.Sprintf("k%d", i%4) })
	deadline := time.Now().Add(20 * time.Second)
	for s.count() < 120 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := s.count(); n != 120 {
		info, _ := b.GetSubscription("orders", "hook")
		t.Fatalf("%d of 120 delivered; %d calls; lag %d inflight %d retrying %d dlq %d queues %+v", n, s.calls.Load(), info.Lag, info.Inflight, info.Retrying, info.DLQ, info.Queues)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	last := map[string]string{}
	firstK0 := -1
	for i, m := range s.order {
		if prev, ok := last[m.ShardingKey]; ok && prev > m.Body {
			t.Errorf("key %s: %s after %s", m.ShardingKey, m.Body, prev)
		}
		last[m.ShardingKey] = m.Body
		if m.ShardingKey == "k0" && firstK0 < 0 {
			firstK0 = i
		}
	}
	if firstK0 < 30 {
		t.Errorf("k0's first message arrived at position %d: the other keys should have flowed while it was suspended", firstK0)
	}
}

func errorsIs(err, target error) bool { return errors.Is(err, target) }
