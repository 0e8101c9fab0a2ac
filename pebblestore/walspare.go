package pebblestore

import (
	"context"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// Zero-filled WAL files, so that a WAL sync writes no inode: doc.go,
// "Storage tricks", says why and how to turn them off.

const (
	spareName    = "tidemq-wal-spare"     // a spare ready for use
	spareTmpName = "tidemq-wal-spare.tmp" // one being filled
	// spareChunk is written and synced at a time, so that a WAL sync
	// queued behind the filling waits for one chunk, not the whole file.
	// Smaller chunks cost more than they spare: at 128 KiB (560 syncs for
	// a full spare) single sends at 64 producers took 85–116 µs of CPU
	// each against 64–76 µs. What lengthened WAL syncs was the zeros'
	// volume, which sizeFor keeps to what the WALs need.
	spareChunk = 1 << 20
)

// walSpares makes spares in the background, one at a time, and hands a
// ready one out. The store owns it: close stops the maker.
type walSpares struct {
	fs       vfs.FS
	dir      string
	memtable int64 // the memtable size Pebble grows its memtables to
	log      *slog.Logger

	ready atomic.Int64 // the length of the whole, synced spare at spareName; 0: none
	// file orders take's move of the spare against make's rename of the
	// next one to spareName: ready is 0 only once the file is moved.
	file sync.Mutex
	logs atomic.Int32 // WAL files handed to Pebble since open
	used atomic.Int64 // of them, spares
	want chan struct{}

	// The maker runs from the first spare wanted until close; mu orders
	// its start against close.
	mu      sync.Mutex
	ctx     context.Context // nil before start
	cancel  context.CancelFunc
	running bool
	done    sync.WaitGroup
}

// newWALSpares prepares spares for dir, whose memtables grow to memtable
// bytes; none is handed out or made before start.
func newWALSpares(fs vfs.FS, dir string, memtable int64, log *slog.Logger) *walSpares {
	return &walSpares{fs: fs, dir: dir, memtable: memtable, log: log, want: make(chan struct{}, 1)}
}

// pebbleFirstMemtable is the size Pebble gives its first memtable after an
// open, doubling it at each rotation up to Options.MemTableSize.
const pebbleFirstMemtable = 256 << 10

// sizeFor is the length of a spare for the n-th WAL since open: as long as
// the memtable that WAL holds, and a tenth more, as Pebble preallocates.
// Making every spare as long as the largest WAL wrote ~70 MiB of zeros for
// each of a new store's 256 KiB, 512 KiB… logs, and those writes lengthened
// its WAL syncs (the end-to-end phase's p99 2.7–2.8 against 2.1–2.2 ms).
func (s *walSpares) sizeFor(n int32) int64 {
	memtable := min(int64(pebbleFirstMemtable), s.memtable)
	for ; n > 1 && memtable < s.memtable; n-- {
		memtable = min(2*memtable, s.memtable)
	}
	return memtable + memtable/10
}

// start is called once Pebble holds the directory's lock, since it removes
// what another process could be filling: a spare left half made by the
// last run. A whole one is used, whatever its length.
func (s *walSpares) start() {
	if s == nil {
		return
	}
	_ = s.fs.Remove(s.path(spareTmpName))
	if fi, err := s.fs.Stat(s.path(spareName)); err == nil {
		if fi.Size() > 0 {
			s.ready.Store(fi.Size())
		} else {
			_ = s.fs.Remove(s.path(spareName))
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ctx, s.cancel = context.WithCancel(context.Background())
}

func (s *walSpares) path(name string) string { return s.fs.PathJoin(s.dir, name) }

// diskBytes is what the spare holds on disk (Pebble's own count leaves it
// out).
func (s *walSpares) diskBytes() int64 {
	if s == nil {
		return 0
	}
	return s.ready.Load()
}

// taken counts the WALs that were spares since open.
func (s *walSpares) taken() int64 {
	if s == nil {
		return 0
	}
	return s.used.Load()
}

// close stops the maker; a spare half filled is removed at the next open.
func (s *walSpares) close() {
	if s == nil {
		return
	}
	s.mu.Lock()
	if s.cancel != nil {
		s.cancel()
	}
	s.mu.Unlock()
	s.done.Wait()
}

// newLog is told of every WAL Pebble asks for. The first is the one every
// open makes; only a store that has filled a memtable gets spares (and a
// maker goroutine), so a store that never takes much writes none.
func (s *walSpares) newLog() {
	if s.logs.Add(1) <= 1 || s.ready.Load() > 0 {
		return
	}
	s.mu.Lock()
	if s.ctx != nil && s.ctx.Err() == nil && !s.running {
		s.running = true
		ctx := s.ctx
		s.done.Go(func() { s.run(ctx) })
	}
	s.mu.Unlock()
	select {
	case s.want <- struct{}{}:
	default:
	}
}

// take moves the ready spare to newname and opens it for writing, if it
// is longer than shorter (a recycled log's length; 0 for a new file). ok is
// false when it is not (or the move failed, which is logged), and the
// caller then tells newLog of the file it makes instead.
func (s *walSpares) take(newname string, category vfs.DiskWriteCategory, shorter int64) (f vfs.File, ok bool) {
	s.file.Lock()
	size := s.ready.Load()
	if size <= shorter {
		s.file.Unlock()
		return nil, false
	}
	f, err := s.fs.ReuseForWrite(s.path(spareName), newname, category)
	s.ready.Store(0)
	s.file.Unlock()
	if err != nil {
		s.log.Warn("pebblestore: using the WAL spare", "err", err)
		return nil, false
	}
	s.used.Add(1)
	s.newLog()
	return f, true
}

// short reports whether a recycled log of length size is short for the WAL
// Pebble asks for now: shorter than half the spare it should have.
func (s *walSpares) short(size int64) bool { return size < s.sizeFor(s.logs.Load()+1)/2 }

func (s *walSpares) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.want:
		}
		if s.ready.Load() > 0 {
			continue
		}
		if err := s.make(ctx, s.sizeFor(s.logs.Load()+1)); err != nil {
			_ = s.fs.Remove(s.path(spareTmpName))
			if ctx.Err() == nil {
				s.log.Info("pebblestore: no WAL spare; the next WAL is a new file", "err", err)
			}
		}
	}
}

// make fills a spare of size bytes under a temporary name and renames it
// once synced, so that a spare under its own name is always whole. It
// leaves the disk's last free space alone: sends need it more (core
// refuses them below --min-free-bytes), and without a spare Pebble just
// starts a new file.
func (s *walSpares) make(ctx context.Context, size int64) error {
	if du, err := s.fs.GetDiskUsage(s.dir); err == nil && du.AvailBytes < uint64(8*s.sizeFor(math.MaxInt32)) {
		return errLowDisk
	}
	f, err := s.fs.Create(s.path(spareTmpName), vfs.WriteCategoryUnspecified)
	if err != nil {
		return err
	}
	zeros := make([]byte, min(spareChunk, size))
	for off := int64(0); off < size; off += spareChunk {
		if err := ctx.Err(); err != nil {
			_ = f.Close()
			return err
		}
		n := min(spareChunk, size-off)
		if _, err := f.Write(zeros[:n]); err != nil {
			_ = f.Close()
			return err
		}
		if err := f.SyncData(); err != nil {
			_ = f.Close()
			return err
		}
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	s.file.Lock()
	defer s.file.Unlock()
	if err := s.fs.Rename(s.path(spareTmpName), s.path(spareName)); err != nil {
		return err
	}
	s.ready.Store(size)
	return nil
}

type spareError string

func (e spareError) Error() string { return string(e) }

const errLowDisk = spareError("less than eight spares' worth of free disk")
