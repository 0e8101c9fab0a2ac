package core_test

// Tests named TestRegression… demonstrate bugs found while writing this
// suite. Each fails until its bug is fixed; the comment above it says where
// the bug is.

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tidemq/tidemq/core"
)

// Ack after Close must answer ErrClosed. queueWritesLocked (settle.go)
// picks between `s.b.requests <- req` and `<-s.b.closing` with one select;
// after Close both are ready, so about half the acks are queued on the
// buffered channel that the stopped appender never reads again, and Ack
// waits on req.done forever. submit (appender.go) has the same select,
// guarded only by a closed.Load() that can race with Close. Fix: check
// closing first (a non-blocking select on it before the send), and make
// Close and enqueueing exclude each other (e.g. enqueue under an RWMutex
// read lock that Close takes for writing before closing b.closing), so
// drainOnClose sees every request that made it into the channel.
func TestRegressionAckAfterCloseHangs(t *testing.T) {
	e := newEnv(t, core.Options{})
	e.putTopic("orders", 1)
	e.subscribe("orders", "g", core.SubscriptionConfig{})
	e.send("orders", numbered("m", 20)...)
	got := e.pull("orders", "g", core.PullRequest{MaxMessages: 20})
	if len(got) != 20 {
		t.Fatalf("pulled %d", len(got))
	}
	b := e.b // the acks that hang outlive the test
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	results := make(chan error, len(got))
	for _, d := range got {
		go func() {
			_, _, err := b.Ack(context.Background(), "orders", "g", []string{d.ReceiptHandle})
			results <- err
		}()
	}
	timeout := time.After(2 * time.Second)
	answered := 0
	for answered < len(got) {
		select {
		case err := <-results:
			answered++
			if !errors.Is(err, core.ErrClosed) {
				t.Errorf("Ack after Close: err = %v, want ErrClosed", err)
			}
		case <-timeout:
			t.Fatalf("%d of %d Acks after Close never returned", len(got)-answered, len(got))
		}
	}
}

// Only visible with -race. PutSubscription on an existing subscription
// replaces s.rec under s.mu (subscription.go, `existing.rec, existing.filter
// = &rec, f`), while ListDead and Redrive (settle.go, `b.store.ScanDead(
// s.rec.ID, …)`) read s.rec without s.mu. Fix: read the id under s.mu, or
// keep it in an immutable field as the cursors do (c.id).
func TestRegressionPutSubscriptionRacesDLQReads(t *testing.T) {
	e := newEnv(t, core.Options{})
	e.putTopic("orders", 1)
	e.subscribe("orders", "g", core.SubscriptionConfig{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for range 200 {
			if _, _, err := e.b.PutSubscription(t.Context(), "orders", "g", core.SubscriptionConfig{Filter: "*"}); err != nil {
				t.Error(err)
				return
			}
		}
	})
	wg.Go(func() {
		for range 200 {
			if _, err := e.b.Send(t.Context(), "orders", []*core.Message{{Body: []byte("x")}}); err != nil {
				t.Error(err)
				return
			}
			got, err := e.b.Pull(t.Context(), "orders", "g", core.PullRequest{MaxMessages: 5})
			if err != nil {
				t.Error(err)
				return
			}
			e.b.Release("orders", "g", handles(got))
			if _, _, err := e.b.ListDead("orders", "g", 10, core.DLQCursor{}); err != nil {
				t.Error(err)
				return
			}
			if _, err := e.b.Redrive(t.Context(), "orders", "g", core.RedriveFilter{DryRun: true}); err != nil {
				t.Error(err)
				return
			}
		}
	})
	wg.Wait()
}

// SPEC §2: lag = messages stored but not yet acked, filtered-out messages
// counting as acked. Two kinds of progress live only in memory and are lost
// on restart, so lag (and ackedOffset) go back up:
//   - durable out-of-order acks: cursor.restore (cursor.go) puts them in
//     preAcked, but subscription.info (subscription.go, `lag :=
//     int64(sq.nOut)` …) counts every offset from the cursor to maxOffset;
//     fix: subtract the preAcked offsets in [cursor, maxOffset).
//   - offsets a filter skipped: cursor.scan advances the watermark past
//     them (c.advance) without persisting it (only ack writes carry the
//     watermark), so a queue holding only non-matching messages reports all
//     of them as lag after a restart, which fires lag alerts and rescans
//     them; fix: persist the watermark when scan moves it past
//     persistedWM (a fire-and-forget write, as the DLQ move on lease
//     expiry does), or at least with the next ack write of the cursor.
//   - offsets a filter skipped behind an outstanding message: the watermark
//     stops at the outstanding one, and only the cursor's position (memory)
//     said the ones after it were skipped; and, before or after a restart,
//     non-matching messages the cursor has not reached yet. Fix: lag
//     applies the filter to the stored index ahead of the cursor
//     (subscription.queueLag).
//   - leased messages that retention removed, or that a filter change
//     drops (these were also counted twice while the cursor read the
//     queue again), counted in memory only. Fix: queueLag leaves them out.
func TestRegressionLagAfterRestart(t *testing.T) {
	t.Run("durable out-of-order ack", func(t *testing.T) {
		e := newEnv(t, core.Options{})
		e.putTopic("orders", 1)
		e.subscribe("orders", "g", core.SubscriptionConfig{})
		e.send("orders", "a", "b", "c")
		got := e.pull("orders", "g", core.PullRequest{})
		e.ackAll("orders", "g", got[1:2]) // offset 1 only
		if lag := e.subInfo("orders", "g").Lag; lag != 2 {
			t.Fatalf("lag %d before restart, want 2", lag)
		}
		e.restart()
		if lag := e.subInfo("orders", "g").Lag; lag != 2 {
			t.Errorf("lag %d after restart, want 2: offset 1's ack is on disk", lag)
		}
	})
	t.Run("filtered-out messages", func(t *testing.T) {
		e := newEnv(t, core.Options{})
		e.putTopic("orders", 1)
		e.subscribe("orders", "g", core.SubscriptionConfig{Filter: "TagA"})
		for range 3 {
			e.sendBatch("orders", &core.Message{Body: []byte("b"), Tag: "TagB"})
		}
		if got := e.drain("orders", "g", core.PullRequest{}); len(got) != 0 {
			t.Fatalf("filter let through %v", bodies(got))
		}
		before := e.subInfo("orders", "g").Queues[0]
		if before.Lag != 0 || before.AckedOffset != 3 {
			t.Fatalf("before restart: %+v, want lag 0 and acked 3", before)
		}
		e.restart()
		if after := e.subInfo("orders", "g").Queues[0]; after != before {
			t.Errorf("after restart: %+v, before: %+v", after, before)
		}
	})
	t.Run("filtered-out messages behind a lease and ahead of the cursor", func(t *testing.T) {
		e := newEnv(t, core.Options{})
		e.putTopic("orders", 1)
		e.subscribe("orders", "g", core.SubscriptionConfig{Filter: "TagA"})
		for _, tag := range []string{"TagA", "TagB", "TagB"} {
			e.sendBatch("orders", &core.Message{Body: []byte(tag), Tag: tag})
		}
		got := e.pull("orders", "g", core.PullRequest{MaxMessages: 10})
		if len(got) != 1 || got[0].Message.Offset != 0 {
			t.Fatalf("pulled %v, want the TagA message at offset 0", positions(got))
		}
		// Not reached by the cursor: two TagB, one TagA.
		for _, tag := range []string{"TagB", "TagB", "TagA"} {
			e.sendBatch("orders", &core.Message{Body: []byte(tag), Tag: tag})
		}
		// Offset 0 leased, offset 5 ahead: the four TagB count as acked.
		if lag := e.subInfo("orders", "g").Lag; lag != 2 {
			t.Fatalf("lag %d before restart, want 2", lag)
		}
		e.restart() // the lease is gone; the watermark is still 0
		if q := e.subInfo("orders", "g").Queues[0]; q.Lag != 2 || q.AckedOffset != 0 {
			t.Errorf("after restart %+v, want lag 2 at acked offset 0", q)
		}
		// The handle from before the restart still acks offset 0.
		if n, _ := e.ack("orders", "g", got[0].ReceiptHandle); n != 1 {
			t.Fatalf("acked %d of the handle from before the restart, want 1", n)
		}
		if lag := e.subInfo("orders", "g").Lag; lag != 1 {
			t.Errorf("lag %d after acking offset 0, want 1", lag)
		}
	})
	t.Run("leased messages retention removed", func(t *testing.T) {
		clk := newClock()
		e := newEnv(t, core.Options{Now: clk.Now})
		if _, _, err := e.b.PutTopic(t.Context(), "orders", core.TopicConfig{Queues: 1, RetentionHours: 1}); err != nil {
			t.Fatal(err)
		}
		e.subscribe("orders", "g", core.SubscriptionConfig{})
		e.send("orders", "a", "b", "c")
		if got := e.pull("orders", "g", core.PullRequest{MaxMessages: 10, Invisible: 3 * time.Hour}); len(got) != 3 {
			t.Fatalf("pulled %d, want 3", len(got))
		}
		clk.Advance(61 * time.Minute)
		e.send("orders", "d")
		if err := e.b.EnforceRetention(); err != nil {
			t.Fatal(err)
		}
		if q := e.topicInfo("orders").QueueStats[0]; q.MinOffset != 3 {
			t.Fatalf("retention left the queue from offset %d, want 3", q.MinOffset)
		}
		// Only d is stored: the leases hold messages that are gone.
		if lag := e.subInfo("orders", "g").Lag; lag != 1 {
			t.Errorf("lag %d, want 1", lag)
		}
		e.restart()
		if lag := e.subInfo("orders", "g").Lag; lag != 1 {
			t.Errorf("lag %d after restart, want 1", lag)
		}
	})
	t.Run("leased messages a filter change drops", func(t *testing.T) {
		e := newEnv(t, core.Options{})
		e.putTopic("orders", 1)
		e.subscribe("orders", "g", core.SubscriptionConfig{Filter: "TagA || TagB"})
		for _, tag := range []string{"TagA", "TagB"} {
			e.sendBatch("orders", &core.Message{Body: []byte(tag), Tag: tag})
		}
		if got := e.pull("orders", "g", core.PullRequest{MaxMessages: 10}); len(got) != 2 {
			t.Fatalf("pulled %d, want 2", len(got))
		}
		e.subscribe("orders", "g", core.SubscriptionConfig{Filter: "TagA"})
		// TagA is leased, counted once; TagB's next delivery drops it.
		if lag := e.subInfo("orders", "g").Lag; lag != 1 {
			t.Errorf("lag %d after the filter change, want 1", lag)
		}
		// A pull reads on to the end, passing both (they are leased): the
		// cursor at the end leaves TagB out all the same.
		if got := e.pull("orders", "g", core.PullRequest{MaxMessages: 10}); len(got) != 0 {
			t.Fatalf("pulled %d after the filter change, want 0", len(got))
		}
		if lag := e.subInfo("orders", "g").Lag; lag != 1 {
			t.Errorf("lag %d with the cursor at the end after the filter change, want 1", lag)
		}
		e.restart()
		if lag := e.subInfo("orders", "g").Lag; lag != 1 {
			t.Errorf("lag %d after restart, want 1", lag)
		}
	})
}

// SPEC §2: "The reply comes as soon as at least one message is ready". With
// a tag filter (or an orderly subscription), cursor.scan (cursor.go, `want =
// max(want, 4096)`) reads at most 4096 index entries per queue per lease;
// when those hold no match, Pull (consume.go) parks for the whole wait, or
// with wait 0 answers empty, although a matching message is stored further
// on. Fix: have the lease report that a scan stopped at its bound with
// entries left, and let Pull look again at once instead of parking.
func TestRegressionFilteredPullParksWithMatchBeyondScanBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, core.Options{})
		e.putTopic("orders", 1)
		e.subscribe("orders", "g", core.SubscriptionConfig{Filter: "TagA"})
		for range 5 {
			msgs := make([]*core.Message, 1000)
			for i := range msgs {
				msgs[i] = &core.Message{Body: []byte("b"), Tag: "TagB"}
			}
			e.sendBatch("orders", msgs...)
		}
		e.sendBatch("orders", &core.Message{Body: []byte("a"), Tag: "TagA"})

		r := <-pullAsync(t.Context(), e.b, "orders", "g", core.PullRequest{Wait: 10 * time.Second})
		if r.err != nil || len(r.got) != 1 {
			t.Fatalf("pull got %d messages, err %v; want the TagA message", len(r.got), r.err)
		}
		if r.elapsed != 0 {
			t.Errorf("a ready TagA message was handed out after %v, want at once", r.elapsed)
		}
	})
}
