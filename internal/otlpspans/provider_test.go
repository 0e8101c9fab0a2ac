package otlpspans

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
)

type diskFullError struct{ disk string }

func (e *diskFullError) Error() string { return e.disk + " is full" }

// recordScenario makes the same spans through any TracerProvider: roots
// and children of remote (sampled and not) and local parents, every
// attribute type, a repeated key, an invalid attribute, more attributes
// than the limit, events, errors, statuses, links, renames and calls after
// End. Every timestamp is given, so two providers produce equal spans up to
// their random ids.
func recordScenario(tp trace.TracerProvider) {
	tr := tp.Tracer("github.com/tidemq/tidemq/core", trace.WithInstrumentationVersion("1.2.3"),
		trace.WithSchemaURL("https://opentelemetry.io/schemas/1.26.0"),
		trace.WithInstrumentationAttributes(attribute.String("component", "broker")))
	ts, _ := trace.ParseTraceState("vendor=abc")
	remote := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{0x0a, 1}, SpanID: trace.SpanID{0x0b, 1},
		TraceFlags: trace.FlagsSampled, TraceState: ts, Remote: true,
	})
	unsampled := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{0x0c, 1}, SpanID: trace.SpanID{0x0d, 1}, Remote: true,
	})
	at := time.Unix(1_700_000_000, 5)
	remoteCtx := trace.ContextWithRemoteSpanContext(context.Background(), remote)

	// A send: a root producer span, its attributes set as the broker does.
	_, send := tr.Start(context.Background(), "tidemq.send", trace.WithSpanKind(trace.SpanKindProducer), trace.WithTimestamp(at))
	send.SetAttributes(everyAttributeType()...)
	send.SetAttributes(attribute.String("string.utf8", "replaced in place"), attribute.KeyValue{})
	send.End(trace.WithTimestamp(at.Add(time.Millisecond)))
	send.SetAttributes(attribute.String("after.end", "ignored"))
	send.End(trace.WithTimestamp(at.Add(time.Hour)))

	// A delivery joining a producer's trace, failing.
	ctx, deliver := tr.Start(remoteCtx, "tidemq.deliver", trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithTimestamp(at), trace.WithAttributes(attribute.Int("tidemq.delivery_attempt", 2)))
	deliver.SetName("tidemq.deliver.renamed")
	deliver.AddEvent("leased", trace.WithTimestamp(at.Add(2)), trace.WithAttributes(attribute.String("consumer", "c1")))
	deliver.RecordError(&diskFullError{disk: "/data"}, trace.WithTimestamp(at.Add(3)))
	deliver.RecordError(errors.New("plain"), trace.WithTimestamp(at.Add(4)))
	deliver.SetStatus(codes.Error, "lease lost")
	deliver.SetStatus(codes.Unset, "ignored: Error beats Unset")

	// A local child with links; Ok is final.
	_, ack := tr.Start(ctx, "tidemq.ack", trace.WithTimestamp(at.Add(5)), trace.WithLinks(
		trace.Link{SpanContext: remote, Attributes: []attribute.KeyValue{attribute.String("link.reason", "batch")}},
		trace.Link{}, // invalid and bare: dropped
		trace.Link{Attributes: []attribute.KeyValue{attribute.Int("kept", 1)}},
	))
	ack.AddLink(trace.Link{SpanContext: unsampled})
	ack.SetStatus(codes.Ok, "description dropped for Ok")
	ack.SetStatus(codes.Error, "ignored after Ok")
	ack.End(trace.WithTimestamp(at.Add(6)))
	deliver.End(trace.WithTimestamp(at.Add(7)))

	// A child of an unsampled producer: parent-based sampling drops it.
	_, dropped := tr.Start(trace.ContextWithRemoteSpanContext(context.Background(), unsampled), "tidemq.ack")
	dropped.SetAttributes(attribute.Bool("never", true))
	dropped.End()

	// A new root despite a parent, and a span over the attribute limit.
	_, root := tr.Start(remoteCtx, "tidemq.redrive", trace.WithNewRoot(), trace.WithTimestamp(at))
	for i := range DefaultCountLimit + 3 {
		root.SetAttributes(attribute.Int(fmt.Sprintf("attr.%03d", i), i))
	}
	root.SetAttributes(attribute.Int("attr.000", -1)) // an existing key still updates past the limit
	root.End(trace.WithTimestamp(at.Add(8)))
}

// normalizeIDs replaces every trace and span id with its order of first
// appearance, so requests from providers with different random ids compare.
func normalizeIDs(req *coltracepb.ExportTraceServiceRequest) {
	ids := map[string][]byte{}
	norm := func(id []byte) []byte {
		if len(id) == 0 || (id[0] >= 0x0a && id[0] <= 0x0d && id[1] == 1 && !slices.ContainsFunc(id[2:], func(b byte) bool { return b != 0 })) {
			return id // the scenario's fixed remote ids
		}
		n, ok := ids[string(id)]
		if !ok {
			n = make([]byte, len(id))
			n[len(n)-1] = byte(len(ids) + 1)
			ids[string(id)] = n
		}
		return n
	}
	for _, rs := range req.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				s.TraceId, s.SpanId, s.ParentSpanId = norm(s.TraceId), norm(s.SpanId), norm(s.ParentSpanId)
				for _, l := range s.Links {
					l.TraceId, l.SpanId = norm(l.TraceId), norm(l.SpanId)
				}
			}
		}
	}
}

func newTestProvider(t *testing.T, col *collector, cfg ProviderConfig) *Provider {
	t.Helper()
	p := NewProvider(newTestExporter(t, Config{Endpoint: col.tracesURL()}), cfg)
	t.Cleanup(func() { _ = p.Shutdown(context.Background()) })
	return p
}

func TestProviderMatchesSDK(t *testing.T) {
	res := resource.NewWithAttributes("https://opentelemetry.io/schemas/1.26.0", attribute.String("service.name", "tidemq"))

	rec := tracetest.NewSpanRecorder()
	sdk := sdktrace.NewTracerProvider(sdktrace.WithResource(res), sdktrace.WithSpanProcessor(rec))
	recordScenario(sdk)
	want := unmarshalRequest(t, MarshalSpans(nil, rec.Ended()))

	col := newCollector(t)
	p := newTestProvider(t, col, ProviderConfig{Resource: res})
	recordScenario(p)
	if err := p.ForceFlush(context.Background()); err != nil {
		t.Fatal(err)
	}
	reqs := col.take()
	if len(reqs) != 1 {
		t.Fatalf("got %d requests, want 1", len(reqs))
	}
	got := unmarshalRequest(t, reqs[0].body)
	normalizeIDs(got)
	normalizeIDs(want)
	if !proto.Equal(got, want) {
		t.Fatalf("request differs from the SDK's:\n%s", textDiff(prototext.Format(want), prototext.Format(got)))
	}
	if n := len(got.ResourceSpans[0].ScopeSpans[0].Spans); n != 4 {
		t.Fatalf("exported %d spans, want 4 (the unsampled child dropped)", n)
	}
}

// TestProviderBatchesAndDrops: full batches go out without a flush, the
// rest at the schedule delay, and a blocked collector makes the queue drop
// spans (counted) rather than block the caller.
func TestProviderBatchesAndDrops(t *testing.T) {
	col := newCollector(t)
	release := make(chan struct{})
	var releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(unblock) // before the collector closes, even when failing
	col.respond = func(w http.ResponseWriter, r *http.Request, n int) {
		if n == 1 {
			<-release
		}
	}
	p := newTestProvider(t, col, ProviderConfig{BatchSize: 10, QueueSize: 20, ScheduleDelay: time.Hour})
	tr := p.Tracer("t")
	ctx := context.Background()
	record := func(n int) {
		for range n {
			_, s := tr.Start(ctx, "s")
			s.End()
		}
	}
	record(10) // one full batch, whose export the collector holds
	deadline := time.Now().Add(10 * time.Second)
	for col.count() == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	record(95) // two batches fill the queue, seven are dropped, five spans stay open
	if d := p.Dropped(); d != 70 {
		t.Fatalf("dropped %d spans, want 70", d)
	}
	unblock()
	if err := p.ForceFlush(ctx); err != nil {
		t.Fatal(err)
	}
	var spans int
	for _, r := range col.take() {
		req := unmarshalRequest(t, r.body)
		spans += len(req.ResourceSpans[0].ScopeSpans[0].Spans)
	}
	if spans != 105-70 {
		t.Fatalf("collector got %d spans, want 35 (105 minus 70 dropped)", spans)
	}
}

func TestProviderExportsOnScheduleAndShutdown(t *testing.T) {
	col := newCollector(t)
	p := newTestProvider(t, col, ProviderConfig{ScheduleDelay: 20 * time.Millisecond})
	_, s := p.Tracer("t").Start(context.Background(), "lone")
	s.End()
	deadline := time.Now().Add(10 * time.Second)
	for col.count() == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if col.count() != 1 {
		t.Fatalf("a lone span was not exported on schedule")
	}

	_, s = p.Tracer("t").Start(context.Background(), "last")
	s.End()
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if col.count() != 2 {
		t.Fatalf("Shutdown did not export the open batch")
	}
	_, s = p.Tracer("t").Start(context.Background(), "after shutdown")
	s.End()
	if err := p.ForceFlush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if col.count() != 2 {
		t.Fatalf("a span ended after Shutdown was exported")
	}
}

// TestProviderConcurrentSpans is for -race: many goroutines record into
// the same batches while the export goroutine takes them, and none is lost.
func TestProviderConcurrentSpans(t *testing.T) {
	col := newCollector(t)
	p := newTestProvider(t, col, ProviderConfig{BatchSize: 64, QueueSize: 1 << 16, ScheduleDelay: time.Millisecond})
	tr := p.Tracer("t")
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 500 {
				_, s := tr.Start(context.Background(), "s", trace.WithAttributes(attribute.Int("g", g), attribute.Int("i", i)))
				s.End()
			}
		})
	}
	wg.Wait()
	if err := p.ForceFlush(context.Background()); err != nil {
		t.Fatal(err)
	}
	seen := map[[2]int64]bool{}
	for _, r := range col.take() {
		for _, s := range unmarshalRequest(t, r.body).ResourceSpans[0].ScopeSpans[0].Spans {
			seen[[2]int64{s.Attributes[0].Value.GetIntValue(), s.Attributes[1].Value.GetIntValue()}] = true
		}
	}
	if len(seen) != 8*500 || p.Dropped() != 0 {
		t.Fatalf("collector got %d distinct spans, dropped %d; want 4000, 0", len(seen), p.Dropped())
	}
}

func TestProviderConfigFromEnv(t *testing.T) {
	cfg, err := ProviderConfigFromEnv(mapEnv(map[string]string{
		"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.25",
		"OTEL_BSP_MAX_QUEUE_SIZE": "65536", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "1024",
		"OTEL_BSP_SCHEDULE_DELAY": "200", "OTEL_BSP_EXPORT_TIMEOUT": "1500",
		"OTEL_ATTRIBUTE_COUNT_LIMIT": "-1",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.QueueSize != 65536 || cfg.BatchSize != 1024 || cfg.ScheduleDelay != 200*time.Millisecond ||
		cfg.ExportTimeout != 1500*time.Millisecond || cfg.AttributeCountLimit != -1 {
		t.Fatalf("config %+v", cfg)
	}
	if d := cfg.Sampler.Description(); d != sdktrace.ParentBased(sdktrace.TraceIDRatioBased(0.25)).Description() {
		t.Fatalf("sampler %s", d)
	}
	def, err := ProviderConfigFromEnv(mapEnv(nil))
	if err != nil || def.Sampler.Description() != sdktrace.ParentBased(sdktrace.AlwaysSample()).Description() {
		t.Fatalf("default sampler %v, %v", def.Sampler, err)
	}
	for _, bad := range []map[string]string{
		{"OTEL_TRACES_SAMPLER": "jaeger_remote"},
		{"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "2"},
		{"OTEL_BSP_MAX_QUEUE_SIZE": "lots"},
		{"OTEL_BSP_SCHEDULE_DELAY": "0"},
		{"OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT": "0"},
	} {
		if _, err := ProviderConfigFromEnv(mapEnv(bad)); err == nil {
			t.Errorf("%v: no error", bad)
		}
	}
}

// TestProviderSamplesAsTheSDK: a ratio sampler gives the same decision for
// the same trace id, so both providers keep the same roots.
func TestProviderSamplesAsTheSDK(t *testing.T) {
	col := newCollector(t)
	p := newTestProvider(t, col, ProviderConfig{Sampler: sdktrace.TraceIDRatioBased(0.5)})
	tr := p.Tracer("t")
	sampled := 0
	for range 2000 {
		_, s := tr.Start(context.Background(), "root")
		sc := s.SpanContext()
		want := sdktrace.TraceIDRatioBased(0.5).ShouldSample(sdktrace.SamplingParameters{TraceID: sc.TraceID()}).Decision == sdktrace.RecordAndSample
		if sc.IsSampled() != want || s.IsRecording() != want {
			t.Fatalf("trace %s: sampled %v recording %v, SDK decides %v", sc.TraceID(), sc.IsSampled(), s.IsRecording(), want)
		}
		if want {
			sampled++
		}
		s.End()
	}
	if sampled < 800 || sampled > 1200 {
		t.Fatalf("%d of 2000 sampled at ratio 0.5", sampled)
	}
}

// TestRecordSpanMatchesStart: NewSpanContext and RecordSpan record what
// Start, SetAttributes and End with timestamps record through the SDK, for
// the default sampler (decided inline) and another one (asked), with plain
// attributes and with ones the SDK's rules rewrite.
func TestRecordSpanMatchesStart(t *testing.T) {
	ts, _ := trace.ParseTraceState("vendor=abc")
	remote := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{0x0a, 1}, SpanID: trace.SpanID{0x0b, 1},
		TraceFlags: trace.FlagsSampled, TraceState: ts, Remote: true,
	})
	local := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{0x0a, 1}, SpanID: trace.SpanID{0x0c, 1}, TraceFlags: trace.FlagsSampled,
	})
	unsampled := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{0x0c, 1}, SpanID: trace.SpanID{0x0d, 1}, Remote: true})
	at := time.Unix(1_700_000_000, 0)
	plain := []attribute.KeyValue{attribute.String("messaging.system", "tidemq"), attribute.Int64("messaging.message.offset", 7)}
	rewritten := append(everyAttributeType(), attribute.Int64("messaging.message.offset", 7), attribute.Int64("messaging.message.offset", 8))
	type call struct {
		parent trace.SpanContext
		name   string
		kind   trace.SpanKind
		attrs  []attribute.KeyValue
	}
	calls := []call{
		{remote, "tidemq.deliver", trace.SpanKindConsumer, plain},
		{local, "tidemq.ack", trace.SpanKindConsumer, rewritten},
		{unsampled, "tidemq.ack", trace.SpanKindConsumer, plain},
		{trace.SpanContext{}, "tidemq.redrive", trace.SpanKindProducer, nil},
	}
	for _, sampler := range []sdktrace.Sampler{nil, sdktrace.ParentBased(sdktrace.AlwaysSample(), sdktrace.WithLocalParentSampled(sdktrace.NeverSample()))} {
		rec := tracetest.NewSpanRecorder()
		res := resource.NewSchemaless(attribute.String("service.name", "tidemq"))
		sdkOpts := []sdktrace.TracerProviderOption{sdktrace.WithSpanProcessor(rec), sdktrace.WithResource(res)}
		if sampler != nil {
			sdkOpts = append(sdkOpts, sdktrace.WithSampler(sampler))
		}
		sdk := sdktrace.NewTracerProvider(sdkOpts...)
		col := newCollector(t)
		p := newTestProvider(t, col, ProviderConfig{Sampler: sampler, Resource: res})
		ours := p.Tracer("core").(*tracer)
		for i, c := range calls {
			start, end := at.Add(time.Duration(i)*time.Second), at.Add(time.Duration(i)*time.Second+time.Millisecond)
			_, s := sdk.Tracer("core").Start(trace.ContextWithSpanContext(context.Background(), c.parent), c.name,
				trace.WithTimestamp(start), trace.WithSpanKind(c.kind))
			s.SetAttributes(c.attrs...)
			s.End(trace.WithTimestamp(end))
			sc := ours.NewSpanContext(c.parent, c.name, c.kind)
			ours.RecordSpan(sc, c.parent, c.name, c.kind, start, end, c.attrs)
			if sc.IsSampled() != s.SpanContext().IsSampled() || sc.TraceState().String() != s.SpanContext().TraceState().String() ||
				(c.parent.IsValid() && sc.TraceID() != c.parent.TraceID()) || !sc.SpanID().IsValid() {
				t.Errorf("call %d: RecordSpan gave %v, the SDK %v", i, sc, s.SpanContext())
			}
		}
		want := unmarshalRequest(t, MarshalSpans(nil, rec.Ended()))
		if err := p.ForceFlush(context.Background()); err != nil {
			t.Fatal(err)
		}
		reqs := col.take()
		if len(reqs) != 1 {
			t.Fatalf("sampler %v: %d requests, want 1", sampler, len(reqs))
		}
		got := unmarshalRequest(t, reqs[0].body)
		normalizeIDs(got)
		normalizeIDs(want)
		if !proto.Equal(got, want) {
			t.Fatalf("sampler %v: RecordSpan's spans differ from the SDK's:\n%s", sampler, textDiff(prototext.Format(want), prototext.Format(got)))
		}
	}
}
