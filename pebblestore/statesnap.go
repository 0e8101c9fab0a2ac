package pebblestore

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"io"
	"math"
	"slices"
	"sync"

	"github.com/cockroachdb/pebble/v2"

	"github.com/tidemq/tidemq/core"
)

// State snapshots: the replicated state (every key but the raft groups')
// as one stream, for a raft FSM's Snapshot and Restore.
//
// The stream, integers big-endian:
//
//	header   magic "TMQSTATE", stream version u32, key layout version u32 (format.go)
//	record   'k', key length u32, value length u32, key, value   (in key order, no raft key)
//	trailer  'e', record count u64, SHA-256 of every byte before it
//
// and nothing after the trailer.

// stateStreamMagic opens every state stream.
const stateStreamMagic = "TMQSTATE"

// stateStreamVersion is the version of the stream's framing; a reader
// refuses one it does not know.
const stateStreamVersion = 1

const (
	stateRecordTag  = 'k'
	stateTrailerTag = 'e'
	// stateHeaderLen is the magic, the stream version and the layout version.
	stateHeaderLen = len(stateStreamMagic) + 4 + 4
	// stateRecordHeaderLen is a record's tag and its two lengths.
	stateRecordHeaderLen = 1 + 4 + 4
	// maxStateKeyBytes bounds a record's key: far above any key the store
	// writes, it keeps a corrupt length from reading a value as a key.
	maxStateKeyBytes = 1 << 20
	// stateReadChunk is how much of a value a restore reads at a time, so
	// that a corrupt length costs the bytes that are there, not the bytes
	// it claims.
	stateReadChunk = 1 << 20
	// restoreBatchBytes is the size at which a restore commits its batch:
	// below half the smallest memtable the tests use (Pebble turns a batch
	// over half a memtable into a memtable of its own, a flush per batch).
	restoreBatchBytes = 1 << 20
)

// ErrStateStream reports a state stream RestoreState cannot use: truncated,
// corrupt, of an unknown version or layout, or holding keys that are not
// the replicated state's.
var ErrStateStream = errors.New("pebblestore: bad state stream")

// ErrRestoreInProgress is StateSnapshot's error on a store whose last
// RestoreState did not finish: its state is half-replaced.
var ErrRestoreInProgress = errors.New("pebblestore: a state restore is in progress")

// StateSnapshot is a consistent point-in-time view of the replicated
// state: every key of the store except the raft groups' own (prefix r),
// read from a Pebble snapshot, so writes after StateSnapshot returns do
// not show. It pins the data it sees on disk until Close; close it before
// the store (Store.Close reports one left open). Its methods are safe for
// concurrent use, and run one at a time.
type StateSnapshot struct {
	s    *Store
	mu   sync.Mutex
	snap *pebble.Snapshot // nil once closed
}

// StateSnapshot takes a snapshot of the replicated state. A store marked
// by an unfinished RestoreState gives ErrRestoreInProgress.
func (s *Store) StateSnapshot() (*StateSnapshot, error) {
	var sn *StateSnapshot
	err := s.read(func() error {
		snap := s.db.NewSnapshot()
		_, closer, err := snap.Get(keyRestoring)
		switch {
		case err == nil:
			return errors.Join(ErrRestoreInProgress, closer.Close(), snap.Close())
		case !errors.Is(err, pebble.ErrNotFound):
			return errors.Join(err, snap.Close())
		}
		sn = &StateSnapshot{s: s, snap: snap}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("pebblestore: state snapshot: %w", err)
	}
	return sn, nil
}

// WriteTo streams the snapshot to w (the format is at the top of
// statesnap.go) and returns the bytes written. It holds a record and 64 KiB
// of buffer at a time, whatever the state's size; each call writes the
// same stream. A store closed meanwhile gives core.ErrClosed; Store.Close
// waits for a WriteTo under way.
func (sn *StateSnapshot) WriteTo(w io.Writer) (int64, error) {
	sn.mu.Lock()
	defer sn.mu.Unlock()
	if sn.snap == nil {
		return 0, errors.New("pebblestore: write state snapshot: snapshot closed")
	}
	cw := &countingWriter{w: w}
	h := sha256.New()
	bw := bufio.NewWriterSize(io.MultiWriter(h, cw), 64<<10)
	var count uint64
	err := sn.s.read(func() error {
		hdr := make([]byte, 0, stateHeaderLen)
		hdr = append(hdr, stateStreamMagic...)
		hdr = be.AppendUint32(hdr, stateStreamVersion)
		hdr = be.AppendUint32(hdr, formatVersion)
		if _, err := bw.Write(hdr); err != nil {
			return err
		}
		var rec [stateRecordHeaderLen]byte
		err := walkState(sn.snap, func(k, v []byte) error {
			if len(k) > maxStateKeyBytes || uint64(len(v)) > math.MaxUint32 {
				return fmt.Errorf("key %.32x… of %d bytes with a value of %d bytes does not fit a state record", k, len(k), len(v))
			}
			rec[0] = stateRecordTag
			be.PutUint32(rec[1:5], uint32(len(k)))
			be.PutUint32(rec[5:9], uint32(len(v)))
			if _, err := bw.Write(rec[:]); err != nil {
				return err
			}
			if _, err := bw.Write(k); err != nil {
				return err
			}
			if _, err := bw.Write(v); err != nil {
				return err
			}
			count++
			return nil
		})
		if err != nil {
			return err
		}
		if _, err := bw.Write(be.AppendUint64([]byte{stateTrailerTag}, count)); err != nil {
			return err
		}
		if err := bw.Flush(); err != nil {
			return err
		}
		// The checksum goes past the hash, straight to w.
		_, err = cw.Write(h.Sum(nil))
		return err
	})
	if err != nil {
		return cw.n, fmt.Errorf("pebblestore: write state snapshot (%d records, %d bytes written): %w", count, cw.n, err)
	}
	return cw.n, nil
}

// Close releases the snapshot; it is idempotent, and a no-op once the
// store is closed (the snapshot went with it).
func (sn *StateSnapshot) Close() error {
	sn.mu.Lock()
	defer sn.mu.Unlock()
	if sn.snap == nil {
		return nil
	}
	snap := sn.snap
	sn.snap = nil
	err := sn.s.read(snap.Close)
	if err != nil && !errors.Is(err, core.ErrClosed) {
		return fmt.Errorf("pebblestore: close state snapshot: %w", err)
	}
	return nil
}

// RestoreState replaces the replicated state (every key but the raft
// groups') with the stream's, one from StateSnapshot.WriteTo, possibly of
// another store, read to its end. The raft keys are untouched. It holds
// a batch of about restoreBatchBytes and one record at a time.
//
// It first sets the keyRestoring marker (synced); the final batch deletes
// it, synced, once the whole stream has checked out. Any error after the
// marker leaves it, and the state half-replaced: RestoreInProgress reports
// it, at once and after a reopen or a crash, and the caller must restore
// again before serving the state. A stream that is truncated, corrupt, of
// another stream or layout version, or holding raft keys gives an error
// that is ErrStateStream. Nothing else may write the store's state during
// the call; Store.Close waits for it.
func (s *Store) RestoreState(r io.Reader) error {
	err := s.read(func() error {
		if err := s.db.Set(keyRestoring, nil, pebble.Sync); err != nil {
			return fmt.Errorf("marking the restore: %w", err)
		}
		return s.restoreState(r)
	})
	if err != nil {
		return fmt.Errorf("pebblestore: restore state: %w", err)
	}
	return nil
}

// RestoreInProgress reports whether a RestoreState started and did not
// finish: then the store's state is half-replaced.
func (s *Store) RestoreInProgress() (bool, error) {
	var found bool
	err := s.read(func() error {
		_, closer, err := s.db.Get(keyRestoring)
		if errors.Is(err, pebble.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		found = true
		return closer.Close()
	})
	if err != nil {
		return false, fmt.Errorf("pebblestore: restore in progress: %w", err)
	}
	return found, nil
}

// restoreState reads the stream into the store, the old state deleted in
// the first batch.
func (s *Store) restoreState(r io.Reader) error {
	sr := &stateReader{br: bufio.NewReaderSize(r, 64<<10), h: sha256.New()}
	if err := sr.header(); err != nil {
		return err
	}
	// Room for a full batch and a record of up to its size, kept across
	// commits: Pebble drops a batch's buffer over 1 MiB at every Reset.
	b := s.db.NewBatch(pebble.WithInitialSizeBytes(2*restoreBatchBytes), pebble.WithMaxRetainedSizeBytes(2*restoreBatchBytes))
	defer b.Close()
	if err := s.deleteState(b); err != nil {
		return err
	}
	formatValue := be.AppendUint32(nil, formatVersion)
	var (
		count    uint64
		rec, buf []byte
		prev     []byte
	)
	for {
		var err error
		if rec, err = sr.read(rec, 1); err != nil {
			return sr.failed(err, count)
		}
		switch rec[0] {
		case stateRecordTag:
		case stateTrailerTag:
			if err := sr.trailer(count); err != nil {
				return err
			}
			if err := b.Delete(keyRestoring, nil); err != nil {
				return err
			}
			return b.Commit(pebble.Sync)
		default:
			return fmt.Errorf("%w: record %d has tag %#x", ErrStateStream, count, rec[0])
		}
		if rec, err = sr.read(rec, stateRecordHeaderLen-1); err != nil {
			return sr.failed(err, count)
		}
		kl, vl := int(be.Uint32(rec[0:4])), int(be.Uint32(rec[4:8]))
		if kl == 0 || kl > maxStateKeyBytes {
			return fmt.Errorf("%w: record %d has a key of %d bytes", ErrStateStream, count, kl)
		}
		if buf, err = sr.read(buf, kl+vl); err != nil {
			return sr.failed(err, count)
		}
		k, v := buf[:kl], buf[kl:]
		switch {
		case isRaftKey(k):
			return fmt.Errorf("%w: record %d has raft key %x", ErrStateStream, count, k)
		case bytes.Equal(k, keyRestoring):
			return fmt.Errorf("%w: record %d is a restore's marker", ErrStateStream, count)
		case bytes.Compare(k, prev) <= 0:
			return fmt.Errorf("%w: record %d has key %x, not after %x", ErrStateStream, count, k, prev)
		case bytes.Equal(k, keyFormat) && !bytes.Equal(v, formatValue):
			return fmt.Errorf("%w: layout version %x, this build reads %d", ErrStateStream, v, formatVersion)
		}
		prev = append(prev[:0], k...)
		// Set copies the key and value into the batch.
		if err := b.Set(k, v, nil); err != nil {
			return err
		}
		count++
		if b.Len() >= restoreBatchBytes {
			// Not synced: the marker is, and the final synced commit makes
			// every earlier one durable with it.
			if err := b.Commit(pebble.NoSync); err != nil {
				return err
			}
			b.Reset()
		}
	}
}

// deleteState adds to b range deletions of every key but the raft groups',
// keyRestoring (the restore's own marker) and keyFormat (so that a store
// that crashes mid-restore still opens): at most four tombstones.
func (s *Store) deleteState(b *pebble.Batch) error {
	it, err := s.db.NewIter(&pebble.IterOptions{})
	if err != nil {
		return err
	}
	// The spans run from the store's first key, not the empty key: a
	// tombstone starting at the empty key made a compaction keep keys the
	// batch's other tombstones covered (a race build of Pebble v2.1.7,
	// TestCrashMidRestoreLeavesTheMark), an edge Pebble has had bugs at.
	var start, end []byte
	if it.First() && bytes.Compare(it.Key(), raftSpanStart) < 0 {
		start = slices.Clone(it.Key())
	}
	if it.Last() && bytes.Compare(it.Key(), raftSpanEnd) >= 0 {
		end = append(slices.Clip(it.Key()), 0) // just past the store's last key
	}
	if err := errors.Join(it.Error(), it.Close()); err != nil {
		return err
	}
	var spans [][2][]byte
	if start != nil {
		spans = append(spans, [2][]byte{start, raftSpanStart})
	}
	if end != nil {
		spans = append(spans, [2][]byte{raftSpanEnd, end})
	}
	keep := [][]byte{keyRestoring, keyFormat} // in key order
	for _, sp := range spans {
		lo := sp[0]
		for _, k := range keep {
			if bytes.Compare(k, lo) < 0 || bytes.Compare(k, sp[1]) >= 0 {
				continue
			}
			if bytes.Compare(lo, k) < 0 {
				if err := b.DeleteRange(lo, k, nil); err != nil {
					return err
				}
			}
			lo = append(slices.Clip(k), 0)
		}
		if err := b.DeleteRange(lo, sp[1], nil); err != nil {
			return err
		}
	}
	return nil
}

// walkState calls fn with every key and value of r but the raft groups',
// in key order; the slices are valid only during the call.
func walkState(r pebble.Reader, fn func(k, v []byte) error) error {
	it, err := r.NewIter(&pebble.IterOptions{})
	if err != nil {
		return err
	}
	for ok := it.First(); ok; {
		k := it.Key()
		if isRaftKey(k) {
			ok = it.SeekGE(raftSpanEnd)
			continue
		}
		v, err := it.ValueAndErr()
		if err == nil {
			err = fn(k, v)
		}
		if err != nil {
			return errors.Join(err, it.Close())
		}
		ok = it.Next()
	}
	return errors.Join(it.Error(), it.Close())
}

// stateReader reads a state stream, hashing every byte it hands out.
type stateReader struct {
	br *bufio.Reader
	h  hash.Hash
	n  int64 // bytes read
}

// read reads n bytes into dst's storage, growing it a chunk at a time.
func (sr *stateReader) read(dst []byte, n int) ([]byte, error) {
	dst = dst[:0]
	for len(dst) < n {
		step := min(n-len(dst), max(len(dst), stateReadChunk))
		dst = slices.Grow(dst, step)
		part := dst[len(dst) : len(dst)+step]
		got, err := io.ReadFull(sr.br, part)
		sr.n += int64(got)
		if err != nil {
			return dst, err
		}
		sr.h.Write(part)
		dst = dst[:len(dst)+step]
	}
	return dst, nil
}

// failed describes a read error: the stream's end is a truncated stream.
func (sr *stateReader) failed(err error, records uint64) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w: truncated at byte %d, after %d records", ErrStateStream, sr.n, records)
	}
	return fmt.Errorf("reading the state stream at byte %d: %w", sr.n, err)
}

func (sr *stateReader) header() error {
	hdr, err := sr.read(nil, stateHeaderLen)
	if err != nil {
		return sr.failed(err, 0)
	}
	magic := len(stateStreamMagic)
	if string(hdr[:magic]) != stateStreamMagic {
		return fmt.Errorf("%w: starts with %q, not %q", ErrStateStream, hdr[:magic], stateStreamMagic)
	}
	if v := be.Uint32(hdr[magic:]); v != stateStreamVersion {
		return fmt.Errorf("%w: stream version %d, this build reads %d", ErrStateStream, v, stateStreamVersion)
	}
	if v := be.Uint32(hdr[magic+4:]); v != formatVersion {
		return fmt.Errorf("%w: layout version %d, this build reads %d", ErrStateStream, v, formatVersion)
	}
	return nil
}

// trailer checks the stream's end, its tag read: the record count, the
// checksum, and nothing after them.
func (sr *stateReader) trailer(records uint64) error {
	cnt, err := sr.read(nil, 8)
	if err != nil {
		return sr.failed(err, records)
	}
	want := sr.h.Sum(nil)
	got := make([]byte, len(want))
	n, err := io.ReadFull(sr.br, got)
	sr.n += int64(n)
	if err != nil {
		return sr.failed(err, records)
	}
	if !bytes.Equal(got, want) {
		return fmt.Errorf("%w: checksum mismatch over %d bytes", ErrStateStream, sr.n-int64(len(got)))
	}
	if c := be.Uint64(cnt); c != records {
		return fmt.Errorf("%w: trailer counts %d records, the stream holds %d", ErrStateStream, c, records)
	}
	switch _, err := sr.br.ReadByte(); {
	case err == nil:
		return fmt.Errorf("%w: bytes after the trailer, at byte %d", ErrStateStream, sr.n)
	case !errors.Is(err, io.EOF):
		return fmt.Errorf("reading past the state stream's trailer: %w", err)
	}
	return nil
}

// countingWriter counts the bytes written through it.
type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
