package pebblestore

import (
	"slices"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/tidemq/tidemq/core"
)

// openWithGauges opens a store in dir on the real disk with opts and a
// reader of its gauges.
func openWithGauges(t *testing.T, dir string, opts Options) (*Store, *sdkmetric.ManualReader) {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	opts.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	s, err := Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	return s, reader
}

func gauge(t *testing.T, reader *sdkmetric.ManualReader, name string) int64 {
	t.Helper()
	v, ok := gaugeValue(t, storeGauges(t, reader), name)
	if !ok {
		t.Fatalf("no %s gauge", name)
	}
	return v
}

// Options.NoFsyncRing: WAL syncs are plain syscalls, none through the
// ring, and no commit polls (nothing counts its syncs); with the ring, on
// a kernel that has io_uring, syncs go through it and lone commits poll.
// The synced messages are there after a reopen either way.
func TestNoFsyncRing(t *testing.T) {
	_, ringErr := newFsyncRing()
	for _, noRing := range []bool{true, false} {
		t.Run(map[bool]string{true: "NoFsyncRing", false: "the ring"}[noRing], func(t *testing.T) {
			if !noRing && ringErr != nil {
				t.Skipf("no io_uring here: %v", ringErr)
			}
			dir := t.TempDir()
			opts := Options{CacheBytes: 8 << 20, MemTableBytes: 4 << 20, NoFsyncRing: noRing}
			s, reader := openWithGauges(t, dir, opts)
			const commits = 20
			for i := range commits {
				b := s.NewBatch()
				b.Append(&core.Message{ID: "m", TopicID: 1, Offset: uint64(i), Seq: uint64(i), Body: []byte("body")})
				b.PutQueueMeta(1, 0, uint64(i+1), int64(4*(i+1)))
				if err := b.Commit(true, true); err != nil {
					t.Fatal(err)
				}
			}
			syncs, polled := gauge(t, reader, "tidemq.store.wal.uring_syncs"), gauge(t, reader, "tidemq.store.wal.polled_commits")
			if noRing && (s.ring != nil || syncs != 0 || polled != 0) {
				t.Errorf("with NoFsyncRing: ring %v, %d syncs through it, %d commits polled; want none", s.ring != nil, syncs, polled)
			}
			if !noRing && (syncs == 0 || polled == 0) {
				t.Errorf("with the ring: %d syncs through it, %d of %d lone commits polled; want some of each", syncs, polled, commits)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			s = openSmallDiskStore(t, dir)
			defer s.Close()
			for seq := range uint64(commits) {
				if m, err := s.ReadMessage(seq); err != nil || string(m.Body) != "body" {
					t.Fatalf("after a reopen, seq %d: %+v, %v", seq, m, err)
				}
			}
		})
	}
}

// Options.NoWALSpares: Pebble's WALs are its own files, no spare is made
// or used however many WALs the writes rotate through; with spares, they
// are used. The synced writes are there after a reopen either way.
func TestNoWALSpares(t *testing.T) {
	for _, noSpares := range []bool{true, false} {
		t.Run(map[bool]string{true: "NoWALSpares", false: "spares"}[noSpares], func(t *testing.T) {
			dir := t.TempDir()
			opts := smallStore
			opts.NoWALSpares = noSpares
			s, reader := openWithGauges(t, dir, opts)
			var n int
			if noSpares {
				// 6 MiB through 1 MiB memtables: the WALs a store with
				// spares takes them for (TestWALSparesServePebblesNewLogs).
				n = 750
				value := make([]byte, 8<<10)
				for i := range n {
					if err := s.db.Set(testKey(i), value, pebble.Sync); err != nil {
						t.Fatal(err)
					}
				}
				if s.spares != nil {
					t.Error("spares set up with NoWALSpares")
				}
			} else {
				n = writeUntilSpares(t, s, vfs.Default, dir, 1)
			}
			used := gauge(t, reader, "tidemq.store.wal.spares_used")
			names, err := vfs.Default.List(dir)
			if err != nil {
				t.Fatal(err)
			}
			spareFiles := slices.ContainsFunc(names, func(n string) bool { return strings.HasPrefix(n, "tidemq-wal-spare") })
			if noSpares && (used != 0 || spareFiles) {
				t.Errorf("with NoWALSpares: %d spares used, spare files in the dir %v", used, spareFiles)
			}
			if !noSpares && used != s.spares.taken() {
				t.Errorf("tidemq.store.wal.spares_used = %d, want the %d spares taken", used, s.spares.taken())
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			s = openSmallDiskStore(t, dir)
			defer s.Close()
			checkKeys(t, s, n)
		})
	}
}
