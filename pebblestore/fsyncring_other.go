//go:build !linux

package pebblestore

import "errors"

// fsyncRing exists only on Linux; elsewhere WAL syncs are plain syscalls.
type fsyncRing struct{}

func newFsyncRing() (*fsyncRing, error) { return nil, errors.New("io_uring is Linux only") }

func (*fsyncRing) fdatasync(uintptr, func() bool) (bool, error) { return false, nil }

func (*fsyncRing) syncs() int64 { return 0 }

func (*fsyncRing) close() error { return nil }

// yieldThread is never reached without a ring (nothing polls).
func yieldThread() {}
