package core_test

import (
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tidemq/tidemq/core"
)

func TestRestartKeepsTopicsSubscriptionsAndPositions(t *testing.T) {
	clk := newClock()
	e := newEnv(t, core.Options{Now: clk.Now})
	ctx := t.Context()
	e.putTopic("orders", 1)
	if _, _, err := e.b.PutTopic(ctx, "events", core.TopicConfig{Queues: 3, RetentionHours: 48}); err != nil {
		t.Fatal(err)
	}
	seven := 7
	e.subscribe("orders", "g", core.SubscriptionConfig{})
	e.subscribe("events", "tagged", core.SubscriptionConfig{
		Filter: "TagA || TagB", MaxRetries: &seven, RetryDelays: []time.Duration{time.Second, time.Minute},
	})
	e.send("orders", numbered("m", 6)...)
	for i := range 9 {
		e.sendBatch("events", &core.Message{Body: fmt.Appendf(nil, "e%d", i), Tag: []string{"TagA", "TagB", "TagC"}[i%3]})
		clk.Advance(time.Second)
	}

	got := e.pull("orders", "g", core.PullRequest{MaxMessages: 6})
	if len(got) != 6 {
		t.Fatalf("pulled %d, want 6", len(got))
	}
	h := map[uint64]string{}
	for _, d := range got {
		h[d.Message.Offset] = d.ReceiptHandle
	}
	// Out of order: 2 and 4 first, then 0 and 1; 3 and 5 stay unacked.
	e.ack("orders", "g", h[2])
	e.ack("orders", "g", h[4])
	e.ack("orders", "g", h[0], h[1])
	tagged := e.drain("events", "tagged", core.PullRequest{MaxMessages: 2})
	if len(tagged) != 6 {
		t.Fatalf("tagged group pulled %d, want 6", len(tagged))
	}
	e.ackAll("events", "tagged", tagged[:4])

	topicsBefore := e.b.ListTopics()
	subsBefore := map[string]core.SubscriptionInfo{
		"g": e.subInfo("orders", "g"), "tagged": e.subInfo("events", "tagged"),
	}
	if q := subsBefore["g"].Queues[0]; q.AckedOffset != 3 {
		t.Fatalf("acked offset %d before restart, want 3", q.AckedOffset)
	}

	e.restart()

	if topicsAfter := e.b.ListTopics(); !reflect.DeepEqual(topicsAfter, topicsBefore) {
		t.Errorf("topics changed across restart:\nbefore %+v\nafter  %+v", topicsBefore, topicsAfter)
	}
	for group, before := range subsBefore {
		after := e.subInfo(before.Topic, group)
		if !reflect.DeepEqual(after.Config, before.Config) || !after.CreatedAt.Equal(before.CreatedAt) {
			t.Errorf("%s config changed across restart:\nbefore %+v\nafter  %+v", group, before.Config, after.Config)
		}
	}
	// Acked offsets hold across restart. (Where a filter skipped messages
	// the in-memory position may be ahead of the durable one; see
	// TestRegressionLagAfterRestart.)
	if q := e.subInfo("orders", "g").Queues[0]; q.AckedOffset != 3 || q.MaxOffset != 6 || q.Inflight != 0 {
		t.Errorf("orders/g queue after restart %+v, want acked 3, max 6, nothing in flight", q)
	}

	// Acked messages, in order or not, stay acked; unacked ones come again.
	again := e.drain("orders", "g", core.PullRequest{})
	if got := positions(again); !slices.Equal(got, []pos{{0, 3}, {0, 5}}) {
		t.Errorf("after restart orders/g delivered %v, want [0@3 0@5]", got)
	}
	taggedAgain := e.drain("events", "tagged", core.PullRequest{})
	if want := bodies(tagged[4:]); !slices.Equal(bodies(taggedAgain), want) {
		t.Errorf("after restart events/tagged delivered %v, want %v", bodies(taggedAgain), want)
	}

	// Offsets continue where they were.
	if r := e.send("orders", "next"); r[0].Offset != 6 {
		t.Errorf("first send after restart got offset %d, want 6", r[0].Offset)
	}
	e.ackAll("orders", "g", again)
	e.ackAll("events", "tagged", taggedAgain)
	e.ackAll("orders", "g", e.drain("orders", "g", core.PullRequest{}))

	e.restart()
	for _, s := range [][2]string{{"orders", "g"}, {"events", "tagged"}} {
		if rest := e.drain(s[0], s[1], core.PullRequest{}); len(rest) != 0 {
			t.Errorf("%s/%s: %d acked messages delivered again after the second restart", s[0], s[1], len(rest))
		}
		if info := e.subInfo(s[0], s[1]); info.Lag != 0 {
			t.Errorf("%s/%s: lag %d after acking everything", s[0], s[1], info.Lag)
		}
	}
}

func TestRestartManyOutOfOrderAcks(t *testing.T) {
	e := newEnv(t, core.Options{})
	e.putTopic("orders", 2)
	e.subscribe("orders", "g", core.SubscriptionConfig{})
	e.send("orders", numbered("m", 300)...)
	got := e.drain("orders", "g", core.PullRequest{MaxMessages: 100})
	if len(got) != 300 {
		t.Fatalf("pulled %d", len(got))
	}
	// Ack every message whose number is not a multiple of 7, newest first.
	var acked []core.Delivered
	var want []string
	for i := len(got) - 1; i >= 0; i-- {
		var n int
		fmt.Sscanf(string(got[i].Message.Body), "m%d", &n)
		if n%7 == 0 {
			want = append(want, string(got[i].Message.Body))
			continue
		}
		acked = append(acked, got[i])
	}
	for c := range slices.Chunk(acked, 13) {
		e.ackAll("orders", "g", c)
	}
	slices.Sort(want)
	e.restart()
	if again := bodies(e.drain("orders", "g", core.PullRequest{})); !slices.Equal(again, want) {
		t.Errorf("after restart delivered %d messages %v,\nwant the %d unacked %v", len(again), again, len(want), want)
	}
}

func TestAckWithHandleFromBeforeRestart(t *testing.T) {
	e := newEnv(t, core.Options{})
	e.putTopic("orders", 1)
	e.subscribe("orders", "g", core.SubscriptionConfig{})
	e.send("orders", "a", "b", "c")
	old := e.pull("orders", "g", core.PullRequest{})
	if len(old) != 3 {
		t.Fatalf("pulled %d", len(old))
	}
	e.restart()

	// Nobody got "b" since the restart: its old handle still acks it.
	n, failed := e.ack("orders", "g", old[1].ReceiptHandle)
	if n != 1 || len(failed) != 0 {
		t.Fatalf("pre-restart handle: acked=%d failed=%v, want 1", n, failed)
	}
	again := e.drain("orders", "g", core.PullRequest{})
	if got := bodies(again); !slices.Equal(got, []string{"a", "c"}) {
		t.Fatalf("after acking b with its old handle, delivered %v, want [a c]", got)
	}
	// "a" was handed out again: its old handle is expired now.
	n, failed = e.ack("orders", "g", old[0].ReceiptHandle)
	if n != 0 || len(failed) != 1 || !errors.Is(failed[0].Err, core.ErrReceiptExpired) {
		t.Errorf("pre-restart handle of a redelivered message: acked=%d failed=%v, want receipt expired", n, failed)
	}
	e.ackAll("orders", "g", again)
	if info := e.subInfo("orders", "g"); info.Lag != 0 || info.Queues[0].AckedOffset != 3 {
		t.Errorf("lag=%d acked=%d, want 0 and 3", info.Lag, info.Queues[0].AckedOffset)
	}
	// The late ack was made durable too.
	e.restart()
	if rest := e.drain("orders", "g", core.PullRequest{}); len(rest) != 0 {
		t.Errorf("delivered %v after everything was acked", bodies(rest))
	}
}

// A crash clone of the FS holds exactly what was synced: every send and ack
// that returned before the clone was taken must be in it.
func TestCrashKeepsAcknowledgedSendsAndAcks(t *testing.T) {
	fs := vfs.NewCrashableMem()
	e := newEnvOn(t, fs, core.Options{})
	e.putTopic("orders", 4)
	e.subscribe("orders", "g", core.SubscriptionConfig{})

	// Consumer state first: 10 messages, 5 of them acked.
	e.send("orders", numbered("early", 10)...)
	got := e.pull("orders", "g", core.PullRequest{MaxMessages: 10})
	if len(got) != 10 {
		t.Fatalf("pulled %d", len(got))
	}
	e.ackAll("orders", "g", got[:5])

	// Producers keep sending while clones are taken. Each acknowledged send
	// is handed to this goroutine, so a snapshot holds only sends that had
	// returned before the clone.
	sent := make(chan string)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for p := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				res, err := e.b.Send(t.Context(), "orders", []*core.Message{{Body: fmt.Appendf(nil, "p%d-%d", p, i)}})
				if err != nil {
					t.Error(err)
					return
				}
				select {
				case sent <- res[0].MessageID:
				case <-stop:
					return
				}
			}
		})
	}
	type checkpoint struct {
		fs   vfs.FS
		sent map[string]bool
	}
	var checkpoints []checkpoint
	acked := map[string]bool{}
	for len(checkpoints) < 3 {
		acked[<-sent] = true
		if len(acked)%60 == 0 {
			checkpoints = append(checkpoints, checkpoint{fs.CrashClone(vfs.CrashCloneCfg{}), maps.Clone(acked)})
		}
	}
	close(stop)
	wg.Wait()

	for i, cp := range checkpoints {
		c := newEnvOn(t, cp.fs, core.Options{})
		c.subscribe("orders", "audit", core.SubscriptionConfig{StartFrom: "earliest"})
		ids := map[string]bool{}
		for _, d := range c.drain("orders", "audit", core.PullRequest{MaxMessages: 500}) {
			ids[d.Message.ID] = true
		}
		lost := 0
		for id := range cp.sent {
			if !ids[id] {
				lost++
			}
		}
		if lost > 0 {
			t.Errorf("checkpoint %d: %d of %d acknowledged sends missing after the crash", i, lost, len(cp.sent))
		}
		// The 5 acked messages stay acked, the other 5 come again.
		var early []string
		for _, d := range c.drain("orders", "g", core.PullRequest{MaxMessages: 500}) {
			if b := string(d.Message.Body); len(b) > 5 && b[:5] == "early" {
				early = append(early, b)
			}
		}
		slices.Sort(early)
		if want := bodies(got[5:]); !slices.Equal(early, want) {
			t.Errorf("checkpoint %d: group g got %v of the early messages, want the unacked %v", i, early, want)
		}
		c.close()
	}
}
