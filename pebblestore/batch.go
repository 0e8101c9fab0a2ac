package pebblestore

import (
	"bytes"
	"fmt"
	"slices"
	"sync"

	"github.com/cockroachdb/pebble/v2"

	"github.com/tidemq/tidemq/core"
)

// batch is core.Batch: the writes of each record family are in its file
// (messages.go, index.go, parked.go, …); this is what they share.
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

// maxRetainedBatchBytes is the largest buffer a closed batch keeps for
// the next one. A group commit of 16 batch sends of 100 × 1 KiB is ~2 MiB:
// grown afresh by doubling at every commit, it was two fifths of what a
// batch send allocated. The appender's commits stop at core's
// MaxCommitBytes (8 MiB). The batches are the store's own (Store.batches),
// not Pebble's pool, whose other users (the raft log, applying replicated
// batches) replace a batch's buffer with one of their own.
const maxRetainedBatchBytes = 16 << 20

func (s *Store) NewBatch() core.Batch {
	return &batch{s: s, b: s.pooledBatch(), key: make([]byte, 0, 32), val: make([]byte, 0, 1024)}
}

// pooledBatch is an empty batch from s.batches, its buffer kept from an
// earlier use; releaseBatch returns it.
func (s *Store) pooledBatch() *pebble.Batch {
	if pb, _ := s.batches.Get().(*pebble.Batch); pb != nil {
		return pb
	}
	return s.db.NewBatch(pebble.WithMaxRetainedSizeBytes(maxRetainedBatchBytes))
}

func (s *Store) releaseBatch(pb *pebble.Batch) {
	// Reset keeps the buffer unless the commit pipeline may still read it
	// (Pebble drops it then, as for a large batch it flushes whole).
	pb.Reset()
	s.batches.Put(pb)
}

func (b *batch) Len() int { return b.b.Len() + len(b.index) }

// Repr implements core.Batch: the waiting index entries go into the batch
// first, so the bytes hold every write. Pebble reuses them once the batch
// is committed or closed.
func (b *batch) Repr() []byte {
	b.flushIndex()
	return b.b.Repr()
}

// Commit implements core.Batch. A synced commit that core says is alone
// (one caller waiting on its own goroutine, nothing queued behind it)
// waits for its WAL sync by polling when syncs may spin, since then nobody
// else wants the CPU it spends (Store.commitPolling); any other commit,
// or every one with Options.NoSyncSpin or NoFsyncRing, parks in Pebble's
// SyncWait. Durable either way when sync is set.
func (b *batch) Commit(sync, alone bool) error {
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
		if sync && alone && b.s.walSyncs != nil {
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
		b.s.releaseBatch(b.b)
		b.b = nil
	}
	if cap(b.index) > 0 {
		indexBufs.Put(&indexBuf{index: b.index[:0], indexKVs: b.indexKVs[:0]})
		b.index, b.indexKVs = nil, nil
	}
}
