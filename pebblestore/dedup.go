package pebblestore

import (
	"github.com/tidemq/tidemq/core"
)

// Remembered sends (U): a send's reply under its topic and dedup key, for
// core.DedupWindow.

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

func (b *batch) PutDedup(r *core.DedupRecord) {
	_ = b.b.Set(dedupKey(r.TopicID, r.Key), encodeDedup(r), nil)
}

func (b *batch) DeleteDedup(topicID uint32, key string) { _ = b.b.Delete(dedupKey(topicID, key), nil) }

// loadDedup reads the remembered sends.
func (s *Store) loadDedup(snap *core.Snapshot) error {
	lo, hi := prefixRange([]byte{prefixDedup})
	return s.walk(lo, hi, func(k, v []byte) (bool, error) {
		r, err := decodeDedup(k, v)
		if err != nil {
			return false, err
		}
		snap.Dedup = append(snap.Dedup, r)
		return true, nil
	})
}
