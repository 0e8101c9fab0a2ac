// Package otlpspans exports OpenTelemetry spans over OTLP/HTTP (protobuf)
// and exists for speed: the broker records 2–3 spans per message, and the
// stock otlptracehttp exporter first copies every span into generated
// tracepb structs (several allocations per attribute) and then encodes those
// with reflection-driven proto.Marshal. This package writes the
// ExportTraceServiceRequest straight from sdktrace.ReadOnlySpan into a
// pooled buffer with protowire, then POSTs it the way otlptracehttp does.
//
// Measured on a shared 2-core AMD EPYC with Go 1.26: 512-span batches of 8
// messaging attributes each, to a loopback collector that discards them
// (go test -run '^$' -bench . -benchtime 2s -count 5 ./internal/otlpspans/,
// medians; allocations include the in-process collector's):
//
//	per span              stock otlptracehttp   otlpspans
//	export, uncompressed  4360 ns               900 ns
//	export, gzip          8500 ns               2000 ns
//	allocations           30.3 (2.2 KB)         0.19 (81 B): ~96 per request
//	encoding alone        (not separable)       460 ns, 0 allocations
//
// Most of the remaining encode time goes into the SDK itself: every
// ReadOnlySpan accessor copies the whole span snapshot.
//
// The request is semantically identical to stock's, which tests check
// against the stock exporter field by field and, once stock's randomly
// ordered ResourceSpans are put in order, byte by byte. Deliberate
// differences: invalid UTF-8 is replaced with U+FFFD where stock fails the
// whole batch; malformed environment variables are errors where stock logs
// and ignores them; a retry that cannot happen before the context deadline
// fails at once instead of sleeping until the deadline; and the
// experimental self-observability metrics of otlptracehttp are not emitted.
//
// # Provider
//
// The exporter made the export cheap; what remained was the SDK's span
// itself (~1.4 µs and ~16 allocations per span in the broker's pull and
// ack, plus the batch processor's copy). Provider is a
// trace.TracerProvider whose spans encode themselves into the open batch
// when they end: one allocation for the span (attributes inline) and one
// for its context. It samples with an sdktrace.Sampler, keeps the SDK's
// attribute, event, link and status rules (a differential test records the
// same calls through both and compares the requests), and batches with the
// OTEL_BSP_* meanings: full batches queue for one export goroutine, and a
// span that would overflow the queue is dropped and counted. Its tracers
// also record a finished span in one call, with no span object:
// NewSpanContext when it begins (the broker stores the context with the
// message), RecordSpan when it is over; core uses these for every
// lifecycle span. In the load tester's pull + ack phase the provider took
// the broker from 19.2 to 17.7 µs of CPU per message and the one-call
// spans to 13.4–14.7 (docs/BENCHMARKS.md, session 4).
//
// Only OTLP/HTTP with protobuf is covered. gRPC (and OTLP/JSON) stay on the
// stock exporters.
package otlpspans
