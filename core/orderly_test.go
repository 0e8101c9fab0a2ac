package core_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidemq/tidemq/core"
)

// Orderly subscriptions (SPEC §2): messages of one sharding key strictly in
// order, a failure holds back that key alone.

func keyed(key string, i int) *core.Message {
	return &core.Message{Body: fmt.Appendf(nil, "%s:%02d", key, i), ShardingKey: key}
}

// order returns the delivered bodies in the order delivered.
func order(ds []core.Delivered) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = string(d.Message.Body)
	}
	return out
}

// perKey returns the delivered indexes of each key, in the order delivered.
func perKey(t testing.TB, ds []core.Delivered) map[string][]int {
	out := map[string][]int{}
	for _, d := range ds {
		k, i := parseKeyed(t, d.Message.Body)
		out[k] = append(out[k], i)
	}
	return out
}

// parseKeyed splits a keyed body "k2:07" into its key and index.
func parseKeyed(t testing.TB, body []byte) (string, int) {
	key, n, ok := strings.Cut(string(body), ":")
	i, err := strconv.Atoi(n)
	if !ok || err != nil {
		t.Errorf("body %q is not key:index", body)
	}
	return key, i
}

// Three consumers race on six keys; one message is nacked once. Every key
// is delivered in send order, the nacked one first again after its retry
// delay, and the other keys keep flowing meanwhile. A consumer handles a
// pull's messages in order and leaves, like the SDK, the key's messages
// after a failed one: their handles are spent (they come again after it).
func TestOrderlyKeepsPerKeyOrderUnderConcurrency(t *testing.T) {
	e := newEnv(t, core.Options{})
	e.putTopic("orders", 4)
	const retryDelay = 300 * time.Millisecond
	e.subscribe("orders", "g", core.SubscriptionConfig{Orderly: true, RetryDelays: []time.Duration{retryDelay}})
	keys := []string{"k0", "k1", "k2", "k3", "k4", "k5"}
	const perKey = 40
	for i := range perKey {
		msgs := make([]*core.Message, len(keys))
		for j, k := range keys {
			msgs[j] = keyed(k, i)
		}
		e.sendBatch("orders", msgs...)
	}

	type delivery struct {
		key     string
		index   int
		attempt int
		at      time.Time
	}
	var (
		mu        sync.Mutex
		delivered []delivery
		nackedAt  time.Time
		acked     atomic.Int64
	)
	const total = perKey * 6
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for c := range 3 {
		wg.Go(func() {
			for ctx.Err() == nil && acked.Load() < total {
				got, err := e.b.Pull(ctx, "orders", "g", core.PullRequest{MaxMessages: 8, Wait: time.Second, ConsumerID: fmt.Sprintf("c%d", c)})
				if err != nil {
					t.Error(err)
					return
				}
				var ack, spent []string
				failedKey := ""
				for _, d := range got {
					key, i := parseKeyed(t, d.Message.Body)
					if key == failedKey {
						spent = append(spent, d.ReceiptHandle)
						continue
					}
					mu.Lock()
					delivered = append(delivered, delivery{key, i, d.Attempt, time.Now()})
					nack := key == "k2" && i == 19 && nackedAt.IsZero()
					if nack {
						nackedAt = time.Now()
					}
					mu.Unlock()
					if nack {
						if _, _, err := e.b.Nack(ctx, "orders", "g", []string{d.ReceiptHandle}, -1, "k2:19 failed once"); err != nil {
							t.Error(err)
						}
						failedKey = key
						continue
					}
					ack = append(ack, d.ReceiptHandle)
				}
				if len(ack) > 0 {
					n, failed, err := e.b.Ack(ctx, "orders", "g", ack)
					if err != nil || len(failed) > 0 {
						t.Errorf("ack: %d %v %v", n, failed, err)
					}
					if acked.Add(int64(n)) >= total {
						cancel() // the others' parked pulls end now
					}
				}
				if len(spent) > 0 {
					n, failed, err := e.b.Ack(ctx, "orders", "g", spent)
					if err != nil || n != 0 || len(failed) != len(spent) {
						t.Errorf("acks of the messages after the nacked one in its pull: %d acked, %v, %v; want all receipt_expired", n, failed, err)
					}
				}
			}
		})
	}
	wg.Wait()
	if n := acked.Load(); n != total {
		t.Fatalf("acked %d of %d messages before the deadline", n, total)
	}

	perKeySeq := map[string][]int{}
	var redeliveredAt time.Time
	for _, d := range delivered {
		perKeySeq[d.key] = append(perKeySeq[d.key], d.index)
		if d.key == "k2" && d.index == 19 && d.attempt == 2 {
			redeliveredAt = d.at
		}
	}
	for _, k := range keys {
		var want []int
		for i := range perKey {
			want = append(want, i)
			if k == "k2" && i == 19 {
				want = append(want, 19) // the nacked one, again, before 20
			}
		}
		if !slices.Equal(perKeySeq[k], want) {
			t.Errorf("key %s delivered in order %v, want %v", k, perKeySeq[k], want)
		}
	}
	if redeliveredAt.IsZero() {
		t.Fatal("k2:19 never came back with attempt 2")
	}
	if held := redeliveredAt.Sub(nackedAt); held < retryDelay-50*time.Millisecond {
		t.Errorf("k2 was held back %v after the nack, want its %v retry delay", held, retryDelay)
	}
	// Pulls carry a key's consecutive messages, so the other keys may all
	// be delivered before the nack; those delivered after it must not all
	// have waited for k2's suspension to end.
	others, afterNack := 0, 0
	for _, d := range delivered {
		if d.key != "k2" && d.at.After(nackedAt) {
			afterNack++
			if d.at.Before(redeliveredAt) {
				others++
			}
		}
	}
	if afterNack > 0 && others == 0 {
		t.Errorf("the %d messages of other keys delivered after the nack all waited for k2's suspension to end", afterNack)
	}
	t.Logf("%d messages of other keys delivered during k2's %v suspension", others, redeliveredAt.Sub(nackedAt))
	if info := e.subInfo("orders", "g"); info.Lag != 0 || info.Inflight != 0 || info.DLQ != 0 || info.Retrying != 0 {
		t.Errorf("after all acked: lag=%d inflight=%d dlq=%d retrying=%d", info.Lag, info.Inflight, info.DLQ, info.Retrying)
	}
}

// A nack suspends its key alone, in the same queue too; the same message
// comes first again after the retry delay, then the rest of the key. The
// key's messages leased after it in the same pull lose their leases.
func TestOrderlyNackSuspendsOnlyItsKey(t *testing.T) {
	clk := newClock()
	e := newEnv(t, core.Options{Now: clk.Now})
	e.putTopic("orders", 1) // both keys share the queue
	e.subscribe("orders", "g", core.SubscriptionConfig{Orderly: true, RetryDelays: []time.Duration{10 * time.Second}})
	e.sendBatch("orders", keyed("a", 0), keyed("b", 0), keyed("a", 1))

	got := e.pull("orders", "g", core.PullRequest{})
	if want := []string{"a:00", "b:00", "a:01"}; !slices.Equal(order(got), want) {
		t.Fatalf("first pull %v, want %v", order(got), want)
	}
	a0, b0, a1 := got[0], got[1], got[2]
	e.nack("orders", "g", a0, -1, "try again")
	if n, failed := e.ack("orders", "g", a1.ReceiptHandle); n != 0 || len(failed) != 1 || failed[0].Err != core.ErrReceiptExpired {
		t.Fatalf("ack of a:01 after a:00's nack: n=%d failed=%v, want receipt expired", n, failed)
	}
	e.ackAll("orders", "g", []core.Delivered{b0})
	// Key b flows; key a waits, neither a:00 nor a:01 comes.
	e.sendBatch("orders", keyed("b", 1))
	if got := e.pull("orders", "g", core.PullRequest{}); !slices.Equal(order(got), []string{"b:01"}) {
		t.Fatalf("while a is suspended got %v, want [b:01]", order(got))
	} else {
		e.ackAll("orders", "g", got)
	}
	clk.Advance(10*time.Second - time.Millisecond)
	e.sendBatch("orders", keyed("b", 2))
	if got := e.pull("orders", "g", core.PullRequest{}); !slices.Equal(order(got), []string{"b:02"}) {
		t.Fatalf("1 ms before a's retry delay ended got %v, want [b:02]", order(got))
	} else {
		e.ackAll("orders", "g", got)
	}
	clk.Advance(time.Millisecond)
	again := e.pull("orders", "g", core.PullRequest{})
	if want := []string{"a:00", "a:01"}; !slices.Equal(order(again), want) {
		t.Fatalf("after the retry delay got %v, want %v", order(again), want)
	}
	if again[0].Attempt != 2 || again[1].Attempt != 1 {
		t.Errorf("attempts %d, %d; want 2 (nacked once) and 1 (its lease was revoked, not failed)", again[0].Attempt, again[1].Attempt)
	}
	if again[0].Message.ID != a0.Message.ID || again[0].Message.Offset != a0.Message.Offset {
		t.Errorf("redelivery is %s@%d, want the original %s@%d", again[0].Message.ID, again[0].Message.Offset, a0.Message.ID, a0.Message.Offset)
	}
	e.ackAll("orders", "g", again)
	e.pullNone("orders", "g", core.PullRequest{}, "every message is acked")
}

// A nack of the 2nd of 4 leased messages of a key: the 1st stays leased
// and acks, the 3rd and 4th lose their leases (their handles neither ack
// nor extend), and after the delay the key resumes with 2, 3, 4 in order.
func TestOrderlyNackInsideAPullRevokesTheRest(t *testing.T) {
	clk := newClock()
	e := newEnv(t, core.Options{Now: clk.Now})
	e.putTopic("orders", 2)
	e.subscribe("orders", "g", core.SubscriptionConfig{Orderly: true, RetryDelays: []time.Duration{5 * time.Second}})
	e.sendBatch("orders", keyed("a", 1), keyed("a", 2), keyed("a", 3), keyed("a", 4))
	got := e.pull("orders", "g", core.PullRequest{MaxMessages: 10})
	if want := []string{"a:01", "a:02", "a:03", "a:04"}; !slices.Equal(order(got), want) {
		t.Fatalf("pull %v, want the key's 4 messages in order %v", order(got), want)
	}
	e.nack("orders", "g", got[1], -1, "2 failed")
	ctx := t.Context()
	if n, failed, err := e.b.Extend(ctx, "orders", "g", []string{got[2].ReceiptHandle}, time.Minute); err != nil || n != 0 || len(failed) != 1 || failed[0].Err != core.ErrReceiptExpired {
		t.Errorf("extend of 3 after 2's nack: %d %v %v, want receipt expired", n, failed, err)
	}
	if n, failed := e.ack("orders", "g", got[2].ReceiptHandle, got[3].ReceiptHandle); n != 0 || len(failed) != 2 ||
		failed[0].Err != core.ErrReceiptExpired || failed[1].Err != core.ErrReceiptExpired {
		t.Errorf("acks of 3 and 4 after 2's nack: n=%d failed=%v, want both receipt expired", n, failed)
	}
	if n, failed := e.ack("orders", "g", got[0].ReceiptHandle); n != 1 || len(failed) != 0 {
		t.Errorf("ack of 1, leased before the nacked one: n=%d failed=%v", n, failed)
	}
	if info := e.subInfo("orders", "g"); info.Inflight != 0 || info.Retrying != 1 || info.Lag != 3 {
		t.Errorf("after the nack: inflight=%d retrying=%d lag=%d, want 0, 1, 3", info.Inflight, info.Retrying, info.Lag)
	}
	e.pullNone("orders", "g", core.PullRequest{MaxMessages: 10}, "the key is suspended")
	clk.Advance(5 * time.Second)
	again := e.pull("orders", "g", core.PullRequest{MaxMessages: 10})
	if want := []string{"a:02", "a:03", "a:04"}; !slices.Equal(order(again), want) {
		t.Fatalf("after the delay %v, want %v", order(again), want)
	}
	if a := []int{again[0].Attempt, again[1].Attempt, again[2].Attempt}; !slices.Equal(a, []int{2, 1, 1}) {
		t.Errorf("attempts %v, want [2 1 1]: the revoked leases count no attempt", a)
	}
	e.ackAll("orders", "g", again)
	if info := e.subInfo("orders", "g"); info.Lag != 0 || info.Inflight != 0 || info.Retrying != 0 {
		t.Errorf("after all acked: lag=%d inflight=%d retrying=%d", info.Lag, info.Inflight, info.Retrying)
	}
}

// One nack call holding the 2nd and 3rd of a key's leased messages: the
// 2nd fails, which revokes the 3rd; the 3rd's handle answers
// receipt_expired, counting no attempt.
func TestOrderlyNackOfSeveralOfAKeyFailsTheFirst(t *testing.T) {
	clk := newClock()
	e := newEnv(t, core.Options{Now: clk.Now})
	e.putTopic("orders", 1)
	e.subscribe("orders", "g", core.SubscriptionConfig{Orderly: true, RetryDelays: []time.Duration{time.Second}})
	e.sendBatch("orders", keyed("a", 1), keyed("a", 2), keyed("a", 3))
	got := e.pull("orders", "g", core.PullRequest{MaxMessages: 10})
	if len(got) != 3 {
		t.Fatalf("pull %v, want 3", order(got))
	}
	// The later one first: the order in the call does not matter.
	n, res, err := e.b.Nack(t.Context(), "orders", "g", []string{got[2].ReceiptHandle, got[1].ReceiptHandle}, -1, "both")
	if err != nil || n != 1 || len(res) != 1 || res[0].ReceiptHandle != got[2].ReceiptHandle || res[0].Err != core.ErrReceiptExpired {
		t.Fatalf("nack of 2 and 3: n=%d failed=%v err=%v, want 2 nacked and 3 receipt expired", n, res, err)
	}
	e.ackAll("orders", "g", got[:1])
	clk.Advance(time.Second)
	again := e.pull("orders", "g", core.PullRequest{MaxMessages: 10})
	if !slices.Equal(order(again), []string{"a:02", "a:03"}) || again[0].Attempt != 2 || again[1].Attempt != 1 {
		t.Fatalf("after the delay %v (attempts %d, %d), want a:02 attempt 2, a:03 attempt 1", order(again), again[0].Attempt, again[1].Attempt)
	}
}

// A pull's leases of a key run out together: the first counts a failed
// attempt and suspends the key, the others count none; after the delay
// the key comes again whole, in order.
func TestOrderlyLeaseExpirySuspendsTheKey(t *testing.T) {
	clk := newClock()
	e := newEnv(t, core.Options{Now: clk.Now})
	e.putTopic("orders", 1)
	e.subscribe("orders", "g", core.SubscriptionConfig{Orderly: true, RetryDelays: []time.Duration{10 * time.Second}})
	var want []string
	for i := range 12 {
		e.sendBatch("orders", keyed("a", i), keyed("b", i))
		want = append(want, fmt.Sprintf("a:%02d", i), fmt.Sprintf("b:%02d", i))
	}
	first := e.pull("orders", "g", core.PullRequest{Invisible: 5 * time.Second})
	if !slices.Equal(order(first), want) {
		t.Fatalf("first pull %v, want %v", order(first), want)
	}
	clk.Advance(5 * time.Second)
	e.pullNone("orders", "g", core.PullRequest{}, "right after the leases ran out (both keys are suspended)")
	if info := e.subInfo("orders", "g"); info.Inflight != 0 || info.Retrying != 2 {
		t.Errorf("after the leases ran out: inflight=%d retrying=%d, want 0 and 2 (each key's first suspended)", info.Inflight, info.Retrying)
	}
	clk.Advance(10 * time.Second)
	again := e.pull("orders", "g", core.PullRequest{})
	if got := perKey(t, again); !slices.Equal(got["a"], perKey(t, first)["a"]) || !slices.Equal(got["b"], perKey(t, first)["b"]) {
		t.Fatalf("after the suspension got %v, want each key whole and in order again", order(again))
	}
	for _, d := range again {
		_, i := parseKeyed(t, d.Message.Body)
		if want := 1 + max(0, 1-i); d.Attempt != want {
			t.Errorf("%s: attempt %d, want %d (only a key's first lease to end counts)", d.Message.Body, d.Attempt, want)
		}
	}
	for _, d := range first {
		if n, failed := e.ack("orders", "g", d.ReceiptHandle); n != 0 || len(failed) != 1 {
			t.Errorf("the expired handle of %s acked: n=%d failed=%v", d.Message.Body, n, failed)
		}
	}
}

// Extends work per handle: a lease kept alive by an extend outlives the
// others of its pull; the first to run out fails, the ones after it are
// revoked, and the one before it stays leased.
func TestOrderlyExtendKeepsOneLeaseOfTheKey(t *testing.T) {
	clk := newClock()
	e := newEnv(t, core.Options{Now: clk.Now})
	e.putTopic("orders", 1)
	e.subscribe("orders", "g", core.SubscriptionConfig{Orderly: true, RetryDelays: []time.Duration{time.Second}})
	e.sendBatch("orders", keyed("a", 0), keyed("a", 1), keyed("a", 2))
	got := e.pull("orders", "g", core.PullRequest{Invisible: 5 * time.Second})
	if len(got) != 3 {
		t.Fatalf("pull %v, want 3", order(got))
	}
	if n, failed, err := e.b.Extend(t.Context(), "orders", "g", []string{got[0].ReceiptHandle}, time.Minute); err != nil || n != 1 || len(failed) != 0 {
		t.Fatalf("extend: %d %v %v", n, failed, err)
	}
	clk.Advance(5 * time.Second)
	e.pullNone("orders", "g", core.PullRequest{}, "a:00 is still leased")
	clk.Advance(5 * time.Second) // a:01's suspension is over, a:00 still leased
	e.pullNone("orders", "g", core.PullRequest{}, "a:00 is still leased")
	if n, failed := e.ack("orders", "g", got[2].ReceiptHandle); n != 0 || len(failed) != 1 {
		t.Errorf("a:02's revoked handle acked: n=%d failed=%v", n, failed)
	}
	e.ackAll("orders", "g", got[:1])
	again := e.pull("orders", "g", core.PullRequest{})
	if !slices.Equal(order(again), []string{"a:01", "a:02"}) || again[0].Attempt != 2 || again[1].Attempt != 1 {
		t.Fatalf("after a:00's ack got %v, want a:01 (attempt 2) and a:02 (attempt 1)", order(again))
	}
}

// Acks of a pull's messages of a key may come in any order; the key is
// free once all are settled, and not before.
func TestOrderlyAcksOutOfOrderFreeTheKey(t *testing.T) {
	e := newEnv(t, core.Options{})
	e.putTopic("orders", 1)
	e.subscribe("orders", "g", core.SubscriptionConfig{Orderly: true})
	e.sendBatch("orders", keyed("a", 0), keyed("a", 1), keyed("a", 2))
	got := e.pull("orders", "g", core.PullRequest{})
	if len(got) != 3 {
		t.Fatalf("pull %v, want 3", order(got))
	}
	e.sendBatch("orders", keyed("a", 3))
	e.ackAll("orders", "g", got[2:])
	e.ackAll("orders", "g", got[1:2])
	e.pullNone("orders", "g", core.PullRequest{}, "a:00 is still leased")
	e.ackAll("orders", "g", got[:1])
	if d := e.pullOne("orders", "g", core.PullRequest{}); string(d.Message.Body) != "a:03" || d.Attempt != 1 {
		t.Fatalf("after all three acked got %s attempt %d, want a:03", d.Message.Body, d.Attempt)
	}
}

// A pull takes a key's messages up to its maxMessages; the next pull gets
// nothing of the key while they are leased, and the rest once they are
// acked.
func TestOrderlyPullTakesAKeyUpToItsMax(t *testing.T) {
	e := newEnv(t, core.Options{})
	e.putTopic("orders", 1)
	e.subscribe("orders", "g", core.SubscriptionConfig{Orderly: true})
	for i := range 5 {
		e.sendBatch("orders", keyed("a", i))
	}
	first := e.pull("orders", "g", core.PullRequest{MaxMessages: 3})
	if want := []string{"a:00", "a:01", "a:02"}; !slices.Equal(order(first), want) {
		t.Fatalf("first pull %v, want %v", order(first), want)
	}
	e.pullNone("orders", "g", core.PullRequest{MaxMessages: 10}, "the key's first three are leased")
	e.ackAll("orders", "g", first)
	if rest := e.pull("orders", "g", core.PullRequest{MaxMessages: 10}); !slices.Equal(order(rest), []string{"a:03", "a:04"}) {
		t.Fatalf("after the acks got %v, want [a:03 a:04]", order(rest))
	}
}

// Messages without a sharding key are ordered by queue: a pull of 256 on an
// 8-queue topic gets many of them, each queue's in offset order.
func TestOrderlyPullCarriesManyMessagesOfAQueue(t *testing.T) {
	e := newEnv(t, core.Options{})
	e.putTopic("orders", 8)
	e.subscribe("orders", "g", core.SubscriptionConfig{Orderly: true})
	msgs := make([]*core.Message, 400)
	for i := range msgs {
		msgs[i] = &core.Message{Body: fmt.Appendf(nil, "m%03d", i)}
	}
	e.sendBatch("orders", msgs...)
	got := e.pull("orders", "g", core.PullRequest{MaxMessages: 256})
	if len(got) != 256 {
		t.Fatalf("pull of 256 got %d messages", len(got))
	}
	last := map[uint32]uint64{}
	for _, d := range got {
		q := d.Message.QueueID
		if o, ok := last[q]; ok && d.Message.Offset != o+1 {
			t.Fatalf("queue %d: offset %d after %d, want consecutive", q, d.Message.Offset, o)
		}
		last[q] = d.Message.Offset
	}
	// Queues the pull did not reach still go out; nothing of one it took.
	for _, d := range e.pull("orders", "g", core.PullRequest{MaxMessages: 256}) {
		if _, ok := last[d.Message.QueueID]; ok {
			t.Fatalf("second pull got %s of queue %d, whose messages the first pull holds", d.Message.Body, d.Message.QueueID)
		}
	}
}

// A restart in the middle of a key's leased messages keeps their order:
// the leases are gone with the run, the nacked message's suspension and
// attempt are not, and the key resumes with it, then the rest.
func TestOrderlyRestartMidGroupKeepsOrder(t *testing.T) {
	clk := newClock()
	e := newEnv(t, core.Options{Now: clk.Now})
	e.putTopic("orders", 1)
	e.subscribe("orders", "g", core.SubscriptionConfig{Orderly: true, RetryDelays: []time.Duration{10 * time.Second}})
	e.sendBatch("orders", keyed("a", 0), keyed("a", 1), keyed("a", 2), keyed("a", 3), keyed("b", 0))
	got := e.pull("orders", "g", core.PullRequest{MaxMessages: 10})
	if want := []string{"a:00", "a:01", "a:02", "a:03", "b:00"}; !slices.Equal(order(got), want) {
		t.Fatalf("pull %v, want %v", order(got), want)
	}
	e.ackAll("orders", "g", got[:1])
	e.ackAll("orders", "g", got[3:4]) // a:03 acked out of order, before a:01 fails
	e.nack("orders", "g", got[1], -1, "a:01 failed")
	e.restart()
	again := e.pull("orders", "g", core.PullRequest{MaxMessages: 10})
	if !slices.Equal(order(again), []string{"b:00"}) {
		t.Fatalf("after the restart got %v, want only b:00 (a is suspended)", order(again))
	}
	e.ackAll("orders", "g", again)
	clk.Advance(10 * time.Second)
	again = e.pull("orders", "g", core.PullRequest{MaxMessages: 10})
	if !slices.Equal(order(again), []string{"a:01", "a:02"}) || again[0].Attempt != 2 || again[1].Attempt != 1 {
		t.Fatalf("after the delay got %v, want a:01 (attempt 2), a:02 (attempt 1); a:03 was acked", order(again))
	}
	// A restart while the key's messages are leased: they come again, in
	// order, from the first one not acked.
	e.ackAll("orders", "g", again[:1])
	e.restart()
	if rest := e.pull("orders", "g", core.PullRequest{MaxMessages: 10}); !slices.Equal(order(rest), []string{"a:02"}) {
		t.Fatalf("after a second restart got %v, want [a:02]", order(rest))
	} else {
		e.ackAll("orders", "g", rest)
	}
	if info := e.subInfo("orders", "g"); info.Lag != 0 {
		t.Errorf("lag %d after all acked", info.Lag)
	}
}

// After maxRetries the message goes to the DLQ and its key moves on.
func TestOrderlyDeadMessageLetsItsKeyMoveOn(t *testing.T) {
	clk := newClock()
	e := newEnv(t, core.Options{Now: clk.Now})
	e.putTopic("orders", 1)
	e.subscribe("orders", "g", core.SubscriptionConfig{Orderly: true, MaxRetries: intPtr(1), RetryDelays: []time.Duration{time.Second}})
	e.sendBatch("orders", keyed("a", 0), keyed("a", 1), keyed("a", 2))
	one := core.PullRequest{MaxMessages: 1} // the key one message at a time
	d := e.pullOne("orders", "g", one)
	e.nack("orders", "g", d, -1, "first failure")
	clk.Advance(time.Second)
	d = e.pullOne("orders", "g", one)
	if string(d.Message.Body) != "a:00" || d.Attempt != 2 {
		t.Fatalf("got %s attempt %d, want a:00 attempt 2", d.Message.Body, d.Attempt)
	}
	e.nack("orders", "g", d, -1, "second failure")
	next := e.pullOne("orders", "g", one)
	if string(next.Message.Body) != "a:01" || next.Attempt != 1 {
		t.Fatalf("after a:00 died got %s attempt %d, want a:01 at once", next.Message.Body, next.Attempt)
	}
	dead := e.listDead("orders", "g")
	if len(dead) != 1 || string(dead[0].Message.Body) != "a:00" || dead[0].Attempt != 2 || dead[0].Reason != "second failure" {
		t.Fatalf("DLQ = %+v, want a:00 attempt 2 reason \"second failure\"", dead)
	}
	// Dead-lettering by hand moves the key on as well.
	e.deadLetter("orders", "g", next, "poison")
	if d := e.pullOne("orders", "g", one); string(d.Message.Body) != "a:02" {
		t.Fatalf("after a:01 was dead-lettered got %s, want a:02", d.Message.Body)
	}
	if info := e.subInfo("orders", "g"); info.DLQ != 2 {
		t.Errorf("dlq=%d, want 2", info.DLQ)
	}
}

// A long poll parked behind a busy key is answered as soon as the key's
// head is acked (fixed in fae82ce: done() promoted the next message of
// the key but nobody woke the parked pull, which then slept until its wait
// or a lease deadline ran out).
func TestRegressionOrderlyAckWakesParkedPull(t *testing.T) {
	e := newEnv(t, core.Options{})
	e.putTopic("orders", 1)
	e.subscribe("orders", "g", core.SubscriptionConfig{Orderly: true})
	e.sendBatch("orders", keyed("a", 0), keyed("a", 1))
	head := e.pullOne("orders", "g", core.PullRequest{MaxMessages: 1, ConsumerID: "first"})
	ch := pullAsync(t.Context(), e.b, "orders", "g", core.PullRequest{Wait: 10 * time.Second, ConsumerID: "parked"})
	// The parked consumer has looked (and found a:01 held back).
	within(t, 5*time.Second, func() error {
		for _, c := range e.subInfo("orders", "g").Consumers {
			if c.ConsumerID == "parked" {
				return nil
			}
		}
		return fmt.Errorf("the long poll has not reached the broker")
	})
	select {
	case r := <-ch:
		t.Fatalf("the long poll answered while a:00 was leased: %v", bodies(r.got))
	default:
	}
	ackedAt := time.Now()
	e.ackAll("orders", "g", []core.Delivered{head})
	select {
	case r := <-ch:
		if r.err != nil || len(r.got) != 1 || string(r.got[0].Message.Body) != "a:01" {
			t.Fatalf("parked pull = %v %v, want a:01", bodies(r.got), r.err)
		}
		if d := time.Since(ackedAt); d > time.Second {
			t.Errorf("parked pull answered %v after the ack, want at once", d)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the parked pull was not answered within 5 s of the head's ack")
	}
}

// A dead-letter of a key's message in the middle of a pull moves the key on
// without a delay: the messages after it lose their leases and go out
// next, with no attempt counted, once the one before it (unaffected, still
// leased) is acked.
func TestOrderlyDeadLetterInsideAPull(t *testing.T) {
	e := newEnv(t, core.Options{})
	e.putTopic("orders", 1)
	e.subscribe("orders", "g", core.SubscriptionConfig{Orderly: true})
	e.sendBatch("orders", keyed("a", 1), keyed("a", 2), keyed("a", 3), keyed("a", 4))
	got := e.pull("orders", "g", core.PullRequest{})
	if len(got) != 4 {
		t.Fatalf("pull %v, want 4", order(got))
	}
	e.deadLetter("orders", "g", got[1], "poison")
	if n, failed := e.ack("orders", "g", got[2].ReceiptHandle); n != 0 || len(failed) != 1 || failed[0].Err != core.ErrReceiptExpired {
		t.Errorf("ack of a:03 after a:02 was dead-lettered: n=%d failed=%v, want receipt expired", n, failed)
	}
	e.pullNone("orders", "g", core.PullRequest{}, "a:01 still holds the key")
	e.ackAll("orders", "g", got[:1])
	again := e.pull("orders", "g", core.PullRequest{})
	if !slices.Equal(order(again), []string{"a:03", "a:04"}) || again[0].Attempt != 1 || again[1].Attempt != 1 {
		t.Fatalf("after the dead-letter and a:01's ack got %v, want a:03, a:04 at once, attempt 1", order(again))
	}
	e.ackAll("orders", "g", again)
	if dead := e.listDead("orders", "g"); len(dead) != 1 || string(dead[0].Message.Body) != "a:02" {
		t.Errorf("DLQ = %v, want a:02", dead)
	}
	if info := e.subInfo("orders", "g"); info.Lag != 0 || info.Inflight != 0 {
		t.Errorf("lag=%d inflight=%d after all settled", info.Lag, info.Inflight)
	}
}

// A pull released because its client went away gives its key back whole:
// the next pull gets the same messages in order, no attempt counted.
func TestOrderlyReleaseGivesTheKeyBackWhole(t *testing.T) {
	e := newEnv(t, core.Options{})
	e.putTopic("orders", 1)
	e.subscribe("orders", "g", core.SubscriptionConfig{Orderly: true})
	e.sendBatch("orders", keyed("a", 0), keyed("a", 1), keyed("a", 2))
	got := e.pull("orders", "g", core.PullRequest{})
	// Given back from the last to the first: a member behind the head
	// waits for it.
	hs := handles(got)
	slices.Reverse(hs)
	e.b.Release("orders", "g", hs)
	again := e.pull("orders", "g", core.PullRequest{})
	if !slices.Equal(order(again), []string{"a:00", "a:01", "a:02"}) {
		t.Fatalf("after the release got %v, want the key again in order", order(again))
	}
	for _, d := range again {
		if d.Attempt != 1 {
			t.Errorf("%s attempt %d, want 1: a released lease is no attempt", d.Message.Body, d.Attempt)
		}
	}
}

// The lease cap per queue bounds what a pull takes of a key, as it bounds
// a queue's outstanding messages.
func TestOrderlyPullOfAKeyStopsAtTheLeaseCap(t *testing.T) {
	e := newEnv(t, core.Options{MaxLeasesPerQueue: 3})
	e.putTopic("orders", 1)
	e.subscribe("orders", "g", core.SubscriptionConfig{Orderly: true})
	for i := range 5 {
		e.sendBatch("orders", keyed("a", i))
	}
	got := e.pull("orders", "g", core.PullRequest{MaxMessages: 10})
	if !slices.Equal(order(got), []string{"a:00", "a:01", "a:02"}) {
		t.Fatalf("pull %v, want the 3 the lease cap allows", order(got))
	}
	e.ackAll("orders", "g", got)
	if rest := e.pull("orders", "g", core.PullRequest{MaxMessages: 10}); !slices.Equal(order(rest), []string{"a:03", "a:04"}) {
		t.Fatalf("after the acks got %v, want a:03, a:04", order(rest))
	}
}

// A handle from before a restart of a message now waiting behind its key's
// head (it was one of its pull's run of the key) has no delivery: its ack
// answered success without acking anything (found by
// TestOrderlyRandomWorkload). It answers receipt_expired, and the message
// comes again after the head.
func TestRegressionOrderlyPreRestartHandleOfWaitingMessage(t *testing.T) {
	e := newEnv(t, core.Options{})
	e.putTopic("orders", 1)
	e.subscribe("orders", "g", core.SubscriptionConfig{Orderly: true})
	e.sendBatch("orders", keyed("a", 0), keyed("a", 1))
	before := e.pull("orders", "g", core.PullRequest{})
	if len(before) != 2 {
		t.Fatalf("pull %v, want 2", order(before))
	}
	e.restart()
	head := e.pullOne("orders", "g", core.PullRequest{MaxMessages: 1})
	if string(head.Message.Body) != "a:00" {
		t.Fatalf("after the restart got %s, want a:00", head.Message.Body)
	}
	// Another pull's scan passes a:01: it waits behind a:00.
	e.pullNone("orders", "g", core.PullRequest{}, "a:00 holds the key")
	if n, failed := e.ack("orders", "g", before[1].ReceiptHandle); n != 0 || len(failed) != 1 || failed[0].Err != core.ErrReceiptExpired {
		t.Fatalf("ack of a:01's handle from before the restart: n=%d failed=%v, want receipt expired", n, failed)
	}
	e.ackAll("orders", "g", []core.Delivered{head})
	if d := e.pullOne("orders", "g", core.PullRequest{}); string(d.Message.Body) != "a:01" {
		t.Fatalf("after a:00's ack got %s, want a:01", d.Message.Body)
	}
}
