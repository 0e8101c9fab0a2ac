package core_test

import (
	"context"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/tidemq/tidemq/core"
	"github.com/tidemq/tidemq/pebblestore"
)

// tracedBroker is a broker on in-memory Pebble whose spans land in rec.
func tracedBroker(t *testing.T) (*core.Broker, *tracetest.SpanRecorder) {
	t.Helper()
	store, err := pebblestore.Open("db", pebblestore.Options{FS: vfs.NewMem()})
	if err != nil {
		t.Fatal(err)
	}
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	b, err := core.New(store, core.Options{AutoCreate: true, TracerProvider: tp})
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
	return b, rec
}

func spanAttr(s sdktrace.ReadOnlySpan, key string) (string, bool) {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value.Emit(), true
		}
	}
	return "", false
}

// TestMessageLifeIsOneTrace follows a message sent with a producer's
// traceparent through a nack and a second delivery to its ack: every span
// is in the producer's trace and carries the messaging attributes.
func TestMessageLifeIsOneTrace(t *testing.T) {
	b, rec := tracedBroker(t)
	ctx := context.Background()
	const producerTP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	pctx := propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier{"traceparent": producerTP})
	zero := 0
	if _, _, err := b.PutSubscription(ctx, "orders", "billing", core.SubscriptionConfig{RetryDelays: []time.Duration{0}, MaxRetries: &zero}); err != nil {
		t.Fatal(err)
	}
	res, err := b.Send(pctx, "orders", []*core.Message{{Body: []byte("hello"), Tag: "TagA", Keys: []string{"order-1"}}})
	if err != nil {
		t.Fatal(err)
	}
	id := res[0].MessageID

	got, err := b.Pull(ctx, "orders", "billing", core.PullRequest{MaxMessages: 1, ConsumerID: "c1"})
	if err != nil || len(got) != 1 {
		t.Fatalf("pull: %v %d", err, len(got))
	}
	sc := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier{"traceparent": got[0].Traceparent}))
	if sc.TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Fatalf("pulled traceparent %q is not in the producer's trace", got[0].Traceparent)
	}
	if _, _, err := b.Ack(ctx, "orders", "billing", []string{got[0].ReceiptHandle}); err != nil {
		t.Fatal(err)
	}

	want := map[string]bool{core.SpanSend: false, core.SpanDeliver: false, core.SpanAck: false}
	for _, s := range rec.Ended() {
		if _, ok := want[s.Name()]; !ok {
			continue
		}
		want[s.Name()] = true
		if s.SpanContext().TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" {
			t.Errorf("%s: trace %s, want the producer's", s.Name(), s.SpanContext().TraceID())
		}
		if v, _ := spanAttr(s, "messaging.system"); v != "tidemq" {
			t.Errorf("%s: messaging.system = %q", s.Name(), v)
		}
		if v, _ := spanAttr(s, "messaging.destination.name"); v != "orders" {
			t.Errorf("%s: messaging.destination.name = %q", s.Name(), v)
		}
		if v, _ := spanAttr(s, "messaging.message.id"); v != id {
			t.Errorf("%s: messaging.message.id = %q, want %q", s.Name(), v, id)
		}
		if s.Name() != core.SpanSend {
			if v, _ := spanAttr(s, "messaging.consumer.group.name"); v != "billing" {
				t.Errorf("%s: group = %q", s.Name(), v)
			}
			if v, _ := spanAttr(s, "tidemq.delivery_attempt"); v != "1" {
				t.Errorf("%s: attempt = %q", s.Name(), v)
			}
		} else if v, _ := spanAttr(s, "messaging.message.offset"); v != "0" {
			t.Errorf("send: offset = %q", v)
		}
	}
	for name, seen := range want {
		if !seen {
			t.Errorf("no %s span", name)
		}
	}
}

// TestMessageWithoutProducerTraceGetsItsOwn checks that each message of a
// batch sent without a traceparent starts its own trace.
func TestMessageWithoutProducerTraceGetsItsOwn(t *testing.T) {
	b, rec := tracedBroker(t)
	ctx := context.Background()
	if _, err := b.Send(ctx, "t", []*core.Message{{Body: []byte("a")}, {Body: []byte("b")}}); err != nil {
		t.Fatal(err)
	}
	traces := map[trace.TraceID]bool{}
	for _, s := range rec.Ended() {
		if s.Name() == core.SpanSend {
			traces[s.SpanContext().TraceID()] = true
		}
	}
	if len(traces) != 2 {
		t.Fatalf("%d send traces, want one per message", len(traces))
	}
}

// TestDeadLetterSpanCarriesReason checks the dead span of a message whose
// only allowed delivery was nacked.
func TestDeadLetterSpanCarriesReason(t *testing.T) {
	b, rec := tracedBroker(t)
	ctx := context.Background()
	zero := 0
	if _, _, err := b.PutSubscription(ctx, "t", "g", core.SubscriptionConfig{MaxRetries: &zero}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Send(ctx, "t", []*core.Message{{Body: []byte("poison")}}); err != nil {
		t.Fatal(err)
	}
	got, err := b.Pull(ctx, "t", "g", core.PullRequest{MaxMessages: 1})
	if err != nil || len(got) != 1 {
		t.Fatalf("pull: %v %d", err, len(got))
	}
	if _, _, err := b.Nack(ctx, "t", "g", []string{got[0].ReceiptHandle}, -1, "bad payload"); err != nil {
		t.Fatal(err)
	}
	for _, s := range rec.Ended() {
		if s.Name() == core.SpanDead {
			if v, _ := spanAttr(s, "tidemq.reason"); v != "bad payload" {
				t.Fatalf("dead span reason %q", v)
			}
			return
		}
	}
	t.Fatal("no tidemq.dead span")
}
