package main

import "runtime/debug"

// tuneGC sets the garbage collector as cmd/tidemq does (see its gc.go: a
// collection at 5× the live heap, a 768 MiB soft limit, unless GOGC or
// GOMEMLIMIT say otherwise), so that an in-process broker runs as the
// binary does. The load generator shares the setting.
func tuneGC(getenv func(string) string) {
	if getenv("GOGC") == "" {
		debug.SetGCPercent(400)
	}
	if getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(768 << 20)
	}
}
