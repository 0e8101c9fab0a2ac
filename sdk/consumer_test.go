package sdk_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidemq/tidemq/sdk"
)

// sendN sends n messages body-0…body-(n-1) in one batch.
func sendN(t *testing.T, c *sdk.Client, topic string, n int, shape func(i int, m *sdk.SendMessage)) {
	t.Helper()
	p, err := sdk.NewProducer(c, topic, sdk.ProducerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var msgs []sdk.SendMessage
	for i := range n {
		m := sdk.NewMessage("body-" + strconv.Itoa(i))
		if shape != nil {
			shape(i, &m)
		}
		msgs = append(msgs, m)
	}
	if _, err := p.SendBatch(t.Context(), msgs); err != nil {
		t.Fatal(err)
	}
}

// waitSettled waits until the group has nothing left to do.
func waitSettled(t *testing.T, c *sdk.Client, topic, group string, timeout time.Duration) sdk.Subscription {
	t.Helper()
	var sub sdk.Subscription
	waitFor(t, timeout, "the subscription to settle", func() (bool, error) {
		var err error
		sub, err = c.GetSubscription(t.Context(), topic, group)
		return err == nil && sub.Lag == 0 && sub.Inflight == 0 && sub.Retrying == 0, err
	})
	return sub
}

// Handlers that fail the first two attempts of some messages with
// RetryAfter(100ms): every message is acked in the end, after 3 attempts.
func TestConsumerRetries(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	c := newClient(t, srv.URL)
	topic := topicName("retries")
	if _, _, err := c.PutTopic(t.Context(), topic, sdk.TopicConfig{Queues: 4}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.PutSubscription(t.Context(), topic, "g", sdk.SubscriptionConfig{}); err != nil {
		t.Fatal(err)
	}
	const n = 40
	sendN(t, c, topic, n, nil)
	cs, err := sdk.NewConsumer(c, topic, "g", sdk.ConsumerOptions{Concurrency: 8, WaitSeconds: 1})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	attempts := map[string][]int{}
	errFlaky := errors.New("flaky downstream")
	runConsumer(t, cs, func(ctx context.Context, m *sdk.PulledMessage) error {
		mu.Lock()
		attempts[m.Body] = append(attempts[m.Body], m.DeliveryAttempt)
		mu.Unlock()
		i, _ := strconv.Atoi(strings.TrimPrefix(m.Body, "body-"))
		if i%5 == 0 && m.DeliveryAttempt <= 2 {
			return fmt.Errorf("attempt %d: %w", m.DeliveryAttempt, sdk.RetryAfter(100*time.Millisecond, errFlaky))
		}
		return nil
	})
	waitSettled(t, c, topic, "g", 20*time.Second)
	mu.Lock()
	defer mu.Unlock()
	for i := range n {
		body := "body-" + strconv.Itoa(i)
		want := []int{1}
		if i%5 == 0 {
			want = []int{1, 2, 3}
		}
		if !slices.Equal(attempts[body], want) {
			t.Errorf("%s: attempts %v, want %v", body, attempts[body], want)
		}
	}
	// The nack reason is the handler's error.
	page, err := c.QueryMessages(t.Context(), topic, sdk.MessageQuery{From: time.Now().Add(-time.Hour), Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range page.Messages {
		if m.Body != "body-0" {
			continue
		}
		st, err := c.GetMessage(t.Context(), topic, m.MessageID)
		if err != nil {
			t.Fatal(err)
		}
		h := st.Subscriptions[0].History
		if len(h) != 3 || h[0].Outcome != sdk.OutcomeNack || h[0].Reason == nil || *h[0].Reason != "attempt 1: flaky downstream" || h[2].Outcome != sdk.OutcomeAck {
			t.Errorf("history of body-0 = %+v", h)
		}
	}
}

// DeadLetter(err) puts the message in the DLQ at once, with err as reason.
func TestConsumerDeadLetter(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	c := newClient(t, srv.URL)
	topic := topicName("dead")
	sendN(t, c, topic, 10, func(i int, m *sdk.SendMessage) {
		if i == 3 {
			m.Tag = "poison"
		}
	})
	cs, err := sdk.NewConsumer(c, topic, "g", sdk.ConsumerOptions{WaitSeconds: 1})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	calls := map[string]int{}
	runConsumer(t, cs, func(ctx context.Context, m *sdk.PulledMessage) error {
		mu.Lock()
		calls[m.Body]++
		mu.Unlock()
		if m.Tag == "poison" {
			return sdk.DeadLetter(errors.New("cannot parse order"))
		}
		return nil
	})
	sub := waitSettled(t, c, topic, "g", 10*time.Second)
	if sub.Dlq != 1 {
		t.Errorf("dlq = %d, want 1", sub.Dlq)
	}
	var dead []sdk.DeadMessage
	for m, err := range c.DeadLetters(t.Context(), topic, "g", sdk.PageOptions{}) {
		if err != nil {
			t.Fatal(err)
		}
		dead = append(dead, m)
	}
	if len(dead) != 1 || dead[0].Body != "body-3" || dead[0].Reason == nil || *dead[0].Reason != "cannot parse order" || dead[0].DeliveryAttempt != 1 {
		t.Fatalf("DLQ = %+v", dead)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(calls) != 10 || calls["body-3"] != 1 {
		t.Errorf("handler calls = %v", calls)
	}
	st, err := c.GetMessage(t.Context(), topic, dead[0].MessageID)
	if err != nil || st.Subscriptions[0].State != sdk.StateDead {
		t.Errorf("GetMessage(dead) = %+v, %v", st, err)
	}
}

// An orderly subscription with 3 keys × 20 messages and 4 handlers: each
// key is processed one message at a time, in order, even across a retry.
func TestConsumerOrderly(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	c := newClient(t, srv.URL)
	topic := topicName("orderly")
	if _, _, err := c.PutTopic(t.Context(), topic, sdk.TopicConfig{Queues: 2}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.PutSubscription(t.Context(), topic, "g", sdk.SubscriptionConfig{Orderly: true}); err != nil {
		t.Fatal(err)
	}
	keys := []string{"order-a", "order-b", "order-c"}
	const perKey = 20
	sendN(t, c, topic, len(keys)*perKey, func(i int, m *sdk.SendMessage) {
		m.ShardingKey = keys[i%len(keys)]
		m.Body = fmt.Sprintf("%s/%02d", m.ShardingKey, i/len(keys))
	})
	// Orderly is not set: the consumer finds out from the subscription.
	cs, err := sdk.NewConsumer(c, topic, "g", sdk.ConsumerOptions{Concurrency: 4, MaxMessages: 16, WaitSeconds: 1})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	done := map[string][]string{}
	running := map[string]int{}
	failed := false
	runConsumer(t, cs, func(ctx context.Context, m *sdk.PulledMessage) error {
		mu.Lock()
		running[m.ShardingKey]++
		if running[m.ShardingKey] > 1 {
			t.Errorf("two handlers at once for key %s", m.ShardingKey)
		}
		fail := m.Body == "order-b/05" && !failed
		failed = failed || fail
		mu.Unlock()
		// A little work, so that handlers overlap.
		select {
		case <-time.After(2 * time.Millisecond):
		case <-ctx.Done():
		}
		mu.Lock()
		defer mu.Unlock()
		running[m.ShardingKey]--
		if fail {
			return sdk.RetryAfter(0, errors.New("transient"))
		}
		done[m.ShardingKey] = append(done[m.ShardingKey], m.Body)
		return nil
	})
	waitFor(t, 30*time.Second, "every message handled", func() (bool, error) {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, d := range done {
			n += len(d)
		}
		return n >= len(keys)*perKey, nil
	})
	mu.Lock()
	defer mu.Unlock()
	for _, k := range keys {
		var want []string
		for i := range perKey {
			want = append(want, fmt.Sprintf("%s/%02d", k, i))
		}
		if !slices.Equal(done[k], want) {
			t.Errorf("key %s handled in order %v", k, done[k])
		}
	}
}

// A handler slower than the lease: the lease is extended, so the message
// is delivered once.
func TestConsumerLeaseExtension(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	c := newClient(t, srv.URL)
	topic := topicName("slow")
	sendN(t, c, topic, 1, nil)
	cs, err := sdk.NewConsumer(c, topic, "g", sdk.ConsumerOptions{InvisibleSeconds: 2, WaitSeconds: 1, Concurrency: 2})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var deliveries []int
	handled := make(chan struct{})
	runConsumer(t, cs, func(ctx context.Context, m *sdk.PulledMessage) error {
		mu.Lock()
		deliveries = append(deliveries, m.DeliveryAttempt)
		first := len(deliveries) == 1
		mu.Unlock()
		select {
		case <-time.After(5 * time.Second): // the slow work
		case <-ctx.Done():
			return context.Cause(ctx)
		}
		if first {
			close(handled)
		}
		return nil
	})
	select {
	case <-handled:
	case <-time.After(20 * time.Second):
		t.Fatal("the slow handler did not finish")
	}
	sub := waitSettled(t, c, topic, "g", 10*time.Second)
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(deliveries, []int{1}) {
		t.Errorf("deliveries %v, want one", deliveries)
	}
	page, err := c.QueryMessages(t.Context(), topic, sdk.MessageQuery{From: time.Now().Add(-time.Hour)})
	if err != nil || len(page.Messages) != 1 {
		t.Fatalf("query = %+v, %v", page, err)
	}
	st, err := c.GetMessage(t.Context(), topic, page.Messages[0].MessageID)
	if err != nil {
		t.Fatal(err)
	}
	if h := st.Subscriptions[0].History; len(h) != 1 || h[0].Outcome != sdk.OutcomeAck {
		t.Errorf("history = %+v, want one acked delivery (lag %d)", h, sub.Lag)
	}
}

// Stopping: pulling stops, running handlers finish (their ctx stays live
// during the grace period) and are acked; Run returns nil; the rest is
// left for the next consumer.
func TestConsumerGracefulStop(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	c := newClient(t, srv.URL)
	topic := topicName("stop")
	sendN(t, c, topic, 10, nil)
	cs, err := sdk.NewConsumer(c, topic, "g", sdk.ConsumerOptions{Concurrency: 2, WaitSeconds: 1, Grace: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan string, 10)
	release := make(chan struct{})
	var mu sync.Mutex
	var acked []string
	var ctxErrs []error
	stop := runConsumer(t, cs, func(ctx context.Context, m *sdk.PulledMessage) error {
		started <- m.Body
		<-release
		mu.Lock()
		defer mu.Unlock()
		ctxErrs = append(ctxErrs, ctx.Err())
		acked = append(acked, m.Body)
		return nil
	})
	first := map[string]bool{<-started: true, <-started: true}
	stopped := make(chan error, 1)
	go func() { stopped <- stop() }()
	// Run is waiting for the two running handlers.
	select {
	case err := <-stopped:
		t.Fatalf("Run returned (%v) while handlers ran", err)
	case <-time.After(300 * time.Millisecond):
	}
	close(release)
	if err := <-stopped; err != nil {
		t.Fatalf("Run = %v", err)
	}
	mu.Lock()
	for _, e := range ctxErrs {
		if e != nil {
			t.Errorf("handler ctx ended during the grace period: %v", e)
		}
	}
	if len(acked) != 2 {
		t.Errorf("handled %v after stop, want the 2 running ones", acked)
	}
	mu.Unlock()
	if len(started) != 0 {
		t.Errorf("a handler started after stop")
	}
	// The two handled are acked; the other 8 go to the next consumer.
	rest := pullAll(t, c, topic, "g", 8)
	if len(rest) != 8 {
		t.Errorf("next consumer got %d messages, want 8", len(rest))
	}
	for _, m := range rest {
		if first[m.Body] {
			t.Errorf("%s was handled and acked, yet delivered again", m.Body)
		}
	}
}

// A permanent pull error ends Run with that error.
func TestConsumerPermanentError(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	c := newClient(t, srv.URL)
	cs, err := sdk.NewConsumer(c, "-bad-name", "g", sdk.ConsumerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	err = cs.Run(t.Context(), func(context.Context, *sdk.PulledMessage) error { return nil })
	if !errors.Is(err, sdk.ErrInvalidName) {
		t.Errorf("Run = %v, want ErrInvalidName", err)
	}
	if _, err := sdk.NewConsumer(c, "t", "g", sdk.ConsumerOptions{WaitSeconds: 31, Concurrency: -1}); err == nil ||
		!strings.Contains(err.Error(), "WaitSeconds") || !strings.Contains(err.Error(), "Concurrency") {
		t.Errorf("NewConsumer(bad options) = %v, want both problems", err)
	}
}

// Messages pulled but not started when the consumer stops are nacked at
// once (delay 0), not left to their lease. Orderly: three messages of one
// key wait behind the first, which is running when ctx ends.
func TestConsumerStopNacksUnstarted(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	c := newClient(t, srv.URL)
	topic := topicName("unstarted")
	sendN(t, c, topic, 4, func(i int, m *sdk.SendMessage) { m.ShardingKey = "k" })
	cs, err := sdk.NewConsumer(c, topic, "g", sdk.ConsumerOptions{Orderly: true, Concurrency: 4, WaitSeconds: 1, InvisibleSeconds: 600})
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan string, 4)
	release := make(chan struct{})
	stop := runConsumer(t, cs, func(ctx context.Context, m *sdk.PulledMessage) error {
		started <- m.Body
		<-release
		return nil
	})
	if first := <-started; first != "body-0" {
		t.Fatalf("first handled %s, want body-0", first)
	}
	waitFor(t, 10*time.Second, "all 4 messages to be held", func() (bool, error) {
		sub, err := c.GetSubscription(t.Context(), topic, "g")
		return err == nil && sub.Inflight == 4, err
	})
	stopped := make(chan error, 1)
	go func() { stopped <- stop() }()
	// The three waiting ones are given back while body-0 still runs.
	page, err := c.QueryMessages(t.Context(), topic, sdk.MessageQuery{From: time.Now().Add(-time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the unstarted messages to be nacked", func() (bool, error) {
		for _, m := range page.Messages {
			if m.Body == "body-0" {
				continue
			}
			st, err := c.GetMessage(t.Context(), topic, m.MessageID)
			if err != nil || len(st.Subscriptions) != 1 || len(st.Subscriptions[0].History) != 1 {
				return false, err
			}
			h := st.Subscriptions[0].History[0]
			if h.Outcome != sdk.OutcomeNack || h.Reason == nil || *h.Reason != "consumer stopping; message not started" {
				return false, fmt.Errorf("%s: %+v", m.Body, h)
			}
		}
		return true, nil
	})
	close(release)
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	if len(started) != 0 {
		t.Errorf("%d more handlers started after stop", len(started))
	}
	sub, err := c.GetSubscription(t.Context(), topic, "g")
	if err != nil || sub.Inflight != 0 {
		t.Errorf("after stop: %+v, %v", sub, err)
	}
}

// Orderly: when a message fails, the later messages of its key already
// held are given back at once instead of being handled out of order.
func TestConsumerOrderlyFailureReleasesKey(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	c := newClient(t, srv.URL)
	topic := topicName("keyfail")
	sendN(t, c, topic, 4, func(i int, m *sdk.SendMessage) { m.ShardingKey = "k" })
	// Orderly on the client, over a subscription that is not: the server
	// hands out the whole key at once.
	cs, err := sdk.NewConsumer(c, topic, "g", sdk.ConsumerOptions{Orderly: true, Concurrency: 4, WaitSeconds: 1, InvisibleSeconds: 600})
	if err != nil {
		t.Fatal(err)
	}
	held := make(chan struct{})
	var mu sync.Mutex
	var handled []string
	runConsumer(t, cs, func(ctx context.Context, m *sdk.PulledMessage) error {
		if m.Body == "body-0" && m.DeliveryAttempt == 1 {
			<-held
			return sdk.RetryAfter(time.Hour, errors.New("boom"))
		}
		mu.Lock()
		handled = append(handled, fmt.Sprintf("%s#%d", m.Body, m.DeliveryAttempt))
		mu.Unlock()
		return nil
	})
	waitFor(t, 10*time.Second, "all 4 messages to be held", func() (bool, error) {
		sub, err := c.GetSubscription(t.Context(), topic, "g")
		return err == nil && sub.Inflight == 4, err
	})
	close(held)
	page, err := c.QueryMessages(t.Context(), topic, sdk.MessageQuery{From: time.Now().Add(-time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the key's later messages to be nacked", func() (bool, error) {
		for _, m := range page.Messages {
			st, err := c.GetMessage(t.Context(), topic, m.MessageID)
			if err != nil || len(st.Subscriptions[0].History) == 0 {
				return false, err
			}
			h := st.Subscriptions[0].History[0]
			want := "an earlier message of its sharding key failed"
			if m.Body == "body-0" {
				want = "boom"
			}
			if h.Outcome != sdk.OutcomeNack || h.Reason == nil || *h.Reason != want {
				return false, fmt.Errorf("%s: %+v", m.Body, h)
			}
		}
		return true, nil
	})
	mu.Lock()
	defer mu.Unlock()
	for _, h := range handled {
		if strings.HasSuffix(h, "#1") {
			t.Errorf("%s was handled after body-0 failed", h)
		}
	}
}
