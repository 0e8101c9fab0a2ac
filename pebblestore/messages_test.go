package pebblestore

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/cockroachdb/pebble/v2"

	"github.com/tidemq/tidemq/core"
)

func queueIndexKeys(t *testing.T, s *Store, topicID uint32) [][]byte {
	t.Helper()
	lo, hi := prefixRange(id32Prefix(prefixQueue, topicID))
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		t.Fatal(err)
	}
	var keys [][]byte
	for it.First(); it.Valid(); it.Next() {
		keys = append(keys, slices.Clone(it.Key()))
	}
	if err := it.Close(); err != nil {
		t.Fatal(err)
	}
	return keys
}

// TestQueueRunsScanLikeEntries appends a queue the ways a broker does (a
// send longer than a run, sends of other queues interleaved, single sends
// in their own commits, store times changing inside a commit, tags and
// sharding keys on some messages) and checks that every scan [from, to)
// returns exactly the entries appended there, and after cutting the queue
// inside a run and at a run's first offset.
func TestQueueRunsScanLikeEntries(t *testing.T) {
	s, err := Open(t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	}()
	topic := &core.TopicRecord{ID: 3, Name: "orders", Queues: 2}
	var want [2][]core.IndexEntry // by queue, by offset
	seq := uint64(1000)
	appendMsgs := func(b core.Batch, queue uint32, n int, storedAtMs int64) {
		for range n {
			off := uint64(len(want[queue]))
			m := &core.Message{ID: fmt.Sprint("m-", seq), TopicID: topic.ID, QueueID: queue, Offset: off, Seq: seq,
				Body: make([]byte, 10+off%7), StoredAtMs: storedAtMs + int64(off%3/2)}
			if off%5 == 0 {
				m.Tag = fmt.Sprint("tag-", off%3)
			}
			if off%4 == 0 {
				m.ShardingKey = fmt.Sprint("key-", off)
			}
			b.Append(m)
			want[queue] = append(want[queue], core.IndexEntry{Offset: off, Seq: seq, StoredAtMs: m.StoredAtMs,
				TagHash: core.TagHash(m.Tag), Size: uint32(len(m.Body)), KeyHash: core.ShardingHash(m.ShardingKey)})
			seq += 1 + off%3 // other topics' messages take seqs in between
		}
	}
	commitBatch := func(fill func(core.Batch)) {
		t.Helper()
		b := s.NewBatch()
		fill(b)
		for q := range want {
			b.PutQueueMeta(topic.ID, uint32(q), uint64(len(want[q])), 0)
		}
		if err := b.Commit(true, false); err != nil {
			t.Fatal(err)
		}
	}
	commitBatch(func(b core.Batch) {
		b.PutTopic(topic)
		appendMsgs(b, 0, 300, 5_000) // longer than a run
		appendMsgs(b, 1, 10, 5_000)
	})
	for range 3 {
		commitBatch(func(b core.Batch) { appendMsgs(b, 0, 1, 6_000) })
	}
	commitBatch(func(b core.Batch) {
		for range 20 { // the queues alternate
			appendMsgs(b, 0, 1, 7_000)
			appendMsgs(b, 1, 1, 7_000)
		}
	})
	if keys, n := queueIndexKeys(t, s, topic.ID), len(want[0])+len(want[1]); len(keys) > 8 {
		t.Fatalf("%d queue-index keys for %d messages, want at most 8 (one per run)", len(keys), n)
	}

	checkScans := func(what string, queue uint32, first uint64) {
		t.Helper()
		all := want[queue]
		next := uint64(len(all))
		for from := uint64(0); from <= next; from++ {
			for _, to := range []uint64{from + 1, from + 2, from + 7, from + 257, next, next + 5} {
				var got []core.IndexEntry
				if err := s.ScanQueue(topic.ID, queue, from, to, func(e core.IndexEntry) bool {
					got = append(got, e)
					return true
				}); err != nil {
					t.Fatalf("%s: ScanQueue(%d, [%d, %d)): %v", what, queue, from, to, err)
				}
				lo, hi := max(from, first), min(max(to, from), next)
				var exp []core.IndexEntry
				if lo < hi {
					exp = all[lo:hi]
				}
				if !slices.Equal(got, exp) {
					t.Fatalf("%s: ScanQueue(%d, [%d, %d)) = %d entries %v…, want %d from offset %d", what, queue, from, to,
						len(got), got[:min(len(got), 2)], len(exp), lo)
				}
			}
		}
		stops := 0
		if err := s.ScanQueue(topic.ID, queue, first, next, func(core.IndexEntry) bool { stops++; return stops < 3 }); err != nil || stops != 3 {
			t.Fatalf("%s: a scan went on after fn returned false: %d calls, %v", what, stops, err)
		}
		r, err := s.queueRange(topic.ID, queue)
		if err != nil || r.Min != first || r.Next != next {
			t.Fatalf("%s: queue %d range %+v, %v; want min %d, next %d", what, queue, r, err, first, next)
		}
	}
	checkScans("runs", 0, 0)
	checkScans("runs", 1, 0)

	cut := func(queue uint32, offset uint64) {
		t.Helper()
		commitBatch(func(b core.Batch) { b.CutQueue(topic.ID, queue, offset, 0) })
		checkScans(fmt.Sprint("cut at ", offset), queue, offset)
	}
	cut(0, 100) // inside the first run
	cut(0, 256) // the second run's first offset
	cut(0, 301) // a single send's run
	cut(0, 310) // inside the last commit's run
	cut(1, 10)  // inside the other queue's first run
	cut(1, 26)

	commitBatch(func(b core.Batch) { b.DeleteTopic(topic) })
	for q := range want {
		if err := s.ScanQueue(topic.ID, uint32(q), 0, uint64(len(want[q])), func(e core.IndexEntry) bool {
			t.Fatalf("deleted queue %d still has entry %+v", q, e)
			return false
		}); err != nil {
			t.Fatal(err)
		}
	}
	if keys := queueIndexKeys(t, s, topic.ID); len(keys) != 0 {
		t.Fatalf("deleted topic keeps queue-index keys %x", keys)
	}
}

// TestCorruptQueueRunIsAnError: a run value cut short reads as an error
// from the scan, not a panic or a wrong entry.
func TestCorruptQueueRunIsAnError(t *testing.T) {
	s, err := Open(t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	e := core.IndexEntry{Offset: 0, Seq: 1 << 40, StoredAtMs: 1 << 41, Size: 1 << 20, TagHash: 1 << 31, KeyHash: 7}
	val := appendQueueEntry(nil, &core.IndexEntry{}, &e)
	for cut := 1; cut < len(val); cut++ {
		if err := s.db.Set(queueRunKey(nil, 1, 0, 0), val[:cut], pebble.NoSync); err != nil {
			t.Fatal(err)
		}
		err := s.ScanQueue(1, 0, 0, 1, func(got core.IndexEntry) bool {
			t.Fatalf("value cut to %d of %d bytes gave entry %+v", cut, len(val), got)
			return false
		})
		if !errors.Is(err, errCorrupt) {
			t.Fatalf("value cut to %d of %d bytes: %v, want errCorrupt", cut, len(val), err)
		}
	}
	// A key without the run marker (one entry per offset) is not this
	// layout's either.
	if err := s.db.Set(queueKey(nil, 1, 1, 0), val, pebble.NoSync); err != nil {
		t.Fatal(err)
	}
	if err := s.ScanQueue(1, 1, 0, 1, func(core.IndexEntry) bool { return true }); !errors.Is(err, errCorrupt) {
		t.Fatalf("a per-offset queue-index key: %v, want errCorrupt", err)
	}
}
