package gateway_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tidemq/tidemq/core"
	"github.com/tidemq/tidemq/gateway"
	"github.com/tidemq/tidemq/internal/promexport"
	"github.com/tidemq/tidemq/webhook"
)

// End-to-end tests of retries, the DLQ, delayed and deduplicated sends,
// seek, message query, orderly, broadcast, push and metrics, through HTTP
// with the contract-checking client of e2e_test.go.

// ------------------------------------------------------------ wire types

type failedHandle struct{ ReceiptHandle, Code string }

type nackReply struct {
	Nacked int
	Failed []failedHandle
}

type deadMessage struct {
	pulledMessage
	Reason string
	DeadAt string
}

type dlqPage struct {
	Messages []deadMessage
	Next     *string
}

type redriveReply struct {
	Redriven int
	DryRun   bool
}

type seekReply struct {
	DryRun bool
	Queues []struct {
		QueueID int
		Count   int64
	}
	Total int64
}

type messageStatus struct {
	Message       pulledMessage
	Subscriptions []struct {
		Group, ConsumerID, State string
		DeliveryAttempt          int
		LastReason               string
		History                  []struct {
			Attempt                          int
			ConsumerID, DeliveredAt, Outcome string
			Reason                           string
			SettledAt                        *string
		}
	}
}

type queryPage struct {
	Messages []pulledMessage
	Next     *string
}

type subscriptionStats struct {
	Lag, Inflight, Retrying, Dlq int64
	Push                         *struct {
		Endpoint, State string
	}
}

// ------------------------------------------------------ client shortcuts

func nackPath(topic, group string) string { return subPath(topic, group) + "/nack" }
func dlqPath(topic, group string) string  { return subPath(topic, group) + "/dlq" }

func (c *client) nack(topic, group string, body map[string]any) nackReply {
	c.t.Helper()
	r := c.do("POST", nackPath(topic, group), body)
	wantStatus(c.t, r, http.StatusOK)
	return decode[nackReply](c.t, r)
}

func (c *client) stats(topic, group string) subscriptionStats {
	c.t.Helper()
	r := c.do("GET", subPath(topic, group), nil)
	wantStatus(c.t, r, http.StatusOK)
	return decode[subscriptionStats](c.t, r)
}

// pullWithin long-polls until a message comes or timeout passes.
func (c *client) pullWithin(topic, group string, timeout time.Duration, req map[string]any) []pulledMessage {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		body := map[string]any{"waitSeconds": 1}
		for k, v := range req {
			body[k] = v
		}
		if msgs := c.pull(topic, group, body); len(msgs) > 0 {
			return msgs
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("nothing to pull from %s/%s within %v", topic, group, timeout)
		}
	}
}

func bodiesOf(msgs []pulledMessage) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = m.Body
	}
	slices.Sort(out)
	return out
}

// ================================================================ tests

func TestE2ENackRedeliversAfterTheDelay(t *testing.T) {
	t.Parallel()
	c := startServer(t, serverConfig{}).client(t)
	c.createTopic("retry", 1)
	c.putSubscription("retry", "g", map[string]any{"retryDelays": []string{"300ms"}}, http.StatusCreated)
	c.send("retry", jsonMsg("by-schedule"))
	c.send("retry", jsonMsg("by-request"))
	msgs := c.pull("retry", "g", map[string]any{"maxMessages": 2})
	if len(msgs) != 2 {
		t.Fatalf("pulled %d", len(msgs))
	}
	handle := map[string]string{}
	for _, m := range msgs {
		handle[m.Body] = m.ReceiptHandle
	}
	nackedAt := time.Now()
	if r := c.nack("retry", "g", map[string]any{"receiptHandles": []string{handle["by-schedule"]}, "reason": "downstream 503"}); r.Nacked != 1 || len(r.Failed) != 0 {
		t.Fatalf("nack = %+v", r)
	}
	if r := c.nack("retry", "g", map[string]any{"receiptHandles": []string{handle["by-request"]}, "delaySeconds": 1}); r.Nacked != 1 {
		t.Fatalf("nack with delaySeconds = %+v", r)
	}
	if s := c.stats("retry", "g"); s.Retrying != 2 {
		t.Errorf("retrying %d after two nacks, want 2", s.Retrying)
	}
	first := c.pullWithin("retry", "g", 5*time.Second, nil)
	firstAt := time.Since(nackedAt)
	if len(first) != 1 || first[0].Body != "by-schedule" || first[0].DeliveryAttempt != 2 {
		t.Fatalf("first retry: %+v", first)
	}
	if firstAt < 300*time.Millisecond {
		t.Errorf("the subscription's 300ms retry came after %v", firstAt)
	}
	second := c.pullWithin("retry", "g", 5*time.Second, nil)
	if len(second) != 1 || second[0].Body != "by-request" || second[0].DeliveryAttempt != 2 {
		t.Fatalf("second retry: %+v", second)
	}
	if at := time.Since(nackedAt); at < time.Second {
		t.Errorf("the nack's delaySeconds 1 retry came after %v", at)
	}
	if a := c.ack("retry", "g", first[0].ReceiptHandle, second[0].ReceiptHandle); a.Acked != 2 {
		t.Errorf("ack of the retries = %+v", a)
	}
	if s := c.stats("retry", "g"); s.Retrying != 0 || s.Lag != 0 {
		t.Errorf("after acking the retries: retrying %d lag %d", s.Retrying, s.Lag)
	}
	wantProblem(t, c.do("POST", nackPath("retry", "g"), map[string]any{"receiptHandles": []string{"x"}, "delaySeconds": -1}), http.StatusBadRequest, "invalid_request")
	wantProblem(t, c.do("POST", nackPath("retry", "nosuch"), map[string]any{"receiptHandles": []string{"x"}}), http.StatusNotFound, "subscription_not_found")
}

func TestE2ELeaseExpiryAndExtend(t *testing.T) {
	t.Parallel()
	c := startServer(t, serverConfig{}).client(t)
	c.createTopic("lease", 1)
	subscribe(c, "lease", "g")
	c.send("lease", jsonMsg("lapses"))
	c.send("lease", jsonMsg("extended"))
	msgs := c.pull("lease", "g", map[string]any{"maxMessages": 2, "invisibleSeconds": 1})
	if len(msgs) != 2 {
		t.Fatalf("pulled %d", len(msgs))
	}
	lapses, extended := msgs[0], msgs[1]
	if lapses.Body != "lapses" {
		lapses, extended = extended, lapses
	}
	r := c.do("POST", subPath("lease", "g")+"/extend", map[string]any{"receiptHandles": []string{extended.ReceiptHandle}, "invisibleSeconds": 30})
	wantStatus(t, r, http.StatusOK)
	if ext := decode[struct{ Extended int }](t, r); ext.Extended != 1 {
		t.Fatalf("extend = %s", r.body)
	}
	again := c.pullWithin("lease", "g", 5*time.Second, nil)
	if len(again) != 1 || again[0].Body != "lapses" || again[0].DeliveryAttempt != 2 {
		t.Fatalf("after the 1 s lease got %+v, want only the unextended message with attempt 2", again)
	}
	a := c.ack("lease", "g", lapses.ReceiptHandle, extended.ReceiptHandle, again[0].ReceiptHandle)
	if a.Acked != 2 || len(a.Failed) != 1 || a.Failed[0].ReceiptHandle != lapses.ReceiptHandle || a.Failed[0].Code != "receipt_expired" {
		t.Errorf("ack = %+v, want the redelivered message's old handle receipt_expired and the other two acked", a)
	}
	if s := c.stats("lease", "g"); s.Lag != 0 || s.Inflight != 0 {
		t.Errorf("lag %d inflight %d after acking", s.Lag, s.Inflight)
	}
}

func TestE2EMaxRetriesDLQAndRedrive(t *testing.T) {
	t.Parallel()
	c := startServer(t, serverConfig{}).client(t)
	c.createTopic("dlq", 1)
	c.putSubscription("dlq", "g", map[string]any{"maxRetries": 1, "retryDelays": []string{"100ms"}}, http.StatusCreated)
	sent := c.send("dlq", map[string]any{"body": "poison", "tag": "TagA", "keys": []string{"order-1"}})
	c.send("dlq", jsonMsg("by-hand"))

	msgs := c.pull("dlq", "g", map[string]any{"maxMessages": 2})
	var poison, byHand pulledMessage
	for _, m := range msgs {
		if m.Body == "poison" {
			poison = m
		} else {
			byHand = m
		}
	}
	c.nack("dlq", "g", map[string]any{"receiptHandles": []string{poison.ReceiptHandle}, "reason": "parse error 1"})
	r := c.do("POST", subPath("dlq", "g")+"/deadletter", map[string]any{"receiptHandles": []string{byHand.ReceiptHandle}, "reason": "operator"})
	wantStatus(t, r, http.StatusOK)
	if d := decode[struct{ DeadLettered int }](t, r); d.DeadLettered != 1 {
		t.Fatalf("deadletter = %s", r.body)
	}
	retry := c.pullWithin("dlq", "g", 5*time.Second, nil)
	if len(retry) != 1 || retry[0].DeliveryAttempt != 2 {
		t.Fatalf("retry = %+v", retry)
	}
	// maxRetries 1: the second failed delivery is the last.
	c.nack("dlq", "g", map[string]any{"receiptHandles": []string{retry[0].ReceiptHandle}, "reason": "parse error 2"})
	if s := c.stats("dlq", "g"); s.Dlq != 2 || s.Retrying != 0 || s.Lag != 0 {
		t.Errorf("stats: dlq %d retrying %d lag %d, want 2 0 0", s.Dlq, s.Retrying, s.Lag)
	}

	r = c.do("GET", dlqPath("dlq", "g")+"?limit=1", nil)
	wantStatus(t, r, http.StatusOK)
	page := decode[dlqPage](t, r)
	if len(page.Messages) != 1 || page.Next == nil {
		t.Fatalf("first DLQ page %s, want one message and a next cursor", r.body)
	}
	r = c.do("GET", dlqPath("dlq", "g")+"?limit=1&cursor="+url.QueryEscape(*page.Next), nil)
	wantStatus(t, r, http.StatusOK)
	page2 := decode[dlqPage](t, r)
	if len(page2.Messages) != 1 || page2.Next != nil {
		t.Fatalf("second DLQ page %s, want one message and no next", r.body)
	}
	dead := map[string]deadMessage{}
	for _, m := range append(page.Messages, page2.Messages...) {
		dead[m.Body] = m
	}
	if p := dead["poison"]; p.MessageID != sent.MessageID || p.Reason != "parse error 2" || p.DeliveryAttempt != 2 || p.Tag != "TagA" || p.DeadAt == "" {
		t.Errorf("dead poison = %+v", p)
	}
	if p := dead["by-hand"]; p.Reason != "operator" || p.DeliveryAttempt != 1 {
		t.Errorf("dead by-hand = %+v", p)
	}
	wantProblem(t, c.do("GET", dlqPath("dlq", "g")+"?cursor=garbage", nil), http.StatusBadRequest, "invalid_request")

	redrive := func(body map[string]any, want int) {
		t.Helper()
		r := c.do("POST", dlqPath("dlq", "g")+":redrive", body)
		wantStatus(t, r, http.StatusOK)
		if rr := decode[redriveReply](t, r); rr.Redriven != want || rr.DryRun != (body["dryRun"] == true) {
			t.Fatalf("redrive %v = %s, want %d", body, r.body, want)
		}
	}
	redrive(map[string]any{"dryRun": true}, 2)
	redrive(map[string]any{"tag": "TagA", "dryRun": true}, 1)
	if s := c.stats("dlq", "g"); s.Dlq != 2 {
		t.Fatalf("dry runs moved messages: dlq %d", s.Dlq)
	}
	if again := c.pull("dlq", "g", nil); len(again) != 0 {
		t.Fatalf("after dry runs pulled %v", bodiesOf(again))
	}
	redrive(map[string]any{"messageIds": []string{sent.MessageID}}, 1)
	back := c.pull("dlq", "g", nil)
	if len(back) != 1 || back[0].MessageID != sent.MessageID || back[0].DeliveryAttempt != 1 {
		t.Fatalf("after redrive pulled %+v, want poison with attempt 1", back)
	}
	c.ack("dlq", "g", back[0].ReceiptHandle)
	redrive(map[string]any{}, 1)
	if back := c.pull("dlq", "g", nil); len(back) != 1 || back[0].Body != "by-hand" {
		t.Fatalf("after redriving all pulled %v", bodiesOf(back))
	}
	if s := c.stats("dlq", "g"); s.Dlq != 0 {
		t.Errorf("dlq %d after redriving everything", s.Dlq)
	}
}

func TestE2EDelayedSend(t *testing.T) {
	t.Parallel()
	c := startServer(t, serverConfig{}).client(t)
	c.createTopic("later", 2)
	subscribe(c, "later", "g")
	sentAt := time.Now()
	j := c.send("later", map[string]any{"body": "json", "delaySeconds": 1})
	raw := c.send("later", "raw", hdr{"Content-Type": "application/octet-stream", "X-Tidemq-Delay-Seconds": "1"})
	for _, r := range []sendReply{j, raw} {
		if r.Offset != nil || r.MessageID == "" {
			t.Errorf("delayed send reply %+v, want offset null", r)
		}
	}
	// The wire reply says null, not a missing field.
	r := c.do("POST", sendPath("later"), map[string]any{"body": "x", "delaySeconds": 1})
	wantStatus(t, r, http.StatusCreated)
	var rawReply map[string]json.RawMessage
	if err := json.Unmarshal(r.body, &rawReply); err != nil || string(rawReply["offset"]) != "null" {
		t.Errorf("delayed send reply %s, want \"offset\":null", r.body)
	}
	if got := c.pull("later", "g", nil); len(got) != 0 {
		t.Fatalf("before the delay ended pulled %v", bodiesOf(got))
	}
	if tp := c.getTopic("later"); tp.Messages != 0 {
		t.Errorf("topic shows %d messages before any is due", tp.Messages)
	}
	var got []pulledMessage
	deadline := time.Now().Add(5 * time.Second)
	for len(got) < 3 && time.Now().Before(deadline) {
		got = append(got, c.pull("later", "g", map[string]any{"waitSeconds": 1, "maxMessages": 10})...)
	}
	if want := []string{"json", "raw", "x"}; !slices.Equal(bodiesOf(got), want) {
		t.Fatalf("after the delay pulled %v, want %v", bodiesOf(got), want)
	}
	if at := time.Since(sentAt); at < time.Second {
		t.Errorf("delayed messages all came %v after the send, before their 1 s delay", at)
	}
	for _, m := range got {
		if m.MessageID == j.MessageID && m.QueueID != j.QueueID {
			t.Errorf("queue %d, send said %d", m.QueueID, j.QueueID)
		}
	}

	// deliverAt works too; both at once is a 400.
	at := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	inAnHour := c.send("later", map[string]any{"body": "in an hour", "deliverAt": at})
	if inAnHour.Offset != nil {
		t.Errorf("deliverAt send reply %+v, want offset null", inAnHour)
	}
	// While it waits, the message is found by id: no offset yet, when it
	// becomes due, and pending for the group.
	r = c.do("GET", topicPath("later")+"/messages/"+inAnHour.MessageID, nil)
	wantStatus(t, r, http.StatusOK)
	var status struct {
		Message       map[string]json.RawMessage `json:"message"`
		Subscriptions []struct {
			Group   string            `json:"group"`
			State   string            `json:"state"`
			History []json.RawMessage `json:"history"`
		} `json:"subscriptions"`
	}
	if err := json.Unmarshal(r.body, &status); err != nil {
		t.Fatal(err)
	}
	wantAt, _ := time.Parse(time.RFC3339, at)
	var gotAt time.Time
	if err := json.Unmarshal(status.Message["deliverAt"], &gotAt); err != nil || !gotAt.Equal(wantAt) {
		t.Errorf("delayed message's deliverAt %s, want %s (%v)", status.Message["deliverAt"], at, err)
	}
	if string(status.Message["offset"]) != "null" || string(status.Message["body"]) != `"in an hour"` {
		t.Errorf("delayed message %s, want offset null and its body", r.body)
	}
	if len(status.Subscriptions) != 1 || status.Subscriptions[0].State != "pending" || len(status.Subscriptions[0].History) != 0 {
		t.Errorf("delayed message's states %s, want pending for g with no history", r.body)
	}
	wantProblem(t, c.do("POST", sendPath("later"), map[string]any{"body": "x", "delaySeconds": 5, "deliverAt": at}), http.StatusBadRequest, "invalid_request")
	wantProblem(t, c.do("POST", sendPath("later"), "x", hdr{"Content-Type": "application/octet-stream", "X-Tidemq-Delay-Seconds": "5", "X-Tidemq-Deliver-At": at}), http.StatusBadRequest, "invalid_request")
	wantProblem(t, c.do("POST", sendPath("later"), map[string]any{"body": "x", "delaySeconds": 604801}), http.StatusBadRequest, "invalid_request")
}

func TestE2EIdempotencyKey(t *testing.T) {
	t.Parallel()
	c := startServer(t, serverConfig{}).client(t)
	c.createTopic("dedup", 4)
	first := c.send("dedup", jsonMsg("pay 1001"), hdr{"Idempotency-Key": "req-1"})
	again := c.send("dedup", jsonMsg("pay 1001"), hdr{"Idempotency-Key": "req-1"})
	if first.Duplicate || !again.Duplicate || again.MessageID != first.MessageID || *again.Offset != *first.Offset || again.QueueID != first.QueueID {
		t.Errorf("first %+v, repeat %+v: want the repeat to be the first's reply with duplicate:true", first, again)
	}
	raw := c.send("dedup", "pay 1001", hdr{"Content-Type": "application/octet-stream", "Idempotency-Key": "req-1"})
	if !raw.Duplicate || raw.MessageID != first.MessageID {
		t.Errorf("raw send with the same key: %+v", raw)
	}
	field := c.send("dedup", map[string]any{"body": "pay 1002", "dedupKey": "req-2"})
	if f2 := c.send("dedup", map[string]any{"body": "pay 1002", "dedupKey": "req-2"}); !f2.Duplicate || f2.MessageID != field.MessageID {
		t.Errorf("dedupKey field: %+v then %+v", field, f2)
	}
	if tp := c.getTopic("dedup"); tp.Messages != 2 {
		t.Errorf("topic holds %d messages, want 2", tp.Messages)
	}
}

func TestE2ESeek(t *testing.T) {
	t.Parallel()
	c := startServer(t, serverConfig{}).client(t)
	c.createTopic("seek", 3)
	subscribe(c, "seek", "g")
	var sent []sendReply
	for i := range 12 {
		sent = append(sent, c.send("seek", jsonMsg(fmt.Sprintf("m%02d", i))))
	}
	for msgs := c.pull("seek", "g", map[string]any{"maxMessages": 100}); len(msgs) > 0; msgs = c.pull("seek", "g", map[string]any{"maxMessages": 100}) {
		c.ack("seek", "g", handles(msgs)...)
	}
	// Seek to the store time of message 6: it and every later one (and any
	// stored in the same millisecond) come again.
	to := sent[6].StoredAt
	toTime, err := time.Parse(time.RFC3339, to)
	if err != nil {
		t.Fatal(err)
	}
	want := map[int]int64{}
	var wantBodies []string
	for i, s := range sent {
		st, _ := time.Parse(time.RFC3339, s.StoredAt)
		if !st.Before(toTime) {
			want[s.QueueID]++
			wantBodies = append(wantBodies, fmt.Sprintf("m%02d", i))
		}
	}
	seek := func(body map[string]any) seekReply {
		t.Helper()
		r := c.do("POST", subPath("seek", "g")+"/seek", body)
		wantStatus(t, r, http.StatusOK)
		return decode[seekReply](t, r)
	}
	dry := seek(map[string]any{"to": to, "dryRun": true})
	if !dry.DryRun || len(dry.Queues) != 3 || dry.Total != int64(len(wantBodies)) {
		t.Fatalf("dry run = %+v, want %d over 3 queues", dry, len(wantBodies))
	}
	for _, q := range dry.Queues {
		if q.Count != want[q.QueueID] {
			t.Errorf("dry run queue %d: %d, want %d", q.QueueID, q.Count, want[q.QueueID])
		}
	}
	if msgs := c.pull("seek", "g", nil); len(msgs) != 0 {
		t.Fatalf("a dry run moved the subscription: pulled %v", bodiesOf(msgs))
	}
	if real := seek(map[string]any{"to": to}); real.DryRun || real.Total != dry.Total {
		t.Fatalf("seek = %+v, want the dry run's total %d", real, dry.Total)
	}
	got := c.pull("seek", "g", map[string]any{"maxMessages": 100})
	if !slices.Equal(bodiesOf(got), wantBodies) {
		t.Fatalf("after seeking pulled %v, want %v", bodiesOf(got), wantBodies)
	}
	c.ack("seek", "g", handles(got)...)
	if s := seek(map[string]any{"to": "earliest", "dryRun": true}); s.Total != 12 {
		t.Errorf("dry run to earliest: %d, want 12", s.Total)
	}
	if s := seek(map[string]any{"to": "latest"}); s.Total != 0 {
		t.Errorf("seek to latest: %d, want 0", s.Total)
	}
	wantProblem(t, c.do("POST", subPath("seek", "g")+"/seek", map[string]any{"to": "yesterday"}), http.StatusBadRequest, "invalid_request")
}

func TestE2EMessageQuery(t *testing.T) {
	t.Parallel()
	c := startServer(t, serverConfig{}).client(t)
	c.createTopic("q", 2)
	c.putSubscription("q", "g", map[string]any{"retryDelays": []string{"50ms"}}, http.StatusCreated)
	c.putSubscription("q", "other", map[string]any{"filter": "TagZ"}, http.StatusCreated)
	var ids []string
	for i := range 5 {
		ids = append(ids, c.send("q", map[string]any{"body": fmt.Sprintf("k%d", i), "keys": []string{"order-7"}, "tag": "TagA"}).MessageID)
	}
	c.send("q", map[string]any{"body": "other key", "keys": []string{"order-8"}})

	// History: nacked once, then acked.
	var target pulledMessage
	for _, m := range c.pull("q", "g", map[string]any{"maxMessages": 10, "consumerId": "worker-1"}) {
		if m.MessageID == ids[0] {
			target = m
		} else {
			c.ack("q", "g", m.ReceiptHandle)
		}
	}
	c.nack("q", "g", map[string]any{"receiptHandles": []string{target.ReceiptHandle}, "reason": "db locked"})
	retry := c.pullWithin("q", "g", 5*time.Second, map[string]any{"consumerId": "worker-2"})
	c.ack("q", "g", retry[0].ReceiptHandle)

	r := c.do("GET", topicPath("q")+"/messages/"+ids[0], nil)
	wantStatus(t, r, http.StatusOK)
	st := decode[messageStatus](t, r)
	if st.Message.MessageID != ids[0] || st.Message.Body != "k0" || !slices.Equal(st.Message.Keys, []string{"order-7"}) {
		t.Errorf("message = %+v", st.Message)
	}
	if len(st.Subscriptions) != 2 {
		t.Fatalf("subscriptions %s", r.body)
	}
	g, other := st.Subscriptions[0], st.Subscriptions[1]
	if g.Group != "g" || g.State != "acked" || g.DeliveryAttempt != 2 || g.LastReason != "db locked" || len(g.History) != 2 {
		t.Fatalf("group g = %+v", g)
	}
	h1, h2 := g.History[0], g.History[1]
	if h1.Attempt != 1 || h1.ConsumerID != "worker-1" || h1.Outcome != "nack" || h1.Reason != "db locked" || h1.SettledAt == nil {
		t.Errorf("history[0] = %+v", h1)
	}
	if h2.Attempt != 2 || h2.ConsumerID != "worker-2" || h2.Outcome != "ack" || h2.SettledAt == nil {
		t.Errorf("history[1] = %+v", h2)
	}
	if other.Group != "other" || other.State != "filtered" || len(other.History) != 0 {
		t.Errorf("group other = %+v", other)
	}
	wantProblem(t, c.do("GET", topicPath("q")+"/messages/nosuchid", nil), http.StatusNotFound, "message_not_found")

	// By key, two a page, until next is null.
	var found []string
	path := topicPath("q") + "/messages?key=order-7&limit=2"
	for page := 0; ; page++ {
		if page > 10 {
			t.Fatal("paging never ends")
		}
		r := c.do("GET", path, nil)
		wantStatus(t, r, http.StatusOK)
		p := decode[queryPage](t, r)
		if len(p.Messages) > 2 {
			t.Fatalf("page of %d with limit 2", len(p.Messages))
		}
		for _, m := range p.Messages {
			found = append(found, m.MessageID)
		}
		if p.Next == nil {
			break
		}
		path = topicPath("q") + "/messages?key=order-7&limit=2&cursor=" + url.QueryEscape(*p.Next)
	}
	slices.Sort(found)
	wantIDs := slices.Clone(ids)
	slices.Sort(wantIDs)
	if !slices.Equal(found, wantIDs) {
		t.Errorf("paging by key found %v, want each of %v once", found, wantIDs)
	}
	r = c.do("GET", topicPath("q")+"/messages?tag=TagA&limit=100", nil)
	wantStatus(t, r, http.StatusOK)
	if p := decode[queryPage](t, r); len(p.Messages) != 5 || p.Next != nil {
		t.Errorf("by tag: %d messages, next %v", len(p.Messages), p.Next)
	}
	wantProblem(t, c.do("GET", topicPath("q")+"/messages?limit=5000&key=x", nil), http.StatusBadRequest, "invalid_request")
}

func TestE2EOrderlyAndBroadcast(t *testing.T) {
	t.Parallel()
	c := startServer(t, serverConfig{}).client(t)
	c.createTopic("ob", 2)
	c.putSubscription("ob", "ordered", map[string]any{"orderly": true}, http.StatusCreated)
	c.putSubscription("ob", "fanout", map[string]any{"mode": "broadcast"}, http.StatusCreated)
	for i := range 3 {
		c.send("ob", map[string]any{"body": fmt.Sprintf("a%d", i), "shardingKey": "a"})
	}
	// A pull carries the key's consecutive messages, in order; while they
	// are leased no other pull gets the key.
	first := c.pull("ob", "ordered", map[string]any{"maxMessages": 10})
	if got := orderOf(first); !slices.Equal(got, []string{"a0", "a1", "a2"}) {
		t.Fatalf("orderly pull = %v, want [a0 a1 a2] in order", got)
	}
	if more := c.pull("ob", "ordered", nil); len(more) != 0 {
		t.Fatalf("a message of the key came while its messages are leased: %v", bodiesOf(more))
	}
	// A nack of a1 revokes a2's lease; a0 is unaffected.
	r := c.do("POST", subPath("ob", "ordered")+"/nack", map[string]any{"receiptHandles": []string{first[1].ReceiptHandle}, "delaySeconds": 0})
	wantStatus(t, r, http.StatusOK)
	if a := c.ack("ob", "ordered", first[2].ReceiptHandle); a.Acked != 0 || len(a.Failed) != 1 || a.Failed[0].Code != "receipt_expired" {
		t.Fatalf("ack of a2 after a1's nack = %+v, want receipt_expired", a)
	}
	if a := c.ack("ob", "ordered", first[0].ReceiptHandle); a.Acked != 1 {
		t.Fatalf("ack of a0 = %+v", a)
	}
	again := c.pull("ob", "ordered", map[string]any{"maxMessages": 10})
	if got := orderOf(again); !slices.Equal(got, []string{"a1", "a2"}) || again[0].DeliveryAttempt != 2 || again[1].DeliveryAttempt != 1 {
		t.Fatalf("after the nack pull = %v, want a1 (attempt 2) then a2 (attempt 1)", got)
	}
	c.ack("ob", "ordered", handles(again)...)

	wantProblem(t, c.do("POST", pullPath("ob", "fanout"), map[string]any{}), http.StatusBadRequest, "invalid_request")
	for _, consumer := range []string{"c1", "c2"} {
		got := c.pull("ob", "fanout", map[string]any{"consumerId": consumer, "maxMessages": 10})
		if want := []string{"a0", "a1", "a2"}; !slices.Equal(bodiesOf(got), want) {
			t.Errorf("broadcast consumer %s got %v, want %v", consumer, bodiesOf(got), want)
		}
		c.ack("ob", "fanout", handles(got)...)
	}
	var sub struct{ Consumers []struct{ ConsumerID string } }
	r = c.do("GET", subPath("ob", "fanout"), nil)
	wantStatus(t, r, http.StatusOK)
	if err := json.Unmarshal(r.body, &sub); err != nil || len(sub.Consumers) != 2 {
		t.Errorf("broadcast consumers %s", r.body)
	}
}

func TestE2EPushSubscription(t *testing.T) {
	t.Parallel()
	ts := startServer(t, serverConfig{})
	c := ts.client(t)
	var (
		mu       sync.Mutex
		received []pulledMessage
	)
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var m pulledMessage
		body, _ := io.ReadAll(r.Body)
		if err := json.Unmarshal(body, &m); err != nil {
			t.Errorf("push body %q: %v", body, err)
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		mu.Lock()
		received = append(received, m)
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(receiver.Close)
	pusher, err := webhook.NewPusher(ts.b, webhook.PusherOptions{Logger: slog.New(slog.DiscardHandler), Reconcile: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := pusher.Close(); err != nil {
			t.Errorf("pusher Close: %v", err)
		}
	})
	c.createTopic("push", 2)
	c.putSubscription("push", "hook", map[string]any{"push": map[string]any{"endpoint": receiver.URL, "maxInFlight": 4}}, http.StatusCreated)
	for i := range 5 {
		c.send("push", jsonMsg(fmt.Sprintf("p%d", i)))
	}
	eventually(t, 10*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(received) < 5 {
			return fmt.Errorf("the receiver got %d of 5 messages", len(received))
		}
		return nil
	})
	mu.Lock()
	got := slices.Clone(received)
	mu.Unlock()
	if want := []string{"p0", "p1", "p2", "p3", "p4"}; !slices.Equal(bodiesOf(got), want) {
		t.Errorf("pushed %v, want %v", bodiesOf(got), want)
	}
	for _, m := range got {
		if m.MessageID == "" || m.DeliveryAttempt != 1 {
			t.Errorf("pushed message %+v, want the pulled-message JSON with attempt 1", m)
		}
	}
	// 2xx acks: nothing left to deliver.
	eventually(t, 5*time.Second, func() error {
		if s := c.stats("push", "hook"); s.Lag != 0 || s.Inflight != 0 {
			return fmt.Errorf("lag %d inflight %d", s.Lag, s.Inflight)
		}
		return nil
	})
	if s := c.stats("push", "hook"); s.Push == nil || s.Push.Endpoint != receiver.URL || s.Push.State != "closed" {
		t.Errorf("push block in stats: %+v", s.Push)
	}
	wantProblem(t, c.do("POST", pullPath("push", "hook"), map[string]any{}), http.StatusConflict, "subscription_mode_conflict")
}

// startMeteredServer starts a server whose /metrics serves the broker's
// and the gateway's metrics through the meter provider the broker process
// uses (internal/promexport).
func startMeteredServer(t *testing.T) *testServer {
	t.Helper()
	reg := prometheus.NewRegistry()
	mp, err := promexport.MeterProvider(func(string) string { return "" }, reg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := mp.Shutdown(context.Background()); err != nil {
			t.Errorf("meter provider Shutdown: %v", err)
		}
	})
	return startServer(t, serverConfig{
		core:    core.Options{MeterProvider: mp},
		gateway: gateway.Options{MeterProvider: mp, Metrics: promhttp.HandlerFor(reg, promhttp.HandlerOpts{})},
	})
}

func TestE2EMetricsFollowLag(t *testing.T) {
	t.Parallel()
	c := startMeteredServer(t).client(t)
	c.createTopic("metered", 2)
	subscribe(c, "metered", "g")

	sample := regexp.MustCompile(`^tidemq_subscription_lag\{([^}]*)\} (\S+)$`)
	lag := func() float64 {
		t.Helper()
		r := c.do("GET", "/metrics", nil)
		wantStatus(t, r, http.StatusOK)
		for line := range strings.SplitSeq(string(r.body), "\n") {
			m := sample.FindStringSubmatch(line)
			if m == nil || !strings.Contains(m[1], `topic="metered"`) || !strings.Contains(m[1], `group="g"`) {
				continue
			}
			v, err := strconv.ParseFloat(m[2], 64)
			if err != nil {
				t.Fatalf("sample %q: %v", line, err)
			}
			return v
		}
		t.Fatalf("no tidemq_subscription_lag sample for metered/g in:\n%s", truncate(r.body, 4000))
		return 0
	}
	if v := lag(); v != 0 {
		t.Errorf("lag %v before any send", v)
	}
	for i := range 4 {
		c.send("metered", jsonMsg(fmt.Sprint(i)))
	}
	if v := lag(); v != 4 {
		t.Errorf("lag %v after 4 sends, want 4", v)
	}
	msgs := c.pull("metered", "g", map[string]any{"maxMessages": 3})
	c.ack("metered", "g", handles(msgs)...)
	if v := lag(); v != 1 {
		t.Errorf("lag %v after acking 3, want 1", v)
	}
	c.ack("metered", "g", handles(c.pull("metered", "g", nil))...)
	if v := lag(); v != 0 {
		t.Errorf("lag %v after acking everything, want 0", v)
	}
}

// orderOf returns the bodies in the order pulled.
func orderOf(msgs []pulledMessage) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = m.Body
	}
	return out
}
