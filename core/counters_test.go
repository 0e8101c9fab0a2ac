package core_test

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tidemq/tidemq/core"
	"github.com/tidemq/tidemq/pebblestore"
)

// durable is what a store holds that the broker's counters must stay above:
// the ids of its history, dead, retry and delayed records and its log seqs.
type durable struct {
	ids     []uint64
	lastSeq uint64 // the highest seq in the log; hasSeq says whether there is one
	hasSeq  bool
	kinds   map[string]int // how many ids of each kind
	snap    *core.Snapshot
}

func (d durable) maxID() uint64 {
	if len(d.ids) == 0 {
		return 0
	}
	return slices.Max(d.ids)
}

// readDurable reads every id and seq from the store itself.
func readDurable(t *testing.T, store core.Store) durable {
	t.Helper()
	snap, err := store.Load()
	if err != nil {
		t.Fatal(err)
	}
	d := durable{snap: snap, kinds: map[string]int{}}
	for _, p := range snap.Retries {
		d.ids = append(d.ids, p.ID)
		d.kinds["retry"]++
	}
	err = store.ScanTimers(0, math.MaxInt64/2, func(_ int64, id uint64, kind byte) bool {
		if kind == core.ParkedDelayed { // a retry's timer names the retry counted above
			d.ids = append(d.ids, id)
			d.kinds["delayed"]++
		}
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range snap.Subscriptions {
		err := store.ScanDead(s.ID, 0, math.MaxInt64/2, 0, 0, func(x *core.Dead) bool {
			d.ids = append(d.ids, x.ID)
			d.kinds["dead"]++
			return true
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, tp := range snap.Topics {
		for q, r := range snap.Queues[tp.ID] {
			for off := uint64(0); off < r.Next; off++ {
				err := store.ScanHistory(tp.ID, uint32(q), off, func(h *core.HistoryRecord) bool {
					d.ids = append(d.ids, h.ID)
					d.kinds["history"]++
					return true
				})
				if err != nil {
					t.Fatal(err)
				}
			}
			err := store.ScanQueue(tp.ID, uint32(q), r.Min, r.Next, func(e core.IndexEntry) bool {
				d.lastSeq, d.hasSeq = max(d.lastSeq, e.Seq), true
				return true
			})
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	return d
}

// settleSome makes one record of each id-taking kind: it sends four
// messages (and one delayed), acks one, nacks one (a retry), dead-letters
// one and redrives it (a retry of its own), so history, parked and dead
// records all take ids.
func settleSome(t *testing.T, e *env, clk *clock, prefix string) []core.SendResult {
	t.Helper()
	ctx := t.Context()
	res := e.send("orders", numbered(prefix, 4)...)
	e.sendBatch("orders", &core.Message{Body: []byte(prefix + "-later"), DeliverAtMs: clk.Now().Add(3 * time.Hour).UnixMilli()})
	var got, earlier []core.Delivered
	for _, d := range e.drain("orders", "g", core.PullRequest{MaxMessages: 10}) {
		if strings.HasPrefix(string(d.Message.Body), prefix) {
			got = append(got, d)
		} else {
			earlier = append(earlier, d) // redriven by an earlier call
		}
	}
	e.ackAll("orders", "g", earlier)
	if len(got) != 4 {
		t.Fatalf("%s: pulled %d, want 4", prefix, len(got))
	}
	e.ackAll("orders", "g", got[:1])
	if n, failed, err := e.b.Nack(ctx, "orders", "g", handles(got[1:2]), time.Hour, "later"); err != nil || n != 1 {
		t.Fatalf("%s: Nack: %d, %v, %v", prefix, n, failed, err)
	}
	if n, failed, err := e.b.DeadLetter(ctx, "orders", "g", handles(got[2:4]), "bad"); err != nil || n != 2 {
		t.Fatalf("%s: DeadLetter: %d, %v, %v", prefix, n, failed, err)
	}
	if n, err := e.b.Redrive(ctx, "orders", "g", core.RedriveFilter{MessageIDs: []string{got[2].Message.ID}}); err != nil || n != 1 {
		t.Fatalf("%s: Redrive: %d, %v", prefix, n, err)
	}
	return res
}

// TestCountersNeverGoBackAcrossRestart: with the broker's clock moved back
// an hour between two runs, every id and seq given after the restart is
// above every one given before, and store times do not go back either.
func TestCountersNeverGoBackAcrossRestart(t *testing.T) {
	clk := newClock()
	e := newEnv(t, core.Options{Now: clk.Now})
	e.putTopic("orders", 2)
	e.subscribe("orders", "g", core.SubscriptionConfig{})
	first := settleSome(t, e, clk, "first")
	before := readDurable(t, e.store)
	for _, kind := range []string{"history", "retry", "dead", "delayed"} {
		if before.kinds[kind] == 0 || !before.hasSeq {
			t.Fatalf("first run left ids %v and a seq %v, want some of every kind", before.kinds, before.hasSeq)
		}
	}

	clk.Advance(-time.Hour)
	e.restart()
	second := settleSome(t, e, clk, "second")
	after := readDurable(t, e.store)

	oldIDs := map[uint64]bool{}
	for _, id := range before.ids {
		oldIDs[id] = true
	}
	for _, id := range after.ids {
		if !oldIDs[id] && id <= before.maxID() {
			t.Errorf("id %d given after the restart, not above %d given before it", id, before.maxID())
		}
	}
	if len(after.ids) <= len(before.ids) {
		t.Errorf("second run added no ids: %d before, %d after", len(before.ids), len(after.ids))
	}
	for _, r := range second {
		m, _, err := e.b.GetMessage("orders", r.MessageID)
		if err != nil {
			t.Fatal(err)
		}
		if m.Seq <= before.lastSeq {
			t.Errorf("message %s got seq %d after the restart, not above %d", r.MessageID, m.Seq, before.lastSeq)
		}
	}
	if last, next := first[len(first)-1].StoredAt, second[0].StoredAt; next.Before(last) {
		t.Errorf("store time went back across the restart: %v after %v", next, last)
	}
}

// TestNextSeqContinuesAfterRetentionCutsEverything: once retention has
// removed every message and the broker restarts, new messages get seqs
// above the old ones, and nothing old is read back as new or new as old.
func TestNextSeqContinuesAfterRetentionCutsEverything(t *testing.T) {
	clk := newClock()
	e := newEnv(t, core.Options{Now: clk.Now})
	e.putTopicRetention("orders", 2, 1)
	var oldMsgs []*core.Message
	for i := range 6 {
		oldMsgs = append(oldMsgs, &core.Message{Body: fmt.Appendf(nil, "old-%d", i), Keys: []string{"key-old"}, Tag: "Old"})
	}
	old := e.sendBatch("orders", oldMsgs...)
	var lastSeq uint64
	for _, r := range old {
		m, _, err := e.b.GetMessage("orders", r.MessageID)
		if err != nil {
			t.Fatal(err)
		}
		lastSeq = max(lastSeq, m.Seq)
	}

	clk.Advance(2 * time.Hour)
	if err := e.b.EnforceRetention(); err != nil {
		t.Fatal(err)
	}
	if n := e.topicInfo("orders").Messages; n != 0 {
		t.Fatalf("%d messages left after retention, want none", n)
	}
	e.restart()

	fresh := e.sendBatch("orders", &core.Message{Body: []byte("new"), Keys: []string{"key-new"}, Tag: "New"})
	m, _, err := e.b.GetMessage("orders", fresh[0].MessageID)
	if err != nil {
		t.Fatal(err)
	}
	if m.Seq <= lastSeq || string(m.Body) != "new" {
		t.Errorf("after a full cut and a restart the new message got seq %d (body %q), want above %d", m.Seq, m.Body, lastSeq)
	}
	for _, r := range old {
		if _, _, err := e.b.GetMessage("orders", r.MessageID); !errors.Is(err, core.ErrMessageNotFound) {
			t.Errorf("GetMessage of cut message %s: %v, want ErrMessageNotFound", r.MessageID, err)
		}
	}
	for q, want := range map[core.Query][]string{
		{Key: "key-old"}: nil, {Tag: "Old"}: nil, {Key: "key-new"}: {"new"}, {Tag: "New"}: {"new"},
	} {
		msgs, _, err := e.b.QueryMessages(t.Context(), "orders", q)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, m := range msgs {
			got = append(got, string(m.Body))
		}
		if !slices.Equal(got, want) {
			t.Errorf("QueryMessages(%+v) = %q, want %q", q, got, want)
		}
	}
}

// TestCrashKeepsCountersAboveDurableRecords: a crash at any point leaves
// counters at least what the durable records need, and a broker opened on
// the crashed store gives no id or seq already held by one of them.
func TestCrashKeepsCountersAboveDurableRecords(t *testing.T) {
	fs := vfs.NewCrashableMem()
	clk := newClock()
	e := newEnvOn(t, fs, core.Options{Now: clk.Now})
	e.putTopic("orders", 2)
	e.subscribe("orders", "g", core.SubscriptionConfig{})
	var clones []vfs.FS
	for i := range 3 {
		settleSome(t, e, clk, fmt.Sprintf("run%d", i))
		clones = append(clones, fs.CrashClone(vfs.CrashCloneCfg{}))
	}
	for i, cfs := range clones {
		store, err := pebblestore.Open("db", pebblestore.Options{FS: cfs, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		d := readDurable(t, store)
		c := d.snap.Counters
		switch {
		case c == nil:
			t.Errorf("clone %d: no counters stored", i)
		case c.IDs < d.maxID():
			t.Errorf("clone %d: stored id high-water %d below the durable id %d", i, c.IDs, d.maxID())
		case d.hasSeq && c.NextSeq <= d.lastSeq:
			t.Errorf("clone %d: stored next seq %d, the log holds %d", i, c.NextSeq, d.lastSeq)
		}
		if err := store.Close(); err != nil {
			t.Fatal(err)
		}

		r := newEnvOn(t, cfs, core.Options{Now: clk.Now})
		res := settleSome(t, r, clk, fmt.Sprintf("after%d", i))
		after := readDurable(t, r.store)
		held := map[uint64]bool{}
		for _, id := range d.ids {
			held[id] = true
		}
		for _, id := range after.ids {
			if !held[id] && id <= d.maxID() {
				t.Errorf("clone %d: id %d given after the crash, not above the durable %d", i, id, d.maxID())
			}
		}
		for _, s := range res {
			m, _, err := r.b.GetMessage("orders", s.MessageID)
			if err != nil {
				t.Fatal(err)
			}
			if m.Seq <= d.lastSeq {
				t.Errorf("clone %d: seq %d given after the crash, the log held %d", i, m.Seq, d.lastSeq)
			}
		}
		r.close()
	}
}
