package sdk_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/tidemq/tidemq/sdk"
)

// pullAll pulls (and acks) from a fresh group until want distinct messages
// came, and returns them by message id.
func pullAll(t *testing.T, c *sdk.Client, topic, group string, want int) map[string]sdk.PulledMessage {
	t.Helper()
	ctx := t.Context()
	got := map[string]sdk.PulledMessage{}
	deadline := time.Now().Add(20 * time.Second)
	for len(got) < want && time.Now().Before(deadline) {
		msgs, err := c.Pull(ctx, topic, group, sdk.PullRequest{MaxMessages: 1000, WaitSeconds: 1, InvisibleSeconds: 120})
		if err != nil {
			t.Fatalf("Pull: %v", err)
		}
		var handles []string
		for _, m := range msgs {
			got[m.MessageID] = m
			handles = append(handles, m.ReceiptHandle)
		}
		if len(handles) > 0 {
			if _, err := c.Ack(ctx, topic, group, sdk.AckRequest{ReceiptHandles: handles}); err != nil {
				t.Fatalf("Ack: %v", err)
			}
		}
	}
	return got
}

func TestProducerSendBatchAsync(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	c := newClient(t, srv.URL)
	ctx := t.Context()
	topic := topicName("produce")
	if _, _, err := c.PutTopic(ctx, topic, sdk.TopicConfig{Queues: 4}); err != nil {
		t.Fatal(err)
	}
	p, err := sdk.NewProducer(c, topic, sdk.ProducerOptions{Group: "orders-service", BatchMaxMessages: 50, Linger: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })

	want := map[string]bool{}
	one, err := p.Send(ctx, sdk.SendMessage{Body: "single", Tag: "TagA", Keys: []string{"k1"}, Properties: map[string]string{"region": "hz"}})
	if err != nil {
		t.Fatal(err)
	}
	if one.MessageID == "" || one.Offset == nil || one.Duplicate || one.StoredAt.IsZero() {
		t.Errorf("Send = %+v", one)
	}
	want["single"] = true

	var batch []sdk.SendMessage
	for i := range 10 {
		batch = append(batch, sdk.NewMessage(fmt.Sprintf("batch-%d", i)))
		want[fmt.Sprintf("batch-%d", i)] = true
	}
	res, err := p.SendBatch(ctx, batch)
	if err != nil || len(res) != 10 {
		t.Fatalf("SendBatch = %d results, %v", len(res), err)
	}
	for i, r := range res {
		if r.MessageID == "" || r.Offset == nil {
			t.Errorf("batch result %d = %+v", i, r)
		}
	}

	// Async: 300 messages in batches; one from a callback.
	const n = 300
	futures := make([]*sdk.Future, n)
	for i := range n {
		body := fmt.Sprintf("async-%d", i)
		want[body] = true
		futures[i] = p.SendAsync(ctx, sdk.SendMessage{Body: body, ShardingKey: fmt.Sprintf("key-%d", i%7)})
	}
	cbDone := make(chan sdk.SendResult, 1)
	p.SendAsyncFunc(ctx, sdk.NewMessage("callback"), func(r sdk.SendResult, err error) {
		if err != nil {
			t.Errorf("async callback: %v", err)
		}
		cbDone <- r
	})
	want["callback"] = true
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	offsets := map[[2]int64]bool{}
	for i, f := range futures {
		select {
		case <-f.Done():
		default:
			t.Fatalf("future %d not done after Flush", i)
		}
		r, err := f.Wait(ctx)
		if err != nil {
			t.Fatalf("async %d: %v", i, err)
		}
		if r.Offset == nil || ids[r.MessageID] || offsets[[2]int64{int64(r.QueueID), *r.Offset}] {
			t.Fatalf("async %d: result %+v missing an offset or repeated", i, r)
		}
		ids[r.MessageID] = true
		offsets[[2]int64{int64(r.QueueID), *r.Offset}] = true
	}
	if r := <-cbDone; r.MessageID == "" {
		t.Errorf("callback result = %+v", r)
	}

	// Everything is delivered, once; the producer group is recorded.
	got := pullAll(t, c, topic, "check", len(want))
	seen := map[string]int{}
	for _, m := range got {
		seen[m.Body]++
		if m.ProducerGroup != "orders-service" {
			t.Errorf("message %s has producer group %q", m.Body, m.ProducerGroup)
		}
	}
	for body := range want {
		if seen[body] != 1 {
			t.Errorf("%s delivered %d times", body, seen[body])
		}
	}
	if len(got) != len(want) {
		t.Errorf("pulled %d messages, sent %d", len(got), len(want))
	}

	// A repeated dedup key stores nothing.
	first, err := p.Send(ctx, sdk.SendMessage{Body: "once", DedupKey: "order-1001-created"})
	if err != nil {
		t.Fatal(err)
	}
	second, err := p.Send(ctx, sdk.SendMessage{Body: "once", DedupKey: "order-1001-created"})
	if err != nil || !second.Duplicate || second.MessageID != first.MessageID {
		t.Errorf("repeated dedup key: %+v then %+v, %v", first, second, err)
	}

	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Send(ctx, sdk.NewMessage("late")); !errors.Is(err, sdk.ErrClosed) {
		t.Errorf("Send after Close = %v, want ErrClosed", err)
	}
	if _, err := p.SendAsync(ctx, sdk.NewMessage("late")).Wait(ctx); !errors.Is(err, sdk.ErrClosed) {
		t.Errorf("SendAsync after Close = %v, want ErrClosed", err)
	}
	if err := p.Close(); err != nil {
		t.Errorf("second Close = %v", err)
	}
}

// A bad message in an async batch fails alone; the rest of its batch is
// stored.
func TestProducerAsyncBadEntry(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	c := newClient(t, srv.URL)
	ctx := t.Context()
	topic := topicName("badentry")
	p, err := sdk.NewProducer(c, topic, sdk.ProducerOptions{Linger: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var fs []*sdk.Future
	for i := range 6 {
		m := sdk.NewMessage(fmt.Sprintf("m%d", i))
		switch i {
		case 2:
			m.Tag = "bad tag"
		case 4:
			m.Body = strings.Repeat("x", 5<<20) // over the 4 MiB message limit
		}
		fs = append(fs, p.SendAsync(ctx, m))
	}
	for i, f := range fs {
		_, err := f.Wait(ctx)
		switch i {
		case 2:
			if !errors.Is(err, sdk.ErrInvalidRequest) {
				t.Errorf("bad tag: %v, want ErrInvalidRequest", err)
			}
		case 4:
			if !errors.Is(err, sdk.ErrMessageTooLarge) && !errors.Is(err, sdk.ErrRequestTooLarge) {
				t.Errorf("huge body: %v, want ErrMessageTooLarge", err)
			}
		default:
			if err != nil {
				t.Errorf("message %d: %v", i, err)
			}
		}
	}
	if got := pullAll(t, c, topic, "g", 4); len(got) != 4 {
		t.Errorf("stored %d messages, want 4", len(got))
	}
}

// With the broker unreachable, the breaker opens after BreakerFailures
// failed attempts and later calls fail at once without a request.
func TestProducerCircuitBreakerFailsFast(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	c := newClient(t, "http://"+addr)
	p, err := sdk.NewProducer(c, "orders", sdk.ProducerOptions{RetryTimeout: -1, BreakerFailures: 2, BreakerOpenFor: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx := t.Context()
	for i := range 2 {
		_, err := p.Send(ctx, sdk.NewMessage("x"))
		if err == nil || errors.Is(err, sdk.ErrCircuitOpen) {
			t.Fatalf("send %d = %v, want a connection error", i, err)
		}
	}
	start := time.Now()
	_, err = p.Send(ctx, sdk.NewMessage("x"))
	if !errors.Is(err, sdk.ErrCircuitOpen) {
		t.Fatalf("send with the breaker open = %v, want ErrCircuitOpen", err)
	}
	if d := time.Since(start); d > 100*time.Millisecond {
		t.Errorf("failing fast took %v", d)
	}
	// Async sends fail fast too.
	if _, err := p.SendAsync(ctx, sdk.NewMessage("x")).Wait(ctx); !errors.Is(err, sdk.ErrCircuitOpen) {
		t.Errorf("async send with the breaker open = %v, want ErrCircuitOpen", err)
	}

	// A retry budget shorter than the breaker's open time does not wait
	// for it either: the call fails as soon as the breaker opens.
	p2, err := sdk.NewProducer(c, "orders", sdk.ProducerOptions{RetryTimeout: 5 * time.Second, MinBackoff: 10 * time.Millisecond,
		BreakerFailures: 1, BreakerOpenFor: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer p2.Close()
	start = time.Now()
	_, err = p2.Send(ctx, sdk.NewMessage("x"))
	if !errors.Is(err, sdk.ErrCircuitOpen) {
		t.Errorf("Send = %v, want ErrCircuitOpen", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("failing fast took %v", d)
	}

	// A ctx that ends while a send waits to retry ends the send.
	p3, err := sdk.NewProducer(c, "orders", sdk.ProducerOptions{RetryTimeout: time.Minute, MinBackoff: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer p3.Close()
	cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if _, err := p3.Send(cctx, sdk.NewMessage("x")); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Send with ctx ending while retrying = %v, want DeadlineExceeded", err)
	}
}

// The caller's trace goes with the message to the consumer's handler.
func TestTracePropagation(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	c := newClient(t, srv.URL)
	topic := topicName("trace")
	traceID, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	spanID, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: traceID, SpanID: spanID, TraceFlags: trace.FlagsSampled})
	ctx := trace.ContextWithSpanContext(t.Context(), sc)

	p, err := sdk.NewProducer(c, topic, sdk.ProducerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, err := p.Send(ctx, sdk.NewMessage("sync")); err != nil {
		t.Fatal(err)
	}
	if _, err := p.SendAsync(ctx, sdk.NewMessage("async")).Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := p.SendAsync(t.Context(), sdk.NewMessage("untraced")).Wait(ctx); err != nil {
		t.Fatal(err)
	}

	cs, err := sdk.NewConsumer(c, topic, "g", sdk.ConsumerOptions{WaitSeconds: 1})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	traces := map[string]trace.SpanContext{}
	parents := map[string]string{}
	stop := runConsumer(t, cs, func(ctx context.Context, m *sdk.PulledMessage) error {
		mu.Lock()
		defer mu.Unlock()
		traces[m.Body] = trace.SpanContextFromContext(ctx)
		parents[m.Body] = m.Traceparent
		return nil
	})
	waitFor(t, 10*time.Second, "3 messages handled", func() (bool, error) {
		mu.Lock()
		defer mu.Unlock()
		return len(traces) == 3, nil
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	for _, body := range []string{"sync", "async"} {
		if !strings.HasPrefix(parents[body], "00-4bf92f3577b34da6a3ce929d0e0e4736-") {
			t.Errorf("%s: traceparent %q", body, parents[body])
		}
		if traces[body].TraceID() != traceID {
			t.Errorf("%s: handler ctx trace %v, want %v", body, traces[body].TraceID(), traceID)
		}
	}
	if parents["untraced"] != "" || traces["untraced"].IsValid() {
		t.Errorf("untraced message got traceparent %q, handler trace %v", parents["untraced"], traces["untraced"])
	}
}
