package main

import "runtime/debug"

// The broker allocates a lot per message (request bodies, records, span
// data) and keeps little in the Go heap: its big memory, Pebble's block
// cache and memtables, is allocated outside it. With Go's default (collect
// when the heap has doubled) the collector took ~10% of the CPU under load;
// collecting at 5× the live heap gave +13% messages per second in the load
// tester's send+pull mix (docs/BENCHMARKS.md). The soft memory limit keeps
// a large live heap (many leases, a full dedup window) from growing 5×.
// GOGC and GOMEMLIMIT, when set, win.
const (
	defaultGCPercent   = 400
	defaultMemoryLimit = 768 << 20
)

func tuneGC(getenv func(string) string) {
	if getenv("GOGC") == "" {
		debug.SetGCPercent(defaultGCPercent)
	}
	if getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(defaultMemoryLimit)
	}
}
