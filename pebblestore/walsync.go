package pebblestore

import (
	"runtime/metrics"
	"strings"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// WAL syncs off the scheduler.
//
// Every acknowledged send waits for an fdatasync of Pebble's WAL (150–300 µs
// on the 2-core VM, ~1 ms in its tail). A goroutine in a blocking syscall
// keeps its scheduler P until the runtime's monitor thread takes it back,
// and that monitor sleeps longer the less it has to do: tracing 64
// single-send producers showed one of the two Ps held by the fsync for
// ~23% of the run while runnable goroutines waited for it. So while other
// goroutines are waiting to run, the WAL is synced through io_uring: the
// kernel runs the fdatasync on one of its io-wq worker threads and the
// syncing goroutine parks on an eventfd in the netpoller, giving its P to
// the waiting work. When nothing waits, the plain syscall is quicker: the
// round trip through a worker thread and the netpoller adds ~80 µs of CPU
// and some latency to a lone send, and no one needs the P. Same guarantee
// either way: the call returns once fdatasync(2) has, with its error.
// Measurements: docs/BENCHMARKS.md, "Issue 10, session 6".

// walSyncFS hands out WAL files whose SyncData goes through ring when other
// goroutines are waiting for a P. Other files (sstables, blob files, the
// MANIFEST) are synced by background work and keep Pebble's own path.
type walSyncFS struct {
	vfs.FS
	ring *fsyncRing
}

func (fs walSyncFS) Create(name string, category vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.Create(name, category)
	return fs.wrap(name, f, err)
}

// ReuseForWrite is how Pebble opens a recycled WAL file.
func (fs walSyncFS) ReuseForWrite(oldname, newname string, category vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.ReuseForWrite(oldname, newname, category)
	return fs.wrap(newname, f, err)
}

func (fs walSyncFS) wrap(name string, f vfs.File, err error) (vfs.File, error) {
	if err != nil || !strings.HasSuffix(name, ".log") || f.Fd() == vfs.InvalidFd {
		return f, err
	}
	return &walFile{File: f, ring: fs.ring}, nil
}

type walFile struct {
	vfs.File
	ring *fsyncRing
}

func (f *walFile) SyncData() error {
	if othersWaitToRun() {
		return f.ring.fdatasync(f.Fd())
	}
	return f.File.SyncData()
}

// runnableWaitThreshold: with one producer, the goroutine net/http starts
// to watch the connection for the next request is usually runnable at the
// moment of the sync; it can wait. Under load there are dozens.
const runnableWaitThreshold = 1

// othersWaitToRun reports whether more goroutines than
// runnableWaitThreshold are ready to run but have no P (an approximate
// count: the runtime reads the run queues without stopping them).
func othersWaitToRun() bool {
	sample := [1]metrics.Sample{{Name: "/sched/goroutines/runnable:goroutines"}}
	metrics.Read(sample[:])
	return sample[0].Value.Kind() == metrics.KindUint64 && sample[0].Value.Uint64() > runnableWaitThreshold
}
