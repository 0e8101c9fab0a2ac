package pebblestore

import (
	"encoding/binary"

	"github.com/tidemq/tidemq/core"
)

// Delivery attempts (F): the failed attempts of a delivery not yet done and
// the end of an orderly key's suspension, under cursor, queue and offset, so
// a restart (or a replica taking over) counts attempts on from where they
// were. A parked retry's record is under core.RetryQueue and its id.

// Attempt: attempt uvarint | dueMs varint
func encodeAttempt(dst []byte, r core.AttemptRecord) []byte {
	dst = binary.AppendUvarint(dst[:0], uint64(max(r.Attempt, 0)))
	return binary.AppendVarint(dst, r.DueMs)
}

func decodeAttempt(k, v []byte) (core.AttemptRecord, error) {
	if len(k) != attemptKeyLen || k[0] != prefixAttempt {
		return core.AttemptRecord{}, errCorrupt
	}
	attempt, n := binary.Uvarint(v)
	if n <= 0 || attempt > uint64(maxAttempt) {
		return core.AttemptRecord{}, errCorrupt
	}
	due, m := binary.Varint(v[n:])
	if m <= 0 || n+m != len(v) {
		return core.AttemptRecord{}, errCorrupt
	}
	return core.AttemptRecord{
		CursorID: be.Uint32(k[1:]),
		QueueID:  be.Uint32(k[5:]),
		Offset:   be.Uint64(k[9:]),
		Attempt:  int(attempt),
		DueMs:    due,
	}, nil
}

// maxAttempt bounds a decoded attempt so that it fits an int on every
// platform; no delivery fails that often.
const maxAttempt = 1<<31 - 1

func (b *batch) PutAttempt(r core.AttemptRecord) {
	b.key = attemptKey(b.key, r.CursorID, r.QueueID, r.Offset)
	b.val = encodeAttempt(b.val, r)
	_ = b.b.Set(b.key, b.val, nil)
}

func (b *batch) DeleteAttempt(cursorID, queueID uint32, offset uint64) {
	b.key = attemptKey(b.key, cursorID, queueID, offset)
	_ = b.b.Delete(b.key, nil)
}

// loadAttempts reads every attempt record, by cursor in key order: each
// cursor's come in (queue, offset) order.
func (s *Store) loadAttempts(snap *core.Snapshot) error {
	lo, hi := prefixRange([]byte{prefixAttempt})
	return s.walk(lo, hi, func(k, v []byte) (bool, error) {
		r, err := decodeAttempt(k, v)
		if err != nil {
			return false, err
		}
		snap.Attempts[r.CursorID] = append(snap.Attempts[r.CursorID], r)
		return true, nil
	})
}
