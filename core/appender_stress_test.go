package core_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/tidemq/tidemq/core"
)

// TestAppenderHammer runs sends (plain, batched, delayed, deduplicated, some
// with their context cancelled while they run), pulls with acks, and topic
// and subscription churn from many goroutines at once, so that the writer
// role passes between requesters, the appender goroutine and the timer
// loop all the time. Then every acknowledged send must be readable where
// its result said, every queue's offsets must run from 0 without a gap or
// a repeat, no failed send may have been stored, and every stored message
// must have been delivered.
func TestAppenderHammer(t *testing.T) {
	e := newEnv(t, core.Options{AutoCreate: true})
	ctx := t.Context()
	stable := []string{"s0", "s1"}
	for _, name := range stable {
		e.putTopic(name, 4)
		e.subscribe(name, "g", core.SubscriptionConfig{})
	}

	const senders, sendsEach = 8, 120
	type sent struct {
		topic string
		body  string
		res   core.SendResult
	}
	var (
		mu       sync.Mutex
		acked    []sent              // acknowledged, in no particular order
		failed   = map[string]bool{} // bodies of sends that returned an error
		delayed  = map[string]bool{} // bodies of acknowledged delayed sends
		firstErr error
	)
	fail := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if firstErr == nil {
			firstErr = err
		}
	}

	var senderWG, bgWG sync.WaitGroup
	stop := make(chan struct{})
	for w := range senders {
		senderWG.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for i := range sendsEach {
				topic := stable[rng.IntN(len(stable))]
				n := 1 + rng.IntN(3)
				msgs := make([]*core.Message, n)
				for j := range msgs {
					msgs[j] = &core.Message{Body: fmt.Appendf(nil, "w%d-%d-%d", w, i, j)}
				}
				isDelayed := rng.IntN(10) == 0
				if isDelayed {
					msgs[0].DeliverAtMs = time.Now().Add(time.Duration(20+rng.IntN(80)) * time.Millisecond).UnixMilli()
				}
				dedupKey := ""
				if rng.IntN(8) == 0 {
					dedupKey = fmt.Sprintf("k-%d-%d", w, i)
					msgs[n-1].DedupKey = dedupKey
				}
				sctx := ctx
				if rng.IntN(6) == 0 {
					// Cancelled while the send runs: whatever it answers
					// must be what was stored.
					c, cancel := context.WithCancel(ctx)
					sctx = c
					after := time.Duration(rng.IntN(200)) * time.Microsecond
					go func() {
						time.Sleep(after)
						cancel()
					}()
				}
				res, err := e.b.Send(sctx, topic, msgs)
				if err != nil {
					if !errors.Is(err, context.Canceled) {
						fail(fmt.Errorf("Send to %s: %w", topic, err))
						return
					}
					mu.Lock()
					for _, m := range msgs {
						failed[string(m.Body)] = true
					}
					mu.Unlock()
					continue
				}
				if len(res) != n {
					fail(fmt.Errorf("Send of %d messages returned %d results", n, len(res)))
					return
				}
				// Offsets are visible once the send is answered.
				info, err := e.b.GetTopic(topic)
				if err != nil {
					fail(err)
					return
				}
				for _, r := range res {
					if !r.Delayed && info.QueueStats[r.QueueID].MaxOffset <= r.Offset {
						fail(fmt.Errorf("%s: offset %d@%d answered before it is visible (max %d)", topic, r.QueueID, r.Offset, info.QueueStats[r.QueueID].MaxOffset))
						return
					}
				}
				mu.Lock()
				for j, m := range msgs {
					if res[j].Delayed {
						delayed[string(m.Body)] = true
					} else {
						acked = append(acked, sent{topic, string(m.Body), res[j]})
					}
				}
				mu.Unlock()
				if dedupKey != "" {
					// The same key again stores nothing and answers the first result.
					again, err := e.b.Send(ctx, topic, []*core.Message{{Body: []byte("dup-" + dedupKey), DedupKey: dedupKey}})
					if err != nil {
						fail(fmt.Errorf("repeated dedup send: %w", err))
						return
					}
					if want := res[n-1]; !again[0].Duplicate || again[0].MessageID != want.MessageID || again[0].Offset != want.Offset {
						fail(fmt.Errorf("repeated dedup send answered %+v, first was %+v", again[0], want))
						return
					}
				}
			}
		})
	}

	// Consumers: pull and ack, their writes queued under the subscription's
	// lock (the appender goroutine's path), racing the sends.
	type where struct {
		topic  string
		queue  uint32
		offset uint64
	}
	delivered := map[where]bool{}
	consume := func(topic string, wait time.Duration) (int, error) {
		ds, err := e.b.Pull(ctx, topic, "g", core.PullRequest{MaxMessages: 16, Wait: wait})
		if err != nil || len(ds) == 0 {
			return 0, err
		}
		mu.Lock()
		for _, d := range ds {
			delivered[where{topic, d.Message.QueueID, d.Message.Offset}] = true
		}
		mu.Unlock()
		n, bad, err := e.b.Ack(ctx, topic, "g", handles(ds))
		if err == nil && (n != len(ds) || len(bad) != 0) {
			err = fmt.Errorf("acked %d of %d, failed %v", n, len(ds), bad)
		}
		return len(ds), err
	}
	for c := range 2 {
		bgWG.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := consume(stable[(c+i)%len(stable)], 5*time.Millisecond); err != nil {
					fail(fmt.Errorf("consumer: %w", err))
					return
				}
			}
		})
	}

	// Admin churn: topics and subscriptions created and deleted while
	// other goroutines send to them; each admin write is a batch of its own.
	notFound := func(err error) bool {
		return err == nil || errors.Is(err, core.ErrTopicNotFound) || errors.Is(err, core.ErrSubscriptionNotFound)
	}
	bgWG.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			name := fmt.Sprintf("churn%d", i%3)
			if _, _, err := e.b.PutTopic(ctx, name, core.TopicConfig{Queues: 2 + i%2}); err != nil && !errors.Is(err, core.ErrQueueCountDecrease) {
				fail(fmt.Errorf("PutTopic(%s): %w", name, err))
				return
			}
			if _, _, err := e.b.PutSubscription(ctx, name, "g", core.SubscriptionConfig{}); !notFound(err) {
				fail(fmt.Errorf("PutSubscription(%s): %w", name, err))
				return
			}
			if err := e.b.DeleteSubscription(ctx, name, "g"); !notFound(err) {
				fail(fmt.Errorf("DeleteSubscription(%s): %w", name, err))
				return
			}
			if err := e.b.DeleteTopic(ctx, name); !notFound(err) {
				fail(fmt.Errorf("DeleteTopic(%s): %w", name, err))
				return
			}
			if i == 20 {
				// A stable topic grows while sends spread over it.
				if _, _, err := e.b.PutTopic(ctx, "s0", core.TopicConfig{Queues: 6}); err != nil {
					fail(fmt.Errorf("growing s0: %w", err))
					return
				}
			}
		}
	})
	for w := range 2 {
		bgWG.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				name := fmt.Sprintf("churn%d", (w+i)%3)
				if _, err := e.b.Send(ctx, name, []*core.Message{{Body: []byte("x")}}); !notFound(err) {
					fail(fmt.Errorf("Send to %s: %w", name, err))
					return
				}
			}
		})
	}

	senderWG.Wait()
	close(stop)
	bgWG.Wait()
	if firstErr != nil {
		t.Fatal(firstErr)
	}

	// Delayed messages get their offsets when the timer loop appends them.
	want := map[string]int{}
	for _, s := range acked {
		want[s.topic]++
	}
	nDelayed := len(delayed)
	deadline := time.Now().Add(20 * time.Second)
	for {
		stored := 0
		for _, name := range stable {
			stored += int(e.topicInfo(name).Messages)
		}
		if stored == len(acked)+nDelayed {
			break
		}
		if stored > len(acked)+nDelayed || time.Now().After(deadline) {
			t.Fatalf("%d messages stored, want %d acknowledged + %d delayed", stored, len(acked), nDelayed)
		}
		time.Sleep(20 * time.Millisecond)
	}

	// Read every queue back from offset 0.
	byPos := map[where]string{}
	seen := map[string]bool{}
	for _, name := range stable {
		info := e.topicInfo(name)
		for qi, qs := range info.QueueStats {
			if qs.MinOffset != 0 {
				t.Fatalf("%s queue %d starts at %d", name, qi, qs.MinOffset)
			}
			var next uint64
			var cursor *core.QueryCursor
			for {
				q := core.Query{QueueID: &qi, Offset: new(uint64), Limit: 500, Cursor: cursor}
				ms, c, err := e.b.QueryMessages(ctx, name, q)
				if err != nil {
					t.Fatalf("QueryMessages(%s, queue %d): %v", name, qi, err)
				}
				for _, m := range ms {
					if int(m.QueueID) != qi || m.Offset != next {
						t.Fatalf("%s queue %d: read %d@%d, want offset %d (a gap or a repeat)", name, qi, m.QueueID, m.Offset, next)
					}
					next++
					body := string(m.Body)
					if seen[body] {
						t.Fatalf("%s: body %q stored twice", name, body)
					}
					seen[body] = true
					byPos[where{name, m.QueueID, m.Offset}] = body
				}
				if c == nil {
					break
				}
				cursor = c
			}
			if next != qs.MaxOffset {
				t.Fatalf("%s queue %d: read offsets 0-%d, the queue ends at %d", name, qi, next, qs.MaxOffset)
			}
		}
	}
	for _, s := range acked {
		got, ok := byPos[where{s.topic, uint32(s.res.QueueID), s.res.Offset}]
		if !ok || got != s.body {
			t.Fatalf("%s: acknowledged %q at %d@%d, read %q there", s.topic, s.body, s.res.QueueID, s.res.Offset, got)
		}
	}
	for body := range delayed {
		if !seen[body] {
			t.Fatalf("delayed %q was acknowledged and never stored", body)
		}
	}
	for body := range failed {
		if seen[body] {
			t.Fatalf("%q was stored, but its send failed", body)
		}
	}

	// Whatever the consumers did not get is still there for them.
	for _, name := range stable {
		for {
			n, err := consume(name, 0)
			if err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				break
			}
		}
	}
	for w := range byPos {
		if !delivered[w] {
			t.Fatalf("%s %d@%d was stored and never delivered", w.topic, w.queue, w.offset)
		}
	}
	t.Logf("%d sends acknowledged (%d delayed), %d failed on cancellation, %d deliveries", len(acked), nDelayed, len(failed), len(delivered))
}

// TestAppenderCloseUnderLoad closes the broker while many goroutines send:
// each send is either refused with ErrClosed or acknowledged, and every
// acknowledged one is there after a restart.
func TestAppenderCloseUnderLoad(t *testing.T) {
	e := newEnv(t, core.Options{})
	e.putTopic("t", 4)
	b := e.b
	var mu sync.Mutex
	acked := map[string]core.SendResult{}
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Go(func() {
			for i := 0; ; i++ {
				body := fmt.Sprintf("w%d-%d", w, i)
				res, err := b.Send(context.Background(), "t", []*core.Message{{Body: []byte(body)}})
				if errors.Is(err, core.ErrClosed) {
					return
				}
				if err != nil {
					t.Errorf("Send: %v", err)
					return
				}
				mu.Lock()
				acked[body] = res[0]
				mu.Unlock()
			}
		})
	}
	time.Sleep(50 * time.Millisecond)
	// Writers of every kind are on their way while Close runs.
	wg.Go(func() {
		if _, _, err := b.PutTopic(context.Background(), "other", core.TopicConfig{}); err != nil && !errors.Is(err, core.ErrClosed) {
			t.Errorf("PutTopic: %v", err)
		}
	})
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	e.restart()
	if len(acked) == 0 {
		t.Fatal("nothing was acknowledged before Close")
	}
	info := e.topicInfo("t")
	if info.Messages != int64(len(acked)) {
		t.Fatalf("%d messages after restart, %d were acknowledged", info.Messages, len(acked))
	}
	for body, r := range acked {
		q := r.QueueID
		off := r.Offset
		ms, _, err := e.b.QueryMessages(t.Context(), "t", core.Query{QueueID: &q, Offset: &off, Limit: 1})
		if err != nil || len(ms) != 1 || string(ms[0].Body) != body {
			t.Fatalf("acknowledged %q at %d@%d; after restart: %v %v", body, q, off, ms, err)
		}
	}
}
