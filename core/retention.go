package core

import (
	"context"
	"log/slog"
	"time"
)

// EnforceRetention removes, per topic, the messages stored before
// now - retentionHours: each queue's index and time index are cut with
// range tombstones, its minOffset advances, and the shared log is cut below
// the oldest record any queue still holds. The log is also cut when that
// record moved for another reason: a deleted topic's bodies stay in the
// log until then (deleting them one by one would be one batch as large as
// the topic's index). The timer loop runs it periodically; it is exported
// for tests and operators.
func (b *Broker) EnforceRetention() error {
	if b.closed.Load() {
		return ErrClosed
	}
	// One run at a time: two runs computing cuts from the same minimum
	// would subtract the same bytes twice.
	b.retentionMu.Lock()
	defer b.retentionMu.Unlock()
	now := b.now()
	type cut struct {
		q      *queue
		oldMin uint64
		newMin uint64
		cutMs  int64
		bytes  int64
	}
	var cuts []cut
	type indexCut struct {
		t      *topic
		bucket uint32
	}
	var indexCuts []indexCut
	// Read before the scans and before the topic list: a record stored
	// after it has a seq at or above it, and a topic holding a record below
	// it was listed before that record was committed. Read after the list,
	// a topic created and sent to in between was missed while its records
	// counted as stored, and the cut took them.
	stored := b.committedSeq.Load()
	b.mu.RLock()
	topics := make([]*topic, 0, len(b.topics))
	for _, t := range b.topics {
		topics = append(topics, t)
	}
	b.mu.RUnlock()
	oldestSeq := ^uint64(0)
	for _, t := range topics {
		b.mu.RLock()
		rec, queues := t.rec, t.queues
		b.mu.RUnlock()
		cutMs := now.Add(-time.Duration(rec.RetentionHours) * time.Hour).UnixMilli()
		// Whole index buckets older than the cut go with one tombstone, once
		// per bucket.
		if bucket := IndexBucket(cutMs); bucket > t.indexCut.Load() {
			indexCuts = append(indexCuts, indexCut{t, bucket})
		}
		for _, q := range queues {
			// Read next before looking up the cut: anything appended after
			// is newer than the cut time.
			next, lo := q.next.Load(), q.min.Load()
			newMin, ok, err := b.store.OffsetAtTime(rec.ID, q.id, cutMs)
			if err != nil {
				return err
			}
			if !ok || newMin > next {
				newMin = next
			}
			if newMin > lo {
				var bytes int64
				err := b.store.ScanQueue(rec.ID, q.id, lo, newMin, func(e IndexEntry) bool {
					bytes += int64(e.Size)
					return true
				})
				if err != nil {
					return err
				}
				cuts = append(cuts, cut{q: q, oldMin: lo, newMin: newMin, cutMs: cutMs, bytes: bytes})
			}
			if first := max(newMin, lo); first < next {
				err := b.store.ScanQueue(rec.ID, q.id, first, first+1, func(e IndexEntry) bool {
					oldestSeq = min(oldestSeq, e.Seq)
					return false
				})
				if err != nil {
					return err
				}
			}
		}
	}
	// Never past what was stored before the scan: a batch committed during
	// it becomes visible queue by queue, and a queue scanned before its
	// records showed looked empty while the batch's other queues held
	// later seqs (cutting at those took its records: TestLogCutsNeverTake
	// ABatchBecomingVisible). With no queue holding a record, everything
	// below it may go.
	oldestSeq = min(oldestSeq, stored)
	cutLog := len(cuts) > 0 || oldestSeq > b.logCut.Load()
	if !cutLog && len(indexCuts) == 0 {
		return nil
	}
	req := &request{kind: reqWrite, writes: []func(Batch){func(batch Batch) {
		for _, c := range cuts {
			if c.q.min.Load() != c.oldMin {
				continue // cut meanwhile; the next run measures again
			}
			batch.CutQueue(c.q.topicID, c.q.id, c.newMin, c.cutMs)
			c.q.pendingBytes -= c.bytes
			b.touch(c.q)
		}
		for _, ic := range indexCuts {
			batch.CutIndex(ic.t.rec.ID, ic.bucket)
		}
		if cutLog {
			// Records appended since the scan have seqs at or above the
			// appender's next seq, so the cut never reaches them.
			batch.CutLog(min(oldestSeq, b.nextSeq))
		}
	}}, after: func() {
		if cutLog {
			b.logCut.Store(oldestSeq)
		}
		for _, c := range cuts {
			c.q.min.CompareAndSwap(c.oldMin, c.newMin)
		}
		for _, ic := range indexCuts {
			ic.t.indexCut.Store(ic.bucket)
		}
	}}
	if err := b.submit(context.Background(), req); err != nil {
		return err
	}
	// A run that cut no queue (only the log or the index behind them) is
	// routine, every retentionEvery: not worth an operator's attention.
	level := slog.LevelDebug
	if len(cuts) > 0 {
		level = slog.LevelInfo
	}
	b.log.Log(context.Background(), level, "retention applied", "queues_cut", len(cuts))
	return nil
}
