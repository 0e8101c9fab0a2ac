package pebblestore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/cockroachdb/pebble/v2"

	"github.com/tidemq/tidemq/core"
)

// Messages: the commit log (L seq → record, record.go), each queue's
// index into it (Q runs), its sparse time index (T) and its position (q).
//
// A queue's index is runs: the entries of consecutive offsets appended in
// one batch are one key, Q topic queue firstOffset 'r', whose value holds
// each entry in offset order (see appendQueueEntry). A send of 100
// messages over 8 queues then writes 8 queue-index keys, not 100; each key
// costs a memtable insert and is rewritten by every compaction of its
// level, and a pull of 256 reads a few keys instead of 256.

// maxQueueRunLen bounds what a scan from inside a run decodes and skips.
const maxQueueRunLen = 256

func (b *batch) Append(m *core.Message) {
	b.val = encodeRecord(b.val[:0], m)
	b.key = logKey(b.key, m.Seq)
	_ = b.b.Set(b.key, b.val, nil)
	b.addToQueueRun(m)
	b.indexMessage(m)
	// The time index is sparse: one entry per queue per store time, pointing
	// at the first offset stored then.
	if b.lastTS == nil {
		b.lastTS = map[[2]uint32]int64{}
	}
	qk := [2]uint32{m.TopicID, m.QueueID}
	if ts, ok := b.lastTS[qk]; !ok || ts != m.StoredAtMs {
		b.lastTS[qk] = m.StoredAtMs
		b.key = timeKey(b.key, m.TopicID, m.QueueID, m.StoredAtMs, m.Offset)
		b.deferIndex(b.key, nil)
	}
}

func (b *batch) PutQueueMeta(topicID, queueID uint32, next uint64, bytes int64) {
	b.val = be.AppendUint64(b.val[:0], next)
	b.val = be.AppendUint64(b.val, uint64(bytes))
	_ = b.b.Set(queueMetaKey(topicID, queueID), b.val, nil)
}

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

// appendQueueEntry encodes e after prev (the run's previous entry, or the
// zero entry for its first): seq as a uvarint delta (seqs grow within a
// run), storedAtMs as a signed delta (0 within a commit), then size, tag
// hash and key hash as uvarints (0 when a message has no tag or key).
func appendQueueEntry(dst []byte, prev, e *core.IndexEntry) []byte {
	dst = binary.AppendUvarint(dst, e.Seq-prev.Seq)
	dst = binary.AppendVarint(dst, e.StoredAtMs-prev.StoredAtMs)
	dst = binary.AppendUvarint(dst, uint64(e.Size))
	dst = binary.AppendUvarint(dst, uint64(e.TagHash))
	return binary.AppendUvarint(dst, uint64(e.KeyHash))
}

// eachQueueEntry calls fn for the entries of one queue-index run from
// offset from on, until fn returns false; it reports whether fn asked for
// more.
func eachQueueEntry(key, val []byte, from uint64, fn func(core.IndexEntry) bool) (bool, error) {
	if len(key) != queueRunKeyLen || key[queueRunKeyLen-1] != queueRunMarker {
		return false, errCorrupt
	}
	r := recordReader{b: val}
	e := core.IndexEntry{Offset: be.Uint64(key[9:])}
	for i := 0; len(r.b) > 0; i++ {
		if i > 0 {
			e.Offset++
		}
		e.Seq += r.uvarint()
		e.StoredAtMs += r.varint()
		size, tagHash, keyHash := r.uvarint(), r.uvarint(), r.uvarint()
		if r.err != nil || size > math.MaxUint32 || tagHash > math.MaxUint32 || keyHash > math.MaxUint32 {
			return false, errCorrupt
		}
		e.Size, e.TagHash, e.KeyHash = uint32(size), uint32(tagHash), uint32(keyHash)
		if e.Offset >= from && !fn(e) {
			return false, nil
		}
	}
	return true, nil
}

// queueRun is the run a batch is building for one queue.
type queueRun struct {
	open        bool
	first, next uint64 // offsets
	last        core.IndexEntry
	n           int
	val         []byte
}

// addToQueueRun indexes m in its queue's run, extending the open one when
// m has its next offset and a higher seq.
func (b *batch) addToQueueRun(m *core.Message) {
	qk := [2]uint32{m.TopicID, m.QueueID}
	if b.queueRuns == nil {
		b.queueRuns = map[[2]uint32]*queueRun{}
	}
	r := b.queueRuns[qk]
	if r == nil {
		r = &queueRun{}
		b.queueRuns[qk] = r
	}
	e := core.IndexEntry{Offset: m.Offset, Seq: m.Seq, StoredAtMs: m.StoredAtMs, TagHash: core.TagHash(m.Tag),
		Size: uint32(len(m.Body)), KeyHash: core.ShardingHash(m.ShardingKey)}
	if !r.open || m.Offset != r.next || m.Seq <= r.last.Seq || r.n == maxQueueRunLen {
		b.closeQueueRun(qk, r)
		*r = queueRun{open: true, first: m.Offset, next: m.Offset, val: r.val[:0]}
	}
	r.val = appendQueueEntry(r.val, &r.last, &e)
	r.last = e
	r.next++
	r.n++
}

// closeQueueRun queues r's key with the other index entries.
func (b *batch) closeQueueRun(qk [2]uint32, r *queueRun) {
	if !r.open {
		return
	}
	b.key = queueRunKey(b.key, qk[0], qk[1], r.first)
	b.deferIndex(b.key, r.val)
	r.open = false
}

// scanQueueIndex calls fn for the entries of [from, to) of one queue in
// offset order. The entry at from may sit inside a run that starts below
// it: the scan begins at the last key at or below from.
func (s *Store) scanQueueIndex(topicID, queueID uint32, from, to uint64, fn func(core.IndexEntry) bool) error {
	it, err := s.db.NewIter(&pebble.IterOptions{
		LowerBound: queueKey(nil, topicID, queueID, 0),
		UpperBound: queueKey(nil, topicID, queueID, to),
	})
	if err != nil {
		return err
	}
	defer it.Close()
	valid := it.SeekLT(queueKey(nil, topicID, queueID, from+1))
	if !valid {
		valid = it.First()
	}
	for ; valid; valid = it.Next() {
		more, err := eachQueueEntry(it.Key(), it.Value(), from, func(e core.IndexEntry) bool {
			return e.Offset < to && fn(e)
		})
		if err != nil {
			return fmt.Errorf("key %x: %w", it.Key(), err)
		}
		if !more {
			break
		}
	}
	return it.Error()
}

// keepRunAbove rewrites, in b, the run that starts below offset and holds
// it as a run of its entries from offset on, keyed at offset, so that
// cutting the queue below offset keeps them and the queue's first key is
// its first retained offset. It must be called before the range deletion.
func (b *batch) keepRunAbove(topicID, queueID uint32, offset uint64) (key, val []byte) {
	err := b.s.read(func() error {
		it, err := b.s.db.NewIter(&pebble.IterOptions{
			LowerBound: queueKey(nil, topicID, queueID, 0),
			UpperBound: queueKey(nil, topicID, queueID, offset),
		})
		if err != nil {
			return err
		}
		defer it.Close()
		if !it.Last() {
			return it.Error()
		}
		var prev core.IndexEntry
		_, err = eachQueueEntry(it.Key(), it.Value(), offset, func(e core.IndexEntry) bool {
			val = appendQueueEntry(val, &prev, &e)
			prev = e
			return true
		})
		return err
	})
	if err != nil {
		if b.err == nil {
			b.err = fmt.Errorf("cutting queue %d/%d at %d: %w", topicID, queueID, offset, err)
		}
		return nil, nil
	}
	if len(val) == 0 {
		return nil, nil
	}
	return queueRunKey(nil, topicID, queueID, offset), val
}

// ReadMessages walks one iterator over the log, forward only: a seq right
// after the last one read is one Next away, and a gap one SeekGE.
// maxSkip is how many log keys ReadMessages steps over before it seeks.
const maxSkip = 16

func (s *Store) ReadMessages(seqs []uint64, out []*core.Message) error {
	if len(seqs) == 0 {
		return nil
	}
	return s.read(func() error {
		// The bounds and the seek key in one allocation (a pull's); the key
		// has its own third: Pebble keeps the bounds, which must not change
		// while the iterator is open.
		const n = 9 // a log key: prefix and seq
		keys := make([]byte, 3*n)
		lo := logKey(keys[0:0:n], seqs[0])
		hi := logKey(keys[n:n:2*n], seqs[len(seqs)-1]+1)
		key := keys[2*n : 2*n : 3*n]
		it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
		if err != nil {
			return fmt.Errorf("pebblestore: read log: %w", err)
		}
		defer it.Close()
		valid := false // the iterator is at a key no seq has passed yet
		for i, seq := range seqs {
			key = logKey(key, seq)
			if !valid || bytes.Compare(it.Key(), key) < 0 {
				// A pull's seqs are close together: consecutive, or every
				// Nth of the log when sends spread over N queues. Stepping
				// over a few keys (without their values, which are in blob
				// files) is cheaper than a seek; past maxSkip keys, seek.
				for n := 0; valid && n < maxSkip; n++ {
					if valid = it.Next(); !valid || bytes.Compare(it.Key(), key) >= 0 {
						break
					}
				}
				if !valid || bytes.Compare(it.Key(), key) < 0 {
					valid = it.SeekGE(key)
				}
			}
			if !valid || !bytes.Equal(it.Key(), key) {
				continue
			}
			v, err := it.ValueAndErr()
			if err != nil {
				return fmt.Errorf("pebblestore: read seq %d: %w", seq, err)
			}
			if out[i], err = decodeRecord(v, seq); err != nil {
				return fmt.Errorf("pebblestore: read seq %d: %w", seq, err)
			}
		}
		return it.Error()
	})
}

// queueRange reads a queue's meta record (next offset, bytes) and its first
// index entry (the lowest retained offset).
func (s *Store) queueRange(topicID, queueID uint32) (core.QueueRange, error) {
	var r core.QueueRange
	v, closer, err := s.db.Get(queueMetaKey(topicID, queueID))
	switch {
	case errors.Is(err, pebble.ErrNotFound):
		return r, nil
	case err != nil:
		return r, err
	}
	if len(v) != 16 {
		closer.Close()
		return r, errCorrupt
	}
	r.Next, r.Bytes = be.Uint64(v), int64(be.Uint64(v[8:]))
	closer.Close()
	r.Min = r.Next
	lo := queueKey(nil, topicID, queueID, 0)
	hi := queueKey(nil, topicID, queueID, r.Next)
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return r, err
	}
	defer it.Close()
	if it.First() {
		r.Min = be.Uint64(it.Key()[9:])
	}
	return r, it.Error()
}

func (s *Store) loadNextSeq(snap *core.Snapshot) error {
	lo, hi := prefixRange([]byte{prefixLog})
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return err
	}
	defer it.Close()
	if it.Last() {
		snap.NextSeq = be.Uint64(it.Key()[1:]) + 1
	}
	return it.Error()
}

func (s *Store) ScanQueue(topicID, queueID uint32, from, to uint64, fn func(core.IndexEntry) bool) error {
	if from >= to {
		return nil
	}
	return s.read(func() error {
		if err := s.scanQueueIndex(topicID, queueID, from, to, fn); err != nil {
			return fmt.Errorf("pebblestore: scan %d/%d: %w", topicID, queueID, err)
		}
		return nil
	})
}

func (s *Store) ReadMessage(seq uint64) (*core.Message, error) {
	var m *core.Message
	err := s.read(func() error {
		kb := recordPool.Get().(*[]byte)
		defer recordPool.Put(kb)
		*kb = logKey(*kb, seq)
		v, closer, err := s.db.Get(*kb)
		if errors.Is(err, pebble.ErrNotFound) {
			return core.ErrMessageNotFound
		}
		if err != nil {
			return fmt.Errorf("pebblestore: read seq %d: %w", seq, err)
		}
		defer closer.Close()
		m, err = decodeRecord(v, seq)
		if err != nil {
			return fmt.Errorf("pebblestore: read seq %d: %w", seq, err)
		}
		return nil
	})
	return m, err
}

func (s *Store) OffsetAtTime(topicID, queueID uint32, timeMs int64) (uint64, bool, error) {
	var off uint64
	var ok bool
	err := s.read(func() error {
		lo := timeKey(nil, topicID, queueID, max(timeMs, 0), 0)
		_, hi := prefixRange(lo[:9])
		it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
		if err != nil {
			return err
		}
		defer it.Close()
		if it.First() && len(it.Key()) == 25 {
			off, ok = be.Uint64(it.Key()[17:]), true
		}
		return it.Error()
	})
	if err != nil {
		return 0, false, fmt.Errorf("pebblestore: offset at time %d/%d: %w", topicID, queueID, err)
	}
	return off, ok, nil
}
