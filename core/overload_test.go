package core_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tidemq/tidemq/core"
	"github.com/tidemq/tidemq/pebblestore"
)

// gatedStore is a real Pebble store whose commits wait while the test
// holds its gate, so a test can stall the appender and fill its queue.
type gatedStore struct {
	*pebblestore.Store
	gate *sync.RWMutex
}

func (g gatedStore) NewBatch() core.Batch { return gatedBatch{g.Store.NewBatch(), g.gate} }

type gatedBatch struct {
	core.Batch
	gate *sync.RWMutex
}

func (b gatedBatch) Commit(sync, alone bool) error {
	b.gate.RLock()
	defer b.gate.RUnlock()
	return b.Batch.Commit(sync, alone)
}

func overloadBroker(t *testing.T, opts core.Options) (*core.Broker, *sync.RWMutex) {
	t.Helper()
	inner, err := pebblestore.Open("db", pebblestore.Options{FS: vfs.NewMem()})
	if err != nil {
		t.Fatal(err)
	}
	gate := &sync.RWMutex{}
	opts.AutoCreate = true
	b, err := core.New(gatedStore{inner, gate}, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Error(err)
		}
		if err := inner.Close(); err != nil {
			t.Error(err)
		}
	})
	return b, gate
}

func TestSendsBeyondTheQueueBoundAreRefused(t *testing.T) {
	b, gate := overloadBroker(t, core.Options{MaxQueuedBytes: 64 << 10})
	ctx := context.Background()
	if _, _, err := b.PutTopic(ctx, "t", core.TopicConfig{}); err != nil {
		t.Fatal(err)
	}
	body := make([]byte, 40<<10)
	send := func() error {
		_, err := b.Send(ctx, "t", []*core.Message{{Body: body}})
		return err
	}
	gate.Lock() // the appender stalls in its next commit
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	refused := false
	deadline := time.Now().Add(5 * time.Second)
	for !refused && time.Now().Before(deadline) {
		wg.Add(1)
		done := make(chan error, 1)
		go func() {
			defer wg.Done()
			err := send()
			done <- err
			errs <- err
		}()
		select {
		case err := <-done:
			if errors.Is(err, core.ErrTooManyRequests) {
				refused = true
			} else {
				gate.Unlock()
				t.Fatalf("a send finished while commits were held: %v", err)
			}
		case <-time.After(50 * time.Millisecond): // queued, waiting
		}
	}
	gate.Unlock()
	wg.Wait()
	close(errs)
	if !refused {
		t.Fatal("sends piled up past MaxQueuedBytes without a refusal")
	}
	stored, tooMany := 0, 0
	for err := range errs {
		switch {
		case err == nil:
			stored++
		case errors.Is(err, core.ErrTooManyRequests):
			tooMany++
		default:
			t.Errorf("send: %v", err)
		}
	}
	// 40 KiB each under a 64 KiB bound: one in the stalled commit and one
	// queued; the rest were refused, and everything accepted was stored.
	if stored < 1 || stored > 3 || tooMany < 1 {
		t.Errorf("stored %d, refused %d", stored, tooMany)
	}
	if info, _ := b.GetTopic("t"); info.Messages != int64(stored) {
		t.Errorf("topic holds %d messages, %d sends succeeded", info.Messages, stored)
	}
}

func TestParkedPullsAreBounded(t *testing.T) {
	b, _ := overloadBroker(t, core.Options{MaxParkedPulls: 2})
	ctx := context.Background()
	if _, _, err := b.PutSubscription(ctx, "t", "g", core.SubscriptionConfig{}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			if _, err := b.Pull(ctx, "t", "g", core.PullRequest{Wait: 20 * time.Second}); err != nil {
				t.Errorf("parked pull: %v", err)
			}
		})
	}
	deadline := time.Now().Add(5 * time.Second)
	for b.ParkedPulls() < 2 {
		if time.Now().After(deadline) {
			t.Fatal("the two pulls never parked")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, err := b.Pull(ctx, "t", "g", core.PullRequest{Wait: 20 * time.Second}); !errors.Is(err, core.ErrTooManyRequests) {
		t.Errorf("a third long poll: %v, want ErrTooManyRequests", err)
	}
	if _, err := b.Pull(ctx, "t", "g", core.PullRequest{}); err != nil {
		t.Errorf("a pull that does not wait: %v", err)
	}
	b.StopPolling()
	wg.Wait()
}
