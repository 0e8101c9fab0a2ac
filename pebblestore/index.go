package pebblestore

import (
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/tidemq/tidemq/core"
)

// Secondary indexes (I): a topic's messages by id, sharding key and tag,
// in hour buckets of their store time (core.IndexBucket), so retention
// drops a topic's old buckets with one range tombstone. Ids that are NUIDs
// are kept in runs (idRun); other ids (core.IndexID), keys and tags have
// one key per message, its seq last. Delayed messages not yet due have
// their own kind, written with their parked record (parked.go).

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
	maxRunLen  = 256
	maxRunSpan = 1 << 20 // digest units; a NUID's sequence grows by at most 333 an id
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

// indexMessage indexes m by id, tag and keys (each key once).
func (b *batch) indexMessage(m *core.Message) {
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
}

func (b *batch) CutIndex(topicID uint32, bucket uint32) {
	lo := id32Prefix(prefixSecondary, topicID)
	b.deleteRange(lo, be.AppendUint32(lo, bucket))
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

// scanNUIDIndex is ScanIndex for NUID digests, which are stored in runs
// (see idRun): a run holding digest starts at most maxRunSpan below it, so
// the runs of a bucket whose first digest lies in [digest-maxRunSpan,
// digest] are all there is to read.
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
			slices.Sort(seqs)
			for _, seq := range seqs {
				if afterBucket > 0 && bucket == afterBucket && seq <= afterSeq {
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
