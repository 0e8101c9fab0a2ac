package pebblestore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// writeUntilSpares writes synced 8 KiB values until the store has taken
// want spares for its WALs and its current WAL is one (at most 40 MiB,
// some 40 memtables); it returns how many keys it wrote.
func writeUntilSpares(t *testing.T, s *Store, fs vfs.FS, dir string, want int64) int {
	t.Helper()
	value := bytes.Repeat([]byte("v"), 8<<10)
	deadline := time.Now().Add(30 * time.Second)
	n := 0
	for s.spares.taken() < want || !isSpare(t, s, fs, dir, currentWAL(t, fs, dir)) {
		if n == 5000 || time.Now().After(deadline) {
			t.Fatalf("after %d synced writes (%d MiB): %d spares taken, want %d and the current WAL one", n, n*len(value)>>20, s.spares.taken(), want)
		}
		// Spares serve only a store's first WALs (later ones are recycled
		// logs of the right length), and the maker fills them in the
		// background: on a busy machine these writes would rotate past
		// that window before a spare is ready. Wait for the one wanted, as
		// a store whose writers are slower than the maker finds it.
		for s.spares.logs.Load() > 1 && s.spares.ready.Load() == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("after %d synced writes: no spare made within 30 s", n)
			}
			time.Sleep(100 * time.Microsecond)
		}
		if err := s.db.Set(testKey(n), value, pebble.Sync); err != nil {
			t.Fatal(err)
		}
		n++
	}
	t.Logf("%d synced writes; %d spares taken; WALs %v", n, s.spares.taken(), wals(t, fs, dir))
	return n
}

// smallStore has 1 MiB memtables, so a few MiB of writes rotate WALs.
var smallStore = Options{MemTableBytes: 1 << 20, CacheBytes: 8 << 20}

// openSmallDiskStore opens a smallStore in dir on the real disk.
func openSmallDiskStore(t *testing.T, dir string) *Store {
	t.Helper()
	s, err := Open(dir, smallStore)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func testKey(i int) []byte { return fmt.Appendf(nil, "test/%06d", i) }

func wals(t *testing.T, fs vfs.FS, dir string) []string {
	t.Helper()
	names, err := fs.List(dir)
	if err != nil {
		t.Fatal(err)
	}
	names = slices.DeleteFunc(names, func(n string) bool { return !isWAL(n) })
	slices.Sort(names) // fixed-width numbers: the last is the newest
	return names
}

func currentWAL(t *testing.T, fs vfs.FS, dir string) string {
	t.Helper()
	w := wals(t, fs, dir)
	if len(w) == 0 {
		t.Fatalf("no WAL in %s", dir)
	}
	return w[len(w)-1]
}

// isSpare reports whether the named file has the length of a spare.
func isSpare(t *testing.T, s *Store, fs vfs.FS, dir, name string) bool {
	t.Helper()
	fi, err := fs.Stat(fs.PathJoin(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	for n := int32(1); n < 32; n++ {
		if fi.Size() == s.spares.sizeFor(n) {
			return true
		}
	}
	return false
}

func checkKeys(t *testing.T, s *Store, n int) {
	t.Helper()
	for i := range n {
		v, closer, err := s.db.Get(testKey(i))
		if err != nil {
			t.Fatalf("key %d of %d: %v", i, n, err)
		}
		if len(v) != 8<<10 {
			t.Fatalf("key %d: %d bytes, want %d", i, len(v), 8<<10)
		}
		_ = closer.Close()
	}
}

// On the real disk, Pebble's WALs after its first become zero-filled
// spares, and what was written to them reads back after a reopen (Pebble
// reads their zeros as the end of the log).
func TestWALSparesServePebblesNewLogs(t *testing.T) {
	dir := t.TempDir()
	s := openSmallDiskStore(t, dir)
	n := writeUntilSpares(t, s, vfs.Default, dir, 3)
	// The next spare, once made, is counted in the store's disk bytes.
	for deadline := time.Now().Add(10 * time.Second); s.spares.ready.Load() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no spare made within 10 s of the last one taken")
		}
	}
	spare := s.spares.ready.Load()
	before, stats, after := s.DiskUsage(), s.Stats(), s.DiskUsage()
	if pebbles := uint64(stats.DiskBytes - spare); pebbles < min(before, after) || pebbles > max(before, after) {
		t.Errorf("Stats().DiskBytes = %d, want Pebble's %d..%d and the spare's %d", stats.DiskBytes, before, after, spare)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := vfs.Default.Stat(vfs.Default.PathJoin(dir, spareTmpName)); err == nil {
		t.Errorf("%s left behind after Close", spareTmpName)
	}

	s = openSmallDiskStore(t, dir)
	defer s.Close()
	checkKeys(t, s, n)
}

// The synced writes to a spare survive a crash: Pebble's recovery stops at
// the zeros after the last record, as it does on a log of its own.
func TestWALSparesKeepSyncedWritesThroughACrash(t *testing.T) {
	fs := vfs.NewCrashableMem()
	opts := smallStore
	opts.FS, opts.sparesOnFS = fs, true
	s, err := Open("db", opts)
	if err != nil {
		t.Fatal(err)
	}
	n := writeUntilSpares(t, s, fs, "db", 2)
	crashed := fs.CrashClone(vfs.CrashCloneCfg{})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	opts.FS = crashed
	s, err = Open("db", opts)
	if err != nil {
		t.Fatalf("open after the crash: %v", err)
	}
	defer s.Close()
	checkKeys(t, s, n)
}

// A spare left whole by the last run is used, whatever its length; a
// half-made or empty one is removed.
func TestWALSparesLeftByTheLastRun(t *testing.T) {
	for _, c := range []struct {
		name      string
		file      string
		bytes     int
		wantReady int64
	}{
		{"whole", spareName, 300 << 10, 300 << 10},
		{"empty", spareName, 0, 0},
		{"half made", spareTmpName, 300 << 10, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			fs := vfs.NewMem()
			f, err := fs.Create(c.file, vfs.WriteCategoryUnspecified)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.Write(make([]byte, c.bytes)); err != nil {
				t.Fatal(err)
			}
			_ = f.Close()

			s := newWALSpares(fs, "", 64<<20, slog.Default())
			s.start()
			defer s.close()
			if got := s.ready.Load(); got != c.wantReady {
				t.Errorf("ready = %d bytes, want %d", got, c.wantReady)
			}
			if _, err := fs.Stat(c.file); (err == nil) != (c.wantReady > 0) {
				t.Errorf("%s exists = %v, want %v", c.file, err == nil, c.wantReady > 0)
			}
		})
	}
}

// Spares grow with Pebble's memtables: 1.1 × 256 KiB for the first WAL,
// doubling to 1.1 × the memtable size.
func TestWALSpareSizes(t *testing.T) {
	s := newWALSpares(vfs.NewMem(), "", 4<<20, slog.Default())
	var got []int64
	for n := int32(1); n <= 6; n++ {
		got = append(got, s.sizeFor(n))
	}
	want := []int64{288358, 576716, 1153433, 2306867, 4613734, 4613734}
	if !slices.Equal(got, want) {
		t.Errorf("sizes for WALs 1–6 with 4 MiB memtables: %v, want %v", got, want)
	}
	if small := newWALSpares(vfs.NewMem(), "", 100<<10, slog.Default()); small.sizeFor(3) != 112640 {
		t.Errorf("a 100 KiB memtable's spare: %d bytes, want 112640", small.sizeFor(3))
	}
}

type nearlyFullDisk struct{ vfs.FS }

func (nearlyFullDisk) GetDiskUsage(string) (vfs.DiskUsage, error) {
	return vfs.DiskUsage{AvailBytes: 4 << 20, TotalBytes: 1 << 30}, nil
}

// A spare never takes the disk's last free space: core's sends need it.
func TestWALSparesLeaveALowDiskAlone(t *testing.T) {
	fs := nearlyFullDisk{vfs.NewMem()}
	s := newWALSpares(fs, "", 1<<20, slog.Default())
	s.start()
	defer s.close()
	if err := s.make(context.Background(), 1<<20); !errors.Is(err, errLowDisk) {
		t.Fatalf("make on a disk with 4 MiB free: %v, want errLowDisk", err)
	}
	names, _ := fs.List("")
	if slices.ContainsFunc(names, func(n string) bool { return strings.HasPrefix(n, "tidemq-wal-spare") }) {
		t.Errorf("a spare was written: %v", names)
	}
	if _, ok := s.take("000002.log", vfs.WriteCategoryUnspecified, 0); ok {
		t.Error("take handed out a spare that was never made")
	}
}

// A second open of a directory in use fails on Pebble's lock without
// touching the spare the first store may be filling.
func TestWALSparesOfAStoreInUseAreLeftAlone(t *testing.T) {
	dir := t.TempDir()
	s := openSmallDiskStore(t, dir)
	defer s.Close()
	// As the first store's maker leaves it while it fills one.
	tmp := vfs.Default.PathJoin(dir, spareTmpName)
	f, err := vfs.Default.Create(tmp, vfs.WriteCategoryUnspecified)
	if err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
	if second, err := Open(dir, smallStore); err == nil {
		second.Close()
		t.Fatal("a second Open of a directory in use succeeded")
	}
	if _, err := vfs.Default.Stat(tmp); err != nil {
		t.Errorf("the refused second open removed the spare being filled: %v", err)
	}
}
