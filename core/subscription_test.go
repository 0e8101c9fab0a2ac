package core_test

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/tidemq/tidemq/core"
)

func TestSubscriptionStartFrom(t *testing.T) {
	clk := newClock()
	e := newEnv(t, core.Options{Now: clk.Now})
	e.putTopic("orders", 3)
	t0 := clk.Now()
	e.send("orders", numbered("A", 6)...)
	clk.Advance(time.Minute)
	t1 := clk.Now()
	e.send("orders", numbered("B", 6)...)
	clk.Advance(time.Minute)

	all := append(numbered("A", 6), numbered("B", 6)...)
	for i, tc := range []struct {
		from string
		want []string
	}{
		{"", all},
		{"earliest", all},
		{"latest", nil},
		{t0.Add(-time.Hour).Format(time.RFC3339), all},
		{t0.Format(time.RFC3339Nano), all},
		{t0.Add(30 * time.Second).Format(time.RFC3339), numbered("B", 6)},
		{t1.Format(time.RFC3339Nano), numbered("B", 6)},
		{t1.Add(time.Millisecond).Format(time.RFC3339Nano), nil},
		{t1.Add(time.Hour).Format(time.RFC3339), nil},
	} {
		group := fmt.Sprintf("g%d", i)
		info := e.subscribe("orders", group, core.SubscriptionConfig{StartFrom: tc.from})
		if tc.from != "" && info.Config.StartFrom != tc.from {
			t.Errorf("%s: StartFrom recorded as %q, want %q", group, info.Config.StartFrom, tc.from)
		}
		if got := bodies(e.drain("orders", group, core.PullRequest{})); !slices.Equal(got, tc.want) {
			t.Errorf("startFrom %q delivered %v, want %v", tc.from, got, tc.want)
		}
	}

	// Subscriptions that started at the end get what comes next.
	e.send("orders", "C")
	for _, g := range []string{"g2", "g7", "g8"} {
		if got := bodies(e.drain("orders", g, core.PullRequest{})); !slices.Equal(got, []string{"C"}) {
			t.Errorf("%s got %v after a new send, want [C]", g, got)
		}
	}
}

func TestSubscriptionRejectsBadConfig(t *testing.T) {
	e := newEnv(t, core.Options{})
	e.putTopic("orders", 1)
	ctx := t.Context()
	neg, tooMany := -1, core.MaxMaxRetries+1
	for _, tc := range []struct {
		cfg   core.SubscriptionConfig
		field string
	}{
		{core.SubscriptionConfig{Mode: "fanout"}, "/mode"},
		{core.SubscriptionConfig{MaxRetries: &neg}, "/maxRetries"},
		{core.SubscriptionConfig{MaxRetries: &tooMany}, "/maxRetries"},
		{core.SubscriptionConfig{StartFrom: "yesterday"}, "/startFrom"},
		{core.SubscriptionConfig{StartFrom: "2025-03-14"}, "/startFrom"},
		{core.SubscriptionConfig{RetryDelays: []time.Duration{time.Second, -time.Second}}, "/retryDelays/1"},
		{core.SubscriptionConfig{RetryDelays: []time.Duration{25 * time.Hour}}, "/retryDelays/0"},
	} {
		_, _, err := e.b.PutSubscription(ctx, "orders", "g", tc.cfg)
		wantValidation(t, err, tc.field, -1)
	}
	_, _, err := e.b.PutSubscription(ctx, "orders", "g", core.SubscriptionConfig{Filter: "A ||"})
	wantErr(t, err, core.ErrInvalidFilter)
	_, _, err = e.b.PutSubscription(ctx, "orders", "-g", core.SubscriptionConfig{})
	wantErr(t, err, core.ErrInvalidName)
	_, _, err = e.b.PutSubscription(ctx, "missing", "g", core.SubscriptionConfig{})
	wantErr(t, err, core.ErrTopicNotFound)
	if subs := e.topicInfo("orders").Subscriptions; len(subs) != 0 {
		t.Errorf("subscriptions %v exist after only bad requests", subs)
	}
}

func TestPutSubscriptionCreatesThenUpdates(t *testing.T) {
	e := newEnv(t, core.Options{})
	e.putTopic("orders", 2)
	ctx := t.Context()
	info, created, err := e.b.PutSubscription(ctx, "orders", "g", core.SubscriptionConfig{})
	if err != nil || !created {
		t.Fatalf("create: created=%v err=%v", created, err)
	}
	c := info.Config
	if c.Mode != core.ModeClustering || c.Filter != "*" || c.MaxRetries != core.DefaultMaxRetries ||
		c.StartFrom != "earliest" || !slices.Equal(c.RetryDelays, core.DefaultRetryDelays) {
		t.Errorf("defaults = %+v", c)
	}

	three := 3
	info, created, err = e.b.PutSubscription(ctx, "orders", "g", core.SubscriptionConfig{Filter: "TagA", MaxRetries: &three})
	if err != nil || created {
		t.Fatalf("update: created=%v err=%v", created, err)
	}
	if info.Config.Filter != "TagA" || info.Config.MaxRetries != 3 {
		t.Errorf("update not applied: %+v", info.Config)
	}
	// The new filter is in force.
	e.sendBatch("orders", &core.Message{Body: []byte("a"), Tag: "TagA"}, &core.Message{Body: []byte("b"), Tag: "TagB"})
	if got := bodies(e.drain("orders", "g", core.PullRequest{})); !slices.Equal(got, []string{"a"}) {
		t.Errorf("after filter update got %v, want [a]", got)
	}
	list, err := e.b.ListSubscriptions("orders")
	if err != nil || len(list) != 1 || list[0].Group != "g" || list[0].Config.Filter != "TagA" {
		t.Errorf("ListSubscriptions = %+v, %v", list, err)
	}
}

func TestSubscriptionStats(t *testing.T) {
	e := newEnv(t, core.Options{})
	e.putTopic("orders", 1)
	e.subscribe("orders", "g", core.SubscriptionConfig{})
	e.send("orders", numbered("m", 10)...)

	check := func(step string, acked uint64, inflight, lag int64) {
		t.Helper()
		info := e.subInfo("orders", "g")
		want := core.SubQueueStat{QueueID: 0, MaxOffset: 10, AckedOffset: acked, Inflight: inflight, Lag: lag}
		if len(info.Queues) != 1 || info.Queues[0] != want {
			t.Errorf("%s: queues %+v, want [%+v]", step, info.Queues, want)
		}
		if info.Lag != lag || info.Inflight != inflight {
			t.Errorf("%s: totals lag=%d inflight=%d, want %d %d", step, info.Lag, info.Inflight, lag, inflight)
		}
	}
	check("before any pull", 0, 0, 10)
	got := e.pull("orders", "g", core.PullRequest{MaxMessages: 4})
	if len(got) != 4 {
		t.Fatalf("pulled %d, want 4", len(got))
	}
	check("after pulling 4", 0, 4, 10)
	h := map[uint64]string{}
	for _, d := range got {
		h[d.Message.Offset] = d.ReceiptHandle
	}
	e.ack("orders", "g", h[0], h[1])
	check("after acking 0 and 1", 2, 2, 8)
	e.ack("orders", "g", h[3])
	check("after acking 3 out of order", 2, 1, 7)
	e.ack("orders", "g", h[2])
	check("after acking 2", 4, 0, 6)
	e.ackAll("orders", "g", e.drain("orders", "g", core.PullRequest{}))
	check("after acking everything", 10, 0, 0)
}

func TestSubscriptionStatsAcrossQueues(t *testing.T) {
	e := newEnv(t, core.Options{})
	e.putTopic("orders", 4)
	e.subscribe("orders", "g", core.SubscriptionConfig{})
	perQueue := map[int]uint64{}
	for _, r := range e.send("orders", numbered("m", 22)...) {
		perQueue[r.QueueID]++
	}
	info := e.subInfo("orders", "g")
	if info.Lag != 22 || len(info.Queues) != 4 {
		t.Fatalf("lag %d over %d queues, want 22 over 4", info.Lag, len(info.Queues))
	}
	for _, q := range info.Queues {
		if q.MaxOffset != perQueue[q.QueueID] || q.Lag != int64(perQueue[q.QueueID]) {
			t.Errorf("queue %d: %+v, want max=lag=%d", q.QueueID, q, perQueue[q.QueueID])
		}
	}
	e.ackAll("orders", "g", e.drain("orders", "g", core.PullRequest{MaxMessages: 5}))
	for _, q := range e.subInfo("orders", "g").Queues {
		if q.AckedOffset != q.MaxOffset || q.Lag != 0 || q.Inflight != 0 {
			t.Errorf("queue %d after acking all: %+v", q.QueueID, q)
		}
	}
}

func TestConsumersAreReported(t *testing.T) {
	clk := newClock()
	e := newEnv(t, core.Options{Now: clk.Now})
	e.putTopic("orders", 1)
	e.subscribe("orders", "g", core.SubscriptionConfig{})
	e.send("orders", "x")
	e.pull("orders", "g", core.PullRequest{ConsumerID: "host-1"})
	clk.Advance(time.Second)
	e.pull("orders", "g", core.PullRequest{ConsumerID: "host-2"})
	info := e.subInfo("orders", "g")
	if len(info.Consumers) != 2 {
		t.Fatalf("consumers %+v, want host-1 and host-2", info.Consumers)
	}
	c1, c2 := info.Consumers[0], info.Consumers[1]
	if c1.ConsumerID != "host-1" || !slices.Equal(c1.Queues, []int{0}) || !c1.LastSeen.Equal(clk.Now().Add(-time.Second)) {
		t.Errorf("host-1 = %+v", c1)
	}
	if c2.ConsumerID != "host-2" || len(c2.Queues) != 0 || !c2.LastSeen.Equal(clk.Now()) {
		t.Errorf("host-2 = %+v (it got nothing, so no queues)", c2)
	}
}

func TestDeleteSubscription(t *testing.T) {
	e := newEnv(t, core.Options{})
	ctx := t.Context()
	e.putTopic("orders", 1)
	e.subscribe("orders", "g", core.SubscriptionConfig{})
	e.subscribe("orders", "other", core.SubscriptionConfig{})
	e.send("orders", "a", "b")
	got := e.pull("orders", "g", core.PullRequest{MaxMessages: 1})

	if err := e.b.DeleteSubscription(ctx, "orders", "g"); err != nil {
		t.Fatal(err)
	}
	_, err := e.b.GetSubscription("orders", "g")
	wantErr(t, err, core.ErrSubscriptionNotFound)
	_, _, err = e.b.Ack(ctx, "orders", "g", handles(got))
	wantErr(t, err, core.ErrSubscriptionNotFound)
	_, err = e.b.Pull(ctx, "orders", "g", core.PullRequest{})
	wantErr(t, err, core.ErrSubscriptionNotFound)
	wantErr(t, e.b.DeleteSubscription(ctx, "orders", "g"), core.ErrSubscriptionNotFound)
	if subs := e.topicInfo("orders").Subscriptions; !slices.Equal(subs, []string{"other"}) {
		t.Errorf("topic lists subscriptions %v, want [other]", subs)
	}
	// Other groups keep their position, and a new "g" starts over.
	if got := bodies(e.drain("orders", "other", core.PullRequest{})); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("other group got %v", got)
	}
	e.subscribe("orders", "g", core.SubscriptionConfig{})
	if again := bodies(e.drain("orders", "g", core.PullRequest{})); !slices.Equal(again, []string{"a", "b"}) {
		t.Errorf("re-created group got %v, want [a b]", again)
	}
	// A handle from the deleted subscription names nothing in the new one.
	n, failed := e.ack("orders", "g", handles(got)...)
	if n != 0 || len(failed) != 1 || !errors.Is(failed[0].Err, core.ErrReceiptInvalid) {
		t.Errorf("old subscription's handle on the new one: acked=%d failed=%v, want receipt invalid", n, failed)
	}

	e.restart()
	if _, err := e.b.GetSubscription("orders", "g"); err != nil {
		t.Errorf("re-created subscription lost on restart: %v", err)
	}
	if subs := e.topicInfo("orders").Subscriptions; !slices.Equal(subs, []string{"g", "other"}) {
		t.Errorf("after restart topic lists %v, want [g other]", subs)
	}
}

func TestPullAutoCreatesSubscription(t *testing.T) {
	t.Run("on", func(t *testing.T) {
		e := newEnv(t, core.Options{AutoCreate: true})
		e.send("orders", "a")
		if got := bodies(e.drain("orders", "g", core.PullRequest{})); !slices.Equal(got, []string{"a"}) {
			t.Errorf("auto-created subscription got %v, want [a] (startFrom earliest)", got)
		}
		if info := e.subInfo("orders", "g"); info.Config.StartFrom != "earliest" || info.Config.Filter != "*" {
			t.Errorf("auto-created config %+v", info.Config)
		}
	})
	t.Run("off", func(t *testing.T) {
		e := newEnv(t, core.Options{})
		_, err := e.b.Pull(t.Context(), "orders", "g", core.PullRequest{})
		wantErr(t, err, core.ErrTopicNotFound)
		e.putTopic("orders", 1)
		_, err = e.b.Pull(t.Context(), "orders", "g", core.PullRequest{})
		wantErr(t, err, core.ErrSubscriptionNotFound)
		_, _, err = e.b.Ack(t.Context(), "orders", "g", []string{"x"})
		wantErr(t, err, core.ErrSubscriptionNotFound)
	})
}

// SubscriptionConfigs lists what ListSubscriptions does of each
// subscription's name and configuration, in the same order, without stats.
func TestSubscriptionConfigs(t *testing.T) {
	e := newEnv(t, core.Options{})
	e.putTopic("orders", 2)
	e.subscribe("orders", "b", core.SubscriptionConfig{Orderly: true})
	e.subscribe("orders", "a", core.SubscriptionConfig{RetryDelays: []time.Duration{time.Second}})
	e.send("orders", "m1", "m2")
	e.pull("orders", "a", core.PullRequest{MaxMessages: 1, ConsumerID: "c1"})
	full, err := e.b.ListSubscriptions("orders")
	if err != nil {
		t.Fatal(err)
	}
	got, err := e.b.SubscriptionConfigs("orders")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(full) {
		t.Fatalf("%d subscriptions, want %d", len(got), len(full))
	}
	for i, s := range got {
		f := full[i]
		if s.Topic != f.Topic || s.Group != f.Group || !s.CreatedAt.Equal(f.CreatedAt) || fmt.Sprint(s.Config) != fmt.Sprint(f.Config) {
			t.Errorf("[%d] = %s/%s %v %+v, want %s/%s %v %+v", i, s.Topic, s.Group, s.CreatedAt, s.Config, f.Topic, f.Group, f.CreatedAt, f.Config)
		}
		if s.Lag != 0 || s.Inflight != 0 || s.Consumers != nil {
			t.Errorf("[%d] has stats: lag %d, inflight %d, consumers %v", i, s.Lag, s.Inflight, s.Consumers)
		}
	}
	if _, err := e.b.SubscriptionConfigs("nope"); !errors.Is(err, core.ErrTopicNotFound) {
		t.Errorf("unknown topic: %v, want ErrTopicNotFound", err)
	}
}
