package core_test

import (
	"context"
	"encoding/binary"
	"slices"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/tidemq/tidemq/core"
)

// BenchmarkLoneSend is one producer sending one 1 KiB message at a time,
// fsync on: the latency target of a single send with nobody to share the
// commit with (docs/LOADTEST.md, target 4). Whatever the broker adds to
// BenchmarkLonePebbleCommit (same disk, same run) is its own critical path.
//
//	go test -run '^$' -bench 'Lone' -count 5 ./core/
func BenchmarkLoneSend(b *testing.B) {
	benchLoneSend(b, core.Options{})
}

// BenchmarkLoneSendNoSync is BenchmarkLoneSend without fsync: what is left
// is the broker's own path (and its goroutine hand-offs) with no disk wait
// to hide it or add noise.
func BenchmarkLoneSendNoSync(b *testing.B) {
	benchLoneSend(b, core.Options{NoSync: true})
}

func benchLoneSend(b *testing.B, opts core.Options) {
	br, _ := benchOpen(b, opts)
	body := benchPayload(benchKiB)
	ctx := context.Background()
	// A few sends first, so that the timed part does not pay for opening
	// the WAL and warming the caches.
	for range 16 {
		if _, err := br.Send(ctx, benchTopic, []*core.Message{{Body: body}}); err != nil {
			b.Fatalf("Send: %v", err)
		}
	}
	lat := make([]time.Duration, 0, b.N)
	b.SetBytes(benchKiB)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		start := time.Now()
		if _, err := br.Send(ctx, benchTopic, []*core.Message{{Body: body}}); err != nil {
			b.Fatalf("Send: %v", err)
		}
		lat = append(lat, time.Since(start))
	}
	reportPercentiles(b, lat)
}

// BenchmarkLonePebbleCommit is the floor of BenchmarkLoneSend: one writer
// committing one 1 KiB Set per synced batch to raw Pebble in b.TempDir().
func BenchmarkLonePebbleCommit(b *testing.B) {
	db, err := pebble.Open(b.TempDir(), &pebble.Options{Logger: pebbleQuiet{}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := db.Close(); err != nil {
			b.Error(err)
		}
	})
	body := benchPayload(benchKiB)
	var key [9]byte
	key[0] = 'm'
	lat := make([]time.Duration, 0, b.N)
	b.SetBytes(benchKiB)
	b.ResetTimer()
	var i uint64
	for b.Loop() {
		start := time.Now()
		i++
		binary.BigEndian.PutUint64(key[1:], i)
		batch := db.NewBatch()
		if err := batch.Set(key[:], body, nil); err != nil {
			b.Fatal(err)
		}
		if err := batch.Commit(pebble.Sync); err != nil {
			b.Fatal(err)
		}
		_ = batch.Close()
		lat = append(lat, time.Since(start))
	}
	reportPercentiles(b, lat)
}

// reportPercentiles adds the p50 and p99 of the measured calls: the
// target is a p50, and ns/op (a mean) is pulled up by a loaded machine's
// outliers.
func reportPercentiles(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-ns")
}

type pebbleQuiet struct{}

func (pebbleQuiet) Infof(string, ...any)  {}
func (pebbleQuiet) Errorf(string, ...any) {}
func (pebbleQuiet) Fatalf(format string, args ...any) {
	panic("pebble: fatal: " + format)
}
