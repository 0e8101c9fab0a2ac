package pebblestore

import (
	"errors"

	"github.com/cockroachdb/pebble/v2"

	"github.com/tidemq/tidemq/core"
)

// Consumer state: a cursor's acked watermark per queue (C) and its acks
// above it (A), so out-of-order acks survive a restart; and the cursor of
// each consumer of a broadcast subscription (M). Leases are not stored.

func (b *batch) PutAckWatermark(subID, queueID uint32, acked uint64) {
	b.val = be.AppendUint64(b.val[:0], acked)
	_ = b.b.Set(watermarkKey(subID, queueID), b.val, nil)
}

func (b *batch) PutAck(subID, queueID uint32, offset uint64) {
	_ = b.b.Set(ackKey(subID, queueID, offset), nil, nil)
}

func (b *batch) DeleteAck(subID, queueID uint32, offset uint64) {
	_ = b.b.Delete(ackKey(subID, queueID, offset), nil)
}

func (b *batch) PutMember(subID uint32, consumerID string, cursorID uint32) {
	_ = b.b.Set(memberKey(subID, consumerID), be.AppendUint32(nil, cursorID), nil)
}

func (b *batch) DeleteCursor(cursorID uint32) {
	for _, p := range []byte{prefixWatermark, prefixAck, prefixAttempt} {
		lo, hi := prefixRange(id32Prefix(p, cursorID))
		b.deleteRange(lo, hi)
	}
}

func (b *batch) DeleteCursorQueue(cursorID, queueID uint32) {
	// The ranges of the key prefix (cursor, queue), not up to queueID+1:
	// the retry queue's id is the largest u32, and queueID+1 would wrap.
	for _, prefix := range [][]byte{ackKey(cursorID, queueID, 0)[:9], attemptKey(nil, cursorID, queueID, 0)[:9]} {
		lo, hi := prefixRange(prefix)
		b.deleteRange(lo, hi)
	}
}

func (s *Store) loadMembers(snap *core.Snapshot) error {
	lo, hi := prefixRange([]byte{prefixMember})
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return err
	}
	defer it.Close()
	for it.First(); it.Valid(); it.Next() {
		k, v := it.Key(), it.Value()
		if len(k) < 5 || len(v) != 4 {
			return errCorrupt
		}
		snap.Members = append(snap.Members, core.MemberRecord{SubID: be.Uint32(k[1:]), ConsumerID: string(k[5:]), CursorID: be.Uint32(v)})
	}
	return it.Error()
}

func (s *Store) loadAcks(snap *core.Snapshot) error {
	byQueue := map[[2]uint32]*core.QueueAcks{}
	get := func(sub, q uint32) *core.QueueAcks {
		k := [2]uint32{sub, q}
		a := byQueue[k]
		if a == nil {
			a = &core.QueueAcks{QueueID: q}
			byQueue[k] = a
		}
		return a
	}
	lo, hi := prefixRange([]byte{prefixWatermark})
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return err
	}
	for it.First(); it.Valid(); it.Next() {
		k := it.Key()
		if len(k) != 9 || len(it.Value()) != 8 {
			it.Close()
			return errCorrupt
		}
		get(be.Uint32(k[1:]), be.Uint32(k[5:])).Watermark = be.Uint64(it.Value())
	}
	if err := errors.Join(it.Error(), it.Close()); err != nil {
		return err
	}
	lo, hi = prefixRange([]byte{prefixAck})
	it, err = s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return err
	}
	for it.First(); it.Valid(); it.Next() {
		k := it.Key()
		if len(k) != 17 {
			it.Close()
			return errCorrupt
		}
		a := get(be.Uint32(k[1:]), be.Uint32(k[5:]))
		a.Acked = append(a.Acked, be.Uint64(k[9:]))
	}
	if err := errors.Join(it.Error(), it.Close()); err != nil {
		return err
	}
	for k, a := range byQueue {
		snap.Acks[k[0]] = append(snap.Acks[k[0]], *a)
	}
	return nil
}
