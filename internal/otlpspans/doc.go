// Package otlpspans makes and exports the broker's OpenTelemetry spans over
// OTLP/HTTP (protobuf) for a fraction of what the OTel SDK costs. The broker
// records two to three spans per message, and the SDK's span objects,
// read-only snapshots, batch processor and the stock otlptracehttp exporter
// (which copies every span into generated tracepb structs and marshals them
// by reflection) cost more than much of the message's own work.
//
// The exporter writes the ExportTraceServiceRequest straight from
// sdktrace.ReadOnlySpan into a pooled buffer with protowire, then POSTs it
// the way otlptracehttp does. The request is semantically identical to
// stock's, which tests check against the stock exporter field by field and,
// once stock's randomly ordered ResourceSpans are put in order, byte by
// byte. Deliberate differences: invalid UTF-8 is replaced with U+FFFD where
// stock fails the whole batch; malformed environment variables are errors
// where stock logs and ignores them; a retry that cannot happen before the
// context deadline fails at once instead of sleeping until the deadline;
// and the experimental self-observability metrics of otlptracehttp are not
// emitted.
//
// # Provider
//
// Most of what an exported SDK span costs is the SDK's span itself: every
// ReadOnlySpan accessor copies the whole snapshot. Provider is a
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
// lifecycle span. What it gains is in docs/BENCHMARKS.md ("Performance
// decisions").
//
// Only OTLP/HTTP with protobuf is covered. gRPC (and OTLP/JSON) stay on the
// stock exporters.
package otlpspans
