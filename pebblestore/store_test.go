package pebblestore_test

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"slices"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tidemq/tidemq/core"
	"github.com/tidemq/tidemq/pebblestore"
)

// Every store test runs on each filesystem the broker is used with.
var filesystems = []struct {
	name string
	fs   func(t *testing.T) (vfs.FS, string)
}{
	{"mem", func(*testing.T) (vfs.FS, string) { return vfs.NewMem(), "db" }},
	{"crashable-mem", func(*testing.T) (vfs.FS, string) { return vfs.NewCrashableMem(), "db" }},
	{"disk", func(t *testing.T) (vfs.FS, string) { return nil, t.TempDir() }},
}

func forEachFS(t *testing.T, test func(t *testing.T, open func() *pebblestore.Store)) {
	for _, c := range filesystems {
		t.Run(c.name, func(t *testing.T) {
			fs, dir := c.fs(t)
			test(t, func() *pebblestore.Store { return openStore(t, fs, dir) })
		})
	}
}

// openStore opens a store that is closed, with the error checked, when the
// test ends (Close is idempotent, so tests may close it earlier).
func openStore(t *testing.T, fs vfs.FS, dir string) *pebblestore.Store {
	t.Helper()
	s, err := pebblestore.Open(dir, pebblestore.Options{FS: fs, CacheBytes: 8 << 20, MemTableBytes: 4 << 20})
	if err != nil {
		t.Fatalf("Open(%s): %v", dir, err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

func commit(t *testing.T, s core.Store, fill func(core.Batch)) {
	t.Helper()
	b := s.NewBatch()
	fill(b)
	if err := b.Commit(true, false); err != nil {
		t.Fatalf("Commit: %v", err)
	}
}

// fixture writes two topics with messages, a subscription and its acks.
type fixture struct {
	orders, other *core.TopicRecord
	sub           *core.SubscriptionRecord
	msgs          []*core.Message // by seq
}

func writeFixture(t *testing.T, s core.Store) *fixture {
	f := &fixture{
		orders: &core.TopicRecord{ID: 1, Name: "orders", Queues: 2, RetentionHours: 24, CreatedAtMs: 1000},
		other:  &core.TopicRecord{ID: 2, Name: "other", Queues: 1, RetentionHours: 1, CreatedAtMs: 2000},
		sub: &core.SubscriptionRecord{ID: 5, TopicID: 1, Group: "g", Mode: core.ModeClustering, Filter: "*",
			MaxRetries: 5, StartFrom: "earliest", RetryDelays: core.DefaultRetryDelays, CreatedAtMs: 1500},
	}
	next := map[[2]uint32]uint64{}
	add := func(topic *core.TopicRecord, queue uint32, tag string, body []byte) {
		k := [2]uint32{topic.ID, queue}
		f.msgs = append(f.msgs, &core.Message{
			ID: fmt.Sprint("id-", len(f.msgs)), TopicID: topic.ID, QueueID: queue, Offset: next[k],
			Seq: uint64(len(f.msgs)), Body: body, Tag: tag, Keys: []string{"k"},
			StoredAtMs: 10_000 + int64(len(f.msgs)), BornAtMs: 9_000,
		})
		next[k]++
	}
	for i := range 5 {
		add(f.orders, 0, "TagA", fmt.Appendf(nil, "orders-0-%d", i))
	}
	for i := range 3 {
		add(f.orders, 1, "", bytes.Repeat([]byte{byte(i)}, 5000)) // compressed
	}
	add(f.other, 0, "TagB", []byte("other"))
	commit(t, s, func(b core.Batch) {
		b.PutTopic(f.orders)
		b.PutTopic(f.other)
		b.PutSubscription(f.sub)
		for _, m := range f.msgs {
			b.Append(m)
		}
		for k, n := range next {
			var bytes int64
			for _, m := range f.msgs {
				if m.TopicID == k[0] && m.QueueID == k[1] {
					bytes += int64(len(m.Body))
				}
			}
			b.PutQueueMeta(k[0], k[1], n, bytes)
		}
		b.PutAckWatermark(5, 0, 2)
		b.PutAck(5, 0, 3)
		b.PutAck(5, 0, 4)
		b.PutAckWatermark(5, 1, 0)
	})
	commit(t, s, func(b core.Batch) { b.DeleteAck(5, 0, 3) })
	return f
}

func scan(t *testing.T, s core.Store, topic, queue uint32, from, to uint64) []core.IndexEntry {
	t.Helper()
	var out []core.IndexEntry
	if err := s.ScanQueue(topic, queue, from, to, func(e core.IndexEntry) bool {
		out = append(out, e)
		return true
	}); err != nil {
		t.Fatalf("ScanQueue(%d/%d [%d,%d)): %v", topic, queue, from, to, err)
	}
	return out
}

func checkFixture(t *testing.T, s core.Store, f *fixture) {
	t.Helper()
	snap, err := s.Load()
	if err != nil {
		t.Fatal(err)
	}
	if snap.NextSeq != uint64(len(f.msgs)) {
		t.Errorf("NextSeq = %d, want %d", snap.NextSeq, len(f.msgs))
	}
	slices.SortFunc(snap.Topics, func(a, b *core.TopicRecord) int { return int(a.ID) - int(b.ID) })
	if len(snap.Topics) != 2 || *snap.Topics[0] != *f.orders || *snap.Topics[1] != *f.other {
		t.Errorf("topics = %+v", snap.Topics)
	}
	wantQueues := map[uint32][]core.QueueRange{
		1: {{Min: 0, Next: 5, Bytes: 5 * 10}, {Min: 0, Next: 3, Bytes: 3 * 5000}},
		2: {{Min: 0, Next: 1, Bytes: 5}},
	}
	if !maps.EqualFunc(snap.Queues, wantQueues, slices.Equal) {
		t.Errorf("queues = %v, want %v", snap.Queues, wantQueues)
	}
	if len(snap.Subscriptions) != 1 || snap.Subscriptions[0].Group != "g" ||
		!slices.Equal(snap.Subscriptions[0].RetryDelays, core.DefaultRetryDelays) {
		t.Errorf("subscriptions = %+v", snap.Subscriptions)
	}
	acks := snap.Acks[5]
	slices.SortFunc(acks, func(a, b core.QueueAcks) int { return int(a.QueueID) - int(b.QueueID) })
	if len(acks) != 2 || acks[0].Watermark != 2 || !slices.Equal(acks[0].Acked, []uint64{4}) ||
		acks[1].Watermark != 0 || len(acks[1].Acked) != 0 {
		t.Errorf("acks of subscription 5 = %+v, want q0 at 2 with [4], q1 at 0", acks)
	}

	entries := scan(t, s, 1, 0, 0, 5)
	if len(entries) != 5 {
		t.Fatalf("scan of orders/0 found %d entries, want 5", len(entries))
	}
	for i, e := range entries {
		m := f.msgs[i]
		want := core.IndexEntry{Offset: m.Offset, Seq: m.Seq, StoredAtMs: m.StoredAtMs, TagHash: core.TagHash(m.Tag), Size: uint32(len(m.Body))}
		if e != want {
			t.Errorf("entry %d = %+v, want %+v", i, e, want)
		}
	}
	if got := scan(t, s, 1, 0, 1, 3); len(got) != 2 || got[0].Offset != 1 || got[1].Offset != 2 {
		t.Errorf("scan [1,3) = %+v", got)
	}
	if got := scan(t, s, 1, 0, 3, 3); len(got) != 0 {
		t.Errorf("empty range scanned %d entries", len(got))
	}
	if got := scan(t, s, 1, 1, 0, 100); len(got) != 3 {
		t.Errorf("scan of orders/1 found %d entries, want 3 (and nothing of other queues)", len(got))
	}
	calls := 0
	if err := s.ScanQueue(1, 0, 0, 5, func(core.IndexEntry) bool { calls++; return calls < 2 }); err != nil || calls != 2 {
		t.Errorf("scan did not stop when fn returned false: %d calls, %v", calls, err)
	}

	for _, m := range f.msgs {
		got, err := s.ReadMessage(m.Seq)
		if err != nil {
			t.Fatalf("ReadMessage(%d): %v", m.Seq, err)
		}
		if got.ID != m.ID || got.Seq != m.Seq || got.Offset != m.Offset || got.Tag != m.Tag || !bytes.Equal(got.Body, m.Body) {
			t.Errorf("ReadMessage(%d) = %s@%d %q, want %s@%d %q", m.Seq, got.ID, got.Offset, got.Tag, m.ID, m.Offset, m.Tag)
		}
	}
	if _, err := s.ReadMessage(uint64(len(f.msgs)) + 7); !errors.Is(err, core.ErrMessageNotFound) {
		t.Errorf("ReadMessage of a missing seq: %v, want ErrMessageNotFound", err)
	}

	// ReadMessages: every other stored seq plus missing ones around them.
	var seqs []uint64
	for i := 0; i < len(f.msgs); i += 2 {
		seqs = append(seqs, f.msgs[i].Seq)
	}
	seqs = append(seqs, uint64(len(f.msgs))+7, uint64(len(f.msgs))+9)
	got := make([]*core.Message, len(seqs))
	if err := s.ReadMessages(seqs, got); err != nil {
		t.Fatalf("ReadMessages: %v", err)
	}
	for j, seq := range seqs {
		if seq >= uint64(len(f.msgs)) {
			if got[j] != nil {
				t.Errorf("ReadMessages: seq %d is not stored, got %+v", seq, got[j])
			}
			continue
		}
		m := f.msgs[seq]
		if g := got[j]; g == nil || g.ID != m.ID || g.Seq != seq || !bytes.Equal(g.Body, m.Body) {
			t.Errorf("ReadMessages: seq %d = %+v, want %s", seq, g, m.ID)
		}
	}
}

// TestReadMessagesAroundGaps reads runs of consecutive seqs (one Next
// each), seqs below a cut log, and seqs past the end, in one call: a seq
// that is missing must not make the iterator skip the next one.
func TestReadMessagesAroundGaps(t *testing.T) {
	s := openStore(t, vfs.Default, t.TempDir())
	b := s.NewBatch()
	for seq := range uint64(10) {
		b.Append(&core.Message{ID: fmt.Sprint("m", seq), TopicID: 1, Offset: seq, Seq: seq, Body: []byte(fmt.Sprint("body ", seq))})
	}
	if err := b.Commit(true, false); err != nil {
		t.Fatal(err)
	}
	b = s.NewBatch()
	b.CutLog(4)
	if err := b.Commit(true, false); err != nil {
		t.Fatal(err)
	}
	seqs := []uint64{2, 3, 4, 5, 6, 8, 9, 12, 13}
	got := make([]*core.Message, len(seqs))
	if err := s.ReadMessages(seqs, got); err != nil {
		t.Fatal(err)
	}
	for i, seq := range seqs {
		stored := seq >= 4 && seq < 10
		switch {
		case !stored && got[i] != nil:
			t.Errorf("seq %d is cut or never stored, read %+v", seq, got[i])
		case stored && (got[i] == nil || got[i].Seq != seq || string(got[i].Body) != fmt.Sprint("body ", seq)):
			t.Errorf("seq %d read as %+v", seq, got[i])
		}
	}
}

func TestStoreWritesAndReadsBack(t *testing.T) {
	forEachFS(t, func(t *testing.T, open func() *pebblestore.Store) {
		s := open()
		f := writeFixture(t, s)
		checkFixture(t, s, f)
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		checkFixture(t, open(), f)
	})
}

func TestStoreDeletes(t *testing.T) {
	forEachFS(t, func(t *testing.T, open func() *pebblestore.Store) {
		s := open()
		f := writeFixture(t, s)
		commit(t, s, func(b core.Batch) {
			b.DeleteSubscription(f.sub)
			b.DeleteTopic(f.orders)
		})
		// The deleted topic's bodies stay in the log until it is cut past
		// them (core's retention does when no queue holds them).
		for _, m := range f.msgs[:8] {
			if _, err := s.ReadMessage(m.Seq); err != nil {
				t.Errorf("message %d of the deleted topic before the log cut: %v", m.Seq, err)
			}
		}
		commit(t, s, func(b core.Batch) { b.CutLog(f.msgs[8].Seq) })
		for _, m := range f.msgs[:8] {
			if _, err := s.ReadMessage(m.Seq); !errors.Is(err, core.ErrMessageNotFound) {
				t.Errorf("message %d of the deleted topic after the log cut: %v, want ErrMessageNotFound", m.Seq, err)
			}
		}
		if got := scan(t, s, 1, 0, 0, 100); len(got) != 0 {
			t.Errorf("deleted topic's index still has %d entries", len(got))
		}
		if _, ok, err := s.OffsetAtTime(1, 0, 0); ok || err != nil {
			t.Errorf("deleted topic's time index still answers: ok=%v err=%v", ok, err)
		}
		snap, err := s.Load()
		if err != nil {
			t.Fatal(err)
		}
		if len(snap.Topics) != 1 || snap.Topics[0].Name != "other" || len(snap.Subscriptions) != 0 || len(snap.Acks) != 0 {
			t.Errorf("after deletes: topics %+v, subscriptions %+v, acks %+v", snap.Topics, snap.Subscriptions, snap.Acks)
		}
		if m, err := s.ReadMessage(f.msgs[8].Seq); err != nil || string(m.Body) != "other" {
			t.Errorf("other topic's message: %v", err)
		}
	})
}

func TestBatchInvisibleUntilCommit(t *testing.T) {
	s := openStore(t, vfs.NewMem(), "db")
	b := s.NewBatch()
	b.PutTopic(&core.TopicRecord{ID: 1, Name: "orders", Queues: 1})
	b.Append(&core.Message{ID: "x", TopicID: 1, Seq: 0, Body: []byte("x")})
	if b.Len() == 0 {
		t.Error("Len = 0 for a batch with writes")
	}
	if _, err := s.ReadMessage(0); !errors.Is(err, core.ErrMessageNotFound) {
		t.Errorf("uncommitted message readable: %v", err)
	}
	b.Close()
	b.Close()
	if snap, err := s.Load(); err != nil || len(snap.Topics) != 0 {
		t.Errorf("closed, uncommitted batch left %+v, %v", snap, err)
	}
}

func TestOffsetAtTime(t *testing.T) {
	s := openStore(t, vfs.NewMem(), "db")
	// Queue 0: offsets 0-2 stored at 1000, 3-4 at 2000, 5 at 2000 in a
	// later batch, 6 at 5000. Queue 1 stays empty.
	var seq uint64
	appendAt := func(ms int64, offsets ...uint64) {
		commit(t, s, func(b core.Batch) {
			for _, o := range offsets {
				b.Append(&core.Message{ID: fmt.Sprint(o), TopicID: 1, QueueID: 0, Offset: o, Seq: seq, StoredAtMs: ms})
				seq++
			}
		})
	}
	appendAt(1000, 0, 1, 2)
	appendAt(2000, 3, 4)
	appendAt(2000, 5)
	appendAt(5000, 6)
	for _, tc := range []struct {
		ms   int64
		want uint64
		ok   bool
	}{
		{-5, 0, true}, {0, 0, true}, {999, 0, true}, {1000, 0, true}, {1001, 3, true},
		{1999, 3, true}, {2000, 3, true}, {2001, 6, true}, {5000, 6, true}, {5001, 0, false},
	} {
		got, ok, err := s.OffsetAtTime(1, 0, tc.ms)
		if err != nil || got != tc.want || ok != tc.ok {
			t.Errorf("OffsetAtTime(%d) = %d %v %v, want %d %v", tc.ms, got, ok, err, tc.want, tc.ok)
		}
	}
	if _, ok, err := s.OffsetAtTime(1, 1, 0); ok || err != nil {
		t.Errorf("empty queue: ok=%v err=%v", ok, err)
	}
	if _, ok, err := s.OffsetAtTime(2, 0, 0); ok || err != nil {
		t.Errorf("unknown topic: ok=%v err=%v", ok, err)
	}
}

func TestOpenOnDiskCloseIsIdempotentThenErrClosed(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, nil, dir)
	f := writeFixture(t, s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	_, err := s.Load()
	wantClosed(t, "Load", err)
	wantClosed(t, "ScanQueue", s.ScanQueue(1, 0, 0, 5, func(core.IndexEntry) bool { return true }))
	_, err = s.ReadMessage(0)
	wantClosed(t, "ReadMessage", err)
	_, _, err = s.OffsetAtTime(1, 0, 0)
	wantClosed(t, "OffsetAtTime", err)
	wantClosed(t, "Compact", s.Compact())
	b := s.NewBatch()
	b.PutTopic(&core.TopicRecord{ID: 9, Name: "late", Queues: 1})
	wantClosed(t, "Commit", b.Commit(true, false))

	// The data is on disk for the next Open.
	checkFixture(t, openStore(t, nil, dir), f)
}

func wantClosed(t *testing.T, op string, err error) {
	t.Helper()
	if !errors.Is(err, core.ErrClosed) {
		t.Errorf("%s after Close: %v, want an error wrapping core.ErrClosed", op, err)
	}
}

func TestSyncedCommitSurvivesCrash(t *testing.T) {
	fs := vfs.NewCrashableMem()
	s := openStore(t, fs, "db")
	f := writeFixture(t, s)
	crashed := fs.CrashClone(vfs.CrashCloneCfg{})
	checkFixture(t, openStore(t, crashed, "db"), f)
}

// STYLE: "after Close, methods return ErrClosed, never panic". Store.Flush
// (store.go) calls s.db.Flush() without the closed check that read() gives
// the other methods, and Pebble panics with "pebble: closed". Fix: wrap it
// in s.read like Compact.
func TestRegressionFlushAfterClosePanics(t *testing.T) {
	s := openStore(t, vfs.NewMem(), "db")
	if err := s.Flush(); err != nil {
		t.Fatalf("Flush while open: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if p := recover(); p != nil {
			t.Errorf("Flush after Close panicked: %v", p)
		}
	}()
	wantClosed(t, "Flush", s.Flush())
}

// TestCountersRecordSurvivesReopen: the last counters a batch stored come
// back from Load after a reopen, and a store that never stored any has
// none; the next seq is kept even when the log has nothing.
func TestCountersRecordSurvivesReopen(t *testing.T) {
	forEachFS(t, func(t *testing.T, open func() *pebblestore.Store) {
		s := open()
		snap, err := s.Load()
		if err != nil {
			t.Fatal(err)
		}
		if snap.Counters != nil {
			t.Fatalf("a new store loaded counters %+v, want none", *snap.Counters)
		}
		for _, c := range []core.Counters{{NextSeq: 3, LastStoredMs: 10, IDs: 7}, {NextSeq: 1 << 40, LastStoredMs: -5, IDs: ^uint64(0)}} {
			b := s.NewBatch()
			b.PutCounters(c)
			if err := b.Commit(true, false); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		s = open()
		snap, err = s.Load()
		if err != nil {
			t.Fatal(err)
		}
		want := core.Counters{NextSeq: 1 << 40, LastStoredMs: -5, IDs: ^uint64(0)}
		if snap.Counters == nil || *snap.Counters != want {
			t.Errorf("loaded counters %+v, want %+v", snap.Counters, want)
		}
		if snap.NextSeq != 0 {
			t.Errorf("an empty log loaded next seq %d, want 0 (the counters hold it)", snap.NextSeq)
		}
	})
}
