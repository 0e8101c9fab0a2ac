package core_test

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/tidemq/tidemq/core"
)

// Broadcast subscriptions (SPEC §2): every consumer gets every matching
// message, with its own position, acks and retries.

func TestBroadcastEveryConsumerGetsEveryMessage(t *testing.T) {
	clk := newClock()
	e := newEnv(t, core.Options{Now: clk.Now})
	e.putTopic("config", 3)
	e.subscribe("config", "caches", core.SubscriptionConfig{Mode: core.ModeBroadcast, RetryDelays: []time.Duration{5 * time.Second}})
	all := numbered("v", 9)
	e.send("config", all...)

	c1 := e.drain("config", "caches", core.PullRequest{ConsumerID: "c1", MaxMessages: 4})
	c2 := e.drain("config", "caches", core.PullRequest{ConsumerID: "c2", MaxMessages: 4})
	if !slices.Equal(bodies(c1), all) || !slices.Equal(bodies(c2), all) {
		t.Fatalf("c1 got %v, c2 got %v; each wants all of %v", bodies(c1), bodies(c2), all)
	}
	// Handles are per consumer: c2's handle does not settle c1's lease.
	if n, failed := e.ack("config", "caches", c2[0].ReceiptHandle); n != 1 || len(failed) != 0 {
		t.Fatalf("c2 acking its own handle: %d %v", n, failed)
	}
	// c1 nacks v0003, c2 acks it: only c1 gets it again.
	var c1v3, c2v3 core.Delivered
	for i := range c1 {
		if string(c1[i].Message.Body) == "v0003" {
			c1v3 = c1[i]
		}
		if string(c2[i].Message.Body) == "v0003" {
			c2v3 = c2[i]
		}
	}
	e.nack("config", "caches", c1v3, -1, "c1 could not apply it")
	var c1rest, c2rest []core.Delivered
	for i := range c1 {
		if c1[i].ReceiptHandle != c1v3.ReceiptHandle {
			c1rest = append(c1rest, c1[i])
		}
		if c2[i].ReceiptHandle != c2[0].ReceiptHandle {
			c2rest = append(c2rest, c2[i])
		}
	}
	e.ackAll("config", "caches", c1rest)
	e.ackAll("config", "caches", c2rest)
	// c1's retry is stored and not acked yet: lag.
	if info := e.subInfo("config", "caches"); info.Retrying != 1 || info.Lag != 1 {
		t.Errorf("retrying=%d lag=%d, want 1 and 1 (c1's retry)", info.Retrying, info.Lag)
	}
	e.advanceTimers(clk, 5*time.Second)
	e.pullNone("config", "caches", core.PullRequest{ConsumerID: "c2"}, "c2 acked v0003")
	again := e.pullOne("config", "caches", core.PullRequest{ConsumerID: "c1"})
	if string(again.Message.Body) != "v0003" || again.Attempt != 2 || again.Message.ID != c2v3.Message.ID {
		t.Fatalf("c1's retry: %s attempt %d, want v0003 attempt 2", again.Message.Body, again.Attempt)
	}
	e.ackAll("config", "caches", []core.Delivered{again})

	// A new message goes to both again; each acks independently.
	e.send("config", "v0009")
	for _, c := range []string{"c1", "c2"} {
		d := e.pullOne("config", "caches", core.PullRequest{ConsumerID: c})
		if string(d.Message.Body) != "v0009" || d.Attempt != 1 {
			t.Errorf("%s got %s attempt %d, want v0009", c, d.Message.Body, d.Attempt)
		}
		e.ackAll("config", "caches", []core.Delivered{d})
	}
	// Positions are durable per consumer.
	e.restart()
	for _, c := range []string{"c1", "c2"} {
		e.pullNone("config", "caches", core.PullRequest{ConsumerID: c}, c+" after restart")
	}
}

// Each consumer's lease runs on its own: one consumer's lost lease is that
// consumer's failed attempt only.
func TestBroadcastLeasesArePerConsumer(t *testing.T) {
	clk := newClock()
	e := newEnv(t, core.Options{Now: clk.Now})
	e.putTopic("config", 1)
	e.subscribe("config", "caches", core.SubscriptionConfig{Mode: core.ModeBroadcast})
	e.send("config", "x")
	slow := e.pullOne("config", "caches", core.PullRequest{ConsumerID: "slow", Invisible: 5 * time.Second})
	fast := e.pullOne("config", "caches", core.PullRequest{ConsumerID: "fast", Invisible: 5 * time.Second})
	e.ackAll("config", "caches", []core.Delivered{fast})
	clk.Advance(5 * time.Second)
	e.pullNone("config", "caches", core.PullRequest{ConsumerID: "fast"}, "fast acked in time")
	d := e.pullOne("config", "caches", core.PullRequest{ConsumerID: "slow"})
	if d.Attempt != 2 || d.Message.ID != slow.Message.ID {
		t.Errorf("slow's redelivery: attempt %d", d.Attempt)
	}
}

func TestBroadcastPullNeedsConsumerID(t *testing.T) {
	e := newEnv(t, core.Options{})
	e.putTopic("config", 1)
	e.subscribe("config", "caches", core.SubscriptionConfig{Mode: core.ModeBroadcast})
	e.send("config", "x")
	_, err := e.b.Pull(t.Context(), "config", "caches", core.PullRequest{ClientAddr: "127.0.0.1:5000"})
	wantValidation(t, err, "/consumerId", -1)
	// Nothing was leased by the refused pull.
	if d := e.pullOne("config", "caches", core.PullRequest{ConsumerID: "c1"}); d.Attempt != 1 {
		t.Errorf("attempt %d after a refused pull", d.Attempt)
	}
}

// A consumer that joins later starts from the subscription's startFrom.
func TestBroadcastNewConsumerStartsFromStartFrom(t *testing.T) {
	clk := newClock()
	e := newEnv(t, core.Options{Now: clk.Now})
	e.putTopic("config", 2)
	e.subscribe("config", "earliest", core.SubscriptionConfig{Mode: core.ModeBroadcast})
	e.subscribe("config", "latest", core.SubscriptionConfig{Mode: core.ModeBroadcast, StartFrom: "latest"})
	e.send("config", "a", "b", "c")
	clk.Advance(time.Minute)
	e.subscribe("config", "since", core.SubscriptionConfig{Mode: core.ModeBroadcast, StartFrom: clk.Now().Format(time.RFC3339Nano)})
	e.send("config", "d")
	for _, g := range []string{"earliest", "latest", "since"} {
		e.ackAll("config", g, e.drain("config", g, core.PullRequest{ConsumerID: "c1"}))
	}
	clk.Advance(time.Minute)
	e.send("config", "e")
	for _, tc := range []struct {
		group string
		want  []string
	}{
		// startFrom is resolved when the consumer joins: earliest is every
		// retained message, latest is what comes after its first pull.
		{"earliest", []string{"a", "b", "c", "d", "e"}},
		{"latest", nil},
		{"since", []string{"d", "e"}},
	} {
		got := e.drain("config", tc.group, core.PullRequest{ConsumerID: "c3"})
		if !slices.Equal(bodies(got), tc.want) {
			t.Errorf("%s: the late consumer c3 got %v, want %v", tc.group, bodies(got), tc.want)
		}
		e.ackAll("config", tc.group, got)
	}
	e.send("config", "f")
	if got := e.drain("config", "latest", core.PullRequest{ConsumerID: "c3"}); !slices.Equal(bodies(got), []string{"f"}) {
		t.Errorf("latest: c3 got %v after joining, want [f]", bodies(got))
	}
}

func TestBroadcastConsumersInStatsExpire(t *testing.T) {
	clk := newClock()
	e := newEnv(t, core.Options{Now: clk.Now, ConsumerExpiry: time.Minute})
	e.putTopic("config", 1)
	e.subscribe("config", "caches", core.SubscriptionConfig{Mode: core.ModeBroadcast})
	e.send("config", "x", "y")
	e.ackAll("config", "caches", e.drain("config", "caches", core.PullRequest{ConsumerID: "c1"}))
	e.pullOne("config", "caches", core.PullRequest{ConsumerID: "c2", MaxMessages: 1})
	ids := func() []string {
		var out []string
		for _, c := range e.subInfo("config", "caches").Consumers {
			out = append(out, c.ConsumerID)
		}
		return out
	}
	if got := ids(); !slices.Equal(got, []string{"c1", "c2"}) {
		t.Fatalf("consumers %v, want [c1 c2]", got)
	}
	// Broadcast stats are the slowest consumer's: c2 has a message leased
	// and one it has not taken (lag 2), c1 none.
	if info := e.subInfo("config", "caches"); info.Lag != 2 || info.Inflight != 1 {
		t.Errorf("lag=%d inflight=%d, want c2's 2 and 1", info.Lag, info.Inflight)
	}
	clk.Advance(40 * time.Second)
	e.pull("config", "caches", core.PullRequest{ConsumerID: "c1"})
	clk.Advance(40 * time.Second) // c2 last seen 80 s ago, c1 40 s ago
	if got := ids(); !slices.Equal(got, []string{"c1"}) {
		t.Errorf("consumers %v after c2 was silent past ConsumerExpiry, want [c1]", got)
	}
	clk.Advance(time.Minute)
	if got := ids(); len(got) != 0 {
		t.Errorf("consumers %v after everyone was silent past ConsumerExpiry, want none", got)
	}
	// A consumer coming back shows again, with its own position.
	if d := e.pullOne("config", "caches", core.PullRequest{ConsumerID: "c2", MaxMessages: 1}); string(d.Message.Body) != "x" || d.Attempt != 2 {
		t.Errorf("c2 back: got %s attempt %d, want its lapsed lease of x again, attempt 2", d.Message.Body, d.Attempt)
	}
	if got := ids(); !slices.Equal(got, []string{"c2"}) {
		t.Errorf("consumers %v after c2 pulled again, want [c2]", got)
	}
}

// Filter expressions are checked when a subscription is put.
func TestPutSubscriptionRejectsInvalidFilter(t *testing.T) {
	e := newEnv(t, core.Options{})
	e.putTopic("orders", 1)
	for _, f := range []string{"TagA ||", "|| TagB", "TagA | TagB", "TagA TagB", "TagA || * ", "TagA || || TagB"} {
		_, _, err := e.b.PutSubscription(t.Context(), "orders", "g", core.SubscriptionConfig{Filter: f})
		if !errors.Is(err, core.ErrInvalidFilter) {
			t.Errorf("filter %q: err = %v, want ErrInvalidFilter", f, err)
		}
	}
	if _, err := e.b.GetSubscription("orders", "g"); !errors.Is(err, core.ErrSubscriptionNotFound) {
		t.Errorf("a refused subscription exists: %v", err)
	}
	// And on update, leaving the old filter in force.
	e.subscribe("orders", "g", core.SubscriptionConfig{Filter: "TagA || TagB"})
	if _, _, err := e.b.PutSubscription(t.Context(), "orders", "g", core.SubscriptionConfig{Filter: "TagA ||| TagB"}); !errors.Is(err, core.ErrInvalidFilter) {
		t.Errorf("update with a bad filter: %v, want ErrInvalidFilter", err)
	}
	if f := e.subInfo("orders", "g").Config.Filter; f != "TagA || TagB" {
		t.Errorf("filter after a refused update: %q", f)
	}
}
