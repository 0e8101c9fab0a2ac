package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"runtime"
	"runtime/metrics"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/cockroachdb/pebble/v2"
	"github.com/go-chi/chi/v5"

	"github.com/tidemq/tidemq/loadtest"
)

// pebbleBaseline is the floor under a send: raw Pebble synced appends of
// the same bytes, in a fresh directory on the same disk as the broker's.
type pebbleBaseline struct {
	BaseDir      string // "" is the system's temp dir
	MessageBytes int
	Batch        int // Sets per commit
	Writers      int // goroutines committing concurrently
	Warmup       time.Duration
	Duration     time.Duration
}

// pebbleResult is what a baseline measured: messages per second and the
// latency of one synced commit.
type pebbleResult struct {
	Messages   int64            `json:"messages"`
	Elapsed    loadtest.Seconds `json:"elapsedSeconds"`
	MsgsPerSec float64          `json:"msgsPerSec"`
	Commit     loadtest.Latency `json:"commit"`
	CPU        time.Duration    `json:"cpuNs"`    // process CPU time while measuring
	IdlePs     time.Duration    `json:"idlePsNs"` // Go scheduler idle time while measuring (idlePsTime)
}

// run writes values of MessageBytes random letters (the broker's bodies are
// the same) under 9-byte sequential keys ('L' + writer + seq, the shape of
// the store's log keys), Batch per pebble.Batch, committed with
// pebble.Sync by Writers goroutines, on Pebble's options for a write-heavy
// store (below), not pebblestore's own.
func (p pebbleBaseline) run(ctx context.Context) (res pebbleResult, err error) {
	dir, err := os.MkdirTemp(p.BaseDir, "tidemq-load-pebble-")
	if err != nil {
		return res, err
	}
	defer func() { err = errors.Join(err, os.RemoveAll(dir)) }()
	cache := pebble.NewCache(256 << 20)
	defer cache.Unref()
	opts := &pebble.Options{
		Cache:                       cache,
		FormatMajorVersion:          pebble.FormatTableFormatV6,
		MemTableSize:                64 << 20,
		MemTableStopWritesThreshold: 4,
		L0CompactionThreshold:       2,
		L0StopWritesThreshold:       1000,
		LBaseMaxBytes:               64 << 20,
		Logger:                      quietPebble{},
	}
	opts.CompactionConcurrencyRange = func() (int, int) { return 1, 2 }
	db, err := pebble.Open(dir, opts)
	if err != nil {
		return res, fmt.Errorf("pebble.Open: %w", err)
	}
	defer func() { err = errors.Join(err, db.Close()) }()

	value := []byte(letters(p.MessageBytes))
	hists := make([]*hdrhistogram.Histogram, p.Writers)
	var messages atomic.Int64
	var measuring atomic.Bool
	var firstErr error
	var errOnce sync.Once
	warmEnd := time.Now().Add(p.Warmup)
	end := warmEnd.Add(p.Duration)
	var start time.Time
	var wg sync.WaitGroup
	for w := range p.Writers {
		hists[w] = loadtest.NewHistogram()
		wg.Go(func() {
			key := make([]byte, 9)
			key[0] = 'L'
			seq := uint64(w) << 40
			for ctx.Err() == nil {
				now := time.Now()
				if !now.Before(end) {
					return
				}
				b := db.NewBatch()
				for range p.Batch {
					binary.BigEndian.PutUint64(key[1:], seq)
					seq++
					_ = b.Set(key, value, nil) // cannot fail on an open batch
				}
				err := b.Commit(pebble.Sync)
				_ = b.Close()
				if err != nil {
					errOnce.Do(func() { firstErr = err })
					return
				}
				if measuring.Load() {
					loadtest.RecordLatency(hists[w], time.Since(now))
					messages.Add(int64(p.Batch))
				}
			}
		})
	}
	// Switch from warm-up to measuring at warmEnd.
	select {
	case <-time.After(time.Until(warmEnd)):
	case <-ctx.Done():
	}
	start = time.Now()
	mark := markUsage()
	measuring.Store(true)
	wg.Wait()
	elapsed := time.Since(start)
	use := mark.since()
	if firstErr != nil {
		return res, fmt.Errorf("pebble commit: %w", firstErr)
	}
	h := loadtest.NewHistogram()
	for _, w := range hists {
		h.Merge(w)
	}
	res = pebbleResult{Messages: messages.Load(), Elapsed: loadtest.Seconds(elapsed), Commit: loadtest.LatencyOf(h), CPU: use.cpu, IdlePs: use.idlePs}
	res.MsgsPerSec = float64(res.Messages) / elapsed.Seconds()
	return res, ctx.Err()
}

// idlePsTime is how long the Go scheduler's Ps have sat parked with
// nothing to run so far, summed over Ps (runtime/metrics
// /cpu/classes/idle). Over a phase it tells the process waiting (for a
// sync, a linger, the network) from the process not getting the CPU,
// which cores used alone cannot: the kernel does not charge the process
// for loopback's receive work. The runtime brings the figure up to date
// only when a garbage collection ends, so this runs one first; called
// before a phase and after it, the difference covers the phase.
func idlePsTime() time.Duration {
	runtime.GC()
	s := []metrics.Sample{{Name: "/cpu/classes/idle:cpu-seconds"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindFloat64 {
		return 0
	}
	return time.Duration(s[0].Value.Float64() * float64(time.Second))
}

// usageMark is where a measured run began: the process's CPU time and its
// Ps' idle time then.
type usageMark struct{ cpu, idlePs time.Duration }

// markUsage and since read idlePsTime outside the CPU window (before it,
// then after it): the garbage collection that brings the idle figure up to
// date is not the run's CPU.
func markUsage() usageMark {
	idle := idlePsTime()
	return usageMark{cpu: cpuTime(), idlePs: idle}
}

// since is the CPU and idle time from m to now.
func (m usageMark) since() usage {
	cpu := cpuTime() - m.cpu
	return usage{cpu: cpu, idlePs: idlePsTime() - m.idlePs}
}

// cpuTime is the CPU time (user and system) this process used so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// letters is n random lowercase letters, like the load tester's bodies.
func letters(n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = 'a' + byte(rand.IntN(26))
	}
	return string(b)
}

type quietPebble struct{}

func (quietPebble) Infof(string, ...any)  {}
func (quietPebble) Errorf(string, ...any) {}
func (quietPebble) Fatalf(format string, args ...any) {
	panic(fmt.Sprintf(format, args...))
}

// startNoop serves a chi router that does nothing: a send (single or
// batch) reads its body and answers 201 with a send result of the real
// size; anything else (the load tester's topic and subscription set-up)
// gets 201 {}.
func startNoop() (*server, error) {
	single := []byte(`{"messageId":"1O8GTGXJ0V5JVDKQ6ZQ5XH","queueId":3,"offset":123456,"storedAt":"2026-01-02T03:04:05.678Z","duplicate":false}` + "\n")
	reply := func(body []byte) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if _, err := io.Copy(io.Discard, r.Body); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Content-Length", strconv.Itoa(len(body)))
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write(body)
		}
	}
	m := chi.NewRouter()
	m.Post("/v1/topics/{topic}/messages", reply(single))
	m.HandleFunc("/*", reply([]byte("{}\n")))
	return serve(m)
}
