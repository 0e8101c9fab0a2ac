package pebblestore

import (
	"io"
	"log/slog"
	"math"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tidemq/tidemq/core"
)

// TestStoreWithoutCountersKeepsIDsUnique: a data dir written before the
// counters record existed (here: one whose mC key is removed) holds ids the
// broker must not give again; the broker opened on it gives ids above them,
// and seqs above its log.
func TestStoreWithoutCountersKeepsIDsUnique(t *testing.T) {
	fs := vfs.NewMem()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	run := func(body string, dropCounters bool) (ids []uint64, seq uint64) {
		s, err := Open("db", Options{FS: fs, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := s.Close(); err != nil {
				t.Error(err)
			}
		}()
		if dropCounters {
			if err := s.db.Delete(keyCounters, pebble.Sync); err != nil {
				t.Fatal(err)
			}
		}
		b, err := core.New(s, core.Options{Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := b.Close(); err != nil {
				t.Error(err)
			}
		}()
		ctx := t.Context()
		if _, _, err := b.PutTopic(ctx, "orders", core.TopicConfig{Queues: 1}); err != nil {
			t.Fatal(err)
		}
		if _, _, err := b.PutSubscription(ctx, "orders", "g", core.SubscriptionConfig{}); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Send(ctx, "orders", []*core.Message{{Body: []byte(body)}}); err != nil {
			t.Fatal(err)
		}
		got, err := b.Pull(ctx, "orders", "g", core.PullRequest{MaxMessages: 10})
		if err != nil || len(got) != 1 {
			t.Fatalf("pulled %d, %v; want the one message", len(got), err)
		}
		seq = got[0].Message.Seq
		if n, _, err := b.DeadLetter(ctx, "orders", "g", []string{got[0].ReceiptHandle}, "bad"); err != nil || n != 1 {
			t.Fatalf("DeadLetter: %d, %v", n, err)
		}
		snap, err := s.Load()
		if err != nil || len(snap.Subscriptions) != 1 {
			t.Fatalf("Load: %v", err)
		}
		err = s.ScanDead(snap.Subscriptions[0].ID, 0, math.MaxInt64/2, 0, 0, func(d *core.Dead) bool {
			ids = append(ids, d.ID)
			return true
		})
		if err != nil {
			t.Fatal(err)
		}
		return ids, seq
	}
	before, seqBefore := run("first", false)
	after, seqAfter := run("second", true)
	if len(before) != 1 || len(after) != 2 {
		t.Fatalf("dead ids %v then %v, want one then two", before, after)
	}
	if fresh := max(after[0], after[1]); min(after[0], after[1]) != before[0] || fresh <= before[0] {
		t.Errorf("dead ids %v after the counters were lost: want %d and one above it", after, before[0])
	}
	if seqAfter <= seqBefore {
		t.Errorf("seq %d after the counters were lost, not above %d", seqAfter, seqBefore)
	}
}
