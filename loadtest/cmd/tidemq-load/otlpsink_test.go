package main

import (
	"bytes"
	"context"
	"net/http"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/tidemq/tidemq/internal/otlpspans"
)

// TestCountSpans counts the spans of a real OTLP request made from spans
// of two tracers (two scope_spans), and refuses a truncated one.
func TestCountSpans(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	for _, name := range []string{"a", "b", "a", "a", "b"} {
		_, sp := tp.Tracer(name).Start(context.Background(), "span")
		sp.End()
	}
	req := otlpspans.MarshalSpans(nil, rec.Ended())
	if n, ok := countSpans(req); !ok || n != 5 {
		t.Fatalf("countSpans = %d, %v; want 5, true", n, ok)
	}
	if _, ok := countSpans(req[:len(req)-3]); ok {
		t.Error("a truncated request counted as well-formed")
	}
}

// TestOTLPSinkCountsEveryExport posts real export requests of different
// sizes, so each reuses a buffer a bigger or smaller one used before.
func TestOTLPSinkCountsEveryExport(t *testing.T) {
	sink, err := startOTLPSink()
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	wantSpans, wantBytes := 0, 0
	for _, spans := range []int{40, 3, 17, 1} {
		rec.Reset()
		for range spans {
			_, sp := tp.Tracer("t").Start(context.Background(), "span")
			sp.End()
		}
		req := otlpspans.MarshalSpans(nil, rec.Ended())
		resp, err := http.Post(sink.URL+"/v1/traces", "application/x-protobuf", bytes.NewReader(req))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("export answered %d", resp.StatusCode)
		}
		wantSpans += spans
		wantBytes += len(req)
	}
	if got := sink.spans.Load(); got != int64(wantSpans) {
		t.Errorf("spans = %d, want %d", got, wantSpans)
	}
	if got := sink.received.Load(); got != int64(wantBytes) {
		t.Errorf("bytes = %d, want %d", got, wantBytes)
	}
	if sink.bad.Load() != 0 || sink.exports.Load() != 4 {
		t.Errorf("exports %d, malformed %d; want 4, 0", sink.exports.Load(), sink.bad.Load())
	}
}
