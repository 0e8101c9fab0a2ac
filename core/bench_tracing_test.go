package core_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/tidemq/tidemq/core"
	"github.com/tidemq/tidemq/internal/otlpspans"
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
// the CPU tracing costs per message, not the disk's noise; its tracers
// are BenchmarkPullAckTracing's.
func BenchmarkSendTracingCPU(b *testing.B) {
	for _, tracing := range []string{"off", "sdk", "otlpspans"} {
		b.Run("batch=100/tracing="+tracing, func(b *testing.B) {
			opts := core.Options{NoSync: true, TracerProvider: benchTracerProvider(b, tracing)}
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

// BenchmarkPullAckTracing is BenchmarkPullAck with tracing off, through
// the stock OTel SDK's provider (--span-pipeline sdk), and through
// internal/otlpspans' provider (the default, lean): two spans per message,
// deliver and ack, encoded and POSTed to a loopback collector that
// discards them. Both queues are large enough that no span is dropped.
func BenchmarkPullAckTracing(b *testing.B) {
	for _, tracing := range []string{"off", "sdk", "otlpspans"} {
		b.Run("tracing="+tracing, func(b *testing.B) {
			benchPullAck(b, core.Options{TracerProvider: benchTracerProvider(b, tracing)})
		})
	}
}

// benchTracerProvider is no tracing ("off"), the SDK with a batch
// processor and otlpspans' exporter ("sdk"), or otlpspans' provider
// ("otlpspans"), exporting to a collector that reads and drops every
// request.
func benchTracerProvider(b *testing.B, tracing string) trace.TracerProvider {
	if tracing == "off" {
		return nil
	}
	col := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
	}))
	b.Cleanup(col.Close)
	exp, err := otlpspans.New(otlpspans.Config{Endpoint: col.URL})
	if err != nil {
		b.Fatal(err)
	}
	const queue = 1 << 20
	if tracing == "sdk" {
		tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp, sdktrace.WithMaxQueueSize(queue)))
		b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
		return tp
	}
	p := otlpspans.NewProvider(exp, otlpspans.ProviderConfig{QueueSize: queue})
	b.Cleanup(func() {
		_ = p.Shutdown(context.Background())
		if d := p.Dropped(); d > 0 {
			b.Errorf("%d spans dropped", d)
		}
	})
	return p
}
