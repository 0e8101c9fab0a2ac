package gctune

import (
	"runtime"
	"runtime/metrics"
	"testing"
	"time"
)

func TestGCPercentFor(t *testing.T) {
	const MiB = 1 << 20
	for _, c := range []struct {
		name                    string
		target, live, scannable uint64
		want                    int
	}{
		{"a small live heap grows 5×", 224 * MiB, 20 * MiB, 21 * MiB, MaxGCPercent},
		{"a flood's bodies: the goal stays at the target", 224 * MiB, 90 * MiB, 91 * MiB, 125},
		{"no lower than Go's default", 224 * MiB, 200 * MiB, 300 * MiB, MinGCPercent},
		{"a live heap past the target", 224 * MiB, 300 * MiB, 300 * MiB, MinGCPercent},
		{"nothing scanned yet", 224 * MiB, 0, 0, MaxGCPercent},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := gcPercentFor(c.target, c.live, c.scannable)
			if got != c.want {
				t.Fatalf("gcPercentFor(%d, %d, %d) = %d, want %d", c.target, c.live, c.scannable, got, c.want)
			}
			if goal := c.live + c.scannable*uint64(got)/100; got > MinGCPercent && goal > c.target {
				t.Fatalf("goal %d MiB over the target %d MiB", goal>>20, c.target>>20)
			}
		})
	}
}

// The tuner follows the live heap collection by collection: up with a
// large live heap, GCPercent comes down, and it goes back up once the heap
// is garbage again.
func TestTunerFollowsTheLiveHeap(t *testing.T) {
	const MiB = 1 << 20
	startTuner(64 * MiB)
	gogc := func() int {
		s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
		metrics.Read(s)
		return int(s[0].Value.Uint64())
	}
	settle := func(want func(int) bool) int {
		deadline := time.Now().Add(10 * time.Second)
		for {
			// The tuner's cleanup runs after a collection, on its own
			// goroutine: collect until it has seen one.
			runtime.GC()
			if p := gogc(); want(p) || time.Now().After(deadline) {
				return p
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if p := settle(func(p int) bool { return p == MaxGCPercent }); p != MaxGCPercent {
		t.Fatalf("GOGC %d with an almost empty heap, want %d", p, MaxGCPercent)
	}
	live := make([][]byte, 48)
	for i := range live {
		live[i] = make([]byte, MiB)
	}
	p := settle(func(p int) bool { return p < MaxGCPercent })
	if p >= MaxGCPercent || p < MinGCPercent {
		t.Fatalf("GOGC %d with 48 MiB live against a 64 MiB target, want in [%d, %d)", p, MinGCPercent, MaxGCPercent)
	}
	runtime.KeepAlive(live)
	live = nil
	if p := settle(func(p int) bool { return p == MaxGCPercent }); p != MaxGCPercent {
		t.Fatalf("GOGC %d after the live heap went, want %d", p, MaxGCPercent)
	}
}
