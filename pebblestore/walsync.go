package pebblestore

import (
	"runtime"
	"runtime/metrics"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// WAL syncs through the fsync ring, spinning while nobody else wants the
// CPU, and lone commits polling for theirs: doc.go, "Storage tricks", says
// what each is for and how to turn it off.

// walSyncFS hands out Pebble's WAL files: zero-filled spares in place of
// new or short ones (walspare.go), their SyncData through ring. Other
// files (sstables, blob files, the MANIFEST) are synced by background work
// and keep Pebble's own path.
type walSyncFS struct {
	vfs.FS
	ring   *fsyncRing // nil: WAL syncs are plain syscalls
	spin   bool
	counts *walSyncCounts
	spares *walSpares // nil: Pebble's own files
}

func (fs walSyncFS) Create(name string, category vfs.DiskWriteCategory) (vfs.File, error) {
	if !isWAL(name) {
		return fs.FS.Create(name, category)
	}
	if fs.spares != nil {
		if f, ok := fs.spares.take(name, category, 0); ok {
			return fs.wrap(f, nil)
		}
		defer fs.spares.newLog()
	}
	return fs.wrap(fs.FS.Create(name, category))
}

// ReuseForWrite is how Pebble opens a recycled WAL file. A short one is
// left for a spare: its syncs would write the inode as soon as the log
// outgrew it. Pebble allows this (it stats the file it gets back).
func (fs walSyncFS) ReuseForWrite(oldname, newname string, category vfs.DiskWriteCategory) (vfs.File, error) {
	if !isWAL(newname) {
		return fs.FS.ReuseForWrite(oldname, newname, category)
	}
	if fs.spares != nil {
		if fi, err := fs.FS.Stat(oldname); err == nil && fs.spares.short(fi.Size()) {
			if f, ok := fs.spares.take(newname, category, fi.Size()); ok {
				_ = fs.FS.Remove(oldname)
				return fs.wrap(f, nil)
			}
		}
		defer fs.spares.newLog()
	}
	return fs.wrap(fs.FS.ReuseForWrite(oldname, newname, category))
}

func isWAL(name string) bool { return strings.HasSuffix(name, ".log") }

// wrap gives a WAL file's syncs to the ring, when there is one.
func (fs walSyncFS) wrap(f vfs.File, err error) (vfs.File, error) {
	if err != nil || fs.ring == nil || f.Fd() == vfs.InvalidFd {
		return f, err
	}
	return &walFile{File: f, ring: fs.ring, spin: fs.spin, counts: fs.counts}, nil
}

type walFile struct {
	vfs.File
	ring   *fsyncRing
	spin   bool
	counts *walSyncCounts // nil: not counted
	sched  schedWatch     // a spinning sync looks every few µs
}

// walSyncSpin bounds the polling: past it (a slow disk, a long fsync) the
// sync parks like one others wait on.
const walSyncSpin = time.Millisecond

func (f *walFile) SyncData() error {
	if f.counts != nil {
		f.counts.begun.Add(1)
		defer f.counts.ended.Add(1)
	}
	var synced bool
	var err error
	switch {
	case f.spin:
		spin := spinPolicy{start: time.Now()}
		synced, err = f.ring.fdatasync(f.Fd(), func() bool { return spin.keepSpinning(time.Now(), f.sched.othersWaitForAP()) })
	case f.sched.othersWaitForAP():
		synced, err = f.ring.fdatasync(f.Fd(), nil)
	}
	if synced {
		return err
	}
	return f.File.SyncData()
}

// spinPolicy decides, look by look, whether a sync keeps polling: for at
// most walSyncSpin, and not once other goroutines have waited for a P for
// spinWhileOthersWait. A goroutine that becomes runnable while every P is
// busy is usually running a few µs later (the one net/http starts to
// watch a connection, a client reading its reply), and parking for it
// costs the wake-up the spinning is for; one still waiting after that is
// load, and the spinner's P is better given to it: parking at the first
// sight of a waiting goroutine lost the lone send's gain, and not parking
// at all cost the pull + ack mix ~5% (alternating runs).
type spinPolicy struct {
	start, othersWaitingSince time.Time
}

const spinWhileOthersWait = 25 * time.Microsecond

func (p *spinPolicy) keepSpinning(now time.Time, othersWait bool) bool {
	if now.Sub(p.start) >= walSyncSpin {
		return false
	}
	if !othersWait {
		p.othersWaitingSince = time.Time{}
		return true
	}
	if p.othersWaitingSince.IsZero() {
		p.othersWaitingSince = now
	}
	return now.Sub(p.othersWaitingSince) < spinWhileOthersWait
}

// schedWatch reads the scheduler's counts into samples it keeps, so a look
// allocates nothing; mu guards them (Pebble might sync one WAL from two
// goroutines, and commits look too).
type schedWatch struct {
	mu      sync.Mutex
	samples [3]metrics.Sample
}

// othersWaitForAP reports whether more goroutines are ready to run than
// there are Ps free to run them, that is, whether a P held by a sync would
// keep one waiting. The runtime's counts are approximate (it reads the run
// queues without stopping them), which only moves the choice between two
// correct waits.
func (s *schedWatch) othersWaitForAP() bool {
	runnable, running, procs, ok := s.read()
	return ok && runnable+running > procs
}

// busy reports whether more goroutines wait to run than there are Ps: more
// than a lone send's own (the WAL flusher it just readied, the connection
// watcher net/http starts for each request). A committer that yielded its
// P then would queue behind them all while it holds the broker's commit
// lock: at 64 producers that cost 4% of the sends and 5% more CPU each.
func (s *schedWatch) busy() bool {
	runnable, _, procs, ok := s.read()
	return ok && runnable > procs
}

// read returns the scheduler's counts of runnable and running goroutines
// and its Ps; ok is false where the runtime does not report them.
func (s *schedWatch) read() (runnable, running, procs uint64, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.samples[0].Name == "" {
		s.samples = [3]metrics.Sample{
			{Name: "/sched/goroutines/runnable:goroutines"},
			{Name: "/sched/goroutines/running:goroutines"},
			{Name: "/sched/gomaxprocs:threads"},
		}
	}
	metrics.Read(s.samples[:])
	for _, x := range s.samples {
		if x.Value.Kind() != metrics.KindUint64 {
			return 0, 0, 0, false
		}
	}
	return s.samples[0].Value.Uint64(), s.samples[1].Value.Uint64(), s.samples[2].Value.Uint64(), true
}

// walSyncCounts counts the WAL syncs begun and ended, for committers that
// poll for the one covering their batch (Store.commitPolling).
type walSyncCounts struct {
	begun, ended atomic.Uint64
	polled       atomic.Int64 // commits that waited by polling
}

// commitPolling commits b with a synced WAL write like
// b.Commit(pebble.Sync), but waits for the sync by polling instead of
// parking while no other goroutine waits for a P, up to walSyncSpin. A
// parked committer is woken by Pebble's WAL flusher once the sync is done,
// and on the 2-core VM that wake-up alone was 26–34 µs of a lone send (p50,
// against 9 µs when the flusher sat in the plain syscall): readying a
// goroutine while a P is idle makes the runtime wake a thread, a futex call
// that costs the flusher 6–12 µs of CPU here, and the committer then waits
// for the flusher to finish. A committer that polls is found not waiting and
// goes on at once (docs/BENCHMARKS.md). The counts
// are only a hint: a sync that ended without our batch sends us to SyncWait
// early, which parks as before, and SyncWait is what reports the sync's
// outcome.
func (s *Store) commitPolling(b *pebble.Batch) error {
	// A sync begun before the apply may miss the batch: wait for a later one.
	begunBefore := s.walSyncs.begun.Load()
	if err := s.db.ApplyNoSyncWait(b, pebble.Sync); err != nil {
		return err
	}
	if s.sched.busy() {
		return b.SyncWait()
	}
	s.walSyncs.polled.Add(1)
	// The apply readied the WAL flusher on this P: let it start the write
	// and the sync here rather than wait for an idle CPU to wake for it.
	runtime.Gosched()
	// Unlike the flusher's, this polling stops at the first sight of a
	// goroutine waiting for a P: the P it holds is one a sender under load
	// needs (polling for as long as the flusher does cost 5% more CPU per
	// send at 64 producers).
	for deadline := time.Now().Add(walSyncSpin); s.walSyncs.ended.Load() <= begunBefore &&
		time.Now().Before(deadline) && !s.sched.othersWaitForAP(); {
		yieldThread()
	}
	return b.SyncWait()
}
