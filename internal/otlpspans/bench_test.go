package otlpspans

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// benchBatch is the batch span processor's default maximum export size.
const benchBatch = 512

// messagingSpans records a batch like the broker's: publish and deliver
// spans carrying the messaging semantic-convention attributes.
func messagingSpans(b *testing.B) []sdktrace.ReadOnlySpan {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithResource(
		resource.NewWithAttributes("https://opentelemetry.io/schemas/1.26.0",
			attribute.String("service.name", "tidemq"),
			attribute.String("service.version", "1.4.0"),
			attribute.String("host.name", "broker-0"))))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	tracer := tp.Tracer("github.com/tidemq/tidemq/broker", trace.WithInstrumentationVersion("1.4.0"))
	kinds := []trace.SpanKind{trace.SpanKindProducer, trace.SpanKindConsumer}
	for i := range benchBatch {
		_, span := tracer.Start(context.Background(), "publish orders",
			trace.WithSpanKind(kinds[i%2]),
			trace.WithAttributes(
				attribute.String("messaging.system", "tidemq"),
				attribute.String("messaging.destination.name", "orders.eu-west"),
				attribute.String("messaging.message.id", "Q8eqf3ZFU1Nx7l0Ah2Rk"+strconv.Itoa(i)),
				attribute.String("messaging.destination.partition.id", strconv.Itoa(i%16)),
				attribute.String("messaging.consumer.group.name", "billing"),
				attribute.Int64("messaging.message.offset", int64(1_000_000+i)),
				attribute.Int("tidemq.delivery_attempt", 1+i%3),
				attribute.String("messaging.client.id", "billing-7f9c"),
			))
		span.End()
	}
	return rec.Ended()
}

func discardingSink(b *testing.B) string {
	srv := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
	}))
	b.Cleanup(srv.Close)
	return srv.URL + "/v1/traces"
}

// runExport reports ns and allocations per span. Allocations include the
// loopback sink's, which are the same for both exporters.
func runExport(b *testing.B, exp sdktrace.SpanExporter, spans []sdktrace.ReadOnlySpan) {
	ctx := context.Background()
	if err := exp.ExportSpans(ctx, spans); err != nil { // warm connections and pools
		b.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	b.ResetTimer()
	for b.Loop() {
		if err := exp.ExportSpans(ctx, spans); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	runtime.ReadMemStats(&after)
	perSpan := float64(b.N * len(spans))
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/perSpan, "ns/span")
	b.ReportMetric(float64(after.Mallocs-before.Mallocs)/perSpan, "allocs/span")
	b.ReportMetric(float64(after.TotalAlloc-before.TotalAlloc)/perSpan, "B/span")
	_ = exp.Shutdown(ctx)
}

func BenchmarkExportStock(b *testing.B) {
	spans := messagingSpans(b)
	for _, compression := range []string{"none", "gzip"} {
		b.Run(compression, func(b *testing.B) {
			opts := []otlptracehttp.Option{otlptracehttp.WithEndpointURL(discardingSink(b))}
			if compression == "gzip" {
				opts = append(opts, otlptracehttp.WithCompression(otlptracehttp.GzipCompression))
			}
			exp, err := otlptracehttp.New(context.Background(), opts...)
			if err != nil {
				b.Fatal(err)
			}
			runExport(b, exp, spans)
		})
	}
}

func BenchmarkExportFast(b *testing.B) {
	spans := messagingSpans(b)
	for _, compression := range []string{"none", "gzip"} {
		b.Run(compression, func(b *testing.B) {
			exp, err := New(Config{Endpoint: discardingSink(b), Compression: compression})
			if err != nil {
				b.Fatal(err)
			}
			runExport(b, exp, spans)
		})
	}
}

func BenchmarkMarshalSpans(b *testing.B) {
	spans := messagingSpans(b)
	buf := MarshalSpans(nil, spans)
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	for b.Loop() {
		buf = MarshalSpans(buf[:0], spans)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(spans)), "ns/span")
}
