package otlpspans

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/embedded"
)

// Batching defaults: the OTEL_BSP_* defaults of the specification, which
// the SDK's batch span processor uses too.
const (
	DefaultBatchSize     = 512
	DefaultQueueSize     = 2048
	DefaultScheduleDelay = 5 * time.Second
	DefaultExportTimeout = 30 * time.Second
	// DefaultCountLimit is the specification's default for attributes per
	// span, events per span, links per span and attributes per event or link.
	DefaultCountLimit = 128
)

// ProviderConfig is how a Provider samples, limits and batches spans. Zero
// fields take the defaults above; Resource nil means no resource.
type ProviderConfig struct {
	Resource      *resource.Resource
	Sampler       sdktrace.Sampler // nil: parent-based, always on (the SDK's default)
	BatchSize     int              // spans per export request
	QueueSize     int              // spans waiting for export, beyond which new ones are dropped
	ScheduleDelay time.Duration    // longest a finished span waits for a full batch
	ExportTimeout time.Duration    // per export request, retries included
	// AttributeCountLimit caps attributes per span (negative: no cap).
	AttributeCountLimit int
}

// Provider is a trace.TracerProvider that writes each span into its OTLP
// protobuf form the moment it ends and exports those bytes in batches.
//
// It exists because the SDK's own span costs more than the broker's work
// for a small message: a recording span is ~16 allocations (the span, an
// attribute slice, a dedupe map, a read-only snapshot, a queue slot) and
// the batch processor copies it again before the exporter reads it through
// interface accessors. Here a span is one allocation plus its context, its
// attributes live in the span, and End appends the encoded span to the
// tracer's open batch. Sampling goes through the same sdktrace.Sampler, and
// batching keeps the batch processor's meaning: a span that would overflow
// the queue is dropped (and counted), never waited for.
//
// Not covered, because tidemq's spans do not use them: span processors
// (there is only the exporter), and attribute value length limits. A span
// ended inside a panicking deferred call does not record the panic.
type Provider struct {
	embedded.TracerProvider

	exp      *Exporter
	cfg      ProviderConfig
	resource []byte // the encoded ResourceSpans.resource field
	// parentBased is set when the sampler is the SDK's default (parent-based,
	// always on), whose decision is the parent's flag: decided inline, it
	// saves a context and a sampler call per span.
	parentBased bool

	mu      sync.Mutex
	tracers map[instrumentation.Scope]*tracer

	queue   chan *batch
	flushes chan chan struct{}
	stop    chan struct{}
	done    chan struct{}
	closed  atomic.Bool
	once    sync.Once
	dropped atomic.Uint64
}

var _ trace.TracerProvider = (*Provider)(nil)

// NewProvider starts a Provider exporting through exp. Shutdown stops it
// and exp.
func NewProvider(exp *Exporter, cfg ProviderConfig) *Provider {
	if cfg.Sampler == nil {
		cfg.Sampler = sdktrace.ParentBased(sdktrace.AlwaysSample())
	}
	if cfg.QueueSize <= 0 {
		cfg.QueueSize = DefaultQueueSize
	}
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = DefaultBatchSize
	}
	cfg.BatchSize = min(cfg.BatchSize, cfg.QueueSize)
	if cfg.ScheduleDelay <= 0 {
		cfg.ScheduleDelay = DefaultScheduleDelay
	}
	if cfg.ExportTimeout <= 0 {
		cfg.ExportTimeout = DefaultExportTimeout
	}
	if cfg.AttributeCountLimit == 0 {
		cfg.AttributeCountLimit = DefaultCountLimit
	}
	p := &Provider{
		exp:     exp,
		cfg:     cfg,
		tracers: map[instrumentation.Scope]*tracer{},
		queue:   make(chan *batch, max(1, cfg.QueueSize/cfg.BatchSize)),
		flushes: make(chan chan struct{}),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	p.parentBased = cfg.Sampler.Description() == sdktrace.ParentBased(sdktrace.AlwaysSample()).Description()
	if cfg.Resource != nil {
		var start int
		p.resource, start = openMessage(nil, fieldResourceSpansResource, reserveSpan)
		for iter := cfg.Resource.Iter(); iter.Next(); {
			kv := iter.Attribute()
			p.resource = appendKeyValue(p.resource, fieldResourceAttributes, &kv)
		}
		p.resource = closeMessage(p.resource, start, reserveSpan)
	}
	go p.exportLoop()
	return p
}

// Tracer returns the tracer of one instrumentation scope; the same scope
// gives the same tracer.
func (p *Provider) Tracer(name string, opts ...trace.TracerOption) trace.Tracer {
	c := trace.NewTracerConfig(opts...)
	scope := instrumentation.Scope{
		Name:       name,
		Version:    c.InstrumentationVersion(),
		SchemaURL:  c.SchemaURL(),
		Attributes: c.InstrumentationAttributes(),
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	t, ok := p.tracers[scope]
	if !ok {
		t = &tracer{p: p, schemaURL: scope.SchemaURL}
		if scope != (instrumentation.Scope{}) {
			t.scope = appendScope(nil, scope)
		}
		p.tracers[scope] = t
	}
	return t
}

// Dropped is how many spans were dropped because the export queue was full.
func (p *Provider) Dropped() uint64 { return p.dropped.Load() }

// ForceFlush exports every span ended before it was called.
func (p *Provider) ForceFlush(ctx context.Context) error {
	done := make(chan struct{})
	select {
	case p.flushes <- done:
	case <-p.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Shutdown exports what is buffered, then stops the export goroutine and
// the exporter. Spans ended afterwards are dropped. It may be called more
// than once.
func (p *Provider) Shutdown(ctx context.Context) error {
	p.once.Do(func() {
		p.closed.Store(true)
		close(p.stop)
	})
	var err error
	select {
	case <-p.done:
	case <-ctx.Done():
		err = ctx.Err()
	}
	return errors.Join(err, p.exp.Shutdown(ctx))
}

// exportLoop owns the export: one request at a time, as the batch span
// processor does, so a slow collector fills the queue and drops spans
// rather than piling up goroutines.
func (p *Provider) exportLoop() {
	defer close(p.done)
	ticker := time.NewTicker(p.cfg.ScheduleDelay)
	defer ticker.Stop()
	for {
		select {
		case b := <-p.queue:
			p.export(b)
		case <-ticker.C:
			p.exportOpen()
		case done := <-p.flushes:
			p.drain()
			close(done)
		case <-p.stop:
			p.drain()
			return
		}
	}
}

// drain exports the queued batches, then every tracer's open one.
func (p *Provider) drain() {
	for {
		select {
		case b := <-p.queue:
			p.export(b)
		default:
			p.exportOpen()
			return
		}
	}
}

// exportOpen exports the batches still being filled.
func (p *Provider) exportOpen() {
	p.mu.Lock()
	tracers := make([]*tracer, 0, len(p.tracers))
	for _, t := range p.tracers {
		tracers = append(tracers, t)
	}
	p.mu.Unlock()
	for _, t := range tracers {
		t.mu.Lock()
		b := t.open
		t.open = nil
		t.mu.Unlock()
		if b != nil {
			p.export(b)
		}
	}
}

func (p *Provider) export(b *batch) {
	defer b.release()
	buf := bufferPool.Get().(*exportBuffer)
	defer buf.release()
	raw, rsStart := openMessage(buf.raw[:0], fieldRequestResourceSpans, reserveBatch)
	raw = append(raw, p.resource...)
	raw, ssStart := openMessage(raw, fieldResourceSpansScopeSpans, reserveBatch)
	raw = append(raw, b.tracer.scope...)
	raw = append(raw, b.spans...)
	raw = appendString(raw, fieldScopeSpansSchemaURL, b.tracer.schemaURL)
	raw = closeMessage(raw, ssStart, reserveBatch)
	if p.cfg.Resource != nil {
		raw = appendString(raw, fieldResourceSpansSchemaURL, p.cfg.Resource.SchemaURL())
	}
	buf.raw = closeMessage(raw, rsStart, reserveBatch)

	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.ExportTimeout)
	defer cancel()
	if err := p.exp.exportRaw(ctx, buf); err != nil {
		otel.Handle(fmt.Errorf("%d spans: %w", b.count, err))
	}
}

// enqueue hands a full batch to the export goroutine, or drops it when
// the queue is full: recording never waits for the network.
func (p *Provider) enqueue(b *batch) {
	if p.closed.Load() {
		b.release()
		return
	}
	select {
	case p.queue <- b:
	default:
		if p.dropped.Add(uint64(b.count)) == uint64(b.count) {
			otel.Handle(fmt.Errorf("otlpspans: export queue full (OTEL_BSP_MAX_QUEUE_SIZE=%d): dropping spans", p.cfg.QueueSize))
		}
		b.release()
	}
}

// batch is encoded Span fields of one scope, ready to be wrapped in a
// request.
type batch struct {
	tracer *tracer
	spans  []byte
	count  int
}

var batchPool = sync.Pool{New: func() any { return new(batch) }}

func (b *batch) release() {
	if cap(b.spans) > 4<<20 {
		b.spans = nil
	}
	b.spans, b.count, b.tracer = b.spans[:0], 0, nil
	batchPool.Put(b)
}

type tracer struct {
	embedded.Tracer
	p         *Provider
	scope     []byte // the encoded ScopeSpans.scope field, empty for the zero scope
	schemaURL string

	mu   sync.Mutex
	open *batch
}

// Start starts a span as the SDK's tracer does: the parent's trace id, a
// new random span id, and the sampler's decision.
func (t *tracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	cfg := trace.NewSpanStartConfig(opts...)
	var parent trace.SpanContext
	if cfg.NewRoot() {
		ctx = trace.ContextWithSpanContext(ctx, parent)
	} else {
		parent = trace.SpanContextFromContext(ctx)
	}
	sc, result := t.sample(ctx, parent, name, cfg.SpanKind(), cfg.Attributes(), cfg.Links())
	if result.Decision == sdktrace.Drop {
		return trace.ContextWithSpan(ctx, nonRecordingSpan{sc: sc, p: t.p}), nonRecordingSpan{sc: sc, p: t.p}
	}
	s := &span{tracer: t, export: result.Decision == sdktrace.RecordAndSample}
	s.sc, s.parent, s.name = sc, parent, name
	s.kind = trace.ValidateSpanKind(cfg.SpanKind())
	s.start = cfg.Timestamp()
	if s.start.IsZero() {
		s.start = time.Now()
	}
	s.attrs = s.attrsInline[:0]
	for _, l := range cfg.Links() {
		s.addLinkLocked(l)
	}
	s.setAttributesLocked(result.Attributes)
	s.setAttributesLocked(cfg.Attributes())
	return trace.ContextWithSpan(ctx, s), s
}

// sample gives a new span's context and the sampler's decision, as the
// SDK's tracer does: the parent's trace id (or a new one), a new random
// span id, the parent's flags with the sampled bit decided. ctx (the
// parent's) is read only by a sampler other than the default.
func (t *tracer) sample(ctx context.Context, parent trace.SpanContext, name string, kind trace.SpanKind,
	attrs []attribute.KeyValue, links []trace.Link) (trace.SpanContext, sdktrace.SamplingResult) {
	var scc trace.SpanContextConfig
	if parent.TraceID().IsValid() {
		scc.TraceID = parent.TraceID()
	} else {
		scc.TraceID = newTraceID()
	}
	scc.SpanID = newSpanID()
	var result sdktrace.SamplingResult
	if t.p.parentBased {
		result.Decision = sdktrace.RecordAndSample
		if parent.IsValid() && !parent.IsSampled() {
			result.Decision = sdktrace.Drop
		}
		result.Tracestate = parent.TraceState()
	} else {
		result = t.p.cfg.Sampler.ShouldSample(sdktrace.SamplingParameters{
			ParentContext: ctx,
			TraceID:       scc.TraceID,
			Name:          name,
			Kind:          kind,
			Attributes:    attrs,
			Links:         links,
		})
	}
	scc.TraceState = result.Tracestate
	scc.TraceFlags = parent.TraceFlags() &^ trace.FlagsSampled
	if result.Decision == sdktrace.RecordAndSample {
		scc.TraceFlags |= trace.FlagsSampled
	}
	return trace.NewSpanContext(scc), result
}

// NewSpanContext decides the context of a span that RecordSpan will
// record once it is over: sampled or not, its ids. Core calls it before a
// send is stored (the message keeps its span's traceparent) and records
// the span after.
func (t *tracer) NewSpanContext(parent trace.SpanContext, name string, kind trace.SpanKind) trace.SpanContext {
	var ctx context.Context // built only for a sampler that reads it
	if !t.p.parentBased {
		ctx = trace.ContextWithSpanContext(context.Background(), parent)
	}
	sc, _ := t.sample(ctx, parent, name, kind, nil, nil)
	return sc
}

// RecordSpan records, in one call and without a span object, a finished
// span of context sc (from NewSpanContext): what Start, SetAttributes and
// End with timestamps would record, except for attributes a sampler adds
// (the SDK's samplers add none). An unsampled sc records nothing. The
// broker's lifecycle spans are made this way (core looks for these two
// methods).
func (t *tracer) RecordSpan(sc, parent trace.SpanContext, name string, kind trace.SpanKind, start, end time.Time, attrs []attribute.KeyValue) {
	if !sc.IsSampled() || t.p.closed.Load() {
		return
	}
	f := spanFields{sc: sc, parent: parent, name: name, kind: trace.ValidateSpanKind(kind), start: start, end: end, attrs: attrs}
	if !plainAttrs(attrs, t.p.cfg.AttributeCountLimit) {
		f.attrs, f.droppedAttrs = appendAttrs(nil, attrs, t.p.cfg.AttributeCountLimit)
	}
	t.record(&f)
}

// plainAttrs reports whether appendAttrs(nil, attrs, limit) would keep
// attrs as they are (all valid, distinct and within limit), so that
// RecordSpan can encode the caller's slice without a copy.
func plainAttrs(attrs []attribute.KeyValue, limit int) bool {
	if limit >= 0 && len(attrs) > limit {
		return false
	}
	for i, a := range attrs {
		if !a.Valid() {
			return false
		}
		for _, b := range attrs[:i] {
			if a.Key == b.Key {
				return false
			}
		}
	}
	return true
}

// record appends a finished span to the open batch.
func (t *tracer) record(f *spanFields) {
	t.mu.Lock()
	b := t.open
	if b == nil {
		b = batchPool.Get().(*batch)
		b.tracer = t
		t.open = b
	}
	b.spans = appendSpanFields(b.spans, f)
	b.count++
	full := b.count >= t.p.cfg.BatchSize
	if full {
		t.open = nil
	}
	t.mu.Unlock()
	if full {
		t.p.enqueue(b)
	}
}

func newTraceID() (id trace.TraceID) {
	for !id.IsValid() {
		hi, lo := rand.Uint64(), rand.Uint64()
		for i := range 8 {
			id[i], id[8+i] = byte(hi>>(56-8*i)), byte(lo>>(56-8*i))
		}
	}
	return id
}

func newSpanID() (id trace.SpanID) {
	for !id.IsValid() {
		v := rand.Uint64()
		for i := range 8 {
			id[i] = byte(v >> (56 - 8*i))
		}
	}
	return id
}

// span is a recording span. Its attributes start in the span itself, sized
// for the broker's spans, so most spans are a single allocation.
type span struct {
	embedded.Span
	tracer *tracer
	export bool // sampled; a RecordOnly span records and is never sent

	mu    sync.Mutex
	ended bool
	spanFields
	attrsInline [10]attribute.KeyValue
}

func (s *span) SpanContext() trace.SpanContext { return s.sc }

func (s *span) IsRecording() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.ended
}

func (s *span) TracerProvider() trace.TracerProvider { return s.tracer.p }

func (s *span) SetName(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.ended {
		s.name = name
	}
}

// SetStatus follows the SDK: Ok is final, Error beats Unset, and only an
// Error keeps its description.
func (s *span) SetStatus(code codes.Code, description string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended || s.status.Code > code {
		return
	}
	s.status = sdktrace.Status{Code: code}
	if code == codes.Error {
		s.status.Description = description
	}
}

func (s *span) SetAttributes(attrs ...attribute.KeyValue) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.ended {
		s.setAttributesLocked(attrs)
	}
}

func (s *span) setAttributesLocked(attrs []attribute.KeyValue) {
	var dropped int
	s.attrs, dropped = appendAttrs(s.attrs, attrs, s.tracer.p.cfg.AttributeCountLimit)
	s.droppedAttrs += dropped
}

// appendAttrs adds attrs to dst by the SDK's rules: invalid attributes are
// dropped, a repeated key takes the new value in the old place, and past
// limit (negative: none) new keys are dropped. It returns dst and how many
// it dropped.
func appendAttrs(dst, attrs []attribute.KeyValue, limit int) ([]attribute.KeyValue, int) {
	dropped := 0
next:
	for _, a := range attrs {
		if !a.Valid() {
			dropped++
			continue
		}
		for i := range dst {
			if dst[i].Key == a.Key {
				dst[i] = a
				continue next
			}
		}
		if limit >= 0 && len(dst) >= limit {
			dropped++
			continue
		}
		dst = append(dst, a)
	}
	return dst, dropped
}

func (s *span) AddEvent(name string, opts ...trace.EventOption) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.ended {
		s.addEventLocked(name, trace.NewEventConfig(opts...))
	}
}

// RecordError adds the exception event the SDK adds.
func (s *span) RecordError(err error, opts ...trace.EventOption) {
	if err == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended {
		return
	}
	opts = append(opts, trace.WithAttributes(
		attribute.String("exception.type", errorType(err)),
		attribute.String("exception.message", err.Error()),
	))
	cfg := trace.NewEventConfig(opts...)
	if cfg.StackTrace() {
		stack := make([]byte, 2048)
		stack = stack[:runtime.Stack(stack, false)]
		cfg = trace.NewEventConfig(append(opts, trace.WithAttributes(attribute.String("exception.stacktrace", string(stack))))...)
	}
	s.addEventLocked("exception", cfg)
}

func errorType(err error) string {
	t := reflect.TypeOf(err)
	if t.PkgPath() == "" && t.Name() == "" {
		return t.String()
	}
	return t.PkgPath() + "." + t.Name()
}

// addEventLocked keeps the newest DefaultCountLimit events, as the SDK's
// evicting queue does.
func (s *span) addEventLocked(name string, cfg trace.EventConfig) {
	at := cfg.Timestamp()
	if at.IsZero() {
		at = time.Now()
	}
	attrs, dropped := limitAttrs(cfg.Attributes())
	ev := sdktrace.Event{Name: name, Attributes: attrs, DroppedAttributeCount: dropped, Time: at}
	if len(s.events) >= DefaultCountLimit {
		s.events = append(s.events[:0], s.events[1:]...)
		s.droppedEvents++
	}
	s.events = append(s.events, ev)
}

func (s *span) AddLink(link trace.Link) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.ended {
		s.addLinkLocked(link)
	}
}

// addLinkLocked drops links without a valid context unless they carry
// attributes or a trace state, as the SDK does.
func (s *span) addLinkLocked(link trace.Link) {
	if !link.SpanContext.IsValid() && len(link.Attributes) == 0 && link.SpanContext.TraceState().Len() == 0 {
		return
	}
	attrs, dropped := limitAttrs(link.Attributes)
	l := sdktrace.Link{SpanContext: link.SpanContext, Attributes: attrs, DroppedAttributeCount: dropped}
	if len(s.links) >= DefaultCountLimit {
		s.links = append(s.links[:0], s.links[1:]...)
		s.droppedLinks++
	}
	s.links = append(s.links, l)
}

func limitAttrs(attrs []attribute.KeyValue) ([]attribute.KeyValue, int) {
	if len(attrs) > DefaultCountLimit {
		return attrs[:DefaultCountLimit], len(attrs) - DefaultCountLimit
	}
	return attrs, 0
}

// End records the span; later calls and changes are ignored.
func (s *span) End(opts ...trace.SpanEndOption) {
	s.mu.Lock()
	if s.ended {
		s.mu.Unlock()
		return
	}
	s.ended = true
	cfg := trace.NewSpanEndConfig(opts...)
	s.end = cfg.Timestamp()
	if s.end.IsZero() {
		s.end = time.Now()
	}
	s.mu.Unlock()
	if s.export && !s.tracer.p.closed.Load() {
		s.tracer.record(&s.spanFields)
	}
}

// nonRecordingSpan is what an unsampled Start returns: it carries the
// span context (so the trace continues, unsampled) and records nothing.
type nonRecordingSpan struct {
	embedded.Span
	sc trace.SpanContext
	p  *Provider
}

func (s nonRecordingSpan) SpanContext() trace.SpanContext        { return s.sc }
func (nonRecordingSpan) IsRecording() bool                       { return false }
func (nonRecordingSpan) SetStatus(codes.Code, string)            {}
func (nonRecordingSpan) SetName(string)                          {}
func (nonRecordingSpan) SetAttributes(...attribute.KeyValue)     {}
func (nonRecordingSpan) End(...trace.SpanEndOption)              {}
func (nonRecordingSpan) AddEvent(string, ...trace.EventOption)   {}
func (nonRecordingSpan) AddLink(trace.Link)                      {}
func (nonRecordingSpan) RecordError(error, ...trace.EventOption) {}
func (s nonRecordingSpan) TracerProvider() trace.TracerProvider  { return s.p }
