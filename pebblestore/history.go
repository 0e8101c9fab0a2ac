package pebblestore

import (
	"github.com/cockroachdb/pebble/v2"

	"github.com/tidemq/tidemq/core"
)

// Delivery history (H): each settled delivery of a message, under the
// message's queue and offset, so retention cuts it with the queue.

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
