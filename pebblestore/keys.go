package pebblestore

import "encoding/binary"

// Key prefixes; the layout is documented in doc.go.
const (
	prefixTopic     = 't'
	prefixSub       = 's'
	prefixQueueMeta = 'q'
	prefixLog       = 'L'
	prefixQueue     = 'Q'
	prefixTime      = 'T'
	prefixWatermark = 'C'
	prefixAck       = 'A'
	prefixSecondary = 'I'
	prefixHistory   = 'H'
)

var be = binary.BigEndian

func topicKey(topicID uint32) []byte {
	k := make([]byte, 5)
	k[0] = prefixTopic
	be.PutUint32(k[1:], topicID)
	return k
}

func subKey(subID uint32) []byte {
	k := make([]byte, 5)
	k[0] = prefixSub
	be.PutUint32(k[1:], subID)
	return k
}

func logKey(dst []byte, seq uint64) []byte {
	dst = append(dst[:0], prefixLog)
	return be.AppendUint64(dst, seq)
}

// queueKey is Q topic queue offset: the per-offset queue-index key of
// earlier data dirs, and the bound of scans (a run's key, queueRunKey, is
// one byte longer and sorts right after it).
func queueKey(dst []byte, topicID, queueID uint32, offset uint64) []byte {
	dst = append(dst[:0], prefixQueue)
	dst = be.AppendUint32(dst, topicID)
	dst = be.AppendUint32(dst, queueID)
	return be.AppendUint64(dst, offset)
}

// timeKey is T topic queue storedAtMs firstOffset: two batches stored in the
// same millisecond get two entries, and a seek to a time lands on the first.
func timeKey(dst []byte, topicID, queueID uint32, storedAtMs int64, offset uint64) []byte {
	dst = append(dst[:0], prefixTime)
	dst = be.AppendUint32(dst, topicID)
	dst = be.AppendUint32(dst, queueID)
	dst = be.AppendUint64(dst, uint64(storedAtMs))
	return be.AppendUint64(dst, offset)
}

// queueMetaKey holds a queue's next offset and byte total (16 bytes), so an
// emptied queue keeps its position and /topics shows bytes without a scan.
func queueMetaKey(topicID, queueID uint32) []byte {
	k := make([]byte, 0, 9)
	k = append(k, prefixQueueMeta)
	k = be.AppendUint32(k, topicID)
	return be.AppendUint32(k, queueID)
}

func watermarkKey(subID, queueID uint32) []byte {
	k := make([]byte, 0, 9)
	k = append(k, prefixWatermark)
	k = be.AppendUint32(k, subID)
	return be.AppendUint32(k, queueID)
}

func ackKey(subID, queueID uint32, offset uint64) []byte {
	k := make([]byte, 0, 17)
	k = append(k, prefixAck)
	k = be.AppendUint32(k, subID)
	k = be.AppendUint32(k, queueID)
	return be.AppendUint64(k, offset)
}

// prefixRange returns [p, p+1) as iterator bounds: every key that starts with p.
func prefixRange(p []byte) (lower, upper []byte) {
	upper = append([]byte(nil), p...)
	for i := len(upper) - 1; i >= 0; i-- {
		if upper[i] < 0xff {
			upper[i]++
			return p, upper[:i+1]
		}
	}
	return p, nil
}

func id32Prefix(prefix byte, id uint32) []byte {
	k := make([]byte, 0, 5)
	k = append(k, prefix)
	return be.AppendUint32(k, id)
}

// indexValueLen is the value length of a per-offset queue-index key of
// earlier data dirs: seq u64, storedAtMs u64, tagHash, size, keyHash u32.
const indexValueLen = 28

// secondaryKey is I topicID bucket kind hash seq: buckets first, so that
// retention drops a topic's old buckets with one range tombstone.
func secondaryKey(dst []byte, topicID, bucket uint32, kind byte, hash, seq uint64) []byte {
	dst = append(dst[:0], prefixSecondary)
	dst = be.AppendUint32(dst, topicID)
	dst = be.AppendUint32(dst, bucket)
	dst = append(dst, kind)
	dst = be.AppendUint64(dst, hash)
	return be.AppendUint64(dst, seq)
}

// historyKey is H topicID queueID offset cursorID id.
func historyKey(topicID, queueID uint32, offset uint64, cursorID uint32, id uint64) []byte {
	return appendHistoryKey(make([]byte, 0, 29), topicID, queueID, offset, cursorID, id)
}

func appendHistoryKey(k []byte, topicID, queueID uint32, offset uint64, cursorID uint32, id uint64) []byte {
	k = append(k[:0], prefixHistory)
	k = be.AppendUint32(k, topicID)
	k = be.AppendUint32(k, queueID)
	k = be.AppendUint64(k, offset)
	k = be.AppendUint32(k, cursorID)
	return be.AppendUint64(k, id)
}
