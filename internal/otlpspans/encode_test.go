package otlpspans

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// everyAttributeType covers each attribute.Type, zero values that proto3
// would omit outside a oneof, and empty slices.
func everyAttributeType() []attribute.KeyValue {
	return []attribute.KeyValue{
		attribute.Bool("bool.true", true),
		attribute.Bool("bool.false", false),
		attribute.Int64("int.zero", 0),
		attribute.Int64("int.negative", -1),
		attribute.Int64("int.max", math.MaxInt64),
		attribute.Float64("float.zero", 0),
		attribute.Float64("float.negzero", math.Copysign(0, -1)),
		attribute.Float64("float.pi", math.Pi),
		attribute.Float64("float.nan", math.NaN()),
		attribute.Float64("float.inf", math.Inf(-1)),
		attribute.String("string.empty", ""),
		attribute.String("string.utf8", "tïdé ✓"),
		attribute.BoolSlice("boolslice", []bool{true, false}),
		attribute.BoolSlice("boolslice.empty", nil),
		attribute.Int64Slice("intslice", []int64{0, -5, 1 << 40}),
		attribute.Int64Slice("intslice.empty", []int64{}),
		attribute.Float64Slice("floatslice", []float64{1.5, 0}),
		attribute.StringSlice("stringslice", []string{"a", "", "c"}),
		attribute.StringSlice("stringslice.empty", nil),
		attribute.ByteSlice("bytes", []byte{0, 1, 0xff}),
		attribute.ByteSlice("bytes.empty", nil),
		attribute.Slice("slice", attribute.StringValue("s"), attribute.IntValue(1), attribute.Value{},
			attribute.SliceValue(attribute.BoolValue(true))),
		attribute.Map("map", attribute.String("k", "v"), attribute.Int("n", 1),
			attribute.Map("nested", attribute.Float64("f", 2))),
		attribute.Map("map.empty"),
		{Key: "empty.value"},
	}
}

// sdkSpans records spans through real TracerProviders: two resources (one
// shared by two providers, so their spans must merge), several scopes, every
// span kind, remote parents, links, events, statuses and span limits.
func sdkSpans(t testing.TB) []sdktrace.ReadOnlySpan {
	rec := tracetest.NewSpanRecorder()
	brokerRes := resource.NewWithAttributes("https://opentelemetry.io/schemas/1.26.0",
		attribute.String("service.name", "tidemq"),
		attribute.Int64("process.pid", 4242),
		attribute.StringSlice("host.ip", []string{"127.0.0.1", ""}))
	clientRes := resource.NewSchemaless(attribute.String("service.name", "tidemq-client"), attribute.Bool("canary", true))

	newProvider := func(res *resource.Resource, opts ...sdktrace.TracerProviderOption) *sdktrace.TracerProvider {
		tp := sdktrace.NewTracerProvider(append([]sdktrace.TracerProviderOption{
			sdktrace.WithResource(res), sdktrace.WithSpanProcessor(rec),
		}, opts...)...)
		t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
		return tp
	}
	brokerTP := newProvider(brokerRes)
	limitedTP := newProvider(brokerRes, sdktrace.WithRawSpanLimits(sdktrace.SpanLimits{
		AttributeValueLengthLimit:   4,
		AttributeCountLimit:         2,
		EventCountLimit:             1,
		LinkCountLimit:              1,
		AttributePerEventCountLimit: 1,
		AttributePerLinkCountLimit:  1,
	}))
	clientTP := newProvider(clientRes)

	broker := brokerTP.Tracer("github.com/tidemq/tidemq/broker",
		trace.WithInstrumentationVersion("1.4.0"),
		trace.WithSchemaURL("https://opentelemetry.io/schemas/1.24.0"),
		trace.WithInstrumentationAttributes(attribute.String("component", "broker"), attribute.Int("shard", 3)))
	storage := brokerTP.Tracer("github.com/tidemq/tidemq/storage", trace.WithInstrumentationVersion("1.4.0"))
	anonymous := brokerTP.Tracer("")
	limited := limitedTP.Tracer("github.com/tidemq/tidemq/broker", trace.WithInstrumentationVersion("1.4.0"))
	client := clientTP.Tracer("github.com/tidemq/tidemq/client", trace.WithInstrumentationVersion("0.9.1"),
		trace.WithSchemaURL("https://opentelemetry.io/schemas/1.21.0"))

	ts, err := trace.ParseTraceState("vendor=abc,other=1")
	if err != nil {
		t.Fatal(err)
	}
	remote := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{0x0a, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
		SpanID:     trace.SpanID{0x0b, 1, 2, 3, 4, 5, 6, 7},
		TraceFlags: trace.FlagsSampled,
		TraceState: ts,
		Remote:     true,
	})
	otherTrace := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{0x0c, 1},
		SpanID:     trace.SpanID{0x0d, 1},
		TraceState: ts,
	})
	at := time.Unix(1_700_000_000, 123456789)
	ctx := trace.ContextWithRemoteSpanContext(context.Background(), remote)

	ctx, publish := broker.Start(ctx, "publish orders", trace.WithSpanKind(trace.SpanKindServer),
		trace.WithTimestamp(at), trace.WithAttributes(everyAttributeType()...))
	publish.AddEvent("enqueued", trace.WithTimestamp(at.Add(time.Millisecond)),
		trace.WithAttributes(attribute.Int64("messaging.message.offset", 99), attribute.String("partition", "")))
	publish.AddEvent("no attributes")
	publish.RecordError(errors.New("disk full"))
	publish.SetStatus(codes.Error, "broker unavailable")

	for _, kind := range []trace.SpanKind{trace.SpanKindInternal, trace.SpanKindClient, trace.SpanKindProducer, trace.SpanKindConsumer} {
		_, s := storage.Start(ctx, "kind "+kind.String(), trace.WithSpanKind(kind),
			trace.WithLinks(
				trace.Link{SpanContext: otherTrace, Attributes: []attribute.KeyValue{attribute.String("link.reason", "batch")}},
				trace.Link{SpanContext: remote}))
		s.SetStatus(codes.Ok, "description is ignored for Ok")
		s.End()
	}
	_, anon := anonymous.Start(ctx, "")
	anon.End()

	_, overLimits := limited.Start(ctx, "over limits", trace.WithAttributes(
		attribute.String("messaging.system", "tidemq"),
		attribute.String("messaging.destination.name", "orders"),
		attribute.Int("tidemq.delivery_attempt", 2)),
		trace.WithLinks(
			trace.Link{SpanContext: otherTrace, Attributes: []attribute.KeyValue{attribute.Int("a", 1), attribute.Int("b", 2)}},
			trace.Link{SpanContext: remote}))
	overLimits.AddEvent("first", trace.WithAttributes(attribute.Int("a", 1), attribute.Int("b", 2)))
	overLimits.AddEvent("second")
	overLimits.End()

	_, consume := client.Start(trace.ContextWithRemoteSpanContext(context.Background(), remote), "consume orders",
		trace.WithSpanKind(trace.SpanKindConsumer), trace.WithNewRoot())
	consume.End()

	publish.End(trace.WithTimestamp(at.Add(time.Second)))
	return rec.Ended()
}

func TestMarshalSpansMatchesStock(t *testing.T) {
	spans := sdkSpans(t)
	stock := newStockEncoder(t)
	requireSameAsStock(t, MarshalSpans(nil, spans), stock.encode(t, spans))

	// One resource only: stock's order is then deterministic, so the bytes
	// must match without any reordering.
	var brokerOnly []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.Resource() == spans[0].Resource() {
			brokerOnly = append(brokerOnly, s)
		}
	}
	ours, theirs := MarshalSpans(nil, brokerOnly), stock.encode(t, brokerOnly)
	if string(ours) != string(theirs) {
		t.Fatal("single-resource batch is not byte-identical to stock")
	}

	if out := MarshalSpans([]byte("prefix"), []sdktrace.ReadOnlySpan{nil}); string(out) != "prefix" {
		t.Fatalf("nil spans: got %q, want dst unchanged", out)
	}
	if body := stock.encode(t, []sdktrace.ReadOnlySpan{nil}); body != nil {
		t.Fatal("stock sent a request for nil spans; we do not")
	}
}

func TestExportSpansMatchesStockOverHTTP(t *testing.T) {
	spans := sdkSpans(t)
	for _, compression := range []string{"", "gzip"} {
		t.Run("compression="+compression, func(t *testing.T) {
			var stockOpts []otlptracehttp.Option
			if compression == "gzip" {
				stockOpts = append(stockOpts, otlptracehttp.WithCompression(otlptracehttp.GzipCompression))
			}
			stock := newStockEncoder(t, stockOpts...)
			want := stock.encode(t, spans)

			col := newCollector(t)
			exp, err := New(Config{
				Endpoint:    col.tracesURL(),
				Headers:     map[string]string{"authorization": "Bearer t0ken", "X-Tenant": "a"},
				Compression: compression,
			})
			if err != nil {
				t.Fatal(err)
			}
			if err := exp.ExportSpans(context.Background(), spans); err != nil {
				t.Fatal(err)
			}
			reqs := col.take()
			if len(reqs) != 1 {
				t.Fatalf("collector saw %d requests, want 1", len(reqs))
			}
			h := reqs[0].header
			for name, want := range map[string]string{
				"Content-Type":     "application/x-protobuf",
				"Content-Encoding": compression,
				"Authorization":    "Bearer t0ken",
				"X-Tenant":         "a",
				"User-Agent":       "OTel OTLP Exporter Go/" + otlptrace.Version(),
			} {
				if got := h.Get(name); got != want {
					t.Errorf("%s = %q, want %q", name, got, want)
				}
			}
			requireSameAsStock(t, reqs[0].body, want)
			if err := exp.Shutdown(context.Background()); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestMarshalRandomSpansMatchesStock throws randomly built spans, including
// values the SDK never produces itself (unspecified and unknown kinds,
// out-of-range dropped counts, pre-1970 times, empty keys, nil resources),
// at both encoders.
func TestMarshalRandomSpansMatchesStock(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	stock := newStockEncoder(t)
	g := randomSpans{rng: rng}
	iterations := 400
	if testing.Short() {
		iterations = 50
	}
	for i := range iterations {
		spans := g.batch()
		ours, theirs := MarshalSpans(nil, spans), stock.encode(t, spans)
		if theirs == nil {
			if len(ours) != 0 {
				t.Fatalf("iteration %d: stock sent nothing, we encoded %d bytes", i, len(ours))
			}
			continue
		}
		t.Run(strconv.Itoa(i), func(t *testing.T) { requireSameAsStock(t, ours, theirs) })
	}
}

type randomSpans struct {
	rng *rand.Rand
}

var (
	schemaResA = resource.NewWithAttributes("https://example.com/a", attribute.String("service.name", "a"))
	// Same attributes as schemaResA, other schema URL: stock merges the two
	// into one ResourceSpans whose schema URL comes from the first span.
	schemaResA2    = resource.NewWithAttributes("https://example.com/a2", attribute.String("service.name", "a"))
	randomResource = []*resource.Resource{
		nil, // groups with the empty resource, as Equivalent() is equal
		resource.Empty(),
		schemaResA,
		schemaResA2,
		resource.NewSchemaless(attribute.String("service.name", "b"), attribute.Int64Slice("ids", []int64{1, 2})),
	}
	randomScope = []instrumentation.Scope{
		{},
		{Name: "broker"},
		{Name: "broker", Version: "1.0"},
		{Name: "broker", Version: "1.0", SchemaURL: "https://example.com/s"},
		{SchemaURL: "https://example.com/only-schema"},
		{Name: "client", Attributes: attribute.NewSet(attribute.String("k", "v"), attribute.Bool("b", false))},
	}
)

func (g randomSpans) batch() []sdktrace.ReadOnlySpan {
	spans := make([]sdktrace.ReadOnlySpan, g.rng.IntN(12))
	for i := range spans {
		if g.rng.IntN(20) == 0 {
			continue // nil span
		}
		spans[i] = g.span().Snapshot()
	}
	return spans
}

func (g randomSpans) span() tracetest.SpanStub {
	s := tracetest.SpanStub{
		Name:                 g.string(),
		SpanContext:          g.spanContext(),
		SpanKind:             trace.SpanKind(g.rng.IntN(8)),
		StartTime:            g.time(),
		EndTime:              g.time(),
		Attributes:           g.attributes(),
		Status:               sdktrace.Status{Code: codes.Code(g.rng.IntN(4)), Description: g.string()},
		DroppedAttributes:    g.count(),
		DroppedEvents:        g.count(),
		DroppedLinks:         g.count(),
		Resource:             randomResource[g.rng.IntN(len(randomResource))],
		InstrumentationScope: randomScope[g.rng.IntN(len(randomScope))],
	}
	if g.rng.IntN(2) == 0 {
		s.Parent = g.spanContext()
	}
	for range g.rng.IntN(4) {
		s.Events = append(s.Events, sdktrace.Event{
			Name: g.string(), Time: g.time(), Attributes: g.attributes(), DroppedAttributeCount: g.count(),
		})
	}
	for range g.rng.IntN(4) {
		s.Links = append(s.Links, sdktrace.Link{
			SpanContext: g.spanContext(), Attributes: g.attributes(), DroppedAttributeCount: g.count(),
		})
	}
	return s
}

func (g randomSpans) spanContext() trace.SpanContext {
	cfg := trace.SpanContextConfig{TraceFlags: trace.TraceFlags(g.rng.IntN(256)), Remote: g.rng.IntN(2) == 0}
	if g.rng.IntN(8) != 0 { // sometimes the invalid all-zero IDs
		cfg.TraceID = trace.TraceID(g.bytes(16))
		cfg.SpanID = trace.SpanID(g.bytes(8))
	}
	for i := range g.rng.IntN(3) {
		cfg.TraceState, _ = cfg.TraceState.Insert("k"+strconv.Itoa(i), "v"+strconv.Itoa(g.rng.IntN(1000)))
	}
	return trace.NewSpanContext(cfg)
}

func (g randomSpans) bytes(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(g.rng.Uint32())
	}
	return b
}

func (g randomSpans) time() time.Time {
	switch g.rng.IntN(6) {
	case 0:
		return time.Time{}
	case 1:
		return time.Unix(-g.rng.Int64N(1e9), 0) // before 1970: clamped to 0
	default:
		return time.Unix(0, g.rng.Int64N(2e18))
	}
}

func (g randomSpans) count() int {
	switch g.rng.IntN(5) {
	case 0:
		return -g.rng.IntN(10)
	case 1:
		return math.MaxUint32 + g.rng.IntN(10) // clamped
	case 2:
		return g.rng.IntN(1 << 20)
	default:
		return 0
	}
}

func (g randomSpans) string() string {
	switch g.rng.IntN(4) {
	case 0:
		return ""
	case 1:
		// Multi-byte text long enough for 2-byte length prefixes. (Invalid
		// UTF-8 has its own test: stock refuses to encode it.)
		runes := make([]rune, g.rng.IntN(150))
		for i := range runes {
			runes[i] = []rune{'a', 'é', '✓', '𝄞', 0}[g.rng.IntN(5)]
		}
		return string(runes)
	default:
		return "s" + strconv.Itoa(g.rng.IntN(1000))
	}
}

func (g randomSpans) attributes() []attribute.KeyValue {
	n := g.rng.IntN(10)
	if n == 9 {
		n = 40 + g.rng.IntN(40) // large enough to push a span past 16 KiB sometimes
	}
	kvs := make([]attribute.KeyValue, n)
	for i := range kvs {
		kvs[i] = attribute.KeyValue{Key: attribute.Key(g.string()), Value: g.value(2)}
	}
	return kvs
}

func (g randomSpans) value(depth int) attribute.Value {
	n := g.rng.IntN(5)
	switch g.rng.IntN(13) {
	case 0:
		return attribute.BoolValue(g.rng.IntN(2) == 0)
	case 1:
		return attribute.Int64Value(int64(g.rng.Uint64()) >> g.rng.IntN(64))
	case 2:
		return attribute.Float64Value(math.Float64frombits(g.rng.Uint64()))
	case 3:
		vs := make([]bool, n)
		for i := range vs {
			vs[i] = g.rng.IntN(2) == 0
		}
		return attribute.BoolSliceValue(vs)
	case 4:
		vs := make([]int64, n)
		for i := range vs {
			vs[i] = int64(g.rng.Uint64()) >> g.rng.IntN(64)
		}
		return attribute.Int64SliceValue(vs)
	case 5:
		vs := make([]float64, n)
		for i := range vs {
			vs[i] = g.rng.NormFloat64()
		}
		return attribute.Float64SliceValue(vs)
	case 6:
		vs := make([]string, n)
		for i := range vs {
			vs[i] = g.string()
		}
		return attribute.StringSliceValue(vs)
	case 7:
		return attribute.ByteSliceValue(g.bytes(n * 40))
	case 8:
		if depth > 0 {
			vs := make([]attribute.Value, n)
			for i := range vs {
				vs[i] = g.value(depth - 1)
			}
			return attribute.SliceValue(vs...)
		}
	case 9:
		if depth > 0 {
			kvs := make([]attribute.KeyValue, n)
			for i := range kvs {
				kvs[i] = attribute.KeyValue{Key: attribute.Key(g.string()), Value: g.value(depth - 1)}
			}
			return attribute.MapValue(kvs...)
		}
	case 10:
		return attribute.Value{}
	}
	return attribute.StringValue(g.string())
}

// TestMarshalSpansLengthPrefixWidths crosses every varint width boundary of
// the reserved length prefixes (1, 2, 3 bytes and beyond), where a wrong
// guess has to move the message.
func TestMarshalSpansLengthPrefixWidths(t *testing.T) {
	stock := newStockEncoder(t)
	for _, size := range []int{0, 100, 127, 128, 200, 16_383, 16_384, 20_000, 2_097_151, 2_097_152, 3 << 20} {
		span := tracetest.SpanStub{
			Name:       "sized",
			Attributes: []attribute.KeyValue{attribute.String("payload", strings.Repeat("x", size))},
			Events:     []sdktrace.Event{{Name: strings.Repeat("e", size%20_000)}},
		}.Snapshot()
		spans := []sdktrace.ReadOnlySpan{span, span}
		requireSameAsStock(t, MarshalSpans(nil, spans), stock.encode(t, spans))
	}
}

// TestMarshalSpansManyScopes goes past the linear scope search into the map,
// with scopes interleaved so grouping has to reorder spans.
func TestMarshalSpansManyScopes(t *testing.T) {
	stock := newStockEncoder(t)
	resources := []*resource.Resource{
		resource.NewSchemaless(attribute.String("service.name", "a")),
		resource.NewSchemaless(attribute.String("service.name", "b")),
	}
	var spans []sdktrace.ReadOnlySpan
	for i := range 300 {
		spans = append(spans, tracetest.SpanStub{
			Name:                 "span " + strconv.Itoa(i),
			Resource:             resources[i%2],
			InstrumentationScope: instrumentation.Scope{Name: "scope " + strconv.Itoa(i%37)},
		}.Snapshot())
	}
	for range 3 { // pooled groupings must come back clean
		requireSameAsStock(t, MarshalSpans(nil, spans), stock.encode(t, spans))
		requireSameAsStock(t, MarshalSpans(nil, spans[:5]), stock.encode(t, spans[:5]))
	}
}
