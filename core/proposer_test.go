package core_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tidemq/tidemq/core"
	"github.com/tidemq/tidemq/pebblestore"
)

// gateProposer commits through the local proposer, counting commits, or
// refuses every batch while failing is set.
type gateProposer struct {
	mu      sync.Mutex
	failing bool
	commits int
}

var errRefused = errors.New("proposal refused")

func (p *gateProposer) Propose(b core.Batch, alone bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.failing {
		return errRefused
	}
	if err := core.LocalProposer(true).Propose(b, alone); err != nil {
		return err
	}
	p.commits++
	return nil
}

func (p *gateProposer) set(failing bool) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.failing = failing
	return p.commits
}

// Every commit goes through Options.Proposer, the start's epoch first; a
// refused proposal fails the send and stores nothing of it.
func TestCommitsGoThroughTheProposer(t *testing.T) {
	p := &gateProposer{}
	e := newEnv(t, core.Options{Proposer: p})
	// The epoch's (its loops may have committed since: the timer loop's
	// first clean-up).
	if n := p.set(false); n < 1 {
		t.Fatalf("%d commits proposed by the start, want the epoch's at least", n)
	}
	e.putTopic("orders", 1)
	e.send("orders", "one")
	before := p.set(true)
	if before < 3 {
		t.Fatalf("%d commits proposed after a topic and a send, want at least 3", before)
	}
	if _, err := e.b.Send(t.Context(), "orders", []*core.Message{{Body: []byte("refused")}}); err == nil {
		t.Fatal("a send whose proposal was refused succeeded")
	}
	p.set(false)
	res := e.send("orders", "two")
	if res[0].Offset != 1 {
		t.Errorf("the send after a refused one got offset %d, want 1", res[0].Offset)
	}
	if n := e.topicInfo("orders").Messages; n != 2 {
		t.Errorf("topic holds %d messages, want 2", n)
	}
}

// A broker whose epoch cannot be made durable does not start.
func TestRefusedEpochFailsTheStart(t *testing.T) {
	store, err := pebblestore.Open("db", pebblestore.Options{FS: vfs.NewMem(), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := store.Close(); err != nil {
			t.Errorf("store Close: %v", err)
		}
	})
	b, err := core.New(store, core.Options{Logger: quiet, Proposer: &gateProposer{failing: true}})
	if err == nil {
		_ = b.Close()
		t.Fatal("core.New succeeded with a proposer that refuses every batch")
	}
	if !errors.Is(err, errRefused) {
		t.Errorf("core.New: %v, want the proposer's error", err)
	}
}

// A settlement whose batch is refused changes nothing in memory: the
// deliveries stay leased under the same handles, nothing is counted as
// dead or retrying, and settling them again works and lasts.
func TestRefusedSettlementLeavesMemoryAsStored(t *testing.T) {
	p := &gateProposer{}
	clk := newClock()
	e := newEnv(t, core.Options{Proposer: p, Now: clk.Now})
	e.putTopic("t", 1)
	e.subscribe("t", "g", core.SubscriptionConfig{})
	e.send("t", "a", "b", "c")
	got := e.pull("t", "g", core.PullRequest{MaxMessages: 3, Invisible: 10 * time.Second})
	if len(got) != 3 {
		t.Fatalf("pulled %d, want 3", len(got))
	}
	h := handles(got)
	ctx := t.Context()
	p.set(true)
	if _, _, err := e.b.Ack(ctx, "t", "g", h[:1]); err == nil {
		t.Fatal("an ack whose batch was refused succeeded")
	}
	if _, _, err := e.b.Nack(ctx, "t", "g", h[1:2], time.Second, "x"); err == nil {
		t.Fatal("a nack whose batch was refused succeeded")
	}
	if _, _, err := e.b.DeadLetter(ctx, "t", "g", h[2:], "x"); err == nil {
		t.Fatal("a dead-letter whose batch was refused succeeded")
	}
	p.set(false)
	info := e.subInfo("t", "g")
	if info.Inflight != 3 || info.DLQ != 0 || info.Retrying != 0 || info.Queues[0].AckedOffset != 0 {
		t.Fatalf("after refused settlements: inflight %d, dlq %d, retrying %d, acked %d; want 3, 0, 0, 0",
			info.Inflight, info.DLQ, info.Retrying, info.Queues[0].AckedOffset)
	}
	// The same handles settle now, and what they did survives a restart.
	if n, failed := e.ack("t", "g", h[0]); n != 1 || len(failed) > 0 {
		t.Fatalf("ack again: %d, %v", n, failed)
	}
	if n, failed, err := e.b.DeadLetter(ctx, "t", "g", h[2:], "x"); err != nil || n != 1 || len(failed) > 0 {
		t.Fatalf("dead-letter again: %d, %v, %v", n, failed, err)
	}
	e.restart()
	clk.Advance(time.Minute)
	again := e.pull("t", "g", core.PullRequest{MaxMessages: 10})
	if len(again) != 1 || string(again[0].Message.Body) != "b" {
		t.Fatalf("after the restart only b (never settled) comes back, got %v", bodies(again))
	}
	if info := e.subInfo("t", "g"); info.DLQ != 1 {
		t.Fatalf("dlq %d after restart, want 1", info.DLQ)
	}
}
