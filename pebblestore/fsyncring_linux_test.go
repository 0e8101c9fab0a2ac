package pebblestore

import (
	"errors"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"golang.org/x/sys/unix"
)

func TestFsyncRingSyncsFilesAndReportsErrors(t *testing.T) {
	r := newTestRing(t)
	f, err := vfs.Default.Create(filepath.Join(t.TempDir(), "wal"), vfs.WriteCategoryUnspecified)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// Many in a row, parked and polled in turn: completions reaped without
	// reading the eventfd leave a count behind, which must not let a later
	// sync return early.
	const syncs = 50
	spinUntilDone := func() bool { return true }
	for i := range syncs {
		if _, err := f.Write([]byte("record\n")); err != nil {
			t.Fatal(err)
		}
		spin := spinUntilDone
		if i%2 == 0 {
			spin = nil
		}
		if synced, err := r.fdatasync(f.Fd(), spin); !synced || err != nil {
			t.Fatalf("sync %d (spinning %v): synced %v, %v", i, spin != nil, synced, err)
		}
	}
	if got := r.syncs(); got != syncs {
		t.Errorf("syncs() = %d, want %d", got, syncs)
	}

	// A FIFO cannot be synced: EINVAL, as from fdatasync(2). The ring
	// cannot tell that from a kernel whose ring cannot fsync, so it gives
	// the plain call (Pebble's own SyncData) the last word and stays out
	// of the way after.
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	pf, err := vfs.Default.OpenReadWrite(fifo, vfs.WriteCategoryUnspecified)
	if err != nil {
		t.Fatal(err)
	}
	defer pf.Close()
	pipeWAL := &walFile{File: pf, ring: r, spin: true}
	if err := pipeWAL.SyncData(); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("SyncData(fifo) = %v, want EINVAL", err)
	}
	if !r.broken {
		t.Error("after EINVAL from the ring, the ring is still used")
	}
	wal := &walFile{File: f, ring: r, spin: true}
	if err := wal.SyncData(); err != nil {
		t.Fatalf("sync after the failed one: %v", err)
	}
	if got := r.syncs(); got != syncs {
		t.Errorf("syncs() = %d after the ring was set aside, want still %d", got, syncs)
	}
}
