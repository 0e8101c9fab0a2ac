// Package gctune sets the garbage collector for a broker process:
// cmd/tidemq, and the load tester when it runs a broker in its own process.
//
// The broker allocates a lot per message (request bodies, records, span
// data) and keeps little in the Go heap: its big memory, Pebble's block
// cache and memtables, is allocated outside it. Go's default (collect when
// the heap has doubled) therefore collects far more often than the live
// heap needs, about a tenth of the CPU under load; collecting at 5× the
// live heap spends a fraction of that (docs/BENCHMARKS.md, "Performance
// decisions"). The soft memory limit keeps a large live heap (many leases,
// a full dedup window) from growing 5×.
package gctune

import "runtime/debug"

const (
	GCPercent   = 400
	MemoryLimit = 768 << 20
)

// Apply sets GCPercent and MemoryLimit unless GOGC or GOMEMLIMIT (as getenv
// reads them) say otherwise.
func Apply(getenv func(string) string) {
	if getenv("GOGC") == "" {
		debug.SetGCPercent(GCPercent)
	}
	if getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(MemoryLimit)
	}
}
