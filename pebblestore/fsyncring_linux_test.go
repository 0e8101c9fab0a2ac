package pebblestore

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

func TestFsyncRingSyncsFilesAndReportsErrors(t *testing.T) {
	r := newTestRing(t)
	f, err := os.Create(filepath.Join(t.TempDir(), "wal"))
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
		if err := r.fdatasync(f.Fd(), spin); err != nil {
			t.Fatalf("sync %d (spinning %v): %v", i, spin != nil, err)
		}
	}
	if got := r.syncs(); got != syncs {
		t.Errorf("syncs() = %d, want %d", got, syncs)
	}

	// A pipe cannot be synced: EINVAL, as from fdatasync(2). The ring
	// cannot tell that from a kernel whose ring cannot fsync, so it gives
	// the plain call the last word and stays out of the way after.
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	defer pw.Close()
	if err := r.fdatasync(pw.Fd(), spinUntilDone); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("fdatasync(pipe) = %v, want EINVAL", err)
	}
	if !r.broken {
		t.Error("after EINVAL from the ring, the ring is still used")
	}
	if err := r.fdatasync(f.Fd(), nil); err != nil {
		t.Fatalf("sync after the failed one: %v", err)
	}
	if got := r.syncs(); got != syncs {
		t.Errorf("syncs() = %d after the ring was set aside, want still %d", got, syncs)
	}
}
