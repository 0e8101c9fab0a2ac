package pebblestore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/cockroachdb/pebble/v2"

	"github.com/tidemq/tidemq/core"
)

const (
	prefixRetry   = 'R'  // R id → parked retry
	prefixDelayed = 'P'  // P id → parked delayed send
	prefixTimer   = 'D'  // D dueMs id → kind
	prefixDead    = 'X'  // X subID deadAtMs id → dead message
	prefixDedup   = 'U'  // U topicID key → remembered send result
	prefixMember  = 'M'  // M subID consumerID → cursor id
	keyLastIDs    = "mI" // the highest topic and subscription ids ever given
)

func parkedKey(kind byte, id uint64) []byte {
	p := byte(prefixDelayed)
	if kind == core.ParkedRetry {
		p = prefixRetry
	}
	return be.AppendUint64([]byte{p}, id)
}

func timerKey(dueMs int64, id uint64) []byte {
	k := be.AppendUint64([]byte{prefixTimer}, uint64(max(dueMs, 0)))
	return be.AppendUint64(k, id)
}

func deadKey(subID uint32, deadAtMs int64, id uint64) []byte {
	k := be.AppendUint32([]byte{prefixDead}, subID)
	k = be.AppendUint64(k, uint64(max(deadAtMs, 0)))
	return be.AppendUint64(k, id)
}

func dedupKey(topicID uint32, key string) []byte {
	k := be.AppendUint32([]byte{prefixDedup}, topicID)
	return append(k, key...)
}

// Parked: kind u8 | subID u32 | topicID u32 | dueMs u64 | attempt u32 | reason | record
func encodeParked(p *core.Parked) []byte {
	b := make([]byte, 0, 64+len(p.Msg.Body))
	b = append(b, p.Kind)
	b = be.AppendUint32(b, p.SubID)
	b = be.AppendUint32(b, p.TopicID)
	b = be.AppendUint64(b, uint64(p.DueMs))
	b = be.AppendUint32(b, uint32(p.Attempt))
	b = appendString(b, p.Reason)
	return encodeRecord(b, p.Msg)
}

func decodeParked(id uint64, b []byte, withBody bool) (*core.Parked, error) {
	if len(b) < 21 {
		return nil, errCorrupt
	}
	p := &core.Parked{ID: id, Kind: b[0], SubID: be.Uint32(b[1:]), TopicID: be.Uint32(b[5:]),
		DueMs: int64(be.Uint64(b[9:])), Attempt: int(be.Uint32(b[17:]))}
	r := recordReader{b: b[21:]}
	p.Reason = r.string()
	if r.err != nil {
		return nil, r.err
	}
	m, err := decodeRecord(r.b, 0)
	if err != nil {
		return nil, err
	}
	if !withBody {
		m.Body = nil
	}
	p.Msg = m
	return p, nil
}

// Dead: attempt u32 | cursorID u32 | reason | record (subID, deadAt and id are in the key)
func encodeDead(d *core.Dead) []byte {
	b := make([]byte, 0, 64+len(d.Msg.Body))
	b = be.AppendUint32(b, uint32(d.Attempt))
	b = be.AppendUint32(b, d.CursorID)
	b = appendString(b, d.Reason)
	return encodeRecord(b, d.Msg)
}

func decodeDead(k, v []byte) (*core.Dead, error) {
	if len(k) != 21 || len(v) < 8 {
		return nil, errCorrupt
	}
	d := &core.Dead{SubID: be.Uint32(k[1:]), DeadAtMs: int64(be.Uint64(k[5:])), ID: be.Uint64(k[13:]),
		Attempt: int(be.Uint32(v)), CursorID: be.Uint32(v[4:])}
	r := recordReader{b: v[8:]}
	d.Reason = r.string()
	if r.err != nil {
		return nil, r.err
	}
	m, err := decodeRecord(r.b, 0)
	if err != nil {
		return nil, err
	}
	d.Msg = m
	return d, nil
}

// Dedup: storedMs u64 | queueID u32 | offset u64 | storedAtMs u64 | delayed u8 | messageId
func encodeDedup(r *core.DedupRecord) []byte {
	b := make([]byte, 0, 64)
	b = be.AppendUint64(b, uint64(r.StoredMs))
	b = be.AppendUint32(b, uint32(r.Result.QueueID))
	b = be.AppendUint64(b, r.Result.Offset)
	b = be.AppendUint64(b, uint64(r.Result.StoredAt.UnixMilli()))
	delayed := byte(0)
	if r.Result.Delayed {
		delayed = 1
	}
	b = append(b, delayed)
	return append(b, r.Result.MessageID...)
}

func decodeDedup(k, v []byte) (*core.DedupRecord, error) {
	if len(k) < 5 || len(v) < 29 {
		return nil, errCorrupt
	}
	r := &core.DedupRecord{TopicID: be.Uint32(k[1:]), Key: string(k[5:]), StoredMs: int64(be.Uint64(v))}
	r.Result.QueueID = int(be.Uint32(v[8:]))
	r.Result.Offset = be.Uint64(v[12:])
	r.Result.StoredAt = msToTime(int64(be.Uint64(v[20:])))
	r.Result.Delayed = v[28] == 1
	r.Result.MessageID = string(v[29:])
	return r, nil
}

func (b *batch) PutParked(p *core.Parked) {
	_ = b.b.Set(parkedKey(p.Kind, p.ID), encodeParked(p), nil)
	if p.Kind == core.ParkedDelayed {
		b.key = delayedIndexKey(b.key, p)
		b.deferIndex(b.key, nil)
	}
}

func (b *batch) DeleteParked(p *core.Parked) {
	_ = b.b.Delete(parkedKey(p.Kind, p.ID), nil)
	if p.Kind == core.ParkedDelayed {
		b.key = delayedIndexKey(b.key, p)
		_ = b.b.Delete(b.key, nil)
	}
}

// delayedIndexKey is where a delayed message is found by id until due
// (core.IndexDelayed).
func delayedIndexKey(dst []byte, p *core.Parked) []byte {
	return secondaryKey(dst, p.TopicID, core.IndexBucket(p.DueMs), core.IndexDelayed, core.IndexHash(p.Msg.ID), p.ID)
}

func (b *batch) PutTimer(dueMs int64, id uint64, kind byte) {
	_ = b.b.Set(timerKey(dueMs, id), []byte{kind}, nil)
}

func (b *batch) DeleteTimersBefore(dueMs int64) {
	b.deleteRange([]byte{prefixTimer}, timerKey(dueMs, 0))
}

func (b *batch) PutDead(d *core.Dead) {
	_ = b.b.Set(deadKey(d.SubID, d.DeadAtMs, d.ID), encodeDead(d), nil)
}

func (b *batch) DeleteDead(d *core.Dead) { _ = b.b.Delete(deadKey(d.SubID, d.DeadAtMs, d.ID), nil) }

func (b *batch) PutDedup(r *core.DedupRecord) {
	_ = b.b.Set(dedupKey(r.TopicID, r.Key), encodeDedup(r), nil)
}

func (b *batch) DeleteDedup(topicID uint32, key string) { _ = b.b.Delete(dedupKey(topicID, key), nil) }

func (b *batch) CutQueue(topicID, queueID uint32, offset uint64, timeMs int64) {
	keptKey, keptVal := b.keepRunAbove(topicID, queueID, offset)
	b.deleteRange(queueKey(nil, topicID, queueID, 0), queueKey(nil, topicID, queueID, offset))
	if keptKey != nil {
		_ = b.b.Set(keptKey, keptVal, nil)
	}
	b.deleteRange(historyKey(topicID, queueID, 0, 0, 0), historyKey(topicID, queueID, offset, 0, 0))
	b.deleteRange(timeKey(nil, topicID, queueID, 0, 0), timeKey(nil, topicID, queueID, timeMs, 0))
}

func (b *batch) CutLog(seq uint64) {
	b.deleteRange(logKey(nil, 0), logKey(nil, seq))
}

func (s *Store) ReadParked(kind byte, id uint64) (*core.Parked, error) {
	var p *core.Parked
	err := s.read(func() error {
		v, closer, err := s.db.Get(parkedKey(kind, id))
		if errors.Is(err, pebble.ErrNotFound) {
			return core.ErrMessageNotFound
		}
		if err != nil {
			return err
		}
		defer closer.Close()
		p, err = decodeParked(id, v, true)
		return err
	})
	if err != nil && !errors.Is(err, core.ErrMessageNotFound) {
		return nil, fmt.Errorf("pebblestore: read parked %d: %w", id, err)
	}
	return p, err
}

func (s *Store) ScanTimers(fromMs, toMs int64, fn func(int64, uint64, byte) bool) error {
	if toMs < fromMs {
		return nil
	}
	return s.read(func() error {
		it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: timerKey(fromMs, 0), UpperBound: timerKey(toMs+1, 0)})
		if err != nil {
			return err
		}
		defer it.Close()
		for it.First(); it.Valid(); it.Next() {
			k, v := it.Key(), it.Value()
			if len(k) != 17 || len(v) != 1 {
				return fmt.Errorf("pebblestore: timer %x: %w", k, errCorrupt)
			}
			if !fn(int64(be.Uint64(k[1:])), be.Uint64(k[9:]), v[0]) {
				break
			}
		}
		return it.Error()
	})
}

func (s *Store) ScanDead(subID uint32, fromMs, toMs, afterMs int64, afterID uint64, fn func(*core.Dead) bool) error {
	return s.read(func() error {
		lo := deadKey(subID, fromMs, 0)
		if after := deadKey(subID, afterMs, afterID+1); afterMs > 0 && string(after) > string(lo) {
			lo = after
		}
		hi := deadKey(subID, toMs+1, 0)
		it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
		if err != nil {
			return err
		}
		defer it.Close()
		for it.First(); it.Valid(); it.Next() {
			d, err := decodeDead(it.Key(), it.Value())
			if err != nil {
				return fmt.Errorf("pebblestore: dead %x: %w", it.Key(), err)
			}
			if !fn(d) {
				break
			}
		}
		return it.Error()
	})
}

// loadParked reads retry records (without bodies), the first timer, DLQ
// sizes and remembered sends.
func (s *Store) loadParked(snap *core.Snapshot) error {
	snap.DeadCounts = map[uint32]int64{}
	lo, hi := prefixRange([]byte{prefixRetry})
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return err
	}
	for it.First(); it.Valid(); it.Next() {
		if len(it.Key()) != 9 {
			it.Close()
			return errCorrupt
		}
		p, err := decodeParked(be.Uint64(it.Key()[1:]), it.Value(), false)
		if err != nil {
			it.Close()
			return err
		}
		snap.Retries = append(snap.Retries, p)
	}
	if err := errors.Join(it.Error(), it.Close()); err != nil {
		return err
	}
	lo, hi = prefixRange([]byte{prefixTimer})
	if it, err = s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi}); err != nil {
		return err
	}
	if it.First() && len(it.Key()) == 17 {
		snap.FirstTimerMs = int64(be.Uint64(it.Key()[1:]))
	}
	if err := errors.Join(it.Error(), it.Close()); err != nil {
		return err
	}
	lo, hi = prefixRange([]byte{prefixDead})
	if it, err = s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi}); err != nil {
		return err
	}
	for it.First(); it.Valid(); it.Next() {
		if len(it.Key()) == 21 {
			snap.DeadCounts[be.Uint32(it.Key()[1:])]++
		}
	}
	if err := errors.Join(it.Error(), it.Close()); err != nil {
		return err
	}
	lo, hi = prefixRange([]byte{prefixDedup})
	if it, err = s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi}); err != nil {
		return err
	}
	for it.First(); it.Valid(); it.Next() {
		r, err := decodeDedup(it.Key(), it.Value())
		if err != nil {
			it.Close()
			return err
		}
		snap.Dedup = append(snap.Dedup, r)
	}
	return errors.Join(it.Error(), it.Close())
}

func (s *Store) ScanIndex(topicID uint32, kind byte, hash uint64, fromBucket, toBucket, afterBucket uint32, afterSeq uint64, fn func(uint32, uint64) bool) error {
	if kind == core.IndexNUID {
		return s.scanNUIDIndex(topicID, hash, fromBucket, toBucket, afterBucket, afterSeq, fn)
	}
	return s.read(func() error {
		var lo, hi []byte
		return eachBucket(fromBucket, toBucket, afterBucket, func(bucket uint32) (bool, error) {
			lo = secondaryKey(lo, topicID, bucket, kind, hash, 0)
			// Buckets are hours since 1970, so 0 means "no cursor" and a
			// cursor after seq 0 is still a cursor.
			if afterBucket > 0 && bucket == afterBucket {
				lo = secondaryKey(lo, topicID, bucket, kind, hash, afterSeq+1)
			}
			_, hi = prefixRange(lo[:len(lo)-8])
			more := true
			err := s.walk(lo, hi, func(k, _ []byte) (bool, error) {
				more = fn(bucket, be.Uint64(k[len(k)-8:]))
				return more, nil
			})
			return more, err
		})
	})
}

// eachBucket calls fn for the index buckets from max(from, after) to to,
// while it says to go on.
func eachBucket(from, to, after uint32, fn func(bucket uint32) (bool, error)) error {
	for bucket := max(from, after); bucket <= to; bucket++ {
		if more, err := fn(bucket); !more || err != nil {
			return err
		}
		if bucket == ^uint32(0) {
			break
		}
	}
	return nil
}

// walk calls fn for the keys in [lo, hi), in order, while it says to go on.
func (s *Store) walk(lo, hi []byte, fn func(k, v []byte) (bool, error)) error {
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return err
	}
	for it.First(); it.Valid(); it.Next() {
		if more, err := fn(it.Key(), it.Value()); !more || err != nil {
			return errors.Join(err, it.Close())
		}
	}
	return errors.Join(it.Error(), it.Close())
}

func (s *Store) ScanHistory(topicID, queueID uint32, offset uint64, fn func(*core.HistoryRecord) bool) error {
	return s.read(func() error {
		lo, hi := prefixRange(historyKey(topicID, queueID, offset, 0, 0)[:17])
		it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
		if err != nil {
			return err
		}
		defer it.Close()
		for it.First(); it.Valid(); it.Next() {
			k := it.Key()
			if len(k) != 29 {
				return errCorrupt
			}
			h := &core.HistoryRecord{TopicID: topicID, QueueID: queueID, Offset: offset,
				StateID: be.Uint32(k[17:]), ID: be.Uint64(k[21:])}
			r := recordReader{b: it.Value()}
			h.Attempt = int(r.u32())
			h.ConsumerID = r.string()
			h.DeliveredAtMs = int64(r.u64())
			if r.err == nil && len(r.b) > 0 {
				h.Outcome = r.b[0]
				r.b = r.b[1:]
			}
			h.Reason = r.string()
			h.SettledAtMs = int64(r.u64())
			if r.err != nil {
				return r.err
			}
			if !fn(h) {
				break
			}
		}
		return it.Error()
	})
}

func memberKey(subID uint32, consumerID string) []byte {
	return append(be.AppendUint32([]byte{prefixMember}, subID), consumerID...)
}

func (b *batch) PutMember(subID uint32, consumerID string, cursorID uint32) {
	_ = b.b.Set(memberKey(subID, consumerID), be.AppendUint32(nil, cursorID), nil)
}

func (b *batch) DeleteCursor(cursorID uint32) {
	for _, p := range []byte{prefixWatermark, prefixAck} {
		lo, hi := prefixRange(id32Prefix(p, cursorID))
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

func (b *batch) DeleteCursorQueue(cursorID, queueID uint32) {
	lo := ackKey(cursorID, queueID, 0)
	b.deleteRange(lo, ackKey(cursorID, queueID+1, 0))
}

func (b *batch) PutLastIDs(lastTopic, lastSub uint32) {
	v := be.AppendUint32(be.AppendUint32(nil, lastTopic), lastSub)
	_ = b.b.Set([]byte(keyLastIDs), v, nil)
}

func (s *Store) loadLastIDs(snap *core.Snapshot) error {
	v, closer, err := s.db.Get([]byte(keyLastIDs))
	if errors.Is(err, pebble.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	defer closer.Close()
	if len(v) != 8 {
		return errCorrupt
	}
	snap.LastTopicID, snap.LastSubID = be.Uint32(v), be.Uint32(v[4:])
	return nil
}

// scanNUIDIndex is ScanIndex for NUID digests, which are stored in runs
// (see idRun): a run holding digest starts at most maxRunSpan below it, so
// the runs of a bucket whose first digest lies in [digest-maxRunSpan,
// digest] are all there is to read. Data dirs written before runs hold one
// entry per message under kind IndexNUID, read as well.
func (s *Store) scanNUIDIndex(topicID uint32, digest uint64, fromBucket, toBucket, afterBucket uint32, afterSeq uint64, fn func(uint32, uint64) bool) error {
	return s.read(func() error {
		var lo, hi []byte
		var seqs []uint64
		return eachBucket(fromBucket, toBucket, afterBucket, func(bucket uint32) (bool, error) {
			seqs = seqs[:0]
			lo = secondaryKey(lo, topicID, bucket, indexNUIDRun, digest-min(digest, maxRunSpan), 0)
			if digest == ^uint64(0) {
				_, hi = prefixRange(lo[:10])
			} else {
				hi = secondaryKey(hi, topicID, bucket, indexNUIDRun, digest+1, 0)
			}
			err := s.walk(lo, hi, func(k, v []byte) (bool, error) {
				var err error
				seqs, err = appendRunSeqs(seqs, k, v, digest)
				return true, err
			})
			if err != nil {
				return false, err
			}
			lo = secondaryKey(lo, topicID, bucket, core.IndexNUID, digest, 0)
			_, hi = prefixRange(lo[:len(lo)-8])
			err = s.walk(lo, hi, func(k, _ []byte) (bool, error) {
				seqs = append(seqs, be.Uint64(k[len(k)-8:]))
				return true, nil
			})
			if err != nil {
				return false, err
			}
			slices.Sort(seqs)
			for i, seq := range seqs {
				if (i > 0 && seq == seqs[i-1]) || (afterBucket > 0 && bucket == afterBucket && seq <= afterSeq) {
					continue
				}
				if !fn(bucket, seq) {
					return false, nil
				}
			}
			return true, nil
		})
	})
}

// appendRunSeqs appends the seqs that the run of key k and value v indexes
// under digest.
func appendRunSeqs(seqs []uint64, k, v []byte, digest uint64) ([]uint64, error) {
	d, seq := be.Uint64(k[len(k)-16:]), be.Uint64(k[len(k)-8:])
	for {
		if d == digest {
			seqs = append(seqs, seq)
		}
		if len(v) == 0 || d > digest {
			return seqs, nil
		}
		dd, n := binary.Uvarint(v)
		if n <= 0 {
			return seqs, fmt.Errorf("pebblestore: id index run %x: bad value", k)
		}
		ds, m := binary.Uvarint(v[n:])
		if m <= 0 {
			return seqs, fmt.Errorf("pebblestore: id index run %x: bad value", k)
		}
		d, seq, v = d+dd, seq+ds, v[n+m:]
	}
}
