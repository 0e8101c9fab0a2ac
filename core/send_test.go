package core_test

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/tidemq/tidemq/core"
)

// checkGapFree fails unless the offsets of each queue are exactly 0..n-1,
// and returns how many messages each queue got.
func checkGapFree(t *testing.T, res []core.SendResult) map[int]int {
	t.Helper()
	perQueue := map[int][]uint64{}
	for _, r := range res {
		perQueue[r.QueueID] = append(perQueue[r.QueueID], r.Offset)
	}
	counts := map[int]int{}
	for q, offs := range perQueue {
		slices.Sort(offs)
		for i, o := range offs {
			if o != uint64(i) {
				t.Fatalf("queue %d offsets %v: not 0,1,2,… without gaps or repeats", q, offs)
			}
		}
		counts[q] = len(offs)
	}
	return counts
}

func TestSendOffsetsAreGapFreePerQueue(t *testing.T) {
	e := newEnv(t, core.Options{})
	e.putTopic("orders", 4)
	var res []core.SendResult
	res = append(res, e.send("orders", numbered("single-", 30)...)...)
	for b := range 5 {
		var msgs []*core.Message
		for i := range 10 {
			msgs = append(msgs, &core.Message{Body: fmt.Appendf(nil, "batch-%d-%d", b, i)})
		}
		res = append(res, e.sendBatch("orders", msgs...)...)
	}
	// Concurrent producers share the queues and still leave no gap.
	var mu sync.Mutex
	var wg sync.WaitGroup
	for p := range 4 {
		wg.Go(func() {
			for i := range 25 {
				r, err := e.b.Send(t.Context(), "orders", []*core.Message{{Body: fmt.Appendf(nil, "p%d-%d", p, i)}})
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				res = append(res, r...)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(res) != 180 {
		t.Fatalf("%d results, want 180", len(res))
	}
	counts := checkGapFree(t, res)
	for _, q := range e.topicInfo("orders").QueueStats {
		if q.MaxOffset != uint64(counts[q.QueueID]) {
			t.Errorf("queue %d MaxOffset %d, but %d messages were sent to it", q.QueueID, q.MaxOffset, counts[q.QueueID])
		}
	}
	ids := map[string]bool{}
	for _, r := range res {
		if r.MessageID == "" || ids[r.MessageID] {
			t.Fatalf("message id %q empty or repeated", r.MessageID)
		}
		ids[r.MessageID] = true
	}
}

func TestSendBatchIsContiguousInRequestOrder(t *testing.T) {
	e := newEnv(t, core.Options{})
	e.putTopic("orders", 1)
	e.send("orders", "first")
	var msgs []*core.Message
	for i := range 5 {
		msgs = append(msgs, &core.Message{Body: fmt.Appendf(nil, "m%d", i)})
	}
	for i, r := range e.sendBatch("orders", msgs...) {
		if r.QueueID != 0 || r.Offset != uint64(i+1) {
			t.Errorf("result %d = queue %d offset %d, want queue 0 offset %d", i, r.QueueID, r.Offset, i+1)
		}
	}
}

func TestSendShardingKeyPinsQueue(t *testing.T) {
	e := newEnv(t, core.Options{})
	e.putTopic("orders", 8)
	queueOf := map[string]int{}
	lastOffset := map[string]int64{}
	for round := range 5 {
		for k := range 20 {
			key := fmt.Sprintf("order-%d", k)
			r := e.sendBatch("orders", &core.Message{Body: fmt.Appendf(nil, "%s/%d", key, round), ShardingKey: key})[0]
			if q, ok := queueOf[key]; ok && q != r.QueueID {
				t.Fatalf("key %s went to queue %d, then %d", key, q, r.QueueID)
			}
			queueOf[key] = r.QueueID
			if last, ok := lastOffset[key]; ok && int64(r.Offset) <= last {
				t.Fatalf("key %s: offset %d after %d", key, r.Offset, last)
			}
			lastOffset[key] = int64(r.Offset)
		}
	}
	used := map[int]bool{}
	for _, q := range queueOf {
		used[q] = true
	}
	if len(used) < 2 {
		t.Errorf("20 keys all hashed to queues %v: sharding does not spread", slices.Collect(maps.Keys(used)))
	}
}

func TestSendWithoutKeyRoundRobins(t *testing.T) {
	e := newEnv(t, core.Options{})
	e.putTopic("orders", 8)
	counts := map[int]int{}
	for _, r := range e.send("orders", numbered("m", 80)...) {
		counts[r.QueueID]++
	}
	for q := range 8 {
		if counts[q] != 10 {
			t.Errorf("queue %d got %d of 80 messages, want 10 each: %v", q, counts[q], counts)
		}
	}
	// One batch spreads too.
	var msgs []*core.Message
	for range 16 {
		msgs = append(msgs, &core.Message{Body: []byte("b")})
	}
	counts = map[int]int{}
	for _, r := range e.sendBatch("orders", msgs...) {
		counts[r.QueueID]++
	}
	if len(counts) != 8 {
		t.Errorf("a batch of 16 used %d queues, want 8: %v", len(counts), counts)
	}
}

func TestSendBatchWithBadEntryStoresNothing(t *testing.T) {
	e := newEnv(t, core.Options{})
	e.putTopic("orders", 2)
	e.send("orders", "kept")

	tooManyKeys := make([]string, core.MaxKeys+1)
	for i := range tooManyKeys {
		tooManyKeys[i] = fmt.Sprint("k", i)
	}
	for _, tc := range []struct {
		name  string
		bad   core.Message
		field string
	}{
		{"tag with bar", core.Message{Tag: "Tag|A"}, "/tag"},
		{"tag with space", core.Message{Tag: "Tag A"}, "/tag"},
		{"tag with tab", core.Message{Tag: "Tag\tA"}, "/tag"},
		{"tag too long", core.Message{Tag: strings.Repeat("t", core.MaxTagLen+1)}, "/tag"},
		{"33 keys", core.Message{Keys: tooManyKeys}, "/keys"},
		{"empty key", core.Message{Keys: []string{"a", ""}}, "/keys/1"},
		{"key too long", core.Message{Keys: []string{strings.Repeat("k", core.MaxKeyLen+1)}}, "/keys/0"},
		{"sharding key too long", core.Message{ShardingKey: strings.Repeat("s", core.MaxShardingLen+1)}, "/shardingKey"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, at := range []int{0, 2, 4} {
				msgs := make([]*core.Message, 5)
				for i := range msgs {
					msgs[i] = &core.Message{Body: []byte("ok"), Tag: "TagA", Keys: []string{"k"}}
				}
				bad := tc.bad
				bad.Body = []byte("bad")
				msgs[at] = &bad
				// Core names the bad message by its index and the field
				// relative to it; the gateway builds "/messages/<i>/tag".
				_, err := e.b.Send(t.Context(), "orders", msgs)
				wantValidation(t, err, tc.field, at)
			}
			// Alone, the same message is entry 0 of a one-message send.
			bad := tc.bad
			_, err := e.b.Send(t.Context(), "orders", []*core.Message{&bad})
			wantValidation(t, err, tc.field, 0)
			if info := e.topicInfo("orders"); info.Messages != 1 {
				t.Errorf("topic holds %d messages after refused sends, want 1", info.Messages)
			}
		})
	}
	// The limits themselves are allowed.
	e.sendBatch("orders", &core.Message{
		Tag: strings.Repeat("t", core.MaxTagLen), Keys: tooManyKeys[:core.MaxKeys],
		ShardingKey: strings.Repeat("s", core.MaxShardingLen),
	})
}

func TestSendMessageTooLarge(t *testing.T) {
	e := newEnv(t, core.Options{MaxMessageBytes: 1024})
	e.putTopic("orders", 1)
	_, err := e.b.Send(t.Context(), "orders", []*core.Message{{Body: make([]byte, 1025)}})
	wantErr(t, err, core.ErrMessageTooLarge)
	_, err = e.b.Send(t.Context(), "orders", []*core.Message{{Body: []byte("small")}, {Body: make([]byte, 1025)}})
	wantErr(t, err, core.ErrMessageTooLarge)
	if n := e.topicInfo("orders").Messages; n != 0 {
		t.Fatalf("%d messages stored after refused sends", n)
	}
	e.sendBatch("orders", &core.Message{Body: make([]byte, 1024)})
}

func TestSendBatchSizeLimits(t *testing.T) {
	e := newEnv(t, core.Options{})
	e.putTopic("orders", 1)
	_, err := e.b.Send(t.Context(), "orders", nil)
	wantValidation(t, err, "/messages", -1)
	msgs := make([]*core.Message, core.MaxBatchMessages+1)
	for i := range msgs {
		msgs[i] = &core.Message{Body: []byte("x")}
	}
	_, err = e.b.Send(t.Context(), "orders", msgs)
	wantValidation(t, err, "/messages", -1)
	checkGapFree(t, e.sendBatch("orders", msgs[:core.MaxBatchMessages]...))
	if n := e.topicInfo("orders").Messages; n != core.MaxBatchMessages {
		t.Errorf("%d messages stored, want %d", n, core.MaxBatchMessages)
	}
}

func TestSendToMissingTopic(t *testing.T) {
	t.Run("auto-create off", func(t *testing.T) {
		e := newEnv(t, core.Options{})
		_, err := e.b.Send(t.Context(), "missing", []*core.Message{{Body: []byte("x")}})
		wantErr(t, err, core.ErrTopicNotFound)
		if n := len(e.b.ListTopics()); n != 0 {
			t.Errorf("%d topics exist after a refused send", n)
		}
	})
	t.Run("auto-create on", func(t *testing.T) {
		e := newEnv(t, core.Options{AutoCreate: true})
		res := e.send("fresh", "x")
		info := e.topicInfo("fresh")
		if info.Queues != core.DefaultQueues || info.RetentionHours != core.DefaultRetentionHours || info.Messages != 1 {
			t.Errorf("auto-created topic %+v, want defaults holding 1 message", info)
		}
		if res[0].QueueID >= core.DefaultQueues {
			t.Errorf("queue %d out of range", res[0].QueueID)
		}
	})
}

func TestSendThenPullReturnsEveryField(t *testing.T) {
	clk := newClock()
	e := newEnv(t, core.Options{Now: clk.Now})
	e.putTopic("orders", 2)
	e.subscribe("orders", "g", core.SubscriptionConfig{})

	sent := []*core.Message{
		{
			Body: []byte("hello"), Tag: "TagA", Keys: []string{"order-1001", "customer-7"},
			Properties: map[string]string{"region": "hz", "empty": ""}, ShardingKey: "order-1001",
			ProducerGroup: "checkout", Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
			BornAtMs: clk.Now().Add(-3e9).UnixMilli(),
		},
		{Body: bytes.Repeat([]byte("compressible payload "), 1000)}, // > 4 KiB: stored compressed
		{Body: []byte{0, 1, 2, 0xff, 0xfe}, BodyBase64: true},
		{Body: []byte{}},
	}
	want := make([]core.Message, len(sent))
	for i, m := range sent {
		want[i] = *m
		want[i].Keys = slices.Clone(m.Keys)
		want[i].Properties = maps.Clone(m.Properties)
		want[i].Body = bytes.Clone(m.Body)
	}
	res := e.sendBatch("orders", sent...)
	byID := map[string]int{}
	for i, r := range res {
		byID[r.MessageID] = i
		if !r.StoredAt.Equal(clk.Now()) {
			t.Errorf("result %d StoredAt %v, want the clock's %v", i, r.StoredAt, clk.Now())
		}
	}

	got := e.drain("orders", "g", core.PullRequest{})
	if len(got) != len(sent) {
		t.Fatalf("pulled %d, want %d", len(got), len(sent))
	}
	for _, d := range got {
		i, ok := byID[d.Message.ID]
		if !ok {
			t.Fatalf("pulled unknown message id %q", d.Message.ID)
		}
		w, m := want[i], d.Message
		if d.Topic != "orders" || d.Attempt != 1 || d.ReceiptHandle == "" {
			t.Errorf("message %d: topic=%q attempt=%d handle=%q", i, d.Topic, d.Attempt, d.ReceiptHandle)
		}
		if !bytes.Equal(m.Body, w.Body) {
			t.Errorf("message %d: body of %d bytes differs from the %d sent", i, len(m.Body), len(w.Body))
		}
		if m.BodyBase64 != w.BodyBase64 || m.Tag != w.Tag || !slices.Equal(m.Keys, w.Keys) ||
			!maps.Equal(m.Properties, w.Properties) || m.ShardingKey != w.ShardingKey ||
			m.ProducerGroup != w.ProducerGroup || m.Traceparent != w.Traceparent || m.BornAtMs != w.BornAtMs {
			t.Errorf("message %d came back as %+v, sent %+v", i, m, w)
		}
		if m.QueueID != uint32(res[i].QueueID) || m.Offset != res[i].Offset || m.StoredAtMs != clk.Now().UnixMilli() {
			t.Errorf("message %d at %d@%d stored %d, send said %d@%d", i, m.QueueID, m.Offset, m.StoredAtMs, res[i].QueueID, res[i].Offset)
		}
	}
}
