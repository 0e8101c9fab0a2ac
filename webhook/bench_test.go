package webhook_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidemq/tidemq/core"
	"github.com/tidemq/tidemq/pebblestore"
	"github.com/tidemq/tidemq/webhook"
)

// BenchmarkPushDelivery measures push throughput to a fast local receiver:
// b.N messages (1 KiB) are stored up front, then the pusher POSTs each one
// (up to 64 in flight) and acks it; the clock runs until the receiver has
// all of them. fsync on, on a real disk.
func BenchmarkPushDelivery(b *testing.B) {
	var got atomic.Int64
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		got.Add(1)
	}))
	defer recv.Close()
	store, err := pebblestore.Open(b.TempDir(), pebblestore.Options{})
	if err != nil {
		b.Fatal(err)
	}
	br, err := core.New(store, core.Options{AutoCreate: true})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	body := make([]byte, 1024)
	for sent := 0; sent < b.N; {
		n := min(1000, b.N-sent)
		msgs := make([]*core.Message, n)
		for i := range msgs {
			msgs[i] = &core.Message{Body: body}
		}
		if _, err := br.Send(ctx, "bench", msgs); err != nil {
			b.Fatal(err)
		}
		sent += n
	}
	b.SetBytes(1024)
	b.ResetTimer()
	p, err := webhook.NewPusher(br, webhook.PusherOptions{Reconcile: 10 * time.Millisecond})
	if err != nil {
		b.Fatal(err)
	}
	if _, _, err := br.PutSubscription(ctx, "bench", "push", core.SubscriptionConfig{
		Push: &core.PushConfig{Endpoint: recv.URL, MaxInFlight: 64},
	}); err != nil {
		b.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Minute)
	for got.Load() < int64(b.N) && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
	if err := p.Close(); err != nil {
		b.Error(err)
	}
	if err := br.Close(); err != nil {
		b.Error(err)
	}
	if err := store.Close(); err != nil {
		b.Error(err)
	}
}
