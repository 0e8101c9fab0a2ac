package core_test

import (
	"slices"
	"testing"
	"time"

	"github.com/tidemq/tidemq/core"
)

// Seek / rewind (SPEC §2, MetaQ 消息回溯).

func TestSeekToATime(t *testing.T) {
	clk := newClock()
	e := newEnv(t, core.Options{Now: clk.Now})
	e.putTopic("orders", 4)
	e.subscribe("orders", "g", core.SubscriptionConfig{})
	start := clk.Now()
	e.send("orders", numbered("a", 8)...)
	clk.Advance(time.Minute)
	bPerQueue := map[int]int64{}
	for _, r := range e.send("orders", numbered("b", 10)...) {
		bPerQueue[r.QueueID]++
	}
	e.ackAll("orders", "g", e.drain("orders", "g", core.PullRequest{MaxMessages: 5}))
	between := start.Add(30 * time.Second).Format(time.RFC3339Nano)

	seek := func(to string, dryRun bool) core.SeekResult {
		t.Helper()
		res, err := e.b.Seek(t.Context(), "orders", "g", to, "", dryRun)
		if err != nil {
			t.Fatalf("Seek(%s, dryRun=%v): %v", to, dryRun, err)
		}
		return res
	}
	checkCounts := func(res core.SeekResult, want map[int]int64) {
		t.Helper()
		var total int64
		for _, q := range res.Queues {
			total += want[q.QueueID]
			if q.Count != want[q.QueueID] {
				t.Errorf("queue %d: %d to deliver again, want %d", q.QueueID, q.Count, want[q.QueueID])
			}
		}
		if len(res.Queues) != 4 || res.Total != total {
			t.Errorf("seek result %+v, want 4 queues totalling %d", res, total)
		}
	}

	dry := seek(between, true)
	checkCounts(dry, bPerQueue)
	e.pullNone("orders", "g", core.PullRequest{}, "a dry run moves nothing")
	if lag := e.subInfo("orders", "g").Lag; lag != 0 {
		t.Errorf("lag %d after a dry run, want 0", lag)
	}

	checkCounts(seek(between, false), bPerQueue)
	if lag := e.subInfo("orders", "g").Lag; lag != 10 {
		t.Errorf("lag %d after seeking back over batch b, want 10", lag)
	}
	got := e.drain("orders", "g", core.PullRequest{MaxMessages: 100})
	if !slices.Equal(bodies(got), numbered("b", 10)) {
		t.Fatalf("after seeking between the batches delivered %v, want batch b %v", bodies(got), numbered("b", 10))
	}
	for _, d := range got {
		if d.Attempt != 1 {
			t.Errorf("%s delivered again with attempt %d, want 1 (a fresh delivery)", d.Message.Body, d.Attempt)
		}
	}
	e.ackAll("orders", "g", got)

	// Earliest: every retained message; durable across a restart.
	if res := seek("earliest", true); res.Total != 18 {
		t.Errorf("dry run to earliest: total %d, want 18", res.Total)
	}
	seek("earliest", false)
	e.restart()
	all := e.drain("orders", "g", core.PullRequest{MaxMessages: 100})
	if want := append(numbered("a", 8), numbered("b", 10)...); !slices.Equal(bodies(all), want) {
		t.Fatalf("after seeking to earliest and a restart delivered %v, want all 18", bodies(all))
	}
	e.ackAll("orders", "g", all)

	// Latest skips a backlog.
	e.send("orders", "c0", "c1", "c2")
	if res := seek("latest", false); res.Total != 0 {
		t.Errorf("seek to latest: total %d, want 0 to deliver again", res.Total)
	}
	e.pullNone("orders", "g", core.PullRequest{}, "the backlog skipped by seeking to latest")
	if lag := e.subInfo("orders", "g").Lag; lag != 0 {
		t.Errorf("lag %d after seeking to latest, want 0", lag)
	}
	e.send("orders", "d0")
	if got := e.drain("orders", "g", core.PullRequest{}); !slices.Equal(bodies(got), []string{"d0"}) {
		t.Errorf("after seeking to latest delivered %v, want only the new [d0]", bodies(got))
	}

	_, err := e.b.Seek(t.Context(), "orders", "g", "yesterday", "", true)
	wantValidation(t, err, "/to", -1)
	_, err = e.b.Seek(t.Context(), "orders", "nosuch", "earliest", "", true)
	wantErr(t, err, core.ErrSubscriptionNotFound)
}

// A seek on a broadcast subscription may move one consumer only.
func TestSeekOneBroadcastConsumer(t *testing.T) {
	clk := newClock()
	e := newEnv(t, core.Options{Now: clk.Now})
	e.putTopic("config", 2)
	e.subscribe("config", "caches", core.SubscriptionConfig{Mode: core.ModeBroadcast})
	e.send("config", numbered("v", 6)...)
	for _, c := range []string{"c1", "c2"} {
		e.ackAll("config", "caches", e.drain("config", "caches", core.PullRequest{ConsumerID: c}))
	}
	res, err := e.b.Seek(t.Context(), "config", "caches", "earliest", "c1", true)
	if err != nil || res.Total != 6 {
		t.Fatalf("dry run for c1: %+v %v, want 6", res, err)
	}
	if _, err := e.b.Seek(t.Context(), "config", "caches", "earliest", "c1", false); err != nil {
		t.Fatal(err)
	}
	if got := e.drain("config", "caches", core.PullRequest{ConsumerID: "c1"}); !slices.Equal(bodies(got), numbered("v", 6)) {
		t.Errorf("c1 after its seek got %v, want all 6", bodies(got))
	} else {
		e.ackAll("config", "caches", got)
	}
	e.pullNone("config", "caches", core.PullRequest{ConsumerID: "c2"}, "c2 was not seeked")

	// Without a consumer id every consumer moves.
	if res, err := e.b.Seek(t.Context(), "config", "caches", "earliest", "", false); err != nil || res.Total != 12 {
		t.Fatalf("seek of every consumer: %+v %v, want 12", res, err)
	}
	for _, c := range []string{"c1", "c2"} {
		if got := e.drain("config", "caches", core.PullRequest{ConsumerID: c}); len(got) != 6 {
			t.Errorf("%s after seeking everyone got %d, want 6", c, len(got))
		}
	}
	_, err = e.b.Seek(t.Context(), "config", "caches", "earliest", "nobody", true)
	wantValidation(t, err, "/consumerId", -1)
}
