package core_test

import (
	"context"
	"fmt"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/tidemq/tidemq/core"
)

// benchDiscard is a span exporter that drops spans: the benchmark measures
// recording and batching on the send path, not an exporter's network.
type benchDiscard struct{}

func (benchDiscard) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (benchDiscard) Shutdown(context.Context) error                             { return nil }

// BenchmarkSendTracing is BenchmarkBrokerSend (16 producers, 1 KiB, fsync
// on) with tracing off and on (every message sampled, a batch span
// processor as in the binary), so the cost of tracing is a ratio of the
// same run.
func BenchmarkSendTracing(b *testing.B) {
	for _, n := range []int{1, 100} {
		for _, tracing := range []string{"off", "on"} {
			b.Run(fmt.Sprintf("batch=%d/tracing=%s", n, tracing), func(b *testing.B) {
				opts := core.Options{}
				if tracing == "on" {
					tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(benchDiscard{}))
					b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
					opts.TracerProvider = tp
				}
				benchSendParallel(b, opts, n)
			})
		}
	}
}

// BenchmarkSendTracingCPU is the same with fsync off, so what differs is
// the CPU tracing costs per message, not the disk's noise.
func BenchmarkSendTracingCPU(b *testing.B) {
	for _, tracing := range []string{"off", "on"} {
		b.Run("batch=100/tracing="+tracing, func(b *testing.B) {
			opts := core.Options{NoSync: true}
			if tracing == "on" {
				tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(benchDiscard{}))
				b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
				opts.TracerProvider = tp
			}
			br, _ := benchOpen(b, opts)
			body := benchPayload(benchKiB)
			b.SetBytes(100 * benchKiB)
			b.ReportAllocs()
			msgs := make([]*core.Message, 100)
			for b.Loop() {
				for i := range msgs {
					msgs[i] = &core.Message{Body: body}
				}
				if _, err := br.Send(context.Background(), benchTopic, msgs); err != nil {
					b.Fatalf("Send: %v", err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(100*b.N), "ns/msg")
		})
	}
}

// BenchmarkPullAckTracing is BenchmarkPullAck with tracing off and on: two
// spans per message (deliver and ack), made and batched, exported nowhere.
func BenchmarkPullAckTracing(b *testing.B) {
	for _, tracing := range []string{"off", "on"} {
		b.Run("tracing="+tracing, func(b *testing.B) {
			opts := core.Options{}
			if tracing == "on" {
				tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(benchDiscard{}))
				b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
				opts.TracerProvider = tp
			}
			benchPullAck(b, opts)
		})
	}
}
