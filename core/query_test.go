package core_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tidemq/tidemq/core"
)

// Message query (SPEC §2 "Query", MetaQ 消息查询): one message's state per
// subscription with its delivery history, and queries by key, tag, time
// and offset with paging.

func historyString(h []core.Attempt) string {
	var parts []string
	for _, a := range h {
		s := fmt.Sprintf("%d/%s/%s", a.Attempt, a.ConsumerID, a.Outcome)
		if a.Reason != "" {
			s += "(" + a.Reason + ")"
		}
		parts = append(parts, s)
	}
	return "[" + strings.Join(parts, " ") + "]"
}

func TestGetMessageStateAndHistoryPerSubscription(t *testing.T) {
	clk := newClock()
	e := newEnv(t, core.Options{Now: clk.Now})
	e.putTopic("orders", 1)
	for _, g := range []string{"acked", "dead", "inflight", "lapsed", "pending", "retrying"} {
		e.subscribe("orders", g, core.SubscriptionConfig{RetryDelays: []time.Duration{time.Hour}})
	}
	e.subscribe("orders", "filtered", core.SubscriptionConfig{Filter: "Other"})
	e.subscribe("orders", "bcast", core.SubscriptionConfig{Mode: core.ModeBroadcast})
	sent := e.sendBatch("orders", &core.Message{Body: []byte("m"), Tag: "TagA", Keys: []string{"order-1"}, Properties: map[string]string{"region": "hz"}})[0]
	t0 := clk.Now()

	e.ackAll("orders", "acked", []core.Delivered{e.pullOne("orders", "acked", core.PullRequest{ConsumerID: "ca"})})
	e.pullOne("orders", "inflight", core.PullRequest{ConsumerID: "ci"})
	e.nack("orders", "retrying", e.pullOne("orders", "retrying", core.PullRequest{ConsumerID: "cr"}), -1, "flaky downstream")
	e.deadLetter("orders", "dead", e.pullOne("orders", "dead", core.PullRequest{ConsumerID: "cd"}), "poison")
	e.ackAll("orders", "bcast", []core.Delivered{e.pullOne("orders", "bcast", core.PullRequest{ConsumerID: "b1"})})
	e.pullOne("orders", "bcast", core.PullRequest{ConsumerID: "b2"})
	e.pullOne("orders", "lapsed", core.PullRequest{ConsumerID: "cl", Invisible: 5 * time.Second})
	clk.Advance(5 * time.Second)
	t1 := clk.Now()
	if d := e.pullOne("orders", "lapsed", core.PullRequest{ConsumerID: "cl2"}); d.Attempt != 2 {
		t.Fatalf("lapsed: attempt %d", d.Attempt)
	}

	type want struct {
		group, consumer, state string
		attempt                int
		reason, history        string
	}
	wants := []want{
		{"acked", "", core.StateAcked, 1, "", "[1/ca/ack]"},
		{"bcast", "b1", core.StateAcked, 1, "", "[1/b1/ack]"},
		{"bcast", "b2", core.StateInflight, 1, "", "[1/b2/pending]"},
		{"dead", "", core.StateDead, 1, "poison", "[1/cd/deadletter(poison)]"},
		{"filtered", "", core.StateFiltered, 0, "", "[]"},
		{"inflight", "", core.StateInflight, 1, "", "[1/ci/pending]"},
		{"lapsed", "", core.StateInflight, 2, "lease expired", "[1/cl/lease_expired(lease expired) 2/cl2/pending]"},
		{"pending", "", core.StatePending, 0, "", "[]"},
		{"retrying", "", core.StateRetrying, 1, "flaky downstream", "[1/cr/nack(flaky downstream)]"},
	}
	var states []core.MessageState
	// The lapsed lease's history is written by the pull that noticed it,
	// which does not wait for the write.
	within(t, 5*time.Second, func() error {
		m, st, err := e.b.GetMessage("orders", sent.MessageID)
		if err != nil {
			return err
		}
		if m.ID != sent.MessageID || string(m.Body) != "m" || m.Tag != "TagA" || !slices.Equal(m.Keys, []string{"order-1"}) || m.Properties["region"] != "hz" {
			t.Fatalf("GetMessage returned %+v", m)
		}
		states = st
		for _, s := range st {
			if s.Group == "lapsed" && len(s.History) < 2 {
				return fmt.Errorf("lapsed history %s", historyString(s.History))
			}
		}
		return nil
	})
	if len(states) != len(wants) {
		t.Fatalf("%d states, want %d: %+v", len(states), len(wants), states)
	}
	for i, w := range wants {
		s := states[i]
		got := want{s.Group, s.ConsumerID, s.State, s.Attempt, s.LastReason, historyString(s.History)}
		if got != w {
			t.Errorf("state %d:\n got %+v\nwant %+v", i, got, w)
		}
		for _, h := range s.History {
			if h.DeliveredAt.Before(t0) || h.DeliveredAt.After(t1) {
				t.Errorf("%s attempt %d delivered at %v, outside [%v, %v]", s.Group, h.Attempt, h.DeliveredAt, t0, t1)
			}
			if (h.Outcome == "pending") != h.SettledAt.IsZero() {
				t.Errorf("%s attempt %d (%s) settled at %v: only a pending attempt has no settle time", s.Group, h.Attempt, h.Outcome, h.SettledAt)
			}
		}
	}

	// The retry comes due, is delivered and acked: history grows.
	e.advanceTimers(clk, time.Hour)
	e.ackAll("orders", "retrying", []core.Delivered{e.pullOne("orders", "retrying", core.PullRequest{ConsumerID: "cr2"})})
	_, states, err := e.b.GetMessage("orders", sent.MessageID)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range states {
		if s.Group == "retrying" {
			if h := historyString(s.History); s.State != core.StateAcked || s.Attempt != 2 || h != "[1/cr/nack(flaky downstream) 2/cr2/ack]" {
				t.Errorf("retrying after its retry was acked: %s attempt %d history %s", s.State, s.Attempt, h)
			}
		}
	}
}

func TestGetMessageNotFound(t *testing.T) {
	e := newEnv(t, core.Options{})
	e.putTopic("orders", 1)
	e.putTopic("other", 1)
	id := e.send("other", "x")[0].MessageID
	if _, _, err := e.b.GetMessage("orders", "nosuchid"); !errors.Is(err, core.ErrMessageNotFound) {
		t.Errorf("unknown id: %v, want ErrMessageNotFound", err)
	}
	if _, _, err := e.b.GetMessage("orders", id); !errors.Is(err, core.ErrMessageNotFound) {
		t.Errorf("id of another topic's message: %v, want ErrMessageNotFound", err)
	}
	if _, _, err := e.b.GetMessage("nosuch", id); !errors.Is(err, core.ErrTopicNotFound) {
		t.Errorf("unknown topic: %v, want ErrTopicNotFound", err)
	}
}

// queryAll pages through a query until the cursor is nil, checking that no
// page is larger than the limit and that only the last page is short.
func (e *env) queryAll(topic string, q core.Query) ([]*core.Message, int) {
	e.t.Helper()
	var all []*core.Message
	pages := 0
	for {
		page, next, err := e.b.QueryMessages(e.t.Context(), topic, q)
		if err != nil {
			e.t.Fatalf("QueryMessages(%+v): %v", q, err)
		}
		pages++
		if len(page) > q.Limit {
			e.t.Fatalf("page of %d with limit %d", len(page), q.Limit)
		}
		all = append(all, page...)
		if next == nil {
			return all, pages
		}
		if len(page) < q.Limit {
			e.t.Errorf("a short page (%d of %d) with a next cursor", len(page), q.Limit)
		}
		q.Cursor = next
		if pages > 1000 {
			e.t.Fatalf("QueryMessages(%+v) pages forever", q)
		}
	}
}

func msgBodies(ms []*core.Message) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = string(m.Body)
	}
	return out
}

func TestQueryMessagesWithPaging(t *testing.T) {
	clk := newClock()
	e := newEnv(t, core.Options{Now: clk.Now})
	e.putTopic("orders", 3)
	start := clk.Now()
	type sent struct {
		body  string
		key   string
		tag   string
		queue int
		off   uint64
		at    time.Time
	}
	var all []sent
	for i := range 30 {
		m := &core.Message{
			Body: fmt.Appendf(nil, "m%02d", i),
			Keys: []string{fmt.Sprintf("order-%d", i%5), "all"},
			Tag:  fmt.Sprintf("T%d", i%3),
		}
		r := e.sendBatch("orders", m)[0]
		all = append(all, sent{string(m.Body), m.Keys[0], m.Tag, r.QueueID, r.Offset, clk.Now()})
		clk.Advance(time.Second)
	}
	// Messages of another topic share the index's hashes, never the answer.
	e.putTopic("other", 1)
	e.sendBatch("other", &core.Message{Body: []byte("foreign"), Keys: []string{"order-2", "all"}, Tag: "T1"})

	check := func(name string, q core.Query, keep func(sent) bool) {
		t.Helper()
		var want []string
		for _, s := range all {
			if keep(s) {
				want = append(want, s.body)
			}
		}
		got, pages := e.queryAll("orders", q)
		bs := msgBodies(got)
		slices.Sort(bs)
		if !slices.Equal(bs, want) {
			t.Errorf("%s: got %v, want each of %v once", name, bs, want)
		}
		if wantPages := max(1, (len(want)+q.Limit-1)/q.Limit); pages < wantPages || pages > wantPages+1 {
			t.Errorf("%s: %d results in %d pages of %d", name, len(got), pages, q.Limit)
		}
	}
	check("key order-2", core.Query{Key: "order-2", Limit: 4}, func(s sent) bool { return s.key == "order-2" })
	check("key all", core.Query{Key: "all", Limit: 7}, func(sent) bool { return true })
	check("key all, one page", core.Query{Key: "all", Limit: 1000}, func(sent) bool { return true })
	check("tag T1", core.Query{Tag: "T1", Limit: 3}, func(s sent) bool { return s.tag == "T1" })
	from, to := start.Add(10*time.Second), start.Add(19*time.Second)
	inRange := func(s sent) bool { return !s.at.Before(from) && !s.at.After(to) }
	check("time range", core.Query{From: from, To: to, Limit: 4}, inRange)
	check("key in a time range", core.Query{Key: "all", From: from, To: to, Limit: 3}, inRange)
	check("tag and key", core.Query{Key: "order-1", Tag: "T1", Limit: 2}, func(s sent) bool { return s.key == "order-1" && s.tag == "T1" })
	q1, off := 1, uint64(2)
	check("queue 1 from offset 2", core.Query{QueueID: &q1, Offset: &off, Limit: 3}, func(s sent) bool { return s.queue == 1 && s.off >= 2 })
	check("queue 1", core.Query{QueueID: &q1, Limit: 4}, func(s sent) bool { return s.queue == 1 })
	check("every queue from a time", core.Query{From: start.Add(25 * time.Second), Limit: 2}, func(s sent) bool { return !s.at.Before(start.Add(25 * time.Second)) })

	// Only exact matches: a key that is another message's tag, a longer key
	// with the same prefix.
	e.sendBatch("orders",
		&core.Message{Body: []byte("tag-not-key"), Tag: "order-9"},
		&core.Message{Body: []byte("longer key"), Keys: []string{"order-99"}},
		&core.Message{Body: []byte("exact"), Keys: []string{"order-9"}},
	)
	if got, _ := e.queryAll("orders", core.Query{Key: "order-9", Limit: 10}); !slices.Equal(msgBodies(got), []string{"exact"}) {
		t.Errorf("key order-9 found %v, want only [exact]", msgBodies(got))
	}
	if got, _ := e.queryAll("orders", core.Query{Tag: "order-9", Limit: 10}); !slices.Equal(msgBodies(got), []string{"tag-not-key"}) {
		t.Errorf("tag order-9 found %v, want only [tag-not-key]", msgBodies(got))
	}
	if got, _ := e.queryAll("orders", core.Query{Key: "nobody", Limit: 10}); len(got) != 0 {
		t.Errorf("unknown key found %v", msgBodies(got))
	}

	// With no filter a query browses every retained message, queue by
	// queue, page by page.
	if got, _ := e.queryAll("orders", core.Query{Limit: 3}); int64(len(got)) != e.topicInfo("orders").Messages {
		t.Errorf("an unfiltered query found %d messages, the topic holds %d", len(got), e.topicInfo("orders").Messages)
	}
	for _, q := range []core.Query{{Key: "all", Limit: core.MaxMaxMessages + 1}, {From: to, To: from, Limit: 10}} {
		_, _, err := e.b.QueryMessages(t.Context(), "orders", q)
		var ve *core.ValidationError
		if !errors.As(err, &ve) {
			t.Errorf("QueryMessages(%+v) = %v, want a ValidationError", q, err)
		}
	}
	bad := 3
	_, _, err := e.b.QueryMessages(t.Context(), "orders", core.Query{QueueID: &bad})
	wantValidation(t, err, "/queueId", -1)
	if _, _, err := e.b.QueryMessages(t.Context(), "nosuch", core.Query{Key: "x"}); !errors.Is(err, core.ErrTopicNotFound) {
		t.Errorf("unknown topic: %v", err)
	}
}
