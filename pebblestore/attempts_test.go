package pebblestore

import (
	"bytes"
	"encoding/binary"
	"reflect"
	"testing"

	"github.com/tidemq/tidemq/core"
)

func attemptCases() []core.AttemptRecord {
	return []core.AttemptRecord{
		{CursorID: 1, QueueID: 0, Offset: 0, Attempt: 1},
		{CursorID: 3, QueueID: 7, Offset: 42, Attempt: 2, DueMs: 1742000000000},
		{CursorID: ^uint32(0), QueueID: core.RetryQueue, Offset: ^uint64(0), Attempt: maxAttempt, DueMs: -1},
	}
}

// The layout of an attempt record is on disk: its key and value bytes are
// fixed here, and a decode gives back what was encoded.
func TestAttemptRecordFormat(t *testing.T) {
	r := core.AttemptRecord{CursorID: 0x01020304, QueueID: 5, Offset: 0x0607, Attempt: 300, DueMs: -2}
	wantKey := []byte{'F', 1, 2, 3, 4, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 6, 7}
	if k := attemptKey(nil, r.CursorID, r.QueueID, r.Offset); !bytes.Equal(k, wantKey) {
		t.Errorf("key %x, want %x", k, wantKey)
	}
	// 300 as uvarint is ac 02; -2 as zigzag varint is 03.
	wantVal := []byte{0xac, 0x02, 0x03}
	if v := encodeAttempt(nil, r); !bytes.Equal(v, wantVal) {
		t.Errorf("value %x, want %x", v, wantVal)
	}
	for _, c := range attemptCases() {
		got, err := decodeAttempt(attemptKey(nil, c.CursorID, c.QueueID, c.Offset), encodeAttempt(nil, c))
		if err != nil || got != c {
			t.Errorf("round trip of %+v: %+v, %v", c, got, err)
		}
	}
}

func TestDecodeAttemptRejectsCorruption(t *testing.T) {
	key := attemptKey(nil, 1, 2, 3)
	for name, kv := range map[string][2][]byte{
		"empty value":        {key, nil},
		"no due time":        {key, {0x01}},
		"truncated uvarint":  {key, {0x81}},
		"trailing bytes":     {key, {0x01, 0x00, 0x00}},
		"attempt too large":  {key, binary.AppendVarint(binary.AppendUvarint(nil, maxAttempt+1), 0)},
		"short key":          {key[:16], {0x01, 0x00}},
		"long key":           {append(bytes.Clone(key), 0), {0x01, 0x00}},
		"other prefix":       {append([]byte{prefixAck}, key[1:]...), {0x01, 0x00}},
		"overlong uvarint":   {key, {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0x00}},
		"overflowing varint": {key, {0x01, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}},
	} {
		if r, err := decodeAttempt(kv[0], kv[1]); err == nil {
			t.Errorf("%s (%x → %x) decoded as %+v", name, kv[0], kv[1], r)
		}
	}
}

// Attempts load by cursor in (queue, offset) order, and each delete takes
// exactly its own: one record, a cursor's queue (the retry queue, whose id
// is the largest, included), a cursor, a subscription's main cursor.
func TestAttemptsLoadAndDelete(t *testing.T) {
	s := openFuzzStore(t)
	commit := func(fill func(core.Batch)) {
		t.Helper()
		b := s.NewBatch()
		fill(b)
		if err := b.Commit(false, false); err != nil {
			t.Fatal(err)
		}
	}
	load := func() map[uint32][]core.AttemptRecord {
		t.Helper()
		snap, err := s.Load()
		if err != nil {
			t.Fatal(err)
		}
		return snap.Attempts
	}
	var all []core.AttemptRecord
	for _, c := range []uint32{9, 2, 5} {
		for _, q := range []uint32{core.RetryQueue, 3, 0} {
			for _, o := range []uint64{1 << 40, 7, 0} {
				all = append(all, core.AttemptRecord{CursorID: c, QueueID: q, Offset: o, Attempt: int(o%5) + 1, DueMs: int64(q)})
			}
		}
	}
	commit(func(b core.Batch) {
		for _, r := range all {
			b.PutAttempt(r)
		}
	})
	want := map[uint32][]core.AttemptRecord{}
	for _, c := range []uint32{2, 5, 9} {
		for _, q := range []uint32{0, 3, core.RetryQueue} {
			for _, o := range []uint64{0, 7, 1 << 40} {
				want[c] = append(want[c], core.AttemptRecord{CursorID: c, QueueID: q, Offset: o, Attempt: int(o%5) + 1, DueMs: int64(q)})
			}
		}
	}
	if got := load(); !reflect.DeepEqual(got, want) {
		t.Fatalf("loaded\n%+v\nwant\n%+v", got, want)
	}

	commit(func(b core.Batch) {
		b.DeleteAttempt(2, 3, 7)
		b.DeleteCursorQueue(5, core.RetryQueue)
		b.DeleteCursorQueue(5, 0)
	})
	// The range tombstones hold through a flush and a compaction.
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := s.Compact(); err != nil {
		t.Fatal(err)
	}
	want[2] = append(want[2][:4:4], want[2][5:]...)
	want[5] = want[5][3:6]
	if got := load(); !reflect.DeepEqual(got, want) {
		t.Fatalf("after deleting one record and two queues:\n%+v\nwant\n%+v", got, want)
	}

	commit(func(b core.Batch) {
		b.DeleteCursor(5)
		b.DeleteSubscription(&core.SubscriptionRecord{ID: 9})
	})
	want = map[uint32][]core.AttemptRecord{2: want[2]}
	if got := load(); !reflect.DeepEqual(got, want) {
		t.Fatalf("after deleting cursor 5 and subscription 9:\n%+v\nwant\n%+v", got, want)
	}
}
