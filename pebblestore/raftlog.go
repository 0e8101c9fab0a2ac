package pebblestore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/hashicorp/raft"
)

// ErrKeyNotFound is what RaftStore.Get and GetUint64 return for a key never
// set. hashicorp/raft recognises a missing key by this exact message (it
// compares err.Error() with "not found"), so it is never wrapped.
var ErrKeyNotFound = errors.New("not found")

// Kinds of raft keys, the byte after the group id (doc.go, "Raft groups").
const (
	raftKindLog    = 'l' // r group 'l' index → encoded raft.Log
	raftKindStable = 's' // r group 's' key → StableStore value
)

// raftLogVersion is the first byte of every encoded raft.Log, so that a
// later encoding can be told apart from this one.
const raftLogVersion = 1

// RaftStore is one raft group's log and stable store in the node's Pebble:
// it implements raft.LogStore and raft.StableStore. Every write is synced
// before it returns. Several groups share one Store, each under its own
// key span; a RaftStore is safe for concurrent use.
type RaftStore struct {
	s     *Store
	group uint32
	// logLo and logHi bound the group's log keys: [r group 'l', r group 'm').
	logLo, logHi []byte
}

var (
	_ raft.LogStore    = (*RaftStore)(nil)
	_ raft.StableStore = (*RaftStore)(nil)
)

// RaftStore returns the log and stable store of raft group group. It
// holds no state of its own: two calls for one group see the same data.
func (s *Store) RaftStore(group uint32) *RaftStore {
	lo := raftKey(nil, group, raftKindLog)
	hi := raftKey(nil, group, raftKindLog+1)
	return &RaftStore{s: s, group: group, logLo: lo, logHi: hi}
}

// raftKey is r group kind: the start of one kind's keys in a group.
func raftKey(dst []byte, group uint32, kind byte) []byte {
	dst = append(dst[:0], prefixRaft)
	dst = be.AppendUint32(dst, group)
	return append(dst, kind)
}

func (r *RaftStore) logKey(dst []byte, index uint64) []byte {
	return be.AppendUint64(raftKey(dst, r.group, raftKindLog), index)
}

func (r *RaftStore) stableKey(key []byte) []byte {
	return append(raftKey(make([]byte, 0, 6+len(key)), r.group, raftKindStable), key...)
}

// FirstIndex implements raft.LogStore: the lowest stored index, 0 if the
// log is empty.
func (r *RaftStore) FirstIndex() (uint64, error) { return r.edgeIndex(true) }

// LastIndex implements raft.LogStore: the highest stored index, 0 if the
// log is empty.
func (r *RaftStore) LastIndex() (uint64, error) { return r.edgeIndex(false) }

// edgeIndex reads the first or last key of the group's log span: one seek
// on an iterator bounded to the span.
func (r *RaftStore) edgeIndex(first bool) (uint64, error) {
	var index uint64
	err := r.s.read(func() error {
		it, err := r.s.db.NewIter(&pebble.IterOptions{LowerBound: r.logLo, UpperBound: r.logHi})
		if err != nil {
			return err
		}
		var ok bool
		if first {
			ok = it.First()
		} else {
			ok = it.Last()
		}
		if ok {
			k := it.Key()
			if len(k) != len(r.logLo)+8 {
				err = fmt.Errorf("raft log key %x has %d bytes", k, len(k))
			} else {
				index = be.Uint64(k[len(r.logLo):])
			}
		}
		return errors.Join(err, it.Error(), it.Close())
	})
	if err != nil {
		return 0, fmt.Errorf("pebblestore: raft group %d: log index: %w", r.group, err)
	}
	return index, nil
}

// GetLog implements raft.LogStore; a missing index is raft.ErrLogNotFound.
func (r *RaftStore) GetLog(index uint64, log *raft.Log) error {
	found, err := r.lookup(r.logKey(nil, index), func(v []byte) error { return decodeRaftLog(v, index, log) })
	if err != nil {
		return fmt.Errorf("pebblestore: raft group %d: log %d: %w", r.group, index, err)
	}
	if !found {
		return raft.ErrLogNotFound
	}
	return nil
}

// lookup calls use with the value stored under key, valid only during the
// call, and reports whether there was one.
func (r *RaftStore) lookup(key []byte, use func(v []byte) error) (found bool, err error) {
	err = r.s.read(func() error {
		v, closer, err := r.s.db.Get(key)
		if errors.Is(err, pebble.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		defer closer.Close()
		found = true
		return use(v)
	})
	return found, err
}

// StoreLog implements raft.LogStore.
func (r *RaftStore) StoreLog(log *raft.Log) error { return r.StoreLogs([]*raft.Log{log}) }

// StoreLogs implements raft.LogStore: the logs are one synced batch, so
// either all of them are stored or none.
func (r *RaftStore) StoreLogs(logs []*raft.Log) error {
	if len(logs) == 0 {
		return nil
	}
	// Entries are whole group-commit batches (megabytes): encoded in place
	// in a pooled batch's buffer, not into one of their own first and then
	// into a batch grown afresh by doubling.
	var k []byte
	err := r.s.read(func() error {
		b := r.s.pooledBatch()
		defer r.s.releaseBatch(b)
		for _, l := range logs {
			k = r.logKey(k[:0], l.Index)
			n := raftLogLen(l)
			op := b.SetDeferred(len(k), n)
			copy(op.Key, k)
			if got := len(encodeRaftLog(op.Value[:0], l)); got != n {
				return fmt.Errorf("raft log %d encoded in %d bytes, %d reserved", l.Index, got, n)
			}
			if err := op.Finish(); err != nil {
				return err
			}
		}
		return b.Commit(pebble.Sync)
	})
	if err != nil {
		return fmt.Errorf("pebblestore: raft group %d: store %d logs: %w", r.group, len(logs), err)
	}
	return nil
}

// DeleteRange implements raft.LogStore: it deletes the logs from min to
// max, both included, with one range tombstone.
func (r *RaftStore) DeleteRange(min, max uint64) error {
	if min > max {
		return nil
	}
	lo := r.logKey(nil, min)
	hi := r.logHi
	if max < math.MaxUint64 {
		hi = r.logKey(nil, max+1)
	}
	err := r.s.read(func() error { return r.s.db.DeleteRange(lo, hi, pebble.Sync) })
	if err != nil {
		return fmt.Errorf("pebblestore: raft group %d: delete logs %d–%d: %w", r.group, min, max, err)
	}
	return nil
}

// Set implements raft.StableStore.
func (r *RaftStore) Set(key, val []byte) error {
	err := r.s.read(func() error { return r.s.db.Set(r.stableKey(key), val, pebble.Sync) })
	if err != nil {
		return fmt.Errorf("pebblestore: raft group %d: set %q: %w", r.group, key, err)
	}
	return nil
}

// Get implements raft.StableStore; a key never set is ErrKeyNotFound.
func (r *RaftStore) Get(key []byte) ([]byte, error) {
	var val []byte
	found, err := r.lookup(r.stableKey(key), func(v []byte) error {
		val = append(make([]byte, 0, len(v)), v...)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("pebblestore: raft group %d: get %q: %w", r.group, key, err)
	}
	if !found {
		return nil, ErrKeyNotFound
	}
	return val, nil
}

// SetUint64 implements raft.StableStore: the value is 8 bytes big-endian,
// under the same keys as Set's.
func (r *RaftStore) SetUint64(key []byte, val uint64) error {
	return r.Set(key, be.AppendUint64(nil, val))
}

// GetUint64 implements raft.StableStore; a key never set is 0 and
// ErrKeyNotFound.
func (r *RaftStore) GetUint64(key []byte) (uint64, error) {
	v, err := r.Get(key)
	if err != nil {
		return 0, err
	}
	if len(v) != 8 {
		return 0, fmt.Errorf("pebblestore: raft group %d: %q holds %d bytes, not a uint64", r.group, key, len(v))
	}
	return be.Uint64(v), nil
}

// encodeRaftLog appends l's encoding to dst: version u8, index uvarint,
// term uvarint, type u8, data (uvarint length, bytes), extensions (uvarint
// length, bytes), appendedAt (u8 0 for the zero time, else 1, then Unix
// seconds varint and nanoseconds uvarint). Equal logs encode to equal bytes.
func encodeRaftLog(dst []byte, l *raft.Log) []byte {
	dst = append(dst, raftLogVersion)
	dst = binary.AppendUvarint(dst, l.Index)
	dst = binary.AppendUvarint(dst, l.Term)
	dst = append(dst, byte(l.Type))
	dst = binary.AppendUvarint(dst, uint64(len(l.Data)))
	dst = append(dst, l.Data...)
	dst = binary.AppendUvarint(dst, uint64(len(l.Extensions)))
	dst = append(dst, l.Extensions...)
	if l.AppendedAt.IsZero() {
		return append(dst, 0)
	}
	dst = append(dst, 1)
	dst = binary.AppendVarint(dst, l.AppendedAt.Unix())
	return binary.AppendUvarint(dst, uint64(l.AppendedAt.Nanosecond()))
}

// raftLogLen is the length of encodeRaftLog's record of l.
func raftLogLen(l *raft.Log) int {
	n := 1 + uvarintLen(l.Index) + uvarintLen(l.Term) + 1 +
		uvarintLen(uint64(len(l.Data))) + len(l.Data) +
		uvarintLen(uint64(len(l.Extensions))) + len(l.Extensions) + 1
	if !l.AppendedAt.IsZero() {
		n += varintLen(l.AppendedAt.Unix()) + uvarintLen(uint64(l.AppendedAt.Nanosecond()))
	}
	return n
}

// errRaftLog reports an encoded raft.Log this build cannot read.
var errRaftLog = errors.New("malformed raft log record")

// decodeRaftLog fills l from v, the record stored under index. Data and
// Extensions share one copy of v, so l outlives v's buffer.
func decodeRaftLog(v []byte, index uint64, l *raft.Log) error {
	if len(v) == 0 || v[0] != raftLogVersion {
		if len(v) == 0 {
			return fmt.Errorf("%w: empty", errRaftLog)
		}
		return fmt.Errorf("%w: version %d, this build reads %d", errRaftLog, v[0], raftLogVersion)
	}
	buf := append([]byte(nil), v[1:]...)
	d := raftLogDecoder{b: buf}
	var out raft.Log
	out.Index = d.uvarint()
	out.Term = d.uvarint()
	out.Type = raft.LogType(d.byte())
	out.Data = d.bytes()
	out.Extensions = d.bytes()
	switch d.byte() {
	case 0:
	case 1:
		sec := d.varint()
		nsec := d.uvarint()
		if nsec >= 1e9 {
			d.err = true
		}
		out.AppendedAt = time.Unix(sec, int64(nsec))
	default:
		d.err = true
	}
	switch {
	case d.err:
		return fmt.Errorf("%w: truncated or out of range", errRaftLog)
	case len(d.b) != 0:
		return fmt.Errorf("%w: %d trailing bytes", errRaftLog, len(d.b))
	case out.Index != index:
		return fmt.Errorf("%w: holds index %d", errRaftLog, out.Index)
	}
	*l = out
	return nil
}

// raftLogDecoder reads an encoded raft.Log; a short or malformed field
// sets err and reads as zero from then on.
type raftLogDecoder struct {
	b   []byte
	err bool
}

func (d *raftLogDecoder) uvarint() uint64 {
	x, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err, d.b = true, nil
		return 0
	}
	d.b = d.b[n:]
	return x
}

func (d *raftLogDecoder) varint() int64 {
	x, n := binary.Varint(d.b)
	if n <= 0 {
		d.err, d.b = true, nil
		return 0
	}
	d.b = d.b[n:]
	return x
}

func (d *raftLogDecoder) byte() byte {
	if len(d.b) == 0 {
		d.err = true
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

// bytes reads a length-prefixed field; an empty one is nil.
func (d *raftLogDecoder) bytes() []byte {
	n := d.uvarint()
	if n > uint64(len(d.b)) {
		d.err, d.b = true, nil
		return nil
	}
	if n == 0 {
		return nil
	}
	p := d.b[:n:n]
	d.b = d.b[n:]
	return p
}
