package core_test

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/tidemq/tidemq/core"
)

// Delayed sends (DeliverAtMs; the gateway turns delaySeconds and deliverAt
// into it) and send dedup (SPEC §2 "Send").

func TestDelayedMessageIsInvisibleUntilDue(t *testing.T) {
	clk := newClock()
	e := newEnv(t, core.Options{Now: clk.Now})
	e.putTopic("orders", 2)
	e.subscribe("orders", "g", core.SubscriptionConfig{})
	due := clk.Now().Add(30 * time.Second)
	res := e.sendBatch("orders",
		&core.Message{Body: []byte("later"), Keys: []string{"k-later"}, DeliverAtMs: due.UnixMilli()},
		&core.Message{Body: []byte("now")},
	)
	later, now := res[0], res[1]
	if !later.Delayed || later.Offset != 0 || later.MessageID == "" || !later.StoredAt.Equal(clk.Now()) {
		t.Errorf("delayed send result %+v, want Delayed with no offset yet", later)
	}
	if now.Delayed {
		t.Errorf("an undelayed message in the same batch is Delayed: %+v", now)
	}
	if n := e.topicInfo("orders").Messages; n != 1 {
		t.Errorf("topic holds %d messages before the delay ends, want 1", n)
	}
	got := e.drain("orders", "g", core.PullRequest{})
	if !slices.Equal(bodies(got), []string{"now"}) {
		t.Fatalf("before the delay ended, delivered %v, want [now]", bodies(got))
	}
	e.ackAll("orders", "g", got)
	e.advanceTimers(clk, 30*time.Second-time.Millisecond)
	e.pullNone("orders", "g", core.PullRequest{}, "1 ms before the message is due")

	e.advanceTimers(clk, time.Millisecond)
	d := e.pullSoon("orders", "g", core.PullRequest{})
	if len(d) != 1 {
		t.Fatalf("pulled %d once due", len(d))
	}
	m := d[0].Message
	if m.ID != later.MessageID || string(m.Body) != "later" || d[0].Attempt != 1 || int(m.QueueID) != later.QueueID {
		t.Errorf("due message: id=%s body=%q attempt=%d queue=%d; want %s later 1 queue %d", m.ID, m.Body, d[0].Attempt, m.QueueID, later.MessageID, later.QueueID)
	}
	if m.StoredAtMs != due.UnixMilli() || m.DeliverAtMs != 0 {
		t.Errorf("due message stored at %d (deliverAt %d), want stored when it came due, %d", m.StoredAtMs, m.DeliverAtMs, due.UnixMilli())
	}
	if n := e.topicInfo("orders").Messages; n != 2 {
		t.Errorf("topic holds %d messages once due, want 2", n)
	}
	// Once due it is indexed like any other message.
	if msgs, _, err := e.b.QueryMessages(t.Context(), "orders", core.Query{Key: "k-later"}); err != nil || len(msgs) != 1 || msgs[0].ID != later.MessageID {
		t.Errorf("query by key of the due message: %d messages, %v", len(msgs), err)
	}
}

// On the real clock: a delayed message comes within the timer loop's
// second of its due time, and a parked long poll gets it.
func TestDelayedMessageArrivesOnTime(t *testing.T) {
	e := newEnv(t, core.Options{})
	e.putTopic("orders", 1)
	e.subscribe("orders", "g", core.SubscriptionConfig{})
	// Delivery times have millisecond resolution (RFC 3339 with ms).
	due := time.UnixMilli(time.Now().Add(300 * time.Millisecond).UnixMilli())
	e.sendBatch("orders", &core.Message{Body: []byte("soon"), DeliverAtMs: due.UnixMilli()})
	got := e.pull("orders", "g", core.PullRequest{Wait: 5 * time.Second})
	at := time.Now()
	if len(got) != 1 || string(got[0].Message.Body) != "soon" {
		t.Fatalf("long poll got %v", bodies(got))
	}
	if at.Before(due) {
		t.Errorf("delivered %v before it was due", due.Sub(at))
	}
	if late := at.Sub(due); late > 1500*time.Millisecond {
		t.Errorf("delivered %v after it was due, want within the timer loop's 1 s scan", late)
	}
}

// A parked message is not subject to retention: a delay longer than the
// topic's retention still delivers it.
func TestDelayLongerThanRetention(t *testing.T) {
	clk := newClock()
	e := newEnv(t, core.Options{Now: clk.Now})
	if _, _, err := e.b.PutTopic(t.Context(), "orders", core.TopicConfig{Queues: 1, RetentionHours: 1}); err != nil {
		t.Fatal(err)
	}
	e.subscribe("orders", "g", core.SubscriptionConfig{})
	e.send("orders", "expires")
	delayed := e.sendBatch("orders", &core.Message{Body: []byte("parked"), DeliverAtMs: clk.Now().Add(3 * time.Hour).UnixMilli()})[0]
	clk.Advance(2 * time.Hour)
	if err := e.b.EnforceRetention(); err != nil {
		t.Fatal(err)
	}
	if info := e.topicInfo("orders"); info.Messages != 0 || info.QueueStats[0].MinOffset != 1 {
		t.Fatalf("after retention: %d messages, min offset %d; want the old one gone", info.Messages, info.QueueStats[0].MinOffset)
	}
	e.pullNone("orders", "g", core.PullRequest{}, "after retention, before the delay ended")
	e.advanceTimers(clk, time.Hour)
	got := e.pullSoon("orders", "g", core.PullRequest{})
	if len(got) != 1 || got[0].Message.ID != delayed.MessageID {
		t.Fatalf("after 3 h got %v, want the parked message", bodies(got))
	}
	e.ackAll("orders", "g", got)
	e.pullNone("orders", "g", core.PullRequest{}, "the expired message never comes")
}

func TestDelayedMessagesSurviveRestart(t *testing.T) {
	clk := newClock()
	e := newEnv(t, core.Options{Now: clk.Now})
	e.putTopic("orders", 2)
	e.subscribe("orders", "g", core.SubscriptionConfig{})
	var ids []string
	for i, d := range []time.Duration{time.Minute, 2 * time.Minute} {
		r := e.sendBatch("orders", &core.Message{Body: fmt.Appendf(nil, "d%d", i), DeliverAtMs: clk.Now().Add(d).UnixMilli()})
		ids = append(ids, r[0].MessageID)
	}
	e.restart()
	e.pullNone("orders", "g", core.PullRequest{}, "after restart, before anything is due")
	e.advanceTimers(clk, time.Minute)
	got := e.pullSoon("orders", "g", core.PullRequest{})
	if len(got) != 1 || got[0].Message.ID != ids[0] {
		t.Fatalf("after 1 min got %v, want d0", bodies(got))
	}
	e.ackAll("orders", "g", got)
	e.restart()
	e.advanceTimers(clk, time.Minute)
	if got := e.pullSoon("orders", "g", core.PullRequest{}); len(got) != 1 || got[0].Message.ID != ids[1] {
		t.Fatalf("after 2 min got %v, want d1", bodies(got))
	}
	if n := e.topicInfo("orders").Messages; n != 2 {
		t.Errorf("topic holds %d messages, want 2: each delayed message appended once", n)
	}
}

// After a restart the timer cursor starts at the earliest parked timer;
// a timer added later that is due before it must still fire. (At HEAD the
// cursor began at that first timer's due time, so a new delayed send or
// retry due earlier was never fired; the working tree's timerCommitted
// rewinds the cursor.)
func TestRegressionTimerDueBeforeOlderTimersAfterRestart(t *testing.T) {
	clk := newClock()
	e := newEnv(t, core.Options{Now: clk.Now})
	e.putTopic("orders", 1)
	e.subscribe("orders", "g", core.SubscriptionConfig{RetryDelays: []time.Duration{10 * time.Second}})
	e.ensurePoke()
	e.sendBatch("orders", &core.Message{Body: []byte("in an hour"), DeliverAtMs: clk.Now().Add(time.Hour).UnixMilli()})
	e.restart()
	e.sendBatch("orders",
		&core.Message{Body: []byte("in a minute"), DeliverAtMs: clk.Now().Add(time.Minute).UnixMilli()},
		&core.Message{Body: []byte("now")},
	)
	e.nack("orders", "g", e.pullOne("orders", "g", core.PullRequest{}), -1, "")
	clk.Advance(10 * time.Second)
	e.pokeTimers()
	got := e.pullSoon("orders", "g", core.PullRequest{})
	if len(got) != 1 || string(got[0].Message.Body) != "now" || got[0].Attempt != 2 {
		t.Fatalf("retry due 10 s after restart: got %v attempts %v", bodies(got), attempts(got))
	}
	e.ackAll("orders", "g", got)
	clk.Advance(50 * time.Second)
	e.pokeTimers()
	if got := e.pullSoon("orders", "g", core.PullRequest{}); len(got) != 1 || string(got[0].Message.Body) != "in a minute" {
		t.Fatalf("delayed send due 1 min after restart: got %v", bodies(got))
	}
}

func TestDedupKeyStoresOneMessage(t *testing.T) {
	clk := newClock()
	e := newEnv(t, core.Options{Now: clk.Now})
	e.putTopic("orders", 4)
	e.subscribe("orders", "g", core.SubscriptionConfig{})
	send := func(body, key string) core.SendResult {
		t.Helper()
		return e.sendBatch("orders", &core.Message{Body: []byte(body), DedupKey: key})[0]
	}
	messages := func(want int64) {
		t.Helper()
		if n := e.topicInfo("orders").Messages; n != want {
			t.Fatalf("topic holds %d messages, want %d", n, want)
		}
	}
	sameAs := func(what string, got, first core.SendResult) {
		t.Helper()
		if !got.Duplicate || got.MessageID != first.MessageID || got.QueueID != first.QueueID || got.Offset != first.Offset || !got.StoredAt.Equal(first.StoredAt) {
			t.Errorf("%s: %+v, want the first send's result %+v with Duplicate", what, got, first)
		}
	}

	first := send("pay 1001", "req-1")
	if first.Duplicate {
		t.Fatal("first send is a duplicate")
	}
	clk.Advance(time.Minute)
	sameAs("repeat", send("pay 1001 (retried)", "req-1"), first)
	messages(1)

	// Within one batch: the second entry with a key repeats the first.
	res := e.sendBatch("orders",
		&core.Message{Body: []byte("a"), DedupKey: "req-2"},
		&core.Message{Body: []byte("b"), DedupKey: "req-3"},
		&core.Message{Body: []byte("a again"), DedupKey: "req-2"},
		&core.Message{Body: []byte("no key")},
	)
	if res[0].Duplicate || res[1].Duplicate || res[3].Duplicate {
		t.Errorf("batch results %+v: only entry 2 repeats a key", res)
	}
	sameAs("repeat inside a batch", res[2], res[0])
	messages(4)

	// A delayed send is deduplicated too, answering Delayed.
	delayed := e.sendBatch("orders", &core.Message{Body: []byte("later"), DedupKey: "req-4", DeliverAtMs: clk.Now().Add(time.Hour).UnixMilli()})[0]
	again := send("later", "req-4")
	if !again.Delayed || !again.Duplicate || again.MessageID != delayed.MessageID {
		t.Errorf("repeat of a delayed send: %+v, want the first's (Delayed) with Duplicate", again)
	}

	// The memory is durable.
	e.restart()
	sameAs("repeat after restart", send("pay 1001", "req-1"), first)
	messages(4)

	// Keys are per topic.
	e.putTopic("other", 1)
	if r := e.sendBatch("other", &core.Message{Body: []byte("x"), DedupKey: "req-1"})[0]; r.Duplicate {
		t.Errorf("a key of topic orders deduplicated a send to topic other: %+v", r)
	}

	// Past the 5 minute window the key is forgotten: a new message.
	clk.Advance(core.DedupWindow + time.Minute)
	fresh := send("pay 1001", "req-1")
	if fresh.Duplicate || fresh.MessageID == first.MessageID {
		t.Errorf("send 7 min after the first: %+v, want a new message", fresh)
	}
	messages(5)
	// …which starts a new window.
	sameAs("repeat of the new message", send("pay 1001", "req-1"), fresh)

	got := e.drain("orders", "g", core.PullRequest{MaxMessages: 100})
	if want := []string{"a", "b", "no key", "pay 1001", "pay 1001"}; !slices.Equal(bodies(got), want) {
		t.Errorf("the subscription got %v, want %v", bodies(got), want)
	}
}

// TestDelayedMessageFoundByIDBeforeDue: GetMessage finds a delayed message
// while it waits (no offset yet, its due time, every group pending or
// filtered), across a restart and a retention pass longer than the topic's
// retention, and once due as the stored message it has become. A message
// of another topic with the same id is not found.
func TestDelayedMessageFoundByIDBeforeDue(t *testing.T) {
	clk := newClock()
	e := newEnv(t, core.Options{Now: clk.Now})
	if _, _, err := e.b.PutTopic(t.Context(), "orders", core.TopicConfig{Queues: 2, RetentionHours: 1}); err != nil {
		t.Fatal(err)
	}
	e.putTopic("other", 1)
	e.subscribe("orders", "all", core.SubscriptionConfig{})
	e.subscribe("orders", "tagB", core.SubscriptionConfig{Filter: "TagB"})
	sentAt := clk.Now()
	due := sentAt.Add(3 * time.Hour)
	res := e.sendBatch("orders", &core.Message{Body: []byte("later"), Tag: "TagA", DeliverAtMs: due.UnixMilli()})[0]

	check := func(when string) {
		t.Helper()
		m, states, err := e.b.GetMessage("orders", res.MessageID)
		if err != nil {
			t.Fatalf("%s: GetMessage: %v", when, err)
		}
		if m.ID != res.MessageID || string(m.Body) != "later" || m.DeliverAtMs != due.UnixMilli() || m.StoredAtMs != sentAt.UnixMilli() {
			t.Errorf("%s: message %s %q deliverAt %d storedAt %d, want %s deliverAt %d storedAt %d", when, m.ID, m.Body,
				m.DeliverAtMs, m.StoredAtMs, res.MessageID, due.UnixMilli(), sentAt.UnixMilli())
		}
		want := []string{"all:pending", "tagB:filtered"}
		var got []string
		for _, s := range states {
			got = append(got, s.Group+":"+s.State)
			if len(s.History) != 0 {
				t.Errorf("%s: group %s has history %+v before any delivery", when, s.Group, s.History)
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s: states %v, want %v", when, got, want)
		}
		if _, _, err := e.b.GetMessage("other", res.MessageID); !errors.Is(err, core.ErrMessageNotFound) {
			t.Errorf("%s: found in another topic: %v", when, err)
		}
	}
	check("just sent")
	e.restart()
	check("after a restart")
	clk.Advance(2 * time.Hour)
	if err := e.b.EnforceRetention(); err != nil {
		t.Fatal(err)
	}
	check("after retention of the topic's 1 h")

	e.advanceTimers(clk, time.Hour)
	e.pullSoon("orders", "all", core.PullRequest{})
	m, states, err := e.b.GetMessage("orders", res.MessageID)
	if err != nil || m.DeliverAtMs != 0 || m.StoredAtMs != due.UnixMilli() {
		t.Fatalf("once due: %+v, %v; want the stored message, stored when due", m, err)
	}
	if len(states) != 2 || states[0].State != core.StateInflight {
		t.Errorf("once due and pulled: states %+v, want inflight for all", states)
	}
}
