package core_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/tidemq/tidemq/core"
	"github.com/tidemq/tidemq/internal/otlpspans"
	"github.com/tidemq/tidemq/pebblestore"
)

// tracers are the two ways the broker's spans are made: the OTel SDK's
// spans, and internal/otlpspans' Provider (the binary's, over OTLP/HTTP),
// whose tracers record lifecycle spans without span objects.
var tracers = []string{"sdk", "otlpspans"}

// tracedBroker is a broker on in-memory Pebble with the given tracer;
// ended returns the spans ended so far (for otlpspans, as a loopback
// collector received them).
func tracedBroker(t *testing.T, tracer string) (b *core.Broker, ended func() []sdktrace.ReadOnlySpan) {
	t.Helper()
	store, err := pebblestore.Open("db", pebblestore.Options{FS: vfs.NewMem()})
	if err != nil {
		t.Fatal(err)
	}
	var tp trace.TracerProvider
	switch tracer {
	case "sdk":
		rec := tracetest.NewSpanRecorder()
		tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
		ended = rec.Ended
	case "otlpspans":
		col := newSpanCollector(t)
		exp, err := otlpspans.New(otlpspans.Config{Endpoint: col.URL})
		if err != nil {
			t.Fatal(err)
		}
		p := otlpspans.NewProvider(exp, otlpspans.ProviderConfig{})
		t.Cleanup(func() { _ = p.Shutdown(context.Background()) })
		tp = p
		ended = func() []sdktrace.ReadOnlySpan {
			if err := p.ForceFlush(context.Background()); err != nil {
				t.Fatal(err)
			}
			return col.spans(t)
		}
	}
	b, err = core.New(store, core.Options{AutoCreate: true, TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil && !errors.Is(err, core.ErrClosed) {
			t.Error(err)
		}
		if err := store.Close(); err != nil {
			t.Error(err)
		}
	})
	return b, ended
}

// spanCollector is a loopback OTLP/HTTP endpoint keeping what it receives.
type spanCollector struct {
	*httptest.Server
	mu     sync.Mutex
	bodies [][]byte
}

func newSpanCollector(t *testing.T) *spanCollector {
	c := &spanCollector{}
	c.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		c.mu.Lock()
		c.bodies = append(c.bodies, body)
		c.mu.Unlock()
	}))
	t.Cleanup(c.Close)
	return c
}

// spans decodes what was received back into read-only spans: names, ids,
// parents, string, int and bool attributes, and status.
func (c *spanCollector) spans(t *testing.T) []sdktrace.ReadOnlySpan {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []sdktrace.ReadOnlySpan
	for _, body := range c.bodies {
		var req coltracepb.ExportTraceServiceRequest
		if err := proto.Unmarshal(body, &req); err != nil {
			t.Fatal(err)
		}
		for _, rs := range req.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					stub := tracetest.SpanStub{Name: s.Name}
					stub.SpanContext = trace.NewSpanContext(trace.SpanContextConfig{
						TraceID: trace.TraceID(s.TraceId), SpanID: trace.SpanID(s.SpanId), TraceFlags: trace.FlagsSampled})
					if len(s.ParentSpanId) == 8 {
						stub.Parent = trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID(s.TraceId), SpanID: trace.SpanID(s.ParentSpanId)})
					}
					for _, kv := range s.Attributes {
						switch v := kv.Value.Value.(type) {
						case *commonpb.AnyValue_StringValue:
							stub.Attributes = append(stub.Attributes, attribute.String(kv.Key, v.StringValue))
						case *commonpb.AnyValue_IntValue:
							stub.Attributes = append(stub.Attributes, attribute.Int64(kv.Key, v.IntValue))
						case *commonpb.AnyValue_BoolValue:
							stub.Attributes = append(stub.Attributes, attribute.Bool(kv.Key, v.BoolValue))
						}
					}
					if s.Status != nil && s.Status.Code == tracepb.Status_STATUS_CODE_ERROR {
						stub.Status = sdktrace.Status{Code: codes.Error, Description: s.Status.Message}
					}
					out = append(out, stub.Snapshot())
				}
			}
		}
	}
	return out
}

func spanAttr(s sdktrace.ReadOnlySpan, key string) (string, bool) {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value.String(), true
		}
	}
	return "", false
}

// TestMessageLifeIsOneTrace follows a message sent with a producer's
// traceparent through a nack and a second delivery to its ack: every span
// is in the producer's trace and carries the messaging attributes.
func TestMessageLifeIsOneTrace(t *testing.T) {
	for _, tracer := range tracers {
		t.Run(tracer, func(t *testing.T) {
			b, ended := tracedBroker(t, tracer)
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
			for _, s := range ended() {
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
		})
	}
}

// TestSpansOfManyMessagesKeepTheirOwnAttributes pulls, acks and nacks
// several messages in one call each: every deliver, ack and nack span
// names its own message, offset and trace (the calls reuse one attribute
// buffer across their messages).
func TestSpansOfManyMessagesKeepTheirOwnAttributes(t *testing.T) {
	for _, tracer := range tracers {
		t.Run(tracer, func(t *testing.T) {
			b, ended := tracedBroker(t, tracer)
			ctx := context.Background()
			if _, _, err := b.PutTopic(ctx, "many", core.TopicConfig{Queues: 1}); err != nil {
				t.Fatal(err)
			}
			if _, _, err := b.PutSubscription(ctx, "many", "g", core.SubscriptionConfig{}); err != nil {
				t.Fatal(err)
			}
			msgs := make([]*core.Message, 6)
			for i := range msgs {
				msgs[i] = &core.Message{Body: []byte{byte('a' + i)}}
			}
			res, err := b.Send(ctx, "many", msgs)
			if err != nil {
				t.Fatal(err)
			}
			offsetOf := map[string]string{} // message id → offset
			for _, r := range res {
				offsetOf[r.MessageID] = strconv.FormatUint(r.Offset, 10)
			}
			got, err := b.Pull(ctx, "many", "g", core.PullRequest{MaxMessages: 6, ConsumerID: "c1"})
			if err != nil || len(got) != 6 {
				t.Fatalf("pull: %v, %d messages", err, len(got))
			}
			var acks, nacks []string
			for i, d := range got {
				if i%2 == 0 {
					acks = append(acks, d.ReceiptHandle)
				} else {
					nacks = append(nacks, d.ReceiptHandle)
				}
			}
			if n, _, err := b.Ack(ctx, "many", "g", acks); err != nil || n != 3 {
				t.Fatalf("ack: %d, %v", n, err)
			}
			if n, _, err := b.Nack(ctx, "many", "g", nacks, 0, "try later"); err != nil || n != 3 {
				t.Fatalf("nack: %d, %v", n, err)
			}
			traceOf := map[string]trace.TraceID{} // message id → its send span's trace
			for _, s := range ended() {
				if s.Name() == core.SpanSend {
					id, _ := spanAttr(s, "messaging.message.id")
					traceOf[id] = s.SpanContext().TraceID()
				}
			}
			seen := map[string]int{}
			for _, s := range ended() {
				name := s.Name()
				if name != core.SpanDeliver && name != core.SpanAck && name != core.SpanNack {
					continue
				}
				id, _ := spanAttr(s, "messaging.message.id")
				seen[name]++
				if off, _ := spanAttr(s, "messaging.message.offset"); off != offsetOf[id] {
					t.Errorf("%s of %s: offset %s, want %s", name, id, off, offsetOf[id])
				}
				if s.SpanContext().TraceID() != traceOf[id] {
					t.Errorf("%s of %s: not in that message's trace", name, id)
				}
				if reason, has := spanAttr(s, "tidemq.reason"); (name == core.SpanNack) != has || (has && reason != "try later") {
					t.Errorf("%s of %s: reason %q (%v)", name, id, reason, has)
				}
			}
			if seen[core.SpanDeliver] != 6 || seen[core.SpanAck] != 3 || seen[core.SpanNack] != 3 {
				t.Errorf("spans seen %v, want 6 deliver, 3 ack, 3 nack", seen)
			}
		})
	}
}

// TestMessageWithoutProducerTraceGetsItsOwn checks that each message of a
// batch sent without a traceparent starts its own trace.
func TestMessageWithoutProducerTraceGetsItsOwn(t *testing.T) {
	for _, tracer := range tracers {
		t.Run(tracer, func(t *testing.T) {
			b, ended := tracedBroker(t, tracer)
			ctx := context.Background()
			if _, err := b.Send(ctx, "t", []*core.Message{{Body: []byte("a")}, {Body: []byte("b")}}); err != nil {
				t.Fatal(err)
			}
			traces := map[trace.TraceID]bool{}
			for _, s := range ended() {
				if s.Name() == core.SpanSend {
					traces[s.SpanContext().TraceID()] = true
				}
			}
			if len(traces) != 2 {
				t.Fatalf("%d send traces, want one per message", len(traces))
			}
		})
	}
}

// TestDeadLetterSpanCarriesReason checks the dead span of a message whose
// only allowed delivery was nacked.
func TestDeadLetterSpanCarriesReason(t *testing.T) {
	for _, tracer := range tracers {
		t.Run(tracer, func(t *testing.T) {
			b, ended := tracedBroker(t, tracer)
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
			for _, s := range ended() {
				if s.Name() == core.SpanDead {
					if v, _ := spanAttr(s, "tidemq.reason"); v != "bad payload" {
						t.Fatalf("dead span reason %q", v)
					}
					return
				}
			}
			t.Fatal("no tidemq.dead span")
		})
	}
}

// TestFailedSendSpanHasError: a send the broker refuses (here: closed)
// ends its spans with the error.
func TestFailedSendSpanHasError(t *testing.T) {
	for _, tracer := range tracers {
		t.Run(tracer, func(t *testing.T) {
			b, ended := tracedBroker(t, tracer)
			ctx := context.Background()
			if _, err := b.Send(ctx, "t", []*core.Message{{Body: []byte("first")}}); err != nil {
				t.Fatal(err)
			}
			if err := b.Close(); err != nil {
				t.Fatal(err)
			}
			if _, err := b.Send(ctx, "t", []*core.Message{{Body: []byte("late")}}); !errors.Is(err, core.ErrClosed) {
				t.Fatalf("send after Close: %v, want ErrClosed", err)
			}
			var failed, ok int
			for _, s := range ended() {
				if s.Name() != core.SpanSend {
					continue
				}
				if s.Status().Code == codes.Error {
					failed++
				} else if _, has := spanAttr(s, "messaging.message.offset"); has {
					ok++
				}
			}
			if failed != 1 || ok != 1 {
				t.Fatalf("send spans: %d failed, %d stored; want 1 and 1", failed, ok)
			}
		})
	}
}

// TestDroppedSpansAreAMetric stalls the collector so the exporter's queue
// (one batch of 4) fills: sends go on, spans are dropped, and the broker's
// tidemq.trace.spans_dropped reports exactly the provider's count.
func TestDroppedSpansAreAMetric(t *testing.T) {
	release := make(chan struct{})
	col := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		<-release
	}))
	t.Cleanup(col.Close)
	exp, err := otlpspans.New(otlpspans.Config{Endpoint: col.URL})
	if err != nil {
		t.Fatal(err)
	}
	p := otlpspans.NewProvider(exp, otlpspans.ProviderConfig{BatchSize: 4, QueueSize: 4, ExportTimeout: time.Minute})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = p.Shutdown(ctx)
	})
	t.Cleanup(func() { close(release) }) // before Shutdown: the stalled export ends
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	store, err := pebblestore.Open("db", pebblestore.Options{FS: vfs.NewMem()})
	if err != nil {
		t.Fatal(err)
	}
	b, err := core.New(store, core.Options{AutoCreate: true, TracerProvider: p, MeterProvider: mp})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := b.Close(); err != nil {
			t.Error(err)
		}
		if err := store.Close(); err != nil {
			t.Error(err)
		}
	}()
	for range 10 {
		msgs := []*core.Message{{Body: []byte("a")}, {Body: []byte("b")}, {Body: []byte("c")}, {Body: []byte("d")}}
		if _, err := b.Send(context.Background(), "dropped", msgs); err != nil {
			t.Fatal(err)
		}
	}
	dropped := p.Dropped()
	if dropped == 0 {
		t.Fatal("no span dropped behind a stalled collector with a queue of 4")
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "tidemq.trace.spans_dropped" {
				continue
			}
			g, ok := m.Data.(metricdata.Gauge[int64])
			if !ok || len(g.DataPoints) != 1 || g.DataPoints[0].Value != int64(dropped) {
				t.Fatalf("tidemq.trace.spans_dropped = %+v, want one point of %d", m.Data, dropped)
			}
			return
		}
	}
	t.Fatal("no tidemq.trace.spans_dropped metric")
}
