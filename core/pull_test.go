package core_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidemq/tidemq/core"
)

func TestPullDeliversEveryMessageOnceToConcurrentConsumers(t *testing.T) {
	const total, pullers = 2000, 4
	e := newEnv(t, core.Options{})
	e.putTopic("orders", 8)
	e.subscribe("orders", "g", core.SubscriptionConfig{})
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()

	var sentMu sync.Mutex
	sentIDs := map[string]bool{}
	sendRange := func(from, to int) error {
		for i := from; i < to; i += 100 {
			var msgs []*core.Message
			for j := i; j < min(i+100, to); j++ {
				msgs = append(msgs, &core.Message{Body: fmt.Appendf(nil, "m%04d", j)})
			}
			res, err := e.b.Send(ctx, "orders", msgs)
			if err != nil {
				return err
			}
			sentMu.Lock()
			for _, r := range res {
				sentIDs[r.MessageID] = true
			}
			sentMu.Unlock()
		}
		return nil
	}
	if err := sendRange(0, total/2); err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	seen := map[pos]string{}
	var count atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() {
		// The second half arrives while the consumers run.
		if err := sendRange(total/2, total); err != nil {
			t.Error(err)
		}
	})
	for p := range pullers {
		wg.Go(func() {
			for count.Load() < total && ctx.Err() == nil {
				got, err := e.b.Pull(ctx, "orders", "g", core.PullRequest{
					MaxMessages: 37, Wait: 100 * time.Millisecond, ConsumerID: fmt.Sprint("c", p),
				})
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				for _, d := range got {
					k := pos{d.Message.QueueID, d.Message.Offset}
					if prev, dup := seen[k]; dup {
						t.Errorf("message %v (%s) delivered twice; first as %s", k, d.Message.ID, prev)
					}
					if d.Attempt != 1 {
						t.Errorf("message %v delivered with attempt %d", k, d.Attempt)
					}
					seen[k] = d.Message.ID
				}
				mu.Unlock()
				count.Add(int64(len(got)))
				if len(got) > 0 {
					n, failed, err := e.b.Ack(ctx, "orders", "g", handles(got))
					if err != nil || n != len(got) || len(failed) != 0 {
						t.Errorf("ack of %d: acked=%d failed=%v err=%v", len(got), n, failed, err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	if ctx.Err() != nil {
		t.Fatalf("gave up after receiving %d of %d messages", count.Load(), total)
	}
	if len(seen) != total {
		t.Fatalf("%d distinct messages delivered, want %d", len(seen), total)
	}
	for _, id := range seen {
		if !sentIDs[id] {
			t.Fatalf("delivered message id %s was never sent", id)
		}
	}
	if rest := e.drain("orders", "g", core.PullRequest{}); len(rest) != 0 {
		t.Errorf("%d messages delivered after everything was acked", len(rest))
	}
	if info := e.subInfo("orders", "g"); info.Lag != 0 || info.Inflight != 0 {
		t.Errorf("lag=%d inflight=%d after acking everything", info.Lag, info.Inflight)
	}
}

func TestPullHonoursMaxMessages(t *testing.T) {
	e := newEnv(t, core.Options{})
	e.putTopic("orders", 4)
	e.subscribe("orders", "g", core.SubscriptionConfig{})
	e.send("orders", numbered("m", 10)...)
	var sizes []int
	var all []core.Delivered
	for range 6 {
		got := e.pull("orders", "g", core.PullRequest{MaxMessages: 3})
		sizes = append(sizes, len(got))
		all = append(all, got...)
	}
	if !slices.Equal(sizes, []int{3, 3, 3, 1, 0, 0}) {
		t.Errorf("pull sizes %v, want [3 3 3 1 0 0]", sizes)
	}
	if got := bodies(all); !slices.Equal(got, numbered("m", 10)) {
		t.Errorf("pulled %v", got)
	}
	// The default is 32.
	e.send("orders", numbered("n", 40)...)
	if got := e.pull("orders", "g", core.PullRequest{}); len(got) != core.DefaultMaxMessages {
		t.Errorf("default pull returned %d, want %d", len(got), core.DefaultMaxMessages)
	}
}

func TestPullRejectsBadRequest(t *testing.T) {
	e := newEnv(t, core.Options{})
	e.putTopic("orders", 1)
	e.subscribe("orders", "g", core.SubscriptionConfig{})
	for _, tc := range []struct {
		req   core.PullRequest
		field string
	}{
		{core.PullRequest{MaxMessages: -1}, "/maxMessages"},
		{core.PullRequest{MaxMessages: core.MaxMaxMessages + 1}, "/maxMessages"},
		{core.PullRequest{Wait: -time.Second}, "/waitSeconds"},
		{core.PullRequest{Wait: 31 * time.Second}, "/waitSeconds"},
		{core.PullRequest{Invisible: 500 * time.Millisecond}, "/invisibleSeconds"},
		{core.PullRequest{Invisible: (core.MaxInvisibleSeconds + 1) * time.Second}, "/invisibleSeconds"},
	} {
		_, err := e.b.Pull(t.Context(), "orders", "g", tc.req)
		wantValidation(t, err, tc.field, -1)
	}
}

func TestAckAnswersPerHandle(t *testing.T) {
	e := newEnv(t, core.Options{})
	e.putTopic("orders", 2)
	e.subscribe("orders", "g", core.SubscriptionConfig{})
	e.subscribe("orders", "other", core.SubscriptionConfig{})
	e.send("orders", "a", "b")
	got := e.pull("orders", "g", core.PullRequest{})
	otherGot := e.pull("orders", "other", core.PullRequest{MaxMessages: 1})
	if len(got) != 2 || len(otherGot) != 1 {
		t.Fatalf("pulled %d and %d", len(got), len(otherGot))
	}

	garbage := []string{
		"", "nope", "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", got[0].ReceiptHandle + "x",
		got[0].ReceiptHandle[:len(got[0].ReceiptHandle)-1], otherGot[0].ReceiptHandle,
	}
	n, failed := e.ack("orders", "g", append([]string{got[0].ReceiptHandle}, garbage...)...)
	if n != 1 {
		t.Errorf("acked %d, want 1", n)
	}
	if len(failed) != len(garbage) {
		t.Fatalf("failed = %v, want one entry per bad handle", failed)
	}
	for i, f := range failed {
		if f.ReceiptHandle != garbage[i] || !errors.Is(f.Err, core.ErrReceiptInvalid) {
			t.Errorf("failed[%d] = %q %v, want %q receipt invalid", i, f.ReceiptHandle, f.Err, garbage[i])
		}
	}

	// Acking again is harmless and counts: a client retrying a timed-out
	// ack. A handle listed twice in one ack counts once.
	n, failed = e.ack("orders", "g", got[0].ReceiptHandle, got[0].ReceiptHandle)
	if n != 1 || len(failed) != 0 {
		t.Errorf("repeated ack: acked=%d failed=%v, want 1 and none", n, failed)
	}
	e.ackAll("orders", "g", got[1:])
	e.ackAll("orders", "g", got) // and once more for both
	if rest := e.drain("orders", "g", core.PullRequest{}); len(rest) != 0 {
		t.Errorf("acked messages delivered again: %v", bodies(rest))
	}
	// The other group is unaffected by g's acks.
	if info := e.subInfo("orders", "other"); info.Lag != 2 || info.Inflight != 1 {
		t.Errorf("other group lag=%d inflight=%d, want 2 and 1", info.Lag, info.Inflight)
	}
	// An ack needs at least one handle.
	_, _, err := e.b.Ack(t.Context(), "orders", "g", nil)
	wantValidation(t, err, "/receiptHandles", -1)
}

func TestLeaseExpiryRedeliversWithNextAttempt(t *testing.T) {
	clk := newClock()
	e := newEnv(t, core.Options{Now: clk.Now})
	e.putTopic("orders", 1)
	e.subscribe("orders", "g", core.SubscriptionConfig{})
	e.send("orders", "slow")
	req := core.PullRequest{Invisible: 10 * time.Second}

	first := e.pull("orders", "g", req)
	if len(first) != 1 || first[0].Attempt != 1 {
		t.Fatalf("first pull: %+v", first)
	}
	clk.Advance(10*time.Second - time.Millisecond)
	if got := e.pull("orders", "g", req); len(got) != 0 {
		t.Fatal("message delivered again 1ms before its lease ended")
	}
	clk.Advance(time.Millisecond)
	second := e.pull("orders", "g", req)
	if len(second) != 1 {
		t.Fatalf("not delivered again once the lease ended: %d messages", len(second))
	}
	d := second[0]
	if d.Message.ID != first[0].Message.ID || d.Attempt != 2 {
		t.Errorf("redelivery id=%s attempt=%d, want %s attempt 2", d.Message.ID, d.Attempt, first[0].Message.ID)
	}
	if d.ReceiptHandle == first[0].ReceiptHandle {
		t.Error("redelivery reuses the first receipt handle")
	}
	if info := e.subInfo("orders", "g"); info.Inflight != 1 || info.Lag != 1 {
		t.Errorf("inflight=%d lag=%d, want 1 and 1", info.Inflight, info.Lag)
	}

	n, failed := e.ack("orders", "g", first[0].ReceiptHandle)
	if n != 0 || len(failed) != 1 || !errors.Is(failed[0].Err, core.ErrReceiptExpired) {
		t.Errorf("ack with the first handle after redelivery: acked=%d failed=%v, want receipt expired", n, failed)
	}
	// The expired handle did not settle the message: the live one still works.
	n, failed = e.ack("orders", "g", d.ReceiptHandle)
	if n != 1 || len(failed) != 0 {
		t.Errorf("ack with the live handle: acked=%d failed=%v", n, failed)
	}
	clk.Advance(time.Minute)
	if got := e.pull("orders", "g", req); len(got) != 0 {
		t.Errorf("acked message delivered again: %v", bodies(got))
	}
	if info := e.subInfo("orders", "g"); info.Lag != 0 || info.Inflight != 0 {
		t.Errorf("after ack: lag=%d inflight=%d", info.Lag, info.Inflight)
	}
}

func TestAckAfterLeaseEndedButBeforeRedeliveryCounts(t *testing.T) {
	clk := newClock()
	e := newEnv(t, core.Options{Now: clk.Now})
	e.putTopic("orders", 1)
	e.subscribe("orders", "g", core.SubscriptionConfig{})
	e.send("orders", "a", "b", "c")
	req := core.PullRequest{Invisible: 5 * time.Second}

	got := e.pull("orders", "g", req)
	if len(got) != 3 {
		t.Fatalf("pulled %d, want 3", len(got))
	}
	clk.Advance(6 * time.Second)

	// No pull has looked since the lease ended.
	n, failed := e.ack("orders", "g", got[0].ReceiptHandle)
	if n != 1 || len(failed) != 0 {
		t.Fatalf("late ack before anyone looked: acked=%d failed=%v, want 1", n, failed)
	}
	// A pull takes one of the two others again; the last one waits its turn.
	again := e.pull("orders", "g", core.PullRequest{MaxMessages: 1, Invisible: 5 * time.Second})
	if len(again) != 1 || again[0].Attempt != 2 || again[0].Message.ID == got[0].Message.ID {
		t.Fatalf("redelivery: %+v", again)
	}
	waiting := got[1]
	if again[0].Message.ID == waiting.Message.ID {
		waiting = got[2]
	}
	n, failed = e.ack("orders", "g", waiting.ReceiptHandle)
	if n != 1 || len(failed) != 0 {
		t.Fatalf("late ack of a message waiting to go out again: acked=%d failed=%v, want 1", n, failed)
	}
	if rest := e.pull("orders", "g", req); len(rest) != 0 {
		t.Errorf("late-acked messages delivered again: %v", bodies(rest))
	}
	e.ackAll("orders", "g", again)
	clk.Advance(time.Minute)
	if rest := e.pull("orders", "g", req); len(rest) != 0 {
		t.Errorf("delivered after everything was acked: %v", bodies(rest))
	}
	if info := e.subInfo("orders", "g"); info.Lag != 0 || info.Queues[0].AckedOffset != 3 {
		t.Errorf("lag=%d acked offset=%d, want 0 and 3", info.Lag, info.Queues[0].AckedOffset)
	}
}

func TestHungMessageDoesNotBlockItsQueue(t *testing.T) {
	clk := newClock()
	e := newEnv(t, core.Options{Now: clk.Now})
	e.putTopic("orders", 1)
	e.subscribe("orders", "g", core.SubscriptionConfig{})
	e.send("orders", "hung")
	hung := e.pull("orders", "g", core.PullRequest{Invisible: time.Hour})
	if len(hung) != 1 {
		t.Fatal("hung message not pulled")
	}
	for round := range 3 {
		want := numbered(fmt.Sprint("r", round, "-"), 5)
		e.send("orders", want...)
		got := e.drain("orders", "g", core.PullRequest{Invisible: time.Hour})
		if !slices.Equal(bodies(got), want) {
			t.Fatalf("round %d: got %v while offset 0 is leased", round, bodies(got))
		}
		e.ackAll("orders", "g", got)
		clk.Advance(time.Minute)
	}
	q := e.subInfo("orders", "g").Queues[0]
	if want := (core.SubQueueStat{QueueID: 0, MaxOffset: 16, AckedOffset: 0, Inflight: 1, Lag: 1}); q != want {
		t.Errorf("queue stat %+v, want %+v (watermark held at the hung message)", q, want)
	}
	e.ackAll("orders", "g", hung)
	if q := e.subInfo("orders", "g").Queues[0]; q.AckedOffset != 16 || q.Lag != 0 {
		t.Errorf("after acking the hung message: %+v", q)
	}
}

func TestReleaseMakesMessagesPullableWithoutCountingAnAttempt(t *testing.T) {
	clk := newClock()
	e := newEnv(t, core.Options{Now: clk.Now})
	e.putTopic("orders", 1)
	e.subscribe("orders", "g", core.SubscriptionConfig{})
	e.send("orders", "a", "b")
	req := core.PullRequest{Invisible: 10 * time.Second}

	first := e.pull("orders", "g", req)
	if len(first) != 2 {
		t.Fatalf("pulled %d", len(first))
	}
	e.b.Release("orders", "g", handles(first))
	second := e.pull("orders", "g", req)
	if got := bodies(second); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("after release, pull got %v, want [a b] at once", got)
	}
	for _, d := range second {
		if d.Attempt != 1 {
			t.Errorf("%s: attempt %d after a release, want 1", d.Message.Body, d.Attempt)
		}
	}
	// The released handles are superseded by the new ones.
	n, failed := e.ack("orders", "g", first[0].ReceiptHandle)
	if n != 0 || len(failed) != 1 || !errors.Is(failed[0].Err, core.ErrReceiptExpired) {
		t.Errorf("ack with a released, re-leased handle: acked=%d failed=%v", n, failed)
	}
	// Releasing stale or foreign handles changes nothing.
	e.b.Release("orders", "g", handles(first))
	e.b.Release("orders", "g", []string{"garbage"})
	e.b.Release("missing", "g", handles(second))
	if got := e.pull("orders", "g", req); len(got) != 0 {
		t.Errorf("stale release freed leased messages: %v", bodies(got))
	}

	// A lease running out does count: the next delivery is attempt 2.
	clk.Advance(10 * time.Second)
	third := e.pull("orders", "g", req)
	if len(third) != 2 {
		t.Fatalf("after the lease ended pulled %d", len(third))
	}
	for _, d := range third {
		if d.Attempt != 2 {
			t.Errorf("%s: attempt %d after a lease ran out, want 2", d.Message.Body, d.Attempt)
		}
	}
	// And a release after that leaves it at 2.
	e.b.Release("orders", "g", handles(third))
	fourth := e.pull("orders", "g", req)
	if len(fourth) != 2 {
		t.Fatalf("after releasing attempt 2 pulled %d", len(fourth))
	}
	for _, d := range fourth {
		if d.Attempt != 2 {
			t.Errorf("%s: attempt %d after releasing attempt 2", d.Message.Body, d.Attempt)
		}
	}
}

func TestMaxLeasesPerQueueLimitsOutstanding(t *testing.T) {
	e := newEnv(t, core.Options{MaxLeasesPerQueue: 3})
	e.putTopic("orders", 1)
	e.subscribe("orders", "g", core.SubscriptionConfig{})
	e.send("orders", numbered("m", 10)...)
	got := e.pull("orders", "g", core.PullRequest{MaxMessages: 10})
	if len(got) != 3 {
		t.Fatalf("pulled %d with 3 leases allowed per queue", len(got))
	}
	if more := e.pull("orders", "g", core.PullRequest{MaxMessages: 10}); len(more) != 0 {
		t.Fatalf("pulled %d more while 3 are leased", len(more))
	}
	e.ackAll("orders", "g", got[:1])
	if more := e.pull("orders", "g", core.PullRequest{MaxMessages: 10}); len(more) != 1 {
		t.Fatalf("after one ack pulled %d, want 1", len(more))
	}
}
