package cluster_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidemq/tidemq/core"
)

// nodeChecker answers checks for one node: unknown until decide is set,
// then commit; it counts the checks each node made.
type nodeChecker struct {
	id     string
	decide *atomic.Bool
	mu     *sync.Mutex
	asked  map[string]int // node id → checks
}

func (c nodeChecker) CheckTransaction(context.Context, string, core.TransactionCheck) (string, error) {
	c.mu.Lock()
	c.asked[c.id]++
	c.mu.Unlock()
	if c.decide.Load() {
		return core.CheckCommit, nil
	}
	return core.CheckUnknown, nil
}

// Half messages survive the loss of the leader that stored them: on the
// new leader none is delivered early, a commit by request delivers its
// message once, and the check-back of the other runs there (and nowhere
// else) and commits it once.
func TestHalfMessagesSurviveLeaderLoss(t *testing.T) {
	var decide atomic.Bool
	var mu sync.Mutex
	asked := map[string]int{}
	nodes := startGroupWith(t, 3, groupOptions{checker: func(id string) core.TransactionChecker {
		return nodeChecker{id: id, decide: &decide, mu: &mu, asked: asked}
	}})
	old := leaderAmong(t, nodes...)
	ctx := t.Context()
	url := "http://producer.invalid/check"
	if _, _, err := old.c.Broker().PutTopic(ctx, "t", core.TopicConfig{Queues: 2, TransactionCheckURL: &url}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := old.c.Broker().PutSubscription(ctx, "t", "g", core.SubscriptionConfig{}); err != nil {
		t.Fatal(err)
	}
	_, byRequest, err := old.c.Broker().SendTransaction(ctx, "t", []*core.Message{{Body: []byte("by-request")}}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	_, byCheck, err := old.c.Broker().SendTransaction(ctx, "t", []*core.Message{{Body: []byte("by-check")}}, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	waitConverged(t, nodes)
	old.stop(t, nodes)
	mu.Lock()
	oldChecks := asked[old.id]
	mu.Unlock()

	var rest []*testNode
	for _, nd := range nodes {
		if nd != old {
			rest = append(rest, nd)
		}
	}
	next := leaderAmong(t, rest...)
	b := next.c.Broker()
	if info, err := b.GetTopic("t"); err != nil || info.HalfMessages != 2 || info.Messages != 0 {
		t.Fatalf("on the new leader: %+v, %v; want 2 half messages and no message", info, err)
	}
	if got, err := b.Pull(ctx, "t", "g", core.PullRequest{MaxMessages: 10}); err != nil || len(got) != 0 {
		t.Fatalf("new leader delivered %d half messages (%v)", len(got), err)
	}
	if _, err := b.CommitTransaction(ctx, "t", byRequest); err != nil {
		t.Fatal(err)
	}
	decide.Store(true)
	delivered := map[string]int{}
	deadline := time.Now().Add(20 * time.Second)
	for (delivered["by-request"] == 0 || delivered["by-check"] == 0) && time.Now().Before(deadline) {
		got, err := b.Pull(ctx, "t", "g", core.PullRequest{MaxMessages: 10, Wait: 500 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		var hs []string
		for _, d := range got {
			delivered[string(d.Message.Body)]++
			hs = append(hs, d.ReceiptHandle)
		}
		if len(hs) > 0 {
			if _, _, err := b.Ack(ctx, "t", "g", hs); err != nil {
				t.Fatal(err)
			}
		}
	}
	if got, _ := b.Pull(ctx, "t", "g", core.PullRequest{MaxMessages: 10, Wait: 500 * time.Millisecond}); len(got) != 0 {
		t.Errorf("delivered again: %d messages", len(got))
	}
	if delivered["by-request"] != 1 || delivered["by-check"] != 1 || len(delivered) != 2 {
		t.Fatalf("delivered %v, want each committed half message once", delivered)
	}
	tx, err := b.CommitTransaction(ctx, "t", byCheck)
	if err != nil || tx.DecidedBy != core.DecidedByCheck {
		t.Fatalf("the check's transaction: %+v, %v", tx, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if asked[old.id] != oldChecks {
		t.Errorf("the stopped old leader checked %d more times", asked[old.id]-oldChecks)
	}
	for _, nd := range rest {
		if nd != next && asked[nd.id] != 0 {
			t.Errorf("follower %s checked %d times", nd.id, asked[nd.id])
		}
	}
	if asked[next.id] == 0 {
		t.Errorf("the new leader never checked: %v", asked)
	}
}
