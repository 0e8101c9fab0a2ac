package pebblestore_test

import (
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tidemq/tidemq/core"
	"github.com/tidemq/tidemq/pebblestore"
)

// Benchmarks of the store's write path on the real disk (b.TempDir()), next
// to raw Pebble writing the same bytes, so that the store's overhead reads
// as a ratio measured in the same run:
//
//	go test -run '^$' -bench 'Append|RawPebble' -benchmem ./pebblestore/

// benchBatchSizes are the messages per commit: a lone send, a typical group
// commit under load, and a large batch send.
var benchBatchSizes = []int{1, 32, 256}

const benchBodyBytes = 1024

var benchQuiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// benchBody is 1 KiB of random bytes, so compression flatters nobody.
func benchBody() []byte {
	r := rand.New(rand.NewPCG(1, 2))
	body := make([]byte, benchBodyBytes)
	for i := range body {
		body[i] = byte(r.Uint32())
	}
	return body
}

// BenchmarkAppend commits batches of N 1 KiB messages through core.Batch,
// as the broker's appender does: one Append per message (log record, queue
// index, id index, sparse time index) and the queue's meta record, then one
// Commit.
func BenchmarkAppend(b *testing.B) {
	for _, n := range benchBatchSizes {
		for _, sync := range []bool{true, false} {
			name := fmt.Sprintf("batch=%d/nosync", n)
			if sync {
				name = fmt.Sprintf("batch=%d/sync", n)
			}
			b.Run(name, func(b *testing.B) { benchAppend(b, n, sync) })
		}
	}
}

// openBenchStore opens a store on the real disk, closed when b ends.
func openBenchStore(b *testing.B) *pebblestore.Store {
	s, err := pebblestore.Open(b.TempDir(), pebblestore.Options{Logger: benchQuiet})
	if err != nil {
		b.Fatalf("Open: %v", err)
	}
	b.Cleanup(func() {
		if err := s.Close(); err != nil {
			b.Errorf("Close: %v", err)
		}
	})
	return s
}

func benchAppend(b *testing.B, n int, sync bool) {
	s := openBenchStore(b)
	body := benchBody()
	const topicID, queues = 1, 8
	msgs := make([]core.Message, n)
	for i := range msgs {
		msgs[i] = core.Message{ID: fmt.Sprintf("bench-%06d", i), TopicID: topicID, Body: body}
	}
	var seq uint64
	var offsets [queues]uint64
	var bytes [queues]int64
	b.SetBytes(int64(n * benchBodyBytes))
	b.ReportAllocs()
	for b.Loop() {
		batch := s.NewBatch()
		nowMs := time.Now().UnixMilli()
		for i := range msgs {
			m := &msgs[i]
			q := uint32(seq % queues)
			m.QueueID, m.Offset, m.Seq = q, offsets[q], seq
			m.BornAtMs, m.StoredAtMs = nowMs, nowMs
			batch.Append(m)
			offsets[q]++
			bytes[q] += int64(len(m.Body))
			seq++
		}
		for q := range min(n, queues) {
			batch.PutQueueMeta(topicID, uint32(q), offsets[q], bytes[q])
		}
		if err := batch.Commit(sync, false); err != nil {
			b.Fatalf("Commit: %v", err)
		}
	}
	b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "msgs/s")
}

// BenchmarkRawPebbleSyncedSet is the floor under BenchmarkAppend/…/sync:
// N 1 KiB values under sequential 9-byte keys (the shape of the store's log
// keys) in one pebble.Batch committed with pebble.Sync. Pebble is opened
// with the store's memtable and cache sizes and otherwise default options.
func BenchmarkRawPebbleSyncedSet(b *testing.B) {
	for _, n := range benchBatchSizes {
		b.Run(fmt.Sprintf("batch=%d", n), func(b *testing.B) { benchRawPebble(b, n) })
	}
}

func benchRawPebble(b *testing.B, n int) {
	cache := pebble.NewCache(256 << 20)
	defer cache.Unref()
	db, err := pebble.Open(b.TempDir(), &pebble.Options{
		Cache:        cache,
		MemTableSize: 64 << 20,
		Logger:       benchPebbleLogger{},
	})
	if err != nil {
		b.Fatalf("pebble.Open: %v", err)
	}
	b.Cleanup(func() {
		if err := db.Close(); err != nil {
			b.Errorf("Close: %v", err)
		}
	})
	body := benchBody()
	key := make([]byte, 9)
	key[0] = 'L'
	var seq uint64
	b.SetBytes(int64(n * benchBodyBytes))
	b.ReportAllocs()
	for b.Loop() {
		batch := db.NewBatch()
		for range n {
			binary.BigEndian.PutUint64(key[1:], seq)
			seq++
			if err := batch.Set(key, body, nil); err != nil {
				b.Fatalf("Set: %v", err)
			}
		}
		if err := batch.Commit(pebble.Sync); err != nil {
			b.Fatalf("Commit: %v", err)
		}
		_ = batch.Close()
	}
	b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "msgs/s")
}

// benchPebbleLogger keeps Pebble's informational chatter out of the output.
type benchPebbleLogger struct{}

func (benchPebbleLogger) Infof(string, ...any)  {}
func (benchPebbleLogger) Errorf(string, ...any) {}
func (benchPebbleLogger) Fatalf(format string, args ...any) {
	panic(fmt.Sprintf(format, args...))
}

// BenchmarkReadMessages reads 256 bodies the way a pull does (sorted seqs,
// one ReadMessages call) from a store holding 100,000 1 KiB messages: one
// queue's messages of batches spread over 8 queues (every 8th seq), and a
// run of consecutive seqs.
//
//	go test -run '^$' -bench ReadMessages -count 5 ./pebblestore/
func BenchmarkReadMessages(b *testing.B) {
	s := openBenchStore(b)
	const total, pull, queues = 100_000, 256, 8
	body := benchBody()
	for seq := uint64(0); seq < total; {
		batch := s.NewBatch()
		for range 256 {
			q := uint32(seq % queues)
			batch.Append(&core.Message{ID: fmt.Sprint("m", seq), TopicID: 1, QueueID: q, Offset: seq / queues, Seq: seq, Body: body, StoredAtMs: 1})
			seq++
		}
		if err := batch.Commit(false, false); err != nil {
			b.Fatal(err)
		}
	}
	for _, stride := range []uint64{1, queues} {
		b.Run(fmt.Sprintf("stride=%d", stride), func(b *testing.B) {
			seqs := make([]uint64, pull)
			out := make([]*core.Message, pull)
			r := rand.New(rand.NewPCG(3, 4))
			b.ReportAllocs()
			for b.Loop() {
				first := r.Uint64N(total - pull*stride)
				for i := range seqs {
					seqs[i] = first + uint64(i)*stride
				}
				if err := s.ReadMessages(seqs, out); err != nil {
					b.Fatal(err)
				}
				if out[pull-1] == nil {
					b.Fatal("a stored message was not read")
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*pull), "ns/msg")
		})
	}
}

// BenchmarkFileAppendSync is why the store keeps zero-filled WAL spares
// (walspare.go): an append and fdatasync to a file that grows, as Pebble's
// new WAL files do, against the same on a file whose blocks were written
// with zeros before. The first must write the inode too.
//
//	go test -run '^$' -bench FileAppendSync -benchtime 2000x ./pebblestore/
func BenchmarkFileAppendSync(b *testing.B) {
	const fileBytes = 64 << 20
	for _, size := range []int{1300, 30 << 10} {
		for _, zeroFilled := range []bool{false, true} {
			name := fmt.Sprintf("new-file/%dB", size)
			if zeroFilled {
				name = fmt.Sprintf("zero-filled/%dB", size)
			}
			b.Run(name, func(b *testing.B) {
				dir := b.TempDir()
				fs := vfs.Default
				var f vfs.File
				written := 0
				next := func() {
					if f != nil {
						_ = f.Close()
					}
					var err error
					if f, err = fs.Create(fs.PathJoin(dir, fmt.Sprint("f", rand.Uint64())), vfs.WriteCategoryUnspecified); err != nil {
						b.Fatal(err)
					}
					written = 0
					if !zeroFilled {
						return
					}
					zeros := make([]byte, 1<<20)
					for range fileBytes / len(zeros) {
						if _, err := f.Write(zeros); err != nil {
							b.Fatal(err)
						}
					}
					if err := f.Sync(); err != nil {
						b.Fatal(err)
					}
					if _, err := f.(io.Seeker).Seek(0, io.SeekStart); err != nil {
						b.Fatal(err)
					}
				}
				next()
				defer f.Close()
				buf := make([]byte, size)
				b.SetBytes(int64(size))
				for b.Loop() {
					if written+size > fileBytes {
						b.StopTimer()
						next()
						b.StartTimer()
					}
					if _, err := f.Write(buf); err != nil {
						b.Fatal(err)
					}
					written += size
					if err := f.SyncData(); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
