package sdk_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidemq/tidemq/sdk"
)

func TestAPIErrorIs(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	c := newClient(t, srv.URL)
	ctx := t.Context()

	_, err := c.GetTopic(ctx, "no-such-topic")
	if !errors.Is(err, sdk.ErrTopicNotFound) {
		t.Fatalf("GetTopic(missing) = %v, want ErrTopicNotFound", err)
	}
	if errors.Is(err, sdk.ErrSubscriptionNotFound) || errors.Is(err, sdk.ErrInvalidName) {
		t.Errorf("%v matches other codes' sentinels", err)
	}
	var ae *sdk.APIError
	if !errors.As(err, &ae) || ae.Status != 404 || ae.Code != "topic_not_found" || ae.Title == "" {
		t.Errorf("APIError = %+v", ae)
	}
	if wrapped := fmt.Errorf("loading: %w", err); !errors.Is(wrapped, sdk.ErrTopicNotFound) {
		t.Error("a wrapped APIError no longer matches its sentinel")
	}

	for _, name := range []string{"-starts-with-dash", "has space", "x/y"} {
		_, _, err = c.PutTopic(ctx, name, sdk.TopicConfig{})
		if !errors.Is(err, sdk.ErrInvalidName) {
			t.Errorf("PutTopic(%q) = %v, want ErrInvalidName", name, err)
		}
	}

	topic := topicName("errors")
	if _, created, err := c.PutTopic(ctx, topic, sdk.TopicConfig{Queues: 4}); err != nil || !created {
		t.Fatalf("PutTopic = created %v, %v", created, err)
	}
	if _, created, err := c.PutTopic(ctx, topic, sdk.TopicConfig{Queues: 4}); err != nil || created {
		t.Fatalf("PutTopic again = created %v, %v", created, err)
	}
	if _, _, err := c.PutTopic(ctx, topic, sdk.TopicConfig{Queues: 2}); !errors.Is(err, sdk.ErrQueueCountDecrease) {
		t.Errorf("shrinking PutTopic = %v, want ErrQueueCountDecrease", err)
	}
	if _, _, err := c.PutSubscription(ctx, topic, "g", sdk.SubscriptionConfig{Filter: "A ||"}); !errors.Is(err, sdk.ErrInvalidFilter) {
		t.Errorf("PutSubscription(bad filter) = %v, want ErrInvalidFilter", err)
	}
	if _, err := c.GetSubscription(ctx, topic, "nobody"); !errors.Is(err, sdk.ErrSubscriptionNotFound) {
		t.Errorf("GetSubscription(missing) = %v, want ErrSubscriptionNotFound", err)
	}
	if _, err := c.GetMessage(ctx, topic, "NOSUCHMESSAGE"); !errors.Is(err, sdk.ErrMessageNotFound) {
		t.Errorf("GetMessage(missing) = %v, want ErrMessageNotFound", err)
	}

	// A bad batch entry: the problem names it.
	bad := []sdk.SendMessage{sdk.NewMessage("ok"), {Body: "x", DelaySeconds: 5, DeliverAt: new(time.Now().Add(time.Minute))}, sdk.NewMessage("ok")}
	_, err = c.SendBatch(ctx, topic, "", bad)
	if !errors.Is(err, sdk.ErrInvalidRequest) || !errors.As(err, &ae) {
		t.Fatalf("SendBatch(bad entry) = %v, want ErrInvalidRequest", err)
	}
	if ae.Entry == nil || *ae.Entry != 1 || ae.Pointer != "/messages/1/deliverAt" || ae.Status != 400 {
		t.Errorf("bad entry problem = %+v (entry %v), want entry 1 at /messages/1/deliverAt", ae, ae.Entry)
	}
	bad[1] = sdk.SendMessage{Body: "x", Tag: "has space"}
	_, err = c.SendBatch(ctx, topic, "", bad)
	if !errors.As(err, &ae) || ae.Pointer != "/messages/1/tag" {
		t.Errorf("SendBatch(bad tag) = %v, want a problem pointing at /messages/1/tag", err)
	}
	// The producer's Send reports client errors at once, without retrying.
	p, err := sdk.NewProducer(c, topic, sdk.ProducerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	start := time.Now()
	if _, err := p.Send(ctx, sdk.SendMessage{Body: "x", DelaySeconds: 1, DeliverAt: new(time.Now().Add(time.Minute))}); !errors.Is(err, sdk.ErrInvalidRequest) {
		t.Errorf("Send(delay and deliverAt) = %v, want ErrInvalidRequest", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("a refused send took %v: it was retried", d)
	}

	// Per-handle failures are values too.
	if f := (sdk.HandleFailure{Code: "receipt_expired"}); !errors.Is(f.Err(), sdk.ErrReceiptExpired) {
		t.Errorf("HandleFailure.Err() = %v", f.Err())
	}
	res, err := c.Ack(ctx, topic, "g2", sdk.AckRequest{ReceiptHandles: []string{"bogus"}})
	if !errors.Is(err, sdk.ErrSubscriptionNotFound) {
		// Either the subscription is unknown (404) or the handle is refused.
		if err != nil || len(res.Failed) != 1 || !errors.Is(res.Failed[0].Err(), sdk.ErrReceiptInvalid) {
			t.Errorf("Ack(bogus) = %+v, %v", res, err)
		}
	}
}

func TestAdminTopicsSubscriptions(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	c := newClient(t, srv.URL)
	ctx := t.Context()
	topic := topicName("admin")

	if _, _, err := c.PutTopic(ctx, topic, sdk.TopicConfig{Queues: 2, RetentionHours: 48}); err != nil {
		t.Fatal(err)
	}
	grown, created, err := c.PutTopic(ctx, topic, sdk.TopicConfig{Queues: 3})
	if err != nil || created || grown.Queues != 3 {
		t.Fatalf("growing PutTopic = %+v, created %v, %v", grown, created, err)
	}
	maxRetries := 2
	sub, created, err := c.PutSubscription(ctx, topic, "workers", sdk.SubscriptionConfig{
		Filter: "TagA || TagB", MaxRetries: &maxRetries, RetryDelays: []string{"1s", "2s"},
	})
	if err != nil || !created {
		t.Fatalf("PutSubscription = created %v, %v", created, err)
	}
	if sub.Mode != sdk.ModeClustering || sub.Filter != "TagA || TagB" || sub.MaxRetries != 2 || !slices.Equal(sub.RetryDelays, []string{"1s", "2s"}) {
		t.Errorf("subscription = %+v", sub)
	}
	if _, _, err := c.PutSubscription(ctx, topic, "audit", sdk.SubscriptionConfig{Mode: sdk.ModeBroadcast}); err != nil {
		t.Fatal(err)
	}
	subs, err := c.ListSubscriptions(ctx, topic)
	if err != nil || len(subs) != 2 {
		t.Fatalf("ListSubscriptions = %+v, %v", subs, err)
	}
	got, err := c.GetTopic(ctx, topic)
	if err != nil || got.Queues != 3 || got.RetentionHours != 48 || len(got.QueueStats) != 3 {
		t.Errorf("GetTopic = %+v, %v", got, err)
	}
	slices.Sort(got.Subscriptions)
	if !slices.Equal(got.Subscriptions, []string{"audit", "workers"}) {
		t.Errorf("topic subscriptions = %v", got.Subscriptions)
	}
	topics, err := c.ListTopics(ctx)
	if err != nil || !slices.ContainsFunc(topics, func(x sdk.Topic) bool { return x.Topic == topic }) {
		t.Errorf("ListTopics = %+v, %v", topics, err)
	}
	if err := c.DeleteSubscription(ctx, topic, "audit"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetSubscription(ctx, topic, "audit"); !errors.Is(err, sdk.ErrSubscriptionNotFound) {
		t.Errorf("GetSubscription(deleted) = %v", err)
	}
	if err := c.DeleteTopic(ctx, topic); err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetTopic(ctx, topic); !errors.Is(err, sdk.ErrTopicNotFound) {
		t.Errorf("GetTopic(deleted) = %v", err)
	}
	if err := c.Ready(ctx); err != nil {
		t.Errorf("Ready = %v", err)
	}
}

func TestQuerySeekDLQ(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	c := newClient(t, srv.URL)
	ctx := t.Context()
	topic := topicName("query")
	if _, _, err := c.PutTopic(ctx, topic, sdk.TopicConfig{Queues: 2}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.PutSubscription(ctx, topic, "g", sdk.SubscriptionConfig{}); err != nil {
		t.Fatal(err)
	}
	var msgs []sdk.SendMessage
	for i := range 7 {
		m := sdk.NewMessage(fmt.Sprintf("m%d", i))
		m.Keys = []string{"order-1"}
		m.Tag = []string{"A", "B"}[i%2]
		msgs = append(msgs, m)
	}
	msgs = append(msgs, sdk.NewBinaryMessage([]byte{0, 1, 2, 0xff}))
	sent, err := c.SendBatch(ctx, topic, "billing", msgs)
	if err != nil {
		t.Fatal(err)
	}

	// Query by key, three per page, through the iterator.
	var bodies []string
	for m, err := range c.Messages(ctx, topic, sdk.MessageQuery{Key: "order-1", Limit: 3}) {
		if err != nil {
			t.Fatal(err)
		}
		bodies = append(bodies, m.Body)
	}
	slices.Sort(bodies)
	if !slices.Equal(bodies, []string{"m0", "m1", "m2", "m3", "m4", "m5", "m6"}) {
		t.Errorf("query by key = %v", bodies)
	}
	page, err := c.QueryMessages(ctx, topic, sdk.MessageQuery{Tag: "B", Limit: 100})
	if err != nil || len(page.Messages) != 3 || page.Next != nil {
		t.Errorf("query by tag = %d messages, next %v, %v", len(page.Messages), page.Next, err)
	}
	q0, off := 0, int64(0)
	page, err = c.QueryMessages(ctx, topic, sdk.MessageQuery{QueueID: &q0, Offset: &off, From: time.Now().Add(-time.Hour)})
	if err != nil || len(page.Messages) == 0 {
		t.Fatalf("query by queue = %+v, %v", page, err)
	}
	for _, m := range page.Messages {
		if m.QueueID != 0 || m.ProducerGroup != "billing" {
			t.Errorf("query by queue 0 got %+v", m)
		}
	}

	// GetMessage: the binary body comes back as sent; the group sees it pending.
	st, err := c.GetMessage(ctx, topic, sent[7].MessageID)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := st.Message.Bytes(); err != nil || !slices.Equal(b, []byte{0, 1, 2, 0xff}) {
		t.Errorf("binary body = %v, %v", b, err)
	}
	if len(st.Subscriptions) != 1 || st.Subscriptions[0].Group != "g" || st.Subscriptions[0].State != sdk.StatePending {
		t.Errorf("states = %+v", st.Subscriptions)
	}

	// Consume everything, dead-lettering two; then the DLQ, paged.
	got, err := c.Pull(ctx, topic, "g", sdk.PullRequest{MaxMessages: 100, WaitSeconds: 1})
	if err != nil || len(got) != len(msgs) {
		t.Fatalf("Pull = %d messages, %v", len(got), err)
	}
	var ack, dead []string
	for _, m := range got {
		if m.Body == "m0" || m.Body == "m1" || m.Body == "m2" {
			dead = append(dead, m.ReceiptHandle)
		} else {
			ack = append(ack, m.ReceiptHandle)
		}
	}
	if r, err := c.DeadLetter(ctx, topic, "g", sdk.DeadLetterRequest{ReceiptHandles: dead, Reason: "poison"}); err != nil || r.DeadLettered != 3 {
		t.Fatalf("DeadLetter = %+v, %v", r, err)
	}
	if r, err := c.Ack(ctx, topic, "g", sdk.AckRequest{ReceiptHandles: ack}); err != nil || r.Acked != len(ack) {
		t.Fatalf("Ack = %+v, %v", r, err)
	}
	var deadBodies []string
	for m, err := range c.DeadLetters(ctx, topic, "g", sdk.PageOptions{Limit: 2}) {
		if err != nil {
			t.Fatal(err)
		}
		if m.Reason == nil || *m.Reason != "poison" || m.DeliveryAttempt != 1 || m.DeadAt.IsZero() {
			t.Errorf("dead message = %+v", m)
		}
		deadBodies = append(deadBodies, m.Body)
	}
	slices.Sort(deadBodies)
	if !slices.Equal(deadBodies, []string{"m0", "m1", "m2"}) {
		t.Errorf("DLQ = %v", deadBodies)
	}
	first, err := c.ListDeadLetters(ctx, topic, "g", sdk.PageOptions{Limit: 2})
	if err != nil || len(first.Messages) != 2 || first.Next == nil {
		t.Fatalf("DLQ page 1 = %+v, %v", first, err)
	}
	if rr, err := c.Redrive(ctx, topic, "g", sdk.RedriveRequest{DryRun: true}); err != nil || rr.Redriven != 3 || !rr.DryRun {
		t.Errorf("Redrive dry run = %+v, %v", rr, err)
	}
	if rr, err := c.Redrive(ctx, topic, "g", sdk.RedriveRequest{MessageIDs: []string{first.Messages[0].MessageID}}); err != nil || rr.Redriven != 1 {
		t.Errorf("Redrive = %+v, %v", rr, err)
	}
	again, err := c.Pull(ctx, topic, "g", sdk.PullRequest{WaitSeconds: 5})
	if err != nil || len(again) != 1 || again[0].MessageID != first.Messages[0].MessageID {
		t.Fatalf("Pull after redrive = %+v, %v", again, err)
	}
	if _, err := c.Ack(ctx, topic, "g", sdk.AckRequest{ReceiptHandles: []string{again[0].ReceiptHandle}}); err != nil {
		t.Fatal(err)
	}
	st, err = c.GetMessage(ctx, topic, again[0].MessageID)
	if err != nil {
		t.Fatal(err)
	}
	// (The server numbers attempts afresh after a redrive, so the history
	// may or may not still show the dead-letter; it ends with the ack.)
	hist := st.Subscriptions[0].History
	if st.Subscriptions[0].State != sdk.StateAcked || len(hist) == 0 || hist[len(hist)-1].Outcome != sdk.OutcomeAck || hist[len(hist)-1].SettledAt == nil {
		t.Errorf("redriven message state %q, history %+v", st.Subscriptions[0].State, hist)
	}

	// Seek back to the start: everything is delivered again.
	dry, err := c.Seek(ctx, topic, "g", sdk.SeekRequest{To: sdk.PositionEarliest, DryRun: true})
	if err != nil || !dry.DryRun || dry.Total != int64(len(msgs)) {
		t.Errorf("Seek dry run = %+v, %v", dry, err)
	}
	if _, err := c.Seek(ctx, topic, "g", sdk.SeekRequest{To: sdk.SeekTime(time.Now().Add(-time.Hour))}); err != nil {
		t.Fatal(err)
	}
	redo, err := c.Pull(ctx, topic, "g", sdk.PullRequest{MaxMessages: 100, WaitSeconds: 1})
	if err != nil || len(redo) != len(msgs) {
		t.Errorf("Pull after seek = %d messages, %v", len(redo), err)
	}
}

// TestClientCompression: the client asks for gzip replies only when told.
func TestClientCompression(t *testing.T) {
	var got atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.Store(r.Header.Get("Accept-Encoding"))
	}))
	defer srv.Close()
	for _, compression := range []bool{false, true} {
		c, err := sdk.NewClient(srv.URL, sdk.ClientOptions{Compression: compression})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Ready(context.Background()); err != nil {
			t.Fatal(err)
		}
		want := ""
		if compression {
			want = "gzip"
		}
		if ae := got.Load(); ae != want {
			t.Errorf("Compression %v: Accept-Encoding %q, want %q", compression, ae, want)
		}
	}
}
