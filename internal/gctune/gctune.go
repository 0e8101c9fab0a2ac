// Package gctune sets the garbage collector for a broker process:
// cmd/tidemq, and the load tester when it runs a broker in its own process.
//
// The broker allocates a lot per message (request bodies, records, span
// data) and keeps little in the Go heap: its big memory, Pebble's block
// cache and memtables, is allocated outside it. Go's default (collect when
// the heap has doubled) therefore collects far more often than the live
// heap needs, about a tenth of the CPU under load; collecting at 5× the
// live heap spends a fraction of that (docs/BENCHMARKS.md, "Performance
// decisions").
//
// 5× of a small live heap is cheap, 5× of a large one is not: a flood of
// 15 MB batches keeps ~90 MB of bodies and their copies live, and 5× of
// that is most of a 512 MiB process. So after every collection the tuner
// lowers the factor as the live heap grows, to keep the heap under
// HeapTarget, down to MinGCPercent (Go's default) once the live heap
// itself is that large; it never collects more often than Go's default
// would. The soft memory limit bounds what is left (many leases, a full
// dedup window, thousands of parked polls' stacks).
package gctune

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"sync/atomic"
)

const (
	MaxGCPercent = 400
	MinGCPercent = 100
	// HeapTarget is the heap (live and garbage) the tuner keeps the
	// collector's goal under while the live heap leaves room for it.
	HeapTarget  = 224 << 20
	MemoryLimit = 768 << 20
)

// Apply sets the collector unless GOGC or GOMEMLIMIT (as getenv reads
// them) say otherwise: with GOGC set, the tuner stays off.
func Apply(getenv func(string) string) {
	if getenv("GOGC") == "" {
		startTuner(HeapTarget)
	}
	if getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(MemoryLimit)
	}
}

var tunerOnce sync.Once

// startTuner sets GCPercent for the live heap now and again after every
// collection; the first call in a process wins.
func startTuner(target uint64) {
	tunerOnce.Do(func() {
		t := &tuner{target: target, samples: []metrics.Sample{
			{Name: "/gc/heap/live:bytes"}, {Name: "/gc/scan/stack:bytes"}, {Name: "/gc/scan/globals:bytes"},
		}}
		t.adjust()
		t.arm()
	})
}

type tuner struct {
	target  uint64
	samples []metrics.Sample
	percent atomic.Int32 // the GCPercent last set
}

// sentinel is a garbage object whose cleanup runs after the next
// collection. It holds a pointer so that the tiny allocator, which packs
// small pointer-free objects together, does not keep it alive.
type sentinel struct{ _ *sentinel }

func (t *tuner) arm() {
	runtime.AddCleanup(&sentinel{}, func(t *tuner) {
		t.adjust()
		t.arm()
	}, t)
}

func (t *tuner) adjust() {
	metrics.Read(t.samples)
	live, stacks, globals := t.samples[0].Value.Uint64(), t.samples[1].Value.Uint64(), t.samples[2].Value.Uint64()
	p := gcPercentFor(t.target, live, live+stacks+globals)
	if t.percent.Load() != int32(p) {
		t.percent.Store(int32(p))
		debug.SetGCPercent(p)
	}
}

// gcPercentFor is the GCPercent whose goal, live + scannable × percent /
// 100 (Go's pacer), is target, within [MinGCPercent, MaxGCPercent].
// Steps of 25 keep it from changing at every collection.
func gcPercentFor(target, live, scannable uint64) int {
	switch {
	case live >= target:
		return MinGCPercent
	case scannable == 0:
		return MaxGCPercent
	}
	p := (target - live) * 100 / scannable
	p -= p % 25
	return int(min(max(p, MinGCPercent), MaxGCPercent))
}
