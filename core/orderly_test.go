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
// delay, and the other keys keep flowing meanwhile.
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
				var ack []string
				for _, d := range got {
					key, i := parseKeyed(t, d.Message.Body)
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
	others := 0
	for _, d := range delivered {
		if d.key != "k2" && d.at.After(nackedAt) && d.at.Before(redeliveredAt) {
			others++
		}
	}
	if others == 0 {
		t.Error("no message of another key was delivered while k2 was suspended")
	}
	t.Logf("%d messages of other keys delivered during k2's %v suspension", others, redeliveredAt.Sub(nackedAt))
	if info := e.subInfo("orders", "g"); info.Lag != 0 || info.Inflight != 0 || info.DLQ != 0 || info.Retrying != 0 {
		t.Errorf("after all acked: lag=%d inflight=%d dlq=%d retrying=%d", info.Lag, info.Inflight, info.DLQ, info.Retrying)
	}
}

// A nack suspends its key alone, in the same queue too; the same message
// comes first again after the retry delay, then the rest of the key.
func TestOrderlyNackSuspendsOnlyItsKey(t *testing.T) {
	clk := newClock()
	e := newEnv(t, core.Options{Now: clk.Now})
	e.putTopic("orders", 1) // both keys share the queue
	e.subscribe("orders", "g", core.SubscriptionConfig{Orderly: true, RetryDelays: []time.Duration{10 * time.Second}})
	e.sendBatch("orders", keyed("a", 0), keyed("b", 0), keyed("a", 1), keyed("b", 1), keyed("b", 2))

	got := e.pull("orders", "g", core.PullRequest{})
	if want := []string{"a:00", "b:00"}; !slices.Equal(bodies(got), want) {
		t.Fatalf("first pull %v, want one head per key %v", bodies(got), want)
	}
	a0, b0 := got[0], got[1]
	if string(a0.Message.Body) != "a:00" {
		a0, b0 = b0, a0
	}
	e.nack("orders", "g", a0, -1, "try again")
	e.ackAll("orders", "g", []core.Delivered{b0})
	// Key b flows; key a waits, neither a:00 nor a:01 comes.
	if got := e.pull("orders", "g", core.PullRequest{}); !slices.Equal(bodies(got), []string{"b:01"}) {
		t.Fatalf("while a is suspended got %v, want [b:01]", bodies(got))
	} else {
		e.ackAll("orders", "g", got)
	}
	clk.Advance(10*time.Second - time.Millisecond)
	if got := e.pull("orders", "g", core.PullRequest{}); !slices.Equal(bodies(got), []string{"b:02"}) {
		t.Fatalf("1 ms before a's retry delay ended got %v, want [b:02]", bodies(got))
	} else {
		e.ackAll("orders", "g", got)
	}
	clk.Advance(time.Millisecond)
	again := e.pullOne("orders", "g", core.PullRequest{})
	if string(again.Message.Body) != "a:00" || again.Attempt != 2 {
		t.Fatalf("after the retry delay got %s attempt %d, want a:00 attempt 2", again.Message.Body, again.Attempt)
	}
	if again.Message.ID != a0.Message.ID || again.Message.Offset != a0.Message.Offset {
		t.Errorf("redelivery is %s@%d, want the original %s@%d", again.Message.ID, again.Message.Offset, a0.Message.ID, a0.Message.Offset)
	}
	e.pullNone("orders", "g", core.PullRequest{}, "a:01 must wait for a:00's ack")
	e.ackAll("orders", "g", []core.Delivered{again})
	if d := e.pullOne("orders", "g", core.PullRequest{}); string(d.Message.Body) != "a:01" || d.Attempt != 1 {
		t.Fatalf("after a:00 was acked got %s attempt %d, want a:01", d.Message.Body, d.Attempt)
	}
}

// A lease that runs out suspends the key for the retry delay too.
func TestOrderlyLeaseExpirySuspendsTheKey(t *testing.T) {
	clk := newClock()
	e := newEnv(t, core.Options{Now: clk.Now})
	e.putTopic("orders", 1)
	e.subscribe("orders", "g", core.SubscriptionConfig{Orderly: true, RetryDelays: []time.Duration{10 * time.Second}})
	e.sendBatch("orders", keyed("a", 0), keyed("a", 1))
	first := e.pullOne("orders", "g", core.PullRequest{Invisible: 5 * time.Second})
	clk.Advance(5 * time.Second)
	e.pullNone("orders", "g", core.PullRequest{}, "right after a:00's lease ran out (its key is suspended)")
	clk.Advance(10 * time.Second)
	d := e.pullOne("orders", "g", core.PullRequest{})
	if d.Message.ID != first.Message.ID || d.Attempt != 2 {
		t.Fatalf("after the suspension got %s attempt %d, want a:00 attempt 2", d.Message.Body, d.Attempt)
	}
	if n, failed := e.ack("orders", "g", first.ReceiptHandle); n != 0 || len(failed) != 1 {
		t.Errorf("the expired handle acked: n=%d failed=%v", n, failed)
	}
}

// After maxRetries the message goes to the DLQ and its key moves on.
func TestOrderlyDeadMessageLetsItsKeyMoveOn(t *testing.T) {
	clk := newClock()
	e := newEnv(t, core.Options{Now: clk.Now})
	e.putTopic("orders", 1)
	e.subscribe("orders", "g", core.SubscriptionConfig{Orderly: true, MaxRetries: intPtr(1), RetryDelays: []time.Duration{time.Second}})
	e.sendBatch("orders", keyed("a", 0), keyed("a", 1), keyed("a", 2))
	d := e.pullOne("orders", "g", core.PullRequest{})
	e.nack("orders", "g", d, -1, "first failure")
	clk.Advance(time.Second)
	d = e.pullOne("orders", "g", core.PullRequest{})
	if string(d.Message.Body) != "a:00" || d.Attempt != 2 {
		t.Fatalf("got %s attempt %d, want a:00 attempt 2", d.Message.Body, d.Attempt)
	}
	e.nack("orders", "g", d, -1, "second failure")
	next := e.pullOne("orders", "g", core.PullRequest{})
	if string(next.Message.Body) != "a:01" || next.Attempt != 1 {
		t.Fatalf("after a:00 died got %s attempt %d, want a:01 at once", next.Message.Body, next.Attempt)
	}
	dead := e.listDead("orders", "g")
	if len(dead) != 1 || string(dead[0].Message.Body) != "a:00" || dead[0].Attempt != 2 || dead[0].Reason != "second failure" {
		t.Fatalf("DLQ = %+v, want a:00 attempt 2 reason \"second failure\"", dead)
	}
	// Dead-lettering by hand moves the key on as well.
	e.deadLetter("orders", "g", next, "poison")
	if d := e.pullOne("orders", "g", core.PullRequest{}); string(d.Message.Body) != "a:02" {
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
	head := e.pullOne("orders", "g", core.PullRequest{ConsumerID: "first"})
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
