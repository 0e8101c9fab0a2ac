package core_test

import (
	"errors"
	"sync"
	"testing"

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
	if n := p.set(false); n != 1 {
		t.Fatalf("%d commits proposed by the start, want 1 (the epoch)", n)
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
