package pebblestore

import (
	"bytes"
	"io"
	"log/slog"
	"reflect"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tidemq/tidemq/core"
)

// The values beside the message log: parked retries and delayed sends,
// dead letters, remembered sends (dedup) and delivery history. Their
// decoders read what is on disk, so they must refuse any bytes, never panic
// on them, and give back exactly what was encoded.

func parkedCases() []*core.Parked {
	msgs := recordCases()
	return []*core.Parked{
		{ID: 1, Kind: core.ParkedRetry, SubID: 3, TopicID: 7, DueMs: 1742000000000, Attempt: 2, Reason: "nack: db down", Msg: msgs[1]},
		{ID: 2, Kind: core.ParkedDelayed, TopicID: 1, DueMs: 1, Msg: msgs[0]},
		{ID: ^uint64(0), Kind: core.ParkedRetry, SubID: ^uint32(0), TopicID: ^uint32(0), DueMs: -5, Attempt: 33, Reason: "ü✓", Msg: msgs[2]},
	}
}

func deadCases() []*core.Dead {
	msgs := recordCases()
	return []*core.Dead{
		{ID: 9, SubID: 4, CursorID: 5, DeadAtMs: 1742000000123, Attempt: 6, Reason: "lease expired", Msg: msgs[1]},
		{ID: 0, SubID: 0, Msg: msgs[0]},
		{ID: ^uint64(0), SubID: ^uint32(0), CursorID: ^uint32(0), DeadAtMs: 1 << 62, Attempt: 1 << 20, Reason: "x", Msg: msgs[3]},
	}
}

func dedupCases() []*core.DedupRecord {
	at := time.UnixMilli(1742000000456).UTC()
	return []*core.DedupRecord{
		{TopicID: 1, Key: "order-1001", StoredMs: 1742000000000, Result: core.SendResult{MessageID: "4ZXKMPQ2Q9J1D3Y6H7F8G0A", QueueID: 3, Offset: 42, StoredAt: at}},
		{TopicID: ^uint32(0), Key: "", StoredMs: -1, Result: core.SendResult{Delayed: true, StoredAt: time.UnixMilli(0).UTC()}},
		{TopicID: 2, Key: "ü\x00\xff", Result: core.SendResult{MessageID: "m", QueueID: 1023, Offset: ^uint64(0), StoredAt: at}},
	}
}

func historyCases() []*core.HistoryRecord {
	return []*core.HistoryRecord{
		{TopicID: 1, QueueID: 2, Offset: 3, StateID: 4, ID: 5, Attempt: 1, ConsumerID: "host-1", DeliveredAtMs: 1742000000000, Outcome: 'a', SettledAtMs: 1742000000100},
		{TopicID: 1, QueueID: 2, Offset: 3, StateID: 4, ID: 6, Attempt: 2, Outcome: 'n', Reason: "timeout talking to the db"},
		{TopicID: 1, QueueID: 2, Offset: 3, StateID: ^uint32(0), ID: ^uint64(0), Attempt: 33, ConsumerID: "ü", DeliveredAtMs: -1, SettledAtMs: -1},
	}
}

// Round trips of the table: decode(encode(x)) == x.
func TestStoredValuesRoundTrip(t *testing.T) {
	for _, p := range parkedCases() {
		got, err := decodeParked(p.ID, encodeParked(p), true)
		if err != nil {
			t.Fatalf("parked %d: %v", p.ID, err)
		}
		wantSameParked(t, got, p)
		noBody, err := decodeParked(p.ID, encodeParked(p), false)
		if err != nil || noBody.Msg.Body != nil {
			t.Errorf("parked %d without body: %v, body %q", p.ID, err, noBody.Msg.Body)
		}
	}
	for _, d := range deadCases() {
		got, err := decodeDead(deadKey(d.SubID, d.DeadAtMs, d.ID), encodeDead(d))
		if err != nil {
			t.Fatalf("dead %d: %v", d.ID, err)
		}
		wantSameDead(t, got, d)
	}
	for _, r := range dedupCases() {
		got, err := decodeDedup(dedupKey(r.TopicID, r.Key), encodeDedup(r))
		if err != nil {
			t.Fatalf("dedup %q: %v", r.Key, err)
		}
		wantSameDedup(t, got, r)
	}
	// All in one batch, as an ack writes them: the records share the
	// batch's scratch buffers.
	s := openFuzzStore(t)
	b := s.NewBatch()
	for _, h := range historyCases() {
		b.PutHistory(h)
	}
	if err := b.Commit(false, false); err != nil {
		t.Fatal(err)
	}
	var got []*core.HistoryRecord
	if err := s.ScanHistory(1, 2, 3, func(h *core.HistoryRecord) bool { got = append(got, h); return true }); err != nil {
		t.Fatal(err)
	}
	if want := historyCases(); !reflect.DeepEqual(got, want) {
		t.Errorf("history read back:\n%+v\nwant\n%+v", deref(got), deref(want))
	}
}

func deref[T any](ps []*T) []T {
	out := make([]T, len(ps))
	for i, p := range ps {
		out[i] = *p
	}
	return out
}

func wantSameParked(t *testing.T, got, want *core.Parked) {
	t.Helper()
	g, w := *got, *want
	g.Msg, w.Msg = nil, nil
	if !reflect.DeepEqual(g, w) {
		t.Fatalf("parked decoded %+v, want %+v", g, w)
	}
	wantSameMessage(t, got.Msg, want.Msg)
}

func wantSameDead(t *testing.T, got, want *core.Dead) {
	t.Helper()
	g, w := *got, *want
	g.Msg, w.Msg = nil, nil
	if !reflect.DeepEqual(g, w) {
		t.Fatalf("dead decoded %+v, want %+v", g, w)
	}
	wantSameMessage(t, got.Msg, want.Msg)
}

func wantSameDedup(t *testing.T, got, want *core.DedupRecord) {
	t.Helper()
	g, w := *got, *want
	if !g.Result.StoredAt.Equal(w.Result.StoredAt) {
		t.Fatalf("dedup %q: storedAt %v, want %v", w.Key, g.Result.StoredAt, w.Result.StoredAt)
	}
	g.Result.StoredAt, w.Result.StoredAt = time.Time{}, time.Time{}
	if !reflect.DeepEqual(g, w) {
		t.Fatalf("dedup decoded %+v, want %+v", g, w)
	}
}

func openFuzzStore(tb testing.TB) *Store {
	tb.Helper()
	s, err := Open("db", Options{FS: vfs.NewMem(), CacheBytes: 1 << 20, MemTableBytes: 1 << 20,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := s.Close(); err != nil {
			tb.Error(err)
		}
	})
	return s
}

// historyPrefix is the key prefix of the history of one message, the
// range ScanHistory reads.
func historyPrefix(topicID, queueID uint32, offset uint64) []byte {
	return bytes.Clone(historyKey(topicID, queueID, offset, 0, 0)[:17])
}

// FuzzDecodeStoredValues feeds arbitrary key and value bytes to the decoder
// of one kind of value: 0 parked (with and without body), 1 dead, 2 dedup,
// 3 delivery history (read through ScanHistory from a real Pebble on
// vfs.NewMem, with the fuzzed key suffix). None may panic; whatever
// decodes is a fixpoint of encode/decode.
func FuzzDecodeStoredValues(f *testing.F) {
	for _, p := range parkedCases() {
		if v := encodeParked(p); len(v) <= 1024 {
			f.Add(uint8(0), []byte(nil), v)
			f.Add(uint8(0), []byte(nil), v[:len(v)/2])
		}
	}
	for _, d := range deadCases() {
		if v := encodeDead(d); len(v) <= 1024 {
			f.Add(uint8(1), deadKey(d.SubID, d.DeadAtMs, d.ID), v)
			f.Add(uint8(1), deadKey(d.SubID, d.DeadAtMs, d.ID)[:9], v[:7])
		}
	}
	for _, r := range dedupCases() {
		v := encodeDedup(r)
		f.Add(uint8(2), dedupKey(r.TopicID, r.Key), v)
		f.Add(uint8(2), dedupKey(r.TopicID, r.Key)[:4], v[:28])
	}
	{
		s := openFuzzStore(f)
		for _, h := range historyCases() {
			b := s.NewBatch()
			b.PutHistory(h)
			if err := b.Commit(false, false); err != nil {
				f.Fatal(err)
			}
		}
		prefix := historyPrefix(1, 2, 3)
		lo, hi := prefixRange(prefix)
		it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
		if err != nil {
			f.Fatal(err)
		}
		for it.First(); it.Valid(); it.Next() {
			k, v := bytes.Clone(it.Key()[len(prefix):]), bytes.Clone(it.Value())
			f.Add(uint8(3), k, v)
			f.Add(uint8(3), k[:len(k)-1], v[:len(v)-1])
		}
		if err := it.Close(); err != nil {
			f.Fatal(err)
		}
	}
	f.Add(uint8(0), []byte(nil), []byte{core.ParkedRetry})
	f.Add(uint8(3), []byte{}, []byte{})

	s := openFuzzStore(f) // one store for the whole run
	offset := uint64(1 << 40)
	f.Fuzz(func(t *testing.T, kind uint8, k, v []byte) {
		switch kind % 4 {
		case 0:
			for _, withBody := range []bool{true, false} {
				p, err := decodeParked(7, v, withBody)
				if err != nil {
					continue
				}
				if !withBody {
					if p.Msg.Body != nil {
						t.Fatalf("decodeParked without body kept a %d-byte body", len(p.Msg.Body))
					}
					continue
				}
				again, err := decodeParked(7, encodeParked(p), true)
				if err != nil {
					t.Fatalf("re-encoded parked value does not decode: %v", err)
				}
				wantSameParked(t, again, p)
			}
		case 1:
			d, err := decodeDead(k, v)
			if err != nil {
				return
			}
			again, err := decodeDead(deadKey(d.SubID, d.DeadAtMs, d.ID), encodeDead(d))
			if err != nil {
				t.Fatalf("re-encoded dead value does not decode: %v", err)
			}
			d.DeadAtMs = max(d.DeadAtMs, 0) // deadKey keeps times before 1970 at 0
			wantSameDead(t, again, d)
		case 2:
			r, err := decodeDedup(k, v)
			if err != nil {
				return
			}
			again, err := decodeDedup(dedupKey(r.TopicID, r.Key), encodeDedup(r))
			if err != nil {
				t.Fatalf("re-encoded dedup value does not decode: %v", err)
			}
			wantSameDedup(t, again, r)
		case 3:
			// A fresh offset each time, so that no scan walks the
			// tombstones of the ones before.
			offset++
			key := append(historyPrefix(1, 2, offset), k...)
			if err := s.db.Set(key, v, pebble.NoSync); err != nil {
				t.Fatal(err)
			}
			var got *core.HistoryRecord
			err := s.ScanHistory(1, 2, offset, func(h *core.HistoryRecord) bool { got = h; return false })
			if err := s.db.Delete(key, pebble.NoSync); err != nil {
				t.Fatal(err)
			}
			if err != nil || got == nil {
				return
			}
			b := s.NewBatch()
			b.PutHistory(got)
			if err := b.Commit(false, false); err != nil {
				t.Fatal(err)
			}
			var again *core.HistoryRecord
			err = s.ScanHistory(1, 2, offset, func(h *core.HistoryRecord) bool { again = h; return false })
			if err := s.db.Delete(historyKey(got.TopicID, got.QueueID, got.Offset, got.StateID, got.ID), pebble.NoSync); err != nil {
				t.Fatal(err)
			}
			if err != nil || again == nil {
				t.Fatalf("re-encoded history record %+v does not read back: %v", *got, err)
			}
			if !reflect.DeepEqual(again, got) {
				t.Fatalf("history record read back as %+v, want %+v", *again, *got)
			}
		}
	})
}
