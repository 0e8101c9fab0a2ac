package core_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidemq/tidemq/core"
	"github.com/tidemq/tidemq/pebblestore"
)

// Benchmarks of the broker over real Pebble on the real disk (b.TempDir()),
// with fsync on unless a benchmark says otherwise:
//
//	go test -run '^$' -bench . -benchmem ./core/
//
// Setup (filling the store) runs outside the timer; each benchmark's setup is
// bounded (the largest, BenchmarkQueryByKey and pending=1M, write 1,000,000
// messages in batches of 1000 without fsync).

const (
	benchTopic = "bench"
	benchGroup = "g"
	benchKiB   = 1024
	// benchFillBatch is the messages per Send when filling a store.
	benchFillBatch = core.MaxBatchMessages
)

var benchLogger = slog.New(slog.NewTextHandler(io.Discard, nil))

// benchPayload returns n random bytes (incompressible, so compression
// flatters nobody).
func benchPayload(n int) []byte {
	r := rand.New(rand.NewPCG(1, 2))
	body := make([]byte, n)
	for i := range body {
		body[i] = byte(r.Uint32())
	}
	return body
}

// benchParallelism is the b.SetParallelism that runs about want goroutines
// in b.RunParallel (which starts parallelism × GOMAXPROCS of them).
func benchParallelism(want int) int {
	return (want + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0)
}

// benchOpen opens a store in b.TempDir() and a broker over it with the
// default topic (8 queues); both are closed when the benchmark ends.
func benchOpen(b *testing.B, opts core.Options) (*core.Broker, *pebblestore.Store) {
	b.Helper()
	store, err := pebblestore.Open(b.TempDir(), pebblestore.Options{Logger: benchLogger})
	if err != nil {
		b.Fatalf("pebblestore.Open: %v", err)
	}
	opts.Logger = benchLogger
	br, err := core.New(store, opts)
	if err != nil {
		_ = store.Close()
		b.Fatalf("core.New: %v", err)
	}
	b.Cleanup(func() {
		if err := br.Close(); err != nil {
			b.Errorf("broker Close: %v", err)
		}
		if err := store.Close(); err != nil {
			b.Errorf("store Close: %v", err)
		}
	})
	if _, _, err := br.PutTopic(context.Background(), benchTopic, core.TopicConfig{}); err != nil {
		b.Fatalf("PutTopic: %v", err)
	}
	return br, store
}

func benchSubscribe(b *testing.B, br *core.Broker) {
	b.Helper()
	if _, _, err := br.PutSubscription(context.Background(), benchTopic, benchGroup, core.SubscriptionConfig{}); err != nil {
		b.Fatalf("PutSubscription: %v", err)
	}
}

// benchFill sends n messages made by mk, in batches of benchFillBatch from
// two goroutines, so the appender can group their commits.
func benchFill(b *testing.B, br *core.Broker, n int, mk func(i int) *core.Message) {
	b.Helper()
	var next atomic.Int64
	var wg sync.WaitGroup
	var errOnce sync.Once
	var firstErr error
	for range 2 {
		wg.Go(func() {
			msgs := make([]*core.Message, 0, benchFillBatch)
			for {
				lo := int(next.Add(benchFillBatch)) - benchFillBatch
				if lo >= n {
					return
				}
				msgs = msgs[:0]
				for i := lo; i < min(lo+benchFillBatch, n); i++ {
					msgs = append(msgs, mk(i))
				}
				if _, err := br.Send(context.Background(), benchTopic, msgs); err != nil {
					errOnce.Do(func() { firstErr = err })
					return
				}
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		b.Fatalf("filling the store: %v", firstErr)
	}
}

// benchSettle flushes the memtable and waits (at most 60 s) for Pebble's
// compactions to finish, so that the timed part does not pay for the
// setup's compaction debt.
func benchSettle(b *testing.B, store *pebblestore.Store) {
	b.Helper()
	if err := store.Flush(); err != nil {
		b.Fatalf("Flush: %v", err)
	}
	deadline := time.Now().Add(60 * time.Second)
	quiet := 0
	for quiet < 3 && time.Now().Before(deadline) {
		m := store.Metrics()
		if m.Compact.NumInProgress == 0 && m.Flush.NumInProgress == 0 {
			quiet++
		} else {
			quiet = 0
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// BenchmarkBrokerSend is 16 producers sending 1 KiB messages as fast as
// they are answered, fsync on: the appender's group commit at work. ns/op is
// wall time per Send call (all senders together).
func BenchmarkBrokerSend(b *testing.B) {
	for _, n := range []int{1, 100} {
		b.Run(fmt.Sprintf("batch=%d", n), func(b *testing.B) { benchSendParallel(b, core.Options{}, n) })
	}
}

// benchSendParallel runs 16 senders of n × 1 KiB per Send on a fresh
// broker with opts, and reports msgs/s.
func benchSendParallel(b *testing.B, opts core.Options, n int) {
	br, _ := benchOpen(b, opts)
	body := benchPayload(benchKiB)
	b.SetBytes(int64(n * benchKiB))
	b.ReportAllocs()
	b.SetParallelism(benchParallelism(16))
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		msgs := make([]*core.Message, n)
		for pb.Next() {
			for i := range msgs {
				msgs[i] = &core.Message{Body: body}
			}
			if _, err := br.Send(context.Background(), benchTopic, msgs); err != nil {
				b.Errorf("Send: %v", err)
				return
			}
		}
	})
	b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "msgs/s")
}

// BenchmarkPullAck is one consumer pulling 32 messages (1 KiB) and acking
// them, fsync on, from a backlog of 100,000. One op is one pull plus one ack.
func BenchmarkPullAck(b *testing.B) { benchPullAck(b, core.Options{}) }

// BenchmarkPullAckOrderly is BenchmarkPullAck on an orderly subscription,
// the messages without a sharding key (so ordered by queue): a pull takes
// a queue's consecutive messages, as many as it asks for.
func BenchmarkPullAckOrderly(b *testing.B) {
	benchPullAckSub(b, core.Options{}, core.SubscriptionConfig{Orderly: true})
}

func benchPullAck(b *testing.B, opts core.Options) {
	benchPullAckSub(b, opts, core.SubscriptionConfig{})
}

func benchPullAckSub(b *testing.B, opts core.Options, cfg core.SubscriptionConfig) {
	const backlog, perPull = 100_000, 32
	br, store := benchOpen(b, opts)
	if _, _, err := br.PutSubscription(context.Background(), benchTopic, benchGroup, cfg); err != nil {
		b.Fatalf("PutSubscription: %v", err)
	}
	body := benchPayload(benchKiB)
	mk := func(int) *core.Message { return &core.Message{Body: body} }
	benchFill(b, br, backlog, mk)
	benchSettle(b, store)
	left := backlog
	ctx := context.Background()
	req := core.PullRequest{MaxMessages: perPull, ConsumerID: "bench"}
	handles := make([]string, 0, perPull)
	b.SetBytes(perPull * benchKiB)
	b.ReportAllocs()
	for b.Loop() {
		if left < perPull {
			b.StopTimer()
			benchFill(b, br, backlog, mk)
			left += backlog
			b.StartTimer()
		}
		ds, err := br.Pull(ctx, benchTopic, benchGroup, req)
		if err != nil {
			b.Fatalf("Pull: %v", err)
		}
		if len(ds) != perPull {
			b.Fatalf("Pull got %d messages, want %d (%d left)", len(ds), perPull, left)
		}
		left -= len(ds)
		handles = handles[:0]
		for _, d := range ds {
			handles = append(handles, d.ReceiptHandle)
		}
		if n, failed, err := br.Ack(ctx, benchTopic, benchGroup, handles); err != nil || n != len(handles) {
			b.Fatalf("Ack: %d of %d, %v, %v", n, len(handles), failed, err)
		}
	}
	b.ReportMetric(float64(perPull*b.N)/b.Elapsed().Seconds(), "msgs/s")
}

// BenchmarkTimerPathWithPendingDelayed checks the claim "1,000,000
// pending delayed messages do not slow sends or pulls measurably". One op is
// a send of one 1 KiB message, a pull of it and its ack, on the topic that
// holds the pending delayed messages (due in 6 days, spread over 1,000 s).
// fsync is off here (in setup and timed part alike): the question is
// whether the pending timers cost CPU or reads on the hot path, and a ~1 ms
// fsync per send and per ack on a shared disk would bury that under noise.
func BenchmarkTimerPathWithPendingDelayed(b *testing.B) {
	for _, c := range []struct {
		name    string
		pending int
	}{{"pending=0", 0}, {"pending=1M", 1_000_000}} {
		b.Run(c.name, func(b *testing.B) {
			br, store := benchOpen(b, core.Options{NoSync: true})
			benchSubscribe(b, br)
			if c.pending > 0 {
				start := time.Now()
				due := start.Add(6 * 24 * time.Hour).UnixMilli()
				small := benchPayload(128)
				benchFill(b, br, c.pending, func(i int) *core.Message {
					return &core.Message{Body: small, DeliverAtMs: due + int64(i)}
				})
				filled := time.Since(start)
				benchSettle(b, store)
				b.Logf("setup: %d delayed messages sent in %v, settled in %v", c.pending, filled.Round(time.Millisecond),
					(time.Since(start) - filled).Round(time.Millisecond))
				info, err := br.GetTopic(benchTopic)
				if err != nil || info.Messages != 0 {
					b.Fatalf("delayed messages reached the queues: %d, %v", info.Messages, err)
				}
			} else {
				benchSettle(b, store)
			}
			body := benchPayload(benchKiB)
			ctx := context.Background()
			req := core.PullRequest{MaxMessages: 1, ConsumerID: "bench"}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := br.Send(ctx, benchTopic, []*core.Message{{Body: body}}); err != nil {
					b.Fatalf("Send: %v", err)
				}
				ds, err := br.Pull(ctx, benchTopic, benchGroup, req)
				if err != nil || len(ds) != 1 {
					b.Fatalf("Pull: %d messages, %v", len(ds), err)
				}
				if n, failed, err := br.Ack(ctx, benchTopic, benchGroup, []string{ds[0].ReceiptHandle}); err != nil || n != 1 {
					b.Fatalf("Ack: %d, %v, %v", n, failed, err)
				}
			}
		})
	}
}

// BenchmarkQueryByKey checks the claim "query by key among 1,000,000
// messages answers in milliseconds". The topic holds 1,000,000 messages of
// 100 bytes, each with its own key k-<i>; one op is QueryMessages by a random
// existing key (one match). Setup writes without fsync; the block cache is
// warm (the store fits in the default 256 MiB cache).
func BenchmarkQueryByKey(b *testing.B) {
	const n = 1_000_000
	br, store := benchOpen(b, core.Options{NoSync: true})
	body := benchPayload(100)
	start := time.Now()
	benchFill(b, br, n, func(i int) *core.Message {
		return &core.Message{Body: body, Keys: []string{"k-" + strconv.Itoa(i)}}
	})
	filled := time.Since(start)
	benchSettle(b, store)
	b.Logf("setup: %d keyed messages sent in %v, settled in %v", n, filled.Round(time.Millisecond),
		(time.Since(start) - filled).Round(time.Millisecond))
	r := rand.New(rand.NewPCG(3, 4))
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		key := "k-" + strconv.Itoa(r.IntN(n))
		ms, _, err := br.QueryMessages(ctx, benchTopic, core.Query{Key: key})
		if err != nil || len(ms) != 1 {
			b.Fatalf("QueryMessages(%s): %d messages, %v", key, len(ms), err)
		}
	}
}
