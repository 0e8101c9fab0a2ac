package pebblestore

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidemq/tidemq/core"
)

// newTestRing skips where the kernel offers no io_uring (not Linux, or
// disabled by sysctl or seccomp): the store then syncs the plain way, which
// every other test covers.
func newTestRing(t *testing.T) *fsyncRing {
	t.Helper()
	r, err := newFsyncRing()
	if err != nil {
		t.Skipf("no io_uring here: %v", err)
	}
	t.Cleanup(func() {
		if err := r.close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return r
}

func TestOthersWaitForAPSeesRunnableGoroutines(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	var sched schedWatch
	othersWaitForAP := sched.othersWaitForAP
	eventually := func(want bool) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); othersWaitForAP() != want; {
			if time.Now().After(deadline) {
				t.Fatalf("othersWaitForAP() stayed %v for 5s", !want)
			}
			time.Sleep(time.Millisecond)
		}
	}
	eventually(false)
	// With one P, while this goroutine runs, every spinner waits for it.
	var stop atomic.Bool
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			for !stop.Load() {
				runtime.Gosched()
			}
		})
	}
	eventually(true)
	stop.Store(true)
	wg.Wait()
	eventually(false)
}

// The store's WAL syncs go through the ring: always when syncs may spin,
// and with spinning off while other goroutines wait to run. Commits marked
// alone poll for their sync when syncs may spin and nothing else wants
// the CPU; many at once under CPU contention may poll or park; with
// spinning off they park. What they synced is there after reopening.
func TestWALSyncsThroughRing(t *testing.T) {
	newTestRing(t) // skips without io_uring
	for _, tc := range []struct {
		name       string
		noSyncSpin bool
		spinners   int
		committers int
		polled     string // how many commits polled: "all", "none" or "any"
	}{
		{"spinning, nothing else running", false, 0, 1, "all"},
		{"not spinning, under CPU contention", true, 4 * runtime.GOMAXPROCS(0), 1, "none"},
		{"spinning, 8 committers under CPU contention", false, 4 * runtime.GOMAXPROCS(0), 8, "any"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			opts := Options{CacheBytes: 8 << 20, MemTableBytes: 4 << 20, NoSyncSpin: tc.noSyncSpin}
			s, err := Open(dir, opts)
			if err != nil {
				t.Fatal(err)
			}
			if s.ring == nil {
				t.Fatal("io_uring works here, but the store on the real disk has no ring")
			}
			if polling := s.walSyncs != nil; polling == tc.noSyncSpin {
				t.Fatalf("commits poll for their sync: %v, with NoSyncSpin %v", polling, tc.noSyncSpin)
			}
			var stop atomic.Bool
			var wg sync.WaitGroup
			for range tc.spinners {
				wg.Go(func() {
					for !stop.Load() {
						runtime.Gosched()
					}
				})
			}
			const batches = 40
			errs := make(chan error, tc.committers)
			var committers sync.WaitGroup
			for c := range tc.committers {
				committers.Go(func() {
					for i := c; i < batches; i += tc.committers {
						var begun uint64
						if s.walSyncs != nil {
							begun = s.walSyncs.begun.Load()
						}
						b := s.NewBatch()
						b.Append(&core.Message{ID: "m", TopicID: 1, QueueID: 0, Offset: uint64(i), Seq: uint64(i), Body: []byte("body")})
						b.PutQueueMeta(1, 0, uint64(i+1), int64(4*(i+1)))
						if err := b.Commit(true, true); err != nil {
							errs <- fmt.Errorf("commit %d: %w", i, err)
							return
						}
						b.Close()
						// Its sync began after it read the count and has ended.
						if s.walSyncs != nil && s.walSyncs.ended.Load() <= begun {
							errs <- fmt.Errorf("commit %d returned with no WAL sync ended since it began (%d begun then, %d ended now)", i, begun, s.walSyncs.ended.Load())
							return
						}
					}
				})
			}
			committers.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			stop.Store(true)
			wg.Wait()
			if n := s.ring.syncs(); n == 0 {
				t.Errorf("no WAL sync went through the ring in %d synced commits", batches)
			}
			if n := s.polledCommits(); tc.polled == "all" && n != batches || tc.polled == "none" && n != 0 || n < 0 || n > batches {
				t.Errorf("%d of %d commits polled for their sync, want %s", n, batches, tc.polled)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}

			s, err = Open(dir, opts)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			seqs := make([]uint64, batches)
			for i := range seqs {
				seqs[i] = uint64(i)
			}
			got := make([]*core.Message, batches)
			if err := s.ReadMessages(seqs, got); err != nil {
				t.Fatal(err)
			}
			for i, m := range got {
				if m == nil || m.Offset != uint64(i) || string(m.Body) != "body" {
					t.Errorf("after reopening, seq %d = %+v, want offset %d with its body", i, m, i)
				}
			}
		})
	}
}

func TestSpinPolicy(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	type look struct {
		at         time.Duration
		othersWait bool
		want       bool
	}
	for _, tc := range []struct {
		name  string
		looks []look
	}{
		{"nobody waits: spins until walSyncSpin", []look{
			{0, false, true}, {500 * time.Microsecond, false, true},
			{walSyncSpin - time.Nanosecond, false, true}, {walSyncSpin, false, false},
		}},
		{"a wait shorter than spinWhileOthersWait is ridden out", []look{
			{10 * time.Microsecond, true, true}, {10*time.Microsecond + spinWhileOthersWait - time.Nanosecond, true, true},
			{50 * time.Microsecond, false, true},
			// A new wait starts its own clock.
			{60 * time.Microsecond, true, true}, {60*time.Microsecond + spinWhileOthersWait/2, true, true},
		}},
		{"a wait that lasts spinWhileOthersWait parks", []look{
			{10 * time.Microsecond, true, true}, {10*time.Microsecond + spinWhileOthersWait, true, false},
		}},
		{"the bound holds even while others come and go", []look{
			{walSyncSpin - time.Microsecond, true, true}, {walSyncSpin, false, false},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := spinPolicy{start: t0}
			for i, l := range tc.looks {
				if got := p.keepSpinning(at(l.at), l.othersWait); got != l.want {
					t.Fatalf("look %d at +%v (others wait %v): keepSpinning = %v, want %v", i, l.at, l.othersWait, got, l.want)
				}
			}
		})
	}
}

func BenchmarkOthersWaitForAP(b *testing.B) {
	var sched schedWatch
	b.ReportAllocs()
	for b.Loop() {
		sched.othersWaitForAP()
	}
}
