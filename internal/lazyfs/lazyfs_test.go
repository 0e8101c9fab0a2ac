package lazyfs_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/tidemq/tidemq/internal/lazyfs"
)

// mount mounts a power-loss file system for the test, unmounted when it
// ends; it skips the test, saying why, where FUSE mounts are impossible.
func mount(t *testing.T) (*lazyfs.FS, string) {
	t.Helper()
	if testing.Short() {
		t.Skip("mounts a FUSE file system; skipped with -short")
	}
	if err := lazyfs.Supported(); err != nil {
		t.Skipf("mounts a FUSE file system: %v", err)
	}
	mnt, state := t.TempDir(), t.TempDir()
	f, err := lazyfs.Mount(mnt, state)
	if err != nil {
		t.Skipf("mounts a FUSE file system: mount refused: %v", err)
	}
	t.Cleanup(func() {
		if err := f.Unmount(); err != nil {
			t.Errorf("unmount: %v", err)
		}
	})
	return f, mnt
}

func write(t *testing.T, path, data string, sync bool) {
	t.Helper()
	fh, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	if _, err := fh.WriteString(data); err != nil {
		t.Fatal(err)
	}
	if sync {
		if err := fh.Sync(); err != nil {
			t.Fatal(err)
		}
	}
}

func syncDir(t *testing.T, path string) {
	t.Helper()
	d, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		t.Fatal(err)
	}
}

func powerLoss(t *testing.T, f *lazyfs.FS) {
	t.Helper()
	if err := f.PowerLoss(); err != nil {
		t.Fatal(err)
	}
}

// wantFile checks path's content; want "" with gone means no such file.
func wantFile(t *testing.T, path, want string, gone bool) {
	t.Helper()
	got, err := os.ReadFile(path)
	switch {
	case gone && errors.Is(err, os.ErrNotExist):
	case gone:
		t.Errorf("%s: %q, %v; want no such file", filepath.Base(path), got, err)
	case err != nil:
		t.Errorf("%s: %v; want %q", filepath.Base(path), err, want)
	case string(got) != want:
		t.Errorf("%s: %q, want %q", filepath.Base(path), got, want)
	}
}

func TestSyncedWritesSurviveAndOthersDoNot(t *testing.T) {
	f, mnt := mount(t)
	a := filepath.Join(mnt, "a")
	write(t, a, "synced ", true)
	syncDir(t, mnt)
	write(t, a, "lost", false)
	wantFile(t, a, "synced lost", false) // before the power loss, as written
	powerLoss(t, f)
	wantFile(t, a, "synced ", false)

	// The mount works after a power loss, and a second one keeps what the
	// first kept.
	write(t, a, "again", true)
	powerLoss(t, f)
	wantFile(t, a, "synced again", false)
	if st := f.Stats(); st.PowerLosses != 2 || st.FileSyncs != 2 || st.DirSyncs != 1 || st.LostBytes != 4 {
		t.Errorf("stats %+v; want 2 power losses, 2 file syncs, 1 directory sync, 4 bytes lost", st)
	}
}

// A name is durable once its directory is synced; a file's own fsync does
// not make it so, nor a sync of another directory.
func TestNamesNeedTheirDirectorySynced(t *testing.T) {
	f, mnt := mount(t)
	sub := filepath.Join(mnt, "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	syncDir(t, mnt)
	write(t, filepath.Join(sub, "named"), "data", true)
	syncDir(t, sub)
	write(t, filepath.Join(sub, "late"), "data", true) // created after the sync
	write(t, filepath.Join(mnt, "top"), "data", true)  // its directory never synced
	powerLoss(t, f)
	wantFile(t, filepath.Join(sub, "named"), "data", false)
	wantFile(t, filepath.Join(sub, "late"), "", true)
	wantFile(t, filepath.Join(mnt, "top"), "", true)

	// A name made durable for a file never synced: an empty file.
	write(t, filepath.Join(mnt, "empty"), "never synced", false)
	syncDir(t, mnt)
	powerLoss(t, f)
	wantFile(t, filepath.Join(mnt, "empty"), "", false)
}

func TestRenameRemoveAndLinkNeedTheDirectorySynced(t *testing.T) {
	f, mnt := mount(t)
	p := func(name string) string { return filepath.Join(mnt, name) }
	write(t, p("old"), "content", true)
	write(t, p("doomed"), "doomed", true)
	syncDir(t, mnt)

	if err := os.Rename(p("old"), p("new")); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(p("doomed")); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(p("new"), p("link")); err != nil {
		t.Fatal(err)
	}
	powerLoss(t, f)
	wantFile(t, p("old"), "content", false)
	wantFile(t, p("new"), "", true)
	wantFile(t, p("link"), "", true)
	wantFile(t, p("doomed"), "doomed", false)

	// The same, synced: a rename over an existing name, a link sharing its
	// inode (a write through one name shows through the other).
	if err := os.Rename(p("old"), p("doomed")); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(p("doomed"), p("link")); err != nil {
		t.Fatal(err)
	}
	syncDir(t, mnt)
	powerLoss(t, f)
	wantFile(t, p("old"), "", true)
	wantFile(t, p("doomed"), "content", false)
	write(t, p("link"), "+", true)
	wantFile(t, p("doomed"), "content+", false)
	powerLoss(t, f)
	wantFile(t, p("doomed"), "content+", false)
}

// Bytes cut off by a truncation and grown back are zeros after a power
// loss, as they are live; a truncation not synced is undone.
func TestTruncations(t *testing.T) {
	f, mnt := mount(t)
	p := filepath.Join(mnt, "f")
	write(t, p, "hello world", true)
	syncDir(t, mnt)
	if err := os.Truncate(p, 5); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(p, 11); err != nil {
		t.Fatal(err)
	}
	powerLoss(t, f)
	wantFile(t, p, "hello world", false)

	if err := os.Truncate(p, 5); err != nil {
		t.Fatal(err)
	}
	write(t, p, "!", false)
	if err := os.Truncate(p, 11); err != nil {
		t.Fatal(err)
	}
	fh, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := fh.Sync(); err != nil {
		t.Fatal(err)
	}
	fh.Close()
	powerLoss(t, f)
	wantFile(t, p, "hello!"+string(bytes.Repeat([]byte{0}, 5)), false)

	// O_TRUNC then a partial rewrite, synced.
	if err := os.WriteFile(p, []byte("hi"), 0o644); err != nil {
		t.Fatal(err)
	}
	write(t, p, "", true)
	powerLoss(t, f)
	wantFile(t, p, "hi", false)
}

// A write in the middle of a large file, synced by fdatasync: only what
// the sync covered survives, at its place.
func TestOverwritesInPlace(t *testing.T) {
	f, mnt := mount(t)
	p := filepath.Join(mnt, "big")
	base := bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB
	if err := os.WriteFile(p, base, 0o644); err != nil {
		t.Fatal(err)
	}
	write(t, p, "", true)
	syncDir(t, mnt)
	fh, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	if _, err := fh.WriteAt([]byte("SYNCED"), 300<<10); err != nil {
		t.Fatal(err)
	}
	if err := fdatasync(fh); err != nil {
		t.Fatal(err)
	}
	if _, err := fh.WriteAt([]byte("LOST"), 700<<10); err != nil {
		t.Fatal(err)
	}
	fh.Close()
	powerLoss(t, f)
	want := bytes.Clone(base)
	copy(want[300<<10:], "SYNCED")
	got, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("after the power loss: %d bytes, equal to what was synced: false (at 300 KiB %q, at 700 KiB %q)",
			len(got), got[300<<10:300<<10+6], got[700<<10:700<<10+4])
	}
}

func fdatasync(fh *os.File) error { return syscall.Fdatasync(int(fh.Fd())) }

// A preallocation changes nothing durable but the size, a punched hole is
// zeros once synced.
func TestFallocate(t *testing.T) {
	f, mnt := mount(t)
	p := filepath.Join(mnt, "f")
	write(t, p, "hello world", true)
	syncDir(t, mnt)
	fh, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	if err := unix.Fallocate(int(fh.Fd()), unix.FALLOC_FL_KEEP_SIZE, 0, 1<<20); err != nil {
		t.Skipf("fallocate: %v", err)
	}
	if err := unix.Fallocate(int(fh.Fd()), unix.FALLOC_FL_KEEP_SIZE|unix.FALLOC_FL_PUNCH_HOLE, 0, 5); err != nil {
		t.Fatal(err)
	}
	if err := fdatasync(fh); err != nil {
		t.Fatal(err)
	}
	if err := unix.Fallocate(int(fh.Fd()), unix.FALLOC_FL_KEEP_SIZE|unix.FALLOC_FL_PUNCH_HOLE, 5, 6); err != nil {
		t.Fatal(err)
	}
	fh.Close()
	powerLoss(t, f)
	wantFile(t, p, "\x00\x00\x00\x00\x00 world", false)
	if st := f.Stats(); st.LostBytes != 6 {
		t.Errorf("%d bytes lost; want the 6 of the hole not synced", st.LostBytes)
	}
}

// A mount on the state of an earlier one starts from what the earlier
// mount's dir/live held, all of it durable.
func TestMountAgainOnTheSameState(t *testing.T) {
	if testing.Short() {
		t.Skip("mounts a FUSE file system; skipped with -short")
	}
	if err := lazyfs.Supported(); err != nil {
		t.Skipf("mounts a FUSE file system: %v", err)
	}
	mnt, state := t.TempDir(), t.TempDir()
	for i, data := range []string{"first", "second"} {
		f, err := lazyfs.Mount(mnt, state)
		if err != nil {
			t.Skipf("mounts a FUSE file system: mount refused: %v", err)
		}
		t.Cleanup(func() { _ = f.Unmount() }) // on a failure; a no-op after the Unmount below
		p := filepath.Join(mnt, "f")
		if i > 0 {
			powerLoss(t, f) // nothing written: the earlier content stays
			wantFile(t, p, "first", false)
		}
		write(t, p, data, false) // not synced: still in dir/live at unmount
		if err := f.Unmount(); err != nil {
			t.Fatal(err)
		}
	}
}
