package pebblestore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tidemq/tidemq/core"
)

var _ core.Store = (*Store)(nil)

// Options configures Open. The zero value works.
type Options struct {
	// FS is the filesystem; nil means the real disk. Tests pass vfs.NewMem().
	FS vfs.FS
	// CacheBytes is the block cache size (default 256 MiB).
	CacheBytes int64
	// MemTableBytes is the memtable size (default 64 MiB).
	MemTableBytes uint64
	// NoSyncSpin: a WAL sync that no other goroutine waits on sleeps in the
	// syscall instead of polling for its completion (walsync.go).
	NoSyncSpin bool
	Logger     *slog.Logger

	// sparesOnFS gives a test's FS zero-filled WAL spares, as the real
	// disk has (walspare.go).
	sparesOnFS bool
}

// Store is the Pebble implementation of core.Store.
type Store struct {
	db   *pebble.DB
	fs   vfs.FS
	ring *fsyncRing // nil: WAL syncs are plain syscalls
	// spares are zero-filled files for Pebble's next WALs (walspare.go);
	// nil on a test's FS.
	spares *walSpares
	// walSyncs is set when synced commits poll for their WAL sync
	// (commitPolling): with the ring, and spinning allowed.
	walSyncs *walSyncCounts
	sched    schedWatch // commitPolling's looks at the scheduler
	dir      string
	mu       sync.RWMutex // guards closed against Close racing with reads
	closed   bool

	writeStalls atomic.Int64
}

// Open opens (or creates) a store in dir.
func Open(dir string, opts Options) (*Store, error) {
	if opts.CacheBytes <= 0 {
		opts.CacheBytes = 256 << 20
	}
	if opts.MemTableBytes == 0 {
		opts.MemTableBytes = 64 << 20
	}
	cache := pebble.NewCache(opts.CacheBytes)
	defer cache.Unref()
	po := &pebble.Options{
		FS:                          opts.FS,
		Cache:                       cache,
		FormatMajorVersion:          pebble.FormatValueSeparation, // blob files (below)
		MemTableSize:                opts.MemTableBytes,
		MemTableStopWritesThreshold: 4,
		// Every flush holds keys of every prefix (log, queue index, id
		// index, history, watermarks), so its L0 file overlaps all of Lbase
		// and an L0 compaction rewrites the whole base level: a small base
		// level (Pebble's default is 64 MiB) and compacting L0 four files
		// at a time (we had 2) bound that rewrite: compaction fell from
		// 36–40% to ~25% of a sustained batch send's CPU, +20% msg/s
		// (docs/BENCHMARKS.md).
		L0CompactionThreshold: 4,
		L0StopWritesThreshold: 1000,
		LBaseMaxBytes:         8 << 20,
		FlushDelayDeleteRange: 10 * 1e9,
		Logger:                quietLogger{opts.Logger},
	}
	po.CompactionConcurrencyRange = func() (int, int) { return 1, 2 }
	// Message bodies go to blob files at flush, and compactions move only
	// keys and blob references. Without it every compaction rewrote the
	// bodies: the log's keys (in seq order) share each flush's files with
	// the index keys, so no file could just be moved down a level. That was
	// a third of a batch send's CPU; see docs/ARCHITECTURE.md.
	po.Experimental.ValueSeparationPolicy = func() pebble.ValueSeparationPolicy {
		return pebble.ValueSeparationPolicy{
			Enabled:               true,
			MinimumSize:           256,
			MaxBlobReferenceDepth: 10,
			// Retention deletes the oldest bodies first and whole blob files
			// with them; a rewrite only pays when a file is mostly garbage.
			RewriteMinimumAge:  5 * time.Minute,
			TargetGarbageRatio: 0.5,
		}
	}
	s := &Store{fs: opts.FS, dir: dir}
	if s.fs == nil {
		s.fs = vfs.Default
	}
	po.EventListener = &pebble.EventListener{
		WriteStallBegin: func(info pebble.WriteStallBeginInfo) {
			s.writeStalls.Add(1)
			quietLogger{opts.Logger}.logger().Warn("pebble write stall", "reason", info.Reason)
		},
	}
	// No bloom filters: they only spare point reads of keys that are not
	// there, and the store's point reads (a record by seq, a parked record
	// by id, metadata at open) find what they look for; pulls, queries and
	// retention use bounded iterators, which filters do not serve. Building
	// them hashed every key at every flush and compaction: without them a
	// batch send went from 155k to 166k msg/s (three A/B pairs,
	// docs/BENCHMARKS.md).
	for i := range po.Levels {
		// Blob files take their block size from the level's (flushes write
		// them at L0). At Pebble's 4 KiB a pull of 256 KiB of bodies read
		// 64 blocks, each a pread, a cgo allocation in the block cache and a
		// checksum; 32 KiB blocks cut a pulled message's CPU by ~13%
		// (docs/BENCHMARKS.md). Reads here are scans, so larger data
		// blocks cost point lookups little.
		po.Levels[i].BlockSize = 32 << 10
	}
	if opts.FS == nil {
		// Only on the real disk: a test's FS keeps its own SyncData, and
		// an in-memory one has no inode to spare a write of.
		ring, err := newFsyncRing()
		if err != nil {
			quietLogger{opts.Logger}.logger().Info("no io_uring: WAL syncs are plain fdatasync calls, each holding a scheduler thread", "reason", err)
		} else {
			s.ring = ring
			if !opts.NoSyncSpin {
				s.walSyncs = new(walSyncCounts)
			}
		}
		po.FS = walSyncFS{FS: vfs.Default, ring: s.ring, spin: !opts.NoSyncSpin, counts: s.walSyncs}
	}
	if opts.FS == nil || opts.sparesOnFS {
		s.spares = newWALSpares(s.fs, dir, int64(opts.MemTableBytes), quietLogger{opts.Logger}.logger())
		fs, _ := po.FS.(walSyncFS)
		if fs.FS == nil {
			fs.FS = s.fs
		}
		fs.spares = s.spares
		po.FS = fs
	}
	db, err := pebble.Open(dir, po)
	if err != nil {
		s.spares.close()
		s.ring.close()
		return nil, fmt.Errorf("pebblestore: open %s: %w", dir, err)
	}
	s.db = db
	s.spares.start()
	return s, nil
}

// quietLogger routes Pebble's informational chatter to slog at debug level.
type quietLogger struct{ l *slog.Logger }

func (q quietLogger) logger() *slog.Logger {
	if q.l == nil {
		return slog.Default()
	}
	return q.l
}
func (q quietLogger) Infof(format string, args ...any) {
	q.logger().Debug(fmt.Sprintf(format, args...), "component", "pebble")
}
func (q quietLogger) Errorf(format string, args ...any) {
	q.logger().Error(fmt.Sprintf(format, args...), "component", "pebble")
}
func (q quietLogger) Fatalf(format string, args ...any) {
	// Pebble calls Fatalf on unrecoverable errors such as a failed fsync,
	// after which the on-disk state is unknown; crashing is the only safe move.
	q.logger().Error(fmt.Sprintf(format, args...), "component", "pebble")
	panic(fmt.Sprintf(format, args...))
}

// Close closes the database; it is idempotent.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	err := s.db.Close()
	s.spares.close()
	err = errors.Join(err, s.ring.close())
	if err != nil {
		return fmt.Errorf("pebblestore: close: %w", err)
	}
	return nil
}

// read runs fn unless the store is closed.
func (s *Store) read(fn func() error) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return core.ErrClosed
	}
	return fn()
}

// Metrics exposes Pebble's metrics for monitoring.
func (s *Store) Metrics() *pebble.Metrics { return s.db.Metrics() }

// DiskUsage estimates the bytes Pebble's files occupy on disk; Stats adds
// the WAL spare.
func (s *Store) DiskUsage() uint64 { return s.db.Metrics().DiskSpaceUsage() }

// Flush forces the memtable to disk (tests and benchmarks use it).
func (s *Store) Flush() error { return s.read(s.db.Flush) }

// Compact compacts the whole key space, so deleted data leaves the disk.
func (s *Store) Compact() error {
	return s.read(func() error {
		// Every key starts with a letter (see doc.go): this spans them all.
		return s.db.Compact(context.Background(), []byte{0x00}, []byte{0xff}, true)
	})
}

func (s *Store) Load() (*core.Snapshot, error) {
	snap := &core.Snapshot{Queues: map[uint32][]core.QueueRange{}, Acks: map[uint32][]core.QueueAcks{}}
	err := s.read(func() error {
		if err := s.loadTopics(snap); err != nil {
			return err
		}
		if err := s.loadSubscriptions(snap); err != nil {
			return err
		}
		if err := s.loadAcks(snap); err != nil {
			return err
		}
		if err := s.loadParked(snap); err != nil {
			return err
		}
		if err := s.loadMembers(snap); err != nil {
			return err
		}
		if err := s.loadLastIDs(snap); err != nil {
			return err
		}
		return s.loadNextSeq(snap)
	})
	if err != nil {
		return nil, fmt.Errorf("pebblestore: load: %w", err)
	}
	return snap, nil
}

func (s *Store) loadTopics(snap *core.Snapshot) error {
	lo, hi := prefixRange([]byte{prefixTopic})
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return err
	}
	defer it.Close()
	for it.First(); it.Valid(); it.Next() {
		t := new(core.TopicRecord)
		if err := json.Unmarshal(it.Value(), t); err != nil {
			return fmt.Errorf("topic %x: %w", it.Key(), err)
		}
		snap.Topics = append(snap.Topics, t)
		ranges := make([]core.QueueRange, t.Queues)
		for q := range ranges {
			r, err := s.queueRange(t.ID, uint32(q))
			if err != nil {
				return err
			}
			ranges[q] = r
		}
		snap.Queues[t.ID] = ranges
	}
	return it.Error()
}

// ReadMessages walks one iterator over the log, forward only: a seq right
// after the last one read is one Next away, and a gap one SeekGE.
// maxSkip is how many log keys ReadMessages steps over before it seeks.
const maxSkip = 16

func (s *Store) ReadMessages(seqs []uint64, out []*core.Message) error {
	if len(seqs) == 0 {
		return nil
	}
	return s.read(func() error {
		// The bounds and the seek key in one allocation (a pull's); the key
		// has its own third: Pebble keeps the bounds, which must not change
		// while the iterator is open.
		const n = 9 // a log key: prefix and seq
		keys := make([]byte, 3*n)
		lo := logKey(keys[0:0:n], seqs[0])
		hi := logKey(keys[n:n:2*n], seqs[len(seqs)-1]+1)
		key := keys[2*n : 2*n : 3*n]
		it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
		if err != nil {
			return fmt.Errorf("pebblestore: read log: %w", err)
		}
		defer it.Close()
		valid := false // the iterator is at a key no seq has passed yet
		for i, seq := range seqs {
			key = logKey(key, seq)
			if !valid || bytes.Compare(it.Key(), key) < 0 {
				// A pull's seqs are close together: consecutive, or every
				// Nth of the log when sends spread over N queues. Stepping
				// over a few keys (without their values, which are in blob
				// files) is cheaper than a seek; past maxSkip keys, seek.
				for n := 0; valid && n < maxSkip; n++ {
					if valid = it.Next(); !valid || bytes.Compare(it.Key(), key) >= 0 {
						break
					}
				}
				if !valid || bytes.Compare(it.Key(), key) < 0 {
					valid = it.SeekGE(key)
				}
			}
			if !valid || !bytes.Equal(it.Key(), key) {
				continue
			}
			v, err := it.ValueAndErr()
			if err != nil {
				return fmt.Errorf("pebblestore: read seq %d: %w", seq, err)
			}
			if out[i], err = decodeRecord(v, seq); err != nil {
				return fmt.Errorf("pebblestore: read seq %d: %w", seq, err)
			}
		}
		return it.Error()
	})
}

// queueRange reads a queue's meta record (next offset, bytes) and its first
// index entry (the lowest retained offset).
func (s *Store) queueRange(topicID, queueID uint32) (core.QueueRange, error) {
	var r core.QueueRange
	v, closer, err := s.db.Get(queueMetaKey(topicID, queueID))
	switch {
	case errors.Is(err, pebble.ErrNotFound):
		return r, nil
	case err != nil:
		return r, err
	}
	if len(v) != 16 {
		closer.Close()
		return r, errCorrupt
	}
	r.Next, r.Bytes = be.Uint64(v), int64(be.Uint64(v[8:]))
	closer.Close()
	r.Min = r.Next
	lo := queueKey(nil, topicID, queueID, 0)
	hi := queueKey(nil, topicID, queueID, r.Next)
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return r, err
	}
	defer it.Close()
	if it.First() {
		r.Min = be.Uint64(it.Key()[9:])
	}
	return r, it.Error()
}

func (s *Store) loadSubscriptions(snap *core.Snapshot) error {
	lo, hi := prefixRange([]byte{prefixSub})
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return err
	}
	defer it.Close()
	for it.First(); it.Valid(); it.Next() {
		sub := new(core.SubscriptionRecord)
		if err := json.Unmarshal(it.Value(), sub); err != nil {
			return fmt.Errorf("subscription %x: %w", it.Key(), err)
		}
		snap.Subscriptions = append(snap.Subscriptions, sub)
	}
	return it.Error()
}

func (s *Store) loadAcks(snap *core.Snapshot) error {
	byQueue := map[[2]uint32]*core.QueueAcks{}
	get := func(sub, q uint32) *core.QueueAcks {
		k := [2]uint32{sub, q}
		a := byQueue[k]
		if a == nil {
			a = &core.QueueAcks{QueueID: q}
			byQueue[k] = a
		}
		return a
	}
	lo, hi := prefixRange([]byte{prefixWatermark})
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return err
	}
	for it.First(); it.Valid(); it.Next() {
		k := it.Key()
		if len(k) != 9 || len(it.Value()) != 8 {
			it.Close()
			return errCorrupt
		}
		get(be.Uint32(k[1:]), be.Uint32(k[5:])).Watermark = be.Uint64(it.Value())
	}
	if err := errors.Join(it.Error(), it.Close()); err != nil {
		return err
	}
	lo, hi = prefixRange([]byte{prefixAck})
	it, err = s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return err
	}
	for it.First(); it.Valid(); it.Next() {
		k := it.Key()
		if len(k) != 17 {
			it.Close()
			return errCorrupt
		}
		a := get(be.Uint32(k[1:]), be.Uint32(k[5:]))
		a.Acked = append(a.Acked, be.Uint64(k[9:]))
	}
	if err := errors.Join(it.Error(), it.Close()); err != nil {
		return err
	}
	for k, a := range byQueue {
		snap.Acks[k[0]] = append(snap.Acks[k[0]], *a)
	}
	return nil
}

func (s *Store) loadNextSeq(snap *core.Snapshot) error {
	lo, hi := prefixRange([]byte{prefixLog})
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return err
	}
	defer it.Close()
	if it.Last() {
		snap.NextSeq = be.Uint64(it.Key()[1:]) + 1
	}
	return it.Error()
}

func (s *Store) ScanQueue(topicID, queueID uint32, from, to uint64, fn func(core.IndexEntry) bool) error {
	if from >= to {
		return nil
	}
	return s.read(func() error {
		if err := s.scanQueueIndex(topicID, queueID, from, to, fn); err != nil {
			return fmt.Errorf("pebblestore: scan %d/%d: %w", topicID, queueID, err)
		}
		return nil
	})
}

func (s *Store) ReadMessage(seq uint64) (*core.Message, error) {
	var m *core.Message
	err := s.read(func() error {
		kb := recordPool.Get().(*[]byte)
		defer recordPool.Put(kb)
		*kb = logKey(*kb, seq)
		v, closer, err := s.db.Get(*kb)
		if errors.Is(err, pebble.ErrNotFound) {
			return core.ErrMessageNotFound
		}
		if err != nil {
			return fmt.Errorf("pebblestore: read seq %d: %w", seq, err)
		}
		defer closer.Close()
		m, err = decodeRecord(v, seq)
		if err != nil {
			return fmt.Errorf("pebblestore: read seq %d: %w", seq, err)
		}
		return nil
	})
	return m, err
}

func (s *Store) OffsetAtTime(topicID, queueID uint32, timeMs int64) (uint64, bool, error) {
	var off uint64
	var ok bool
	err := s.read(func() error {
		lo := timeKey(nil, topicID, queueID, max(timeMs, 0), 0)
		_, hi := prefixRange(lo[:9])
		it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
		if err != nil {
			return err
		}
		defer it.Close()
		if it.First() && len(it.Key()) == 25 {
			off, ok = be.Uint64(it.Key()[17:]), true
		}
		return it.Error()
	})
	if err != nil {
		return 0, false, fmt.Errorf("pebblestore: offset at time %d/%d: %w", topicID, queueID, err)
	}
	return off, ok, nil
}

func msToTime(ms int64) time.Time { return time.UnixMilli(ms).UTC() }

// Stats reports store health for metrics.
func (s *Store) Stats() core.StoreStats {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return core.StoreStats{}
	}
	m := s.db.Metrics()
	stats := core.StoreStats{
		DiskBytes:     int64(m.DiskSpaceUsage()) + s.spares.diskBytes(),
		L0Sublevels:   int64(m.Levels[0].Sublevels),
		WriteStalls:   s.writeStalls.Load(),
		WALUringSyncs: s.ring.syncs(),
		WALSpares:     s.spares.taken(),
	}
	if s.walSyncs != nil {
		stats.WALPolledCommits = s.walSyncs.polled.Load()
	}
	return stats
}

// FreeBytes reports the space left for the store on its filesystem.
func (s *Store) FreeBytes() (int64, error) {
	u, err := s.fs.GetDiskUsage(s.dir)
	if err != nil {
		return 0, fmt.Errorf("pebblestore: disk usage of %s: %w", s.dir, err)
	}
	return int64(u.AvailBytes), nil
}
