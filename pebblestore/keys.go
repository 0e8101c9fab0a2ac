package pebblestore

import (
	"encoding/binary"

	"github.com/tidemq/tidemq/core"
)

// Key prefixes: every key the store writes starts with one of these (the
// layout is documented in doc.go). Integers in keys are big-endian and
// fixed-width, so keys sort in numeric order.
const (
	prefixTopic     = 't' // t topicID → topic record (JSON)
	prefixSub       = 's' // s subID → subscription record (JSON)
	prefixMeta      = 'm' // m name → store-wide values (keyLastIDs, keyCounters, keyEpoch, keyFormat, keyRestoring; applied.go: a raft group's applied index and session, the cluster's receipt key)
	prefixQueueMeta = 'q' // q topicID queueID → next offset, bytes
	prefixLog       = 'L' // L seq → message record
	prefixQueue     = 'Q' // Q topicID queueID firstOffset 'r' → queue-index run
	prefixTime      = 'T' // T topicID queueID storedAtMs firstOffset → ∅
	prefixSecondary = 'I' // I topicID bucket kind … → ∅ or an id run
	prefixHistory   = 'H' // H topicID queueID offset cursorID id → delivery
	prefixWatermark = 'C' // C cursorID queueID → acked watermark
	prefixAck       = 'A' // A cursorID queueID offset → ∅
	prefixAttempt   = 'F' // F cursorID queueID offset → failed attempts, suspension end
	prefixMember    = 'M' // M subID consumerID → cursor id
	prefixRetry     = 'R' // R id → parked retry
	prefixDelayed   = 'P' // P id → parked delayed send
	prefixHalf      = 'h' // h id → parked half message (transactions.go)
	prefixTxOpen    = 'x' // x id → open transaction record (JSON)
	prefixTxSettled = 'y' // y id → settled transaction record (JSON)
	prefixTimer     = 'D' // D dueMs id → kind
	prefixDead      = 'X' // X subID deadAtMs id → dead message
	prefixDedup     = 'U' // U topicID key → remembered send result
	prefixRaft      = 'r' // r group kind … → a raft group's log and stable store (raftlog.go)
)

// Keys of the m prefix.
var (
	// keyLastIDs holds the highest topic and subscription ids ever given.
	keyLastIDs = []byte{prefixMeta, 'I'}
	// keyCounters holds the broker's counters (core.Counters): next seq,
	// last store time, highest record id.
	keyCounters = []byte{prefixMeta, 'C'}
	// keyFormat holds the layout's version (format.go).
	keyFormat = []byte{prefixMeta, 'V'}
	// keyEpoch holds the broker's epoch (uint64), raised on every start;
	// a store without it is at epoch 0.
	keyEpoch = []byte{prefixMeta, 'E'}
	// keyRestoring marks a RestoreState under way (statesnap.go): while it
	// is there the state is half-replaced and must not be served.
	keyRestoring = []byte{prefixMeta, 'R'}
)

// The raft groups' keys span [raftSpanStart, raftSpanEnd): every key of
// prefix r. They are each replica's own log and votes, not the state it
// applied, so fingerprints and state snapshots leave them out (isRaftKey).
var raftSpanStart, raftSpanEnd = []byte{prefixRaft}, []byte{prefixRaft + 1}

func isRaftKey(k []byte) bool { return len(k) > 0 && k[0] == prefixRaft }

// Markers inside keys of a prefix.
const (
	// queueRunMarker ends a queue-index key (Q): the key's value is a run
	// of entries from its offset on.
	queueRunMarker = 'r'
	// indexNUIDRun is the secondary index kind of NUID id runs; core's
	// other kinds (core.IndexID, IndexKey, IndexTag, IndexDelayed) are
	// stored under their own byte.
	indexNUIDRun byte = 'r'
)

var be = binary.BigEndian

func topicKey(topicID uint32) []byte { return id32Prefix(prefixTopic, topicID) }

func subKey(subID uint32) []byte { return id32Prefix(prefixSub, subID) }

func logKey(dst []byte, seq uint64) []byte {
	dst = append(dst[:0], prefixLog)
	return be.AppendUint64(dst, seq)
}

// queueKey is Q topic queue offset: the bound of queue-index scans. A run's
// key (queueRunKey) is one byte longer and sorts right after it.
func queueKey(dst []byte, topicID, queueID uint32, offset uint64) []byte {
	dst = append(dst[:0], prefixQueue)
	dst = be.AppendUint32(dst, topicID)
	dst = be.AppendUint32(dst, queueID)
	return be.AppendUint64(dst, offset)
}

// queueRunKeyLen is the length of a queue-index key: Q topic queue
// firstOffset 'r'.
const queueRunKeyLen = 18

func queueRunKey(dst []byte, topicID, queueID uint32, firstOffset uint64) []byte {
	return append(queueKey(dst, topicID, queueID, firstOffset), queueRunMarker)
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

// attemptKey is F cursorID queueID offset: a cursor's records, and each of
// its queues', are contiguous, so deleting either is one range tombstone.
func attemptKey(dst []byte, cursorID, queueID uint32, offset uint64) []byte {
	dst = append(dst[:0], prefixAttempt)
	dst = be.AppendUint32(dst, cursorID)
	dst = be.AppendUint32(dst, queueID)
	return be.AppendUint64(dst, offset)
}

// attemptKeyLen is the length of an attemptKey.
const attemptKeyLen = 17

func memberKey(subID uint32, consumerID string) []byte {
	return append(id32Prefix(prefixMember, subID), consumerID...)
}

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

// parkedKey is R id for a retry, P id for a delayed send, h id for a half
// message.
func parkedKey(kind byte, id uint64) []byte {
	p := byte(prefixDelayed)
	switch kind {
	case core.ParkedRetry:
		p = prefixRetry
	case core.ParkedHalf:
		p = prefixHalf
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
