package pebblestore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"go.opentelemetry.io/otel/metric"

	"github.com/tidemq/tidemq/core"
)

var _ core.Store = (*Store)(nil)

// Options configures Open. The zero value works, with every storage trick
// on (doc.go, "Storage tricks", says what each does); each No… field turns
// one off.
type Options struct {
	// FS is the filesystem; nil means the real disk. Tests pass vfs.NewMem().
	FS vfs.FS
	// CacheBytes is the block cache size (default 256 MiB).
	CacheBytes int64
	// MemTableBytes is the memtable size (default 64 MiB).
	MemTableBytes uint64
	// NoSyncSpin turns sync spinning off: a WAL sync nobody else waits on
	// sleeps in the syscall, and a commit marked alone parks like the rest.
	NoSyncSpin bool
	// NoFsyncRing turns the fsync ring off: WAL syncs are plain fdatasync
	// calls (and never spin, whatever NoSyncSpin says).
	NoFsyncRing bool
	// NoWALSpares turns WAL spares off: Pebble's WALs are its own new or
	// recycled files, never zero-filled spares.
	NoWALSpares bool
	// MeterProvider receives the store's gauges (metrics.go); nil: none.
	MeterProvider metric.MeterProvider
	Logger        *slog.Logger

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
	// nil on a test's FS or with Options.NoWALSpares.
	spares *walSpares
	// walSyncs is set when a lone synced commit polls for its WAL sync
	// (commitPolling): with the ring, and spinning allowed.
	walSyncs *walSyncCounts
	sched    schedWatch // commitPolling's looks at the scheduler
	dir      string
	mu       sync.RWMutex // guards closed against Close racing with reads
	closed   bool
	metrics  metric.Registration // nil without a MeterProvider

	writeStalls atomic.Int64
	// batches are NewBatch's Pebble batches, reset and kept with their
	// buffers (batch.go, maxRetainedBatchBytes).
	batches sync.Pool
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
		FS:                 opts.FS,
		Cache:              cache,
		FormatMajorVersion: pebble.FormatValueSeparation, // blob files (below)
		MemTableSize:       opts.MemTableBytes,
		// At most two memtables, the one filling and the one flushing:
		// under a flood of large batches four of them (256 MiB outside
		// the Go heap) took a flooded broker past 512 MiB, and sustained
		// batch sends were no slower with two (docs/BENCHMARKS.md).
		MemTableStopWritesThreshold: 2,
		// Every flush holds keys of every prefix (log, queue index, id
		// index, history, watermarks), so its L0 file overlaps all of Lbase
		// and an L0 compaction rewrites the whole base level: a small base
		// level (Pebble's default is 64 MiB) and compacting L0 four files
		// at a time bound that rewrite: compaction is ~25% of a sustained
		// batch send's CPU instead of 36–40% (docs/BENCHMARKS.md).
		L0CompactionThreshold: 4,
		L0StopWritesThreshold: 1000,
		LBaseMaxBytes:         8 << 20,
		FlushDelayDeleteRange: 10 * 1e9,
		Logger:                quietLogger{opts.Logger},
	}
	po.CompactionConcurrencyRange = func() (int, int) { return 1, 2 }
	// Message bodies go to blob files at flush, and compactions move only
	// keys and blob references. Otherwise every compaction rewrites the
	// bodies: the log's keys (in seq order) share each flush's files with
	// the index keys, so no file can just be moved down a level, and that
	// costs a third of a batch send's CPU (docs/ARCHITECTURE.md).
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
	// them hashes every key at every flush and compaction, for ~7% of a
	// batch send's rate (docs/BENCHMARKS.md).
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
		if !opts.NoFsyncRing {
			ring, err := newFsyncRing()
			if err != nil {
				quietLogger{opts.Logger}.logger().Info("no io_uring: WAL syncs are plain fdatasync calls, each holding a scheduler thread", "reason", err)
			} else {
				s.ring = ring
				if !opts.NoSyncSpin {
					s.walSyncs = new(walSyncCounts)
				}
			}
		}
		po.FS = walSyncFS{FS: vfs.Default, ring: s.ring, spin: !opts.NoSyncSpin, counts: s.walSyncs}
	}
	if (opts.FS == nil || opts.sparesOnFS) && !opts.NoWALSpares {
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
	if err := checkFormat(db, dir); err != nil {
		_ = db.Close()
		s.spares.close()
		s.ring.close()
		return nil, err
	}
	s.spares.start()
	if err := s.registerMetrics(opts.MeterProvider); err != nil {
		_ = s.Close()
		return nil, fmt.Errorf("pebblestore: metrics: %w", err)
	}
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
	var err error
	if s.metrics != nil {
		err = s.metrics.Unregister()
	}
	err = errors.Join(err, s.db.Close())
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
	snap := &core.Snapshot{Queues: map[uint32][]core.QueueRange{}, Acks: map[uint32][]core.QueueAcks{}, Attempts: map[uint32][]core.AttemptRecord{},
		MirrorProgress: map[string][]core.MirrorProgress{}}
	err := s.read(func() error {
		// Each record family reads its part (meta.go, consumers.go,
		// parked.go, dead.go, dedup.go, attempts.go, messages.go,
		// mirrors.go).
		for _, load := range []func(*core.Snapshot) error{
			s.loadTopics, s.loadSubscriptions, s.loadLastIDs, s.loadCounters, s.loadEpoch, s.loadAcks, s.loadMembers,
			s.loadParked, s.loadDeadCounts, s.loadDedup, s.loadAttempts, s.loadTransactions, s.loadNextSeq,
			s.loadMirrors,
		} {
			if err := load(snap); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("pebblestore: load: %w", err)
	}
	return snap, nil
}

// walk calls fn for the keys in [lo, hi), in order, while it says to go on.
func (s *Store) walk(lo, hi []byte, fn func(k, v []byte) (bool, error)) error {
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return err
	}
	for it.First(); it.Valid(); it.Next() {
		if more, err := fn(it.Key(), it.Value()); !more || err != nil {
			return errors.Join(err, it.Close())
		}
	}
	return errors.Join(it.Error(), it.Close())
}

func msToTime(ms int64) time.Time { return time.UnixMilli(ms).UTC() }

// Stats reports the store's disk usage for the broker's metrics; the
// store's own gauges go through Options.MeterProvider (metrics.go).
func (s *Store) Stats() core.StoreStats {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return core.StoreStats{}
	}
	return core.StoreStats{DiskBytes: int64(s.db.Metrics().DiskSpaceUsage()) + s.spares.diskBytes()}
}

// FreeBytes reports the space left for the store on its filesystem.
func (s *Store) FreeBytes() (int64, error) {
	u, err := s.fs.GetDiskUsage(s.dir)
	if err != nil {
		return 0, fmt.Errorf("pebblestore: disk usage of %s: %w", s.dir, err)
	}
	return int64(u.AvailBytes), nil
}
