package main

import (
	"context"
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
