package pebblestore

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"slices"
	"sync"

	"github.com/cockroachdb/pebble/v2"

	"github.com/tidemq/tidemq/core"
)

type batch struct {
	s      *Store
	b      *pebble.Batch
	key    []byte
	val    []byte
	err    error // the first encoding error; Commit reports it
	lastTS map[[2]uint32]int64

	// The queue, secondary and time index entries of appended messages wait
	// here and go into the batch sorted, at Commit or before a range
	// deletion. Pebble inserts a batch into its memtable skiplist in batch
	// order, and an insert right after the previous one skips the search:
	// interleaved (log, queue, id hash, log, …) every insert searched from
	// the top, ~20% of the store's CPU. The log keys come in seq order
	// already.
	index    []byte    // the entries' bytes
	indexKVs []indexKV // where each entry's key and value are in index

	run       idRun                   // the NUID id-index run being built
	queueRuns map[[2]uint32]*queueRun // the queue-index run of each queue appended to
}

// idRun is consecutive NUID index entries of a batch kept as one key (kind
// indexNUIDRun, see ScanIndex): the first entry's digest and seq in the
// key, then each next entry as uvarint deltas of both in the value. A run
// needs increasing digests and seqs, one topic and bucket, at most
// maxRunLen entries and digests within maxRunSpan of its first, which is
// what lets a lookup find every run that may hold a digest with one range
// read. A send of 100 messages is then one index key, not 100: each key
// costs a memtable insert and is rewritten by every compaction of its
// level (the per-message entries were 6–9 points of a batch send's rate).
type idRun struct {
	open              bool
	topicID, bucket   uint32
	first, last       uint64 // digests
	firstSeq, lastSeq uint64
	n                 int
	deltas            []byte
}

const (
	indexNUIDRun byte = 'r'
	maxRunLen         = 256
	maxRunSpan        = 1 << 20 // digest units; a NUID's sequence grows by at most 333 an id
)

// addToRun indexes a NUID digest for seq, extending the open run when it
// can.
func (b *batch) addToRun(topicID, bucket uint32, digest, seq uint64) {
	r := &b.run
	if r.open && r.topicID == topicID && r.bucket == bucket && digest > r.last && digest-r.first <= maxRunSpan &&
		seq > r.lastSeq && r.n < maxRunLen {
		r.deltas = binary.AppendUvarint(r.deltas, digest-r.last)
		r.deltas = binary.AppendUvarint(r.deltas, seq-r.lastSeq)
		r.last, r.lastSeq = digest, seq
		r.n++
		return
	}
	b.closeRun()
	*r = idRun{open: true, topicID: topicID, bucket: bucket, first: digest, last: digest,
		firstSeq: seq, lastSeq: seq, n: 1, deltas: r.deltas[:0]}
}

// closeRun queues the open run's key with the other index entries.
func (b *batch) closeRun() {
	r := &b.run
	if !r.open {
		return
	}
	b.key = secondaryKey(b.key, r.topicID, r.bucket, indexNUIDRun, r.first, r.firstSeq)
	b.deferIndex(b.key, r.deltas)
	r.open = false
}

type indexKV struct{ keyStart, valStart, end int }

// indexBufs recycles the index buffers of committed batches: a batch of a
// few thousand messages holds ~200 KB of them.
var indexBufs = sync.Pool{New: func() any { return new(indexBuf) }}

type indexBuf struct {
	index    []byte
	indexKVs []indexKV
}

func (b *batch) deferIndex(key, val []byte) {
	if b.index == nil {
		buf := indexBufs.Get().(*indexBuf)
		b.index, b.indexKVs = buf.index, buf.indexKVs
	}
	kv := indexKV{keyStart: len(b.index)}
	b.index = append(b.index, key...)
	kv.valStart = len(b.index)
	b.index = append(b.index, val...)
	kv.end = len(b.index)
	b.indexKVs = append(b.indexKVs, kv)
}

// deleteRange is every range deletion of a batch: the waiting index
// entries go in first, so that a tombstone written after them in the batch
// covers them as it would have had they been written in place.
func (b *batch) deleteRange(lo, hi []byte) {
	b.flushIndex()
	_ = b.b.DeleteRange(lo, hi, nil)
}

// flushIndex writes the waiting index entries in key order. Stable: a key
// set twice keeps its last value.
func (b *batch) flushIndex() {
	b.closeRun()
	for qk, r := range b.queueRuns {
		b.closeQueueRun(qk, r)
	}
	if len(b.indexKVs) == 0 {
		return
	}
	slices.SortStableFunc(b.indexKVs, func(x, y indexKV) int {
		return bytes.Compare(b.index[x.keyStart:x.valStart], b.index[y.keyStart:y.valStart])
	})
	for _, kv := range b.indexKVs {
		var val []byte
		if kv.end > kv.valStart {
			val = b.index[kv.valStart:kv.end]
		}
		_ = b.b.Set(b.index[kv.keyStart:kv.valStart], val, nil)
	}
	b.index, b.indexKVs = b.index[:0], b.indexKVs[:0]
}

func (s *Store) NewBatch() core.Batch {
	return &batch{s: s, b: s.db.NewBatch(), key: make([]byte, 0, 32), val: make([]byte, 0, 1024)}
}

func (b *batch) setJSON(key []byte, v any) {
	data, err := json.Marshal(v)
	if err != nil && b.err == nil {
		b.err = err
	}
	_ = b.b.Set(key, data, nil)
}

func (b *batch) PutTopic(t *core.TopicRecord) { b.setJSON(topicKey(t.ID), t) }

func (b *batch) DeleteTopic(t *core.TopicRecord) {
	// The topic's ranges go with range tombstones. Its bodies in the shared
	// log stay until retention cuts the log past them (core): deleting them
	// one by one took a batch as large as the topic (10M messages: 170 MB).
	for _, p := range []byte{prefixQueue, prefixTime, prefixSecondary, prefixHistory, prefixQueueMeta} {
		lo, hi := prefixRange(id32Prefix(p, t.ID))
		b.deleteRange(lo, hi)
	}
	_ = b.b.Delete(topicKey(t.ID), nil)
}

func (b *batch) PutSubscription(s *core.SubscriptionRecord) { b.setJSON(subKey(s.ID), s) }

func (b *batch) DeleteSubscription(s *core.SubscriptionRecord) {
	for _, p := range []byte{prefixWatermark, prefixAck, prefixDead, prefixMember} {
		lo, hi := prefixRange(id32Prefix(p, s.ID))
		b.deleteRange(lo, hi)
	}
	_ = b.b.Delete(subKey(s.ID), nil)
}

func (b *batch) Append(m *core.Message) {
	b.val = encodeRecord(b.val[:0], m)
	b.key = logKey(b.key, m.Seq)
	_ = b.b.Set(b.key, b.val, nil)
	b.addToQueueRun(m)
	bucket := core.IndexBucket(m.StoredAtMs)
	if kind, digest := core.IDIndex(m.ID); kind == core.IndexNUID {
		b.addToRun(m.TopicID, bucket, digest, m.Seq)
	} else {
		b.key = secondaryKey(b.key, m.TopicID, bucket, kind, digest, m.Seq)
		b.deferIndex(b.key, nil)
	}
	if m.Tag != "" {
		b.key = secondaryKey(b.key, m.TopicID, bucket, core.IndexTag, core.IndexHash(m.Tag), m.Seq)
		b.deferIndex(b.key, nil)
	}
	for i, k := range m.Keys {
		if slices.Contains(m.Keys[:i], k) {
			continue
		}
		b.key = secondaryKey(b.key, m.TopicID, bucket, core.IndexKey, core.IndexHash(k), m.Seq)
		b.deferIndex(b.key, nil)
	}
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

func (b *batch) Len() int { return b.b.Len() + len(b.index) }

func (b *batch) Commit(sync bool) error { return b.commit(sync, false) }

// CommitPolling implements core.PollingBatch: a synced commit that waits
// for its WAL sync by polling when syncs may spin (Store.commitPolling).
func (b *batch) CommitPolling() error { return b.commit(true, true) }

func (b *batch) commit(sync, poll bool) error {
	defer b.Close()
	if b.err != nil {
		return fmt.Errorf("pebblestore: commit: %w", b.err)
	}
	b.flushIndex()
	opt := pebble.NoSync
	if sync {
		opt = pebble.Sync
	}
	err := b.s.read(func() error {
		if poll && b.s.walSyncs != nil {
			return b.s.commitPolling(b.b)
		}
		return b.b.Commit(opt)
	})
	if err != nil {
		return fmt.Errorf("pebblestore: commit: %w", err)
	}
	return nil
}

func (b *batch) Close() {
	if b.b != nil {
		_ = b.b.Close()
		b.b = nil
	}
	if cap(b.index) > 0 {
		indexBufs.Put(&indexBuf{index: b.index[:0], indexKVs: b.indexKVs[:0]})
		b.index, b.indexKVs = nil, nil
	}
}

func (b *batch) CutIndex(topicID uint32, bucket uint32) {
	lo := id32Prefix(prefixSecondary, topicID)
	b.deleteRange(lo, be.AppendUint32(lo, bucket))
}

// History: attempt u32 | consumer | deliveredAtMs u64 | outcome u8 | reason | settledAtMs u64
func (b *batch) PutHistory(h *core.HistoryRecord) {
	// An ack writes one of these per message: the batch's scratch buffers,
	// which Set copies, instead of two allocations each.
	v := be.AppendUint32(b.val[:0], uint32(h.Attempt))
	v = appendString(v, h.ConsumerID)
	v = be.AppendUint64(v, uint64(h.DeliveredAtMs))
	v = append(v, h.Outcome)
	v = appendString(v, h.Reason)
	b.val = be.AppendUint64(v, uint64(h.SettledAtMs))
	b.key = appendHistoryKey(b.key, h.TopicID, h.QueueID, h.Offset, h.StateID, h.ID)
	_ = b.b.Set(b.key, b.val, nil)
}
