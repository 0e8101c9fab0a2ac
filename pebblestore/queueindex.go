package pebblestore

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/cockroachdb/pebble/v2"

	"github.com/tidemq/tidemq/core"
)

// A queue's index is runs: the entries of consecutive offsets appended in
// one batch are one key, Q topic queue firstOffset 'r', whose value holds
// each entry in offset order (see appendQueueEntry). A send of 100
// messages over 8 queues then writes 8 queue-index keys, not 100; each key
// costs a memtable insert and is rewritten by every compaction of its
// level, and a pull of 256 reads a few keys instead of 256. Data dirs of
// earlier versions hold one key per offset (Q topic queue offset, 17 bytes,
// a 28-byte value): they are read alike, told apart by key length.
const (
	queueRunMarker = 'r'
	queueRunKeyLen = 18
	legacyQueueKey = 17
	maxQueueRunLen = 256 // bounds what a scan from inside a run decodes and skips
)

func queueRunKey(dst []byte, topicID, queueID uint32, firstOffset uint64) []byte {
	return append(queueKey(dst, topicID, queueID, firstOffset), queueRunMarker)
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

// eachQueueEntry calls fn for the entries of one queue-index key, of
// either form, from offset from on, until fn returns false; it reports
// whether fn asked for more.
func eachQueueEntry(key, val []byte, from uint64, fn func(core.IndexEntry) bool) (bool, error) {
	switch len(key) {
	case legacyQueueKey:
		if len(val) != indexValueLen {
			return false, errCorrupt
		}
		e := core.IndexEntry{
			Offset:     be.Uint64(key[9:]),
			Seq:        be.Uint64(val),
			StoredAtMs: int64(be.Uint64(val[8:])),
			TagHash:    be.Uint32(val[16:]),
			Size:       be.Uint32(val[20:]),
			KeyHash:    be.Uint32(val[24:]),
		}
		if e.Offset < from {
			return true, nil
		}
		return fn(e), nil
	case queueRunKeyLen:
		if key[17] != queueRunMarker {
			return false, errCorrupt
		}
	default:
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
		if !it.Last() || len(it.Key()) != queueRunKeyLen {
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
