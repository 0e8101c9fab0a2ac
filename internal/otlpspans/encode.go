package otlpspans

import (
	"encoding/binary"
	"math"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Field numbers of opentelemetry-proto v1 (collector/trace, trace, common,
// resource). Fields are written in ascending number order, as proto.Marshal
// does, so that single-resource batches come out byte-identical to the
// stock exporter.
const (
	fieldRequestResourceSpans protowire.Number = 1

	fieldResourceSpansResource   protowire.Number = 1
	fieldResourceSpansScopeSpans protowire.Number = 2
	fieldResourceSpansSchemaURL  protowire.Number = 3

	fieldResourceAttributes protowire.Number = 1

	fieldScopeSpansScope     protowire.Number = 1
	fieldScopeSpansSpans     protowire.Number = 2
	fieldScopeSpansSchemaURL protowire.Number = 3

	fieldScopeName       protowire.Number = 1
	fieldScopeVersion    protowire.Number = 2
	fieldScopeAttributes protowire.Number = 3

	fieldSpanTraceID           protowire.Number = 1
	fieldSpanSpanID            protowire.Number = 2
	fieldSpanTraceState        protowire.Number = 3
	fieldSpanParentSpanID      protowire.Number = 4
	fieldSpanName              protowire.Number = 5
	fieldSpanKind              protowire.Number = 6
	fieldSpanStartTime         protowire.Number = 7
	fieldSpanEndTime           protowire.Number = 8
	fieldSpanAttributes        protowire.Number = 9
	fieldSpanDroppedAttributes protowire.Number = 10
	fieldSpanEvents            protowire.Number = 11
	fieldSpanDroppedEvents     protowire.Number = 12
	fieldSpanLinks             protowire.Number = 13
	fieldSpanDroppedLinks      protowire.Number = 14
	fieldSpanStatus            protowire.Number = 15
	fieldSpanFlags             protowire.Number = 16

	fieldEventTime              protowire.Number = 1
	fieldEventName              protowire.Number = 2
	fieldEventAttributes        protowire.Number = 3
	fieldEventDroppedAttributes protowire.Number = 4

	fieldLinkTraceID           protowire.Number = 1
	fieldLinkSpanID            protowire.Number = 2
	fieldLinkAttributes        protowire.Number = 4
	fieldLinkDroppedAttributes protowire.Number = 5
	fieldLinkFlags             protowire.Number = 6

	fieldStatusMessage protowire.Number = 2
	fieldStatusCode    protowire.Number = 3

	fieldKeyValueKey   protowire.Number = 1
	fieldKeyValueValue protowire.Number = 2

	fieldAnyString protowire.Number = 1
	fieldAnyBool   protowire.Number = 2
	fieldAnyInt    protowire.Number = 3
	fieldAnyDouble protowire.Number = 4
	fieldAnyArray  protowire.Number = 5
	fieldAnyKvlist protowire.Number = 6
	fieldAnyBytes  protowire.Number = 7

	fieldListValues protowire.Number = 1 // ArrayValue.values and KeyValueList.values
)

// OTLP enum and bit values the stock tracetransform writes.
const (
	statusCodeOk    = 1 // STATUS_CODE_OK; the SDK's codes.Ok is 2
	statusCodeError = 2 // STATUS_CODE_ERROR; the SDK's codes.Error is 1

	spanFlagsContextHasIsRemote = 0x100
	spanFlagsContextIsRemote    = 0x200
)

// Length prefixes are reserved before a sub-message is written and filled
// in afterwards. The reservation is a guess of the varint width; a wrong
// guess costs one memmove of that sub-message, so the guesses are sized for
// the usual case (attributes < 128 B, spans < 16 KiB, a batch < 2 MiB).
const (
	reserveSmall = 1
	reserveSpan  = 2
	reserveBatch = 3
)

// MarshalSpans appends to dst the OTLP ExportTraceServiceRequest that the
// stock otlptrace exporter would send for spans. Nil spans are skipped; an
// empty result means there is nothing to send.
func MarshalSpans(dst []byte, spans []sdktrace.ReadOnlySpan) []byte {
	g := groupingPool.Get().(*grouping)
	defer groupingPool.Put(g)
	g.build(spans)
	for r := range g.resources {
		dst = g.appendResourceSpans(dst, spans, r)
	}
	g.reset()
	return dst
}

var groupingPool = sync.Pool{New: func() any { return new(grouping) }}

// scopeKey mirrors the key the stock exporter groups ScopeSpans by; the
// resource is keyed by attribute set only, so resources that differ only in
// schema URL share one ResourceSpans with the first span's schema URL.
type scopeKey struct {
	resource attribute.Distinct
	scope    instrumentation.Scope
}

type scopeGroup struct {
	key      scopeKey
	resource int // index into grouping.resources
	count    int
	start    int // offset of this group's spans in grouping.order
}

type resourceGroup struct {
	key      attribute.Distinct
	resource *resource.Resource // of the first span, as stock uses
}

// grouping orders spans the way tracetransform.Spans nests them: resources
// and their scopes in first-seen order, spans in input order. (Stock then
// emits resources in map order, i.e. randomly; first-seen is one of the
// orders it can produce.)
type grouping struct {
	resources []resourceGroup
	scopes    []scopeGroup
	spanScope []int32 // scope group of each span, -1 for nil spans
	order     []int32 // span indices sorted by (resource, scope, input order)
	cursor    []int   // next free slot in order, per scope group
	lastScope int
	index     map[scopeKey]int // only once there are too many scopes to scan
}

// maxScannedScopes bounds the linear search before a map pays off.
const maxScannedScopes = 8

func (g *grouping) build(spans []sdktrace.ReadOnlySpan) {
	if cap(g.spanScope) < len(spans) {
		g.spanScope = make([]int32, len(spans))
		g.order = make([]int32, len(spans))
	}
	g.spanScope = g.spanScope[:len(spans)]
	for i, s := range spans {
		if s == nil {
			g.spanScope[i] = -1
			continue
		}
		res := s.Resource()
		key := scopeKey{resource: res.Equivalent(), scope: s.InstrumentationScope()}
		sg := g.findScope(key)
		if sg < 0 {
			sg = g.addScope(key, res)
		}
		g.scopes[sg].count++
		g.spanScope[i] = int32(sg)
	}

	offset := 0
	for r := range g.resources {
		for sg := range g.scopes {
			if g.scopes[sg].resource == r {
				g.scopes[sg].start = offset
				offset += g.scopes[sg].count
			}
		}
	}
	g.order = g.order[:offset]
	g.cursor = g.cursor[:0]
	for sg := range g.scopes {
		g.cursor = append(g.cursor, g.scopes[sg].start)
	}
	for i, sg := range g.spanScope {
		if sg >= 0 {
			g.order[g.cursor[sg]] = int32(i)
			g.cursor[sg]++
		}
	}
}

func (g *grouping) findScope(key scopeKey) int {
	if len(g.scopes) > 0 && g.scopes[g.lastScope].key == key {
		return g.lastScope
	}
	if g.index != nil && len(g.scopes) > maxScannedScopes {
		if sg, ok := g.index[key]; ok {
			g.lastScope = sg
			return sg
		}
		return -1
	}
	for sg := range g.scopes {
		if g.scopes[sg].key == key {
			g.lastScope = sg
			return sg
		}
	}
	return -1
}

func (g *grouping) addScope(key scopeKey, res *resource.Resource) int {
	r := -1
	for i := range g.resources {
		if g.resources[i].key == key.resource {
			r = i
			break
		}
	}
	if r < 0 {
		r = len(g.resources)
		g.resources = append(g.resources, resourceGroup{key: key.resource, resource: res})
	}
	sg := len(g.scopes)
	g.scopes = append(g.scopes, scopeGroup{key: key, resource: r})
	g.lastScope = sg
	if len(g.scopes) > maxScannedScopes {
		if g.index == nil {
			g.index = make(map[scopeKey]int)
		}
		if len(g.index) == 0 {
			for i := range g.scopes {
				g.index[g.scopes[i].key] = i
			}
		}
		g.index[key] = sg
	}
	return sg
}

// reset drops references to spans and resources so a pooled grouping does
// not keep them alive.
func (g *grouping) reset() {
	clear(g.resources)
	clear(g.scopes)
	g.resources = g.resources[:0]
	g.scopes = g.scopes[:0]
	g.lastScope = 0
	clear(g.index)
}

func (g *grouping) appendResourceSpans(b []byte, spans []sdktrace.ReadOnlySpan, r int) []byte {
	res := g.resources[r].resource
	b, rsStart := openMessage(b, fieldRequestResourceSpans, reserveBatch)
	if res != nil {
		var resStart int
		b, resStart = openMessage(b, fieldResourceSpansResource, reserveSpan)
		for iter := res.Iter(); iter.Next(); {
			kv := iter.Attribute()
			b = appendKeyValue(b, fieldResourceAttributes, &kv)
		}
		b = closeMessage(b, resStart, reserveSpan)
	}
	for sg := range g.scopes {
		group := &g.scopes[sg]
		if group.resource != r {
			continue
		}
		var ssStart int
		b, ssStart = openMessage(b, fieldResourceSpansScopeSpans, reserveBatch)
		scope := group.key.scope
		if scope != (instrumentation.Scope{}) {
			b = appendScope(b, scope)
		}
		for _, i := range g.order[group.start : group.start+group.count] {
			b = appendSpan(b, spans[i])
		}
		b = appendString(b, fieldScopeSpansSchemaURL, scope.SchemaURL)
		b = closeMessage(b, ssStart, reserveBatch)
	}
	b = appendString(b, fieldResourceSpansSchemaURL, res.SchemaURL())
	return closeMessage(b, rsStart, reserveBatch)
}

func appendScope(b []byte, scope instrumentation.Scope) []byte {
	b, start := openMessage(b, fieldScopeSpansScope, reserveSmall)
	b = appendString(b, fieldScopeName, scope.Name)
	b = appendString(b, fieldScopeVersion, scope.Version)
	for iter := scope.Attributes.Iter(); iter.Next(); {
		kv := iter.Attribute()
		b = appendKeyValue(b, fieldScopeAttributes, &kv)
	}
	return closeMessage(b, start, reserveSmall)
}

// spanFields is what one OTLP Span message holds: the SDK's read-only
// spans are copied into it field by field, and the Provider's spans are it.
type spanFields struct {
	sc, parent    trace.SpanContext
	name          string
	kind          trace.SpanKind
	start, end    time.Time
	attrs         []attribute.KeyValue
	droppedAttrs  int
	events        []sdktrace.Event
	droppedEvents int
	links         []sdktrace.Link
	droppedLinks  int
	status        sdktrace.Status
}

func appendSpan(b []byte, s sdktrace.ReadOnlySpan) []byte {
	// Each accessor copies (under the span's lock), so each is called once.
	f := spanFields{
		sc:            s.SpanContext(),
		parent:        s.Parent(),
		name:          s.Name(),
		kind:          s.SpanKind(),
		start:         s.StartTime(),
		end:           s.EndTime(),
		attrs:         s.Attributes(),
		droppedAttrs:  s.DroppedAttributes(),
		events:        s.Events(),
		droppedEvents: s.DroppedEvents(),
		links:         s.Links(),
		droppedLinks:  s.DroppedLinks(),
		status:        s.Status(),
	}
	return appendSpanFields(b, &f)
}

func appendSpanFields(b []byte, s *spanFields) []byte {
	b, start := openMessage(b, fieldScopeSpansSpans, reserveSpan)

	traceID, spanID := s.sc.TraceID(), s.sc.SpanID()
	b = appendBytes(b, fieldSpanTraceID, traceID[:])
	b = appendBytes(b, fieldSpanSpanID, spanID[:])
	b = appendTraceState(b, fieldSpanTraceState, s.sc.TraceState())
	if parentID := s.parent.SpanID(); parentID.IsValid() {
		b = appendBytes(b, fieldSpanParentSpanID, parentID[:])
	}
	b = appendString(b, fieldSpanName, s.name)
	b = appendVarint(b, fieldSpanKind, spanKind(s.kind))
	b = appendFixed64(b, fieldSpanStartTime, uint64(max(0, s.start.UnixNano())))
	b = appendFixed64(b, fieldSpanEndTime, uint64(max(0, s.end.UnixNano())))
	for i := range s.attrs {
		b = appendKeyValue(b, fieldSpanAttributes, &s.attrs[i])
	}
	b = appendVarint(b, fieldSpanDroppedAttributes, clampUint32(s.droppedAttrs))
	for i := range s.events {
		b = appendEvent(b, &s.events[i])
	}
	b = appendVarint(b, fieldSpanDroppedEvents, clampUint32(s.droppedEvents))
	for i := range s.links {
		b = appendLink(b, &s.links[i])
	}
	b = appendVarint(b, fieldSpanDroppedLinks, clampUint32(s.droppedLinks))
	b = appendStatus(b, s.status)
	b = appendFlags(b, fieldSpanFlags, s.sc.TraceFlags(), s.parent.IsRemote())

	return closeMessage(b, start, reserveSpan)
}

func appendEvent(b []byte, ev *sdktrace.Event) []byte {
	b, start := openMessage(b, fieldSpanEvents, reserveSmall)
	b = appendFixed64(b, fieldEventTime, uint64(max(0, ev.Time.UnixNano())))
	b = appendString(b, fieldEventName, ev.Name)
	for i := range ev.Attributes {
		b = appendKeyValue(b, fieldEventAttributes, &ev.Attributes[i])
	}
	b = appendVarint(b, fieldEventDroppedAttributes, clampUint32(ev.DroppedAttributeCount))
	return closeMessage(b, start, reserveSmall)
}

// appendLink leaves out the link's trace_state because stock v1.45 does.
func appendLink(b []byte, link *sdktrace.Link) []byte {
	b, start := openMessage(b, fieldSpanLinks, reserveSmall)
	traceID, spanID := link.SpanContext.TraceID(), link.SpanContext.SpanID()
	b = appendBytes(b, fieldLinkTraceID, traceID[:])
	b = appendBytes(b, fieldLinkSpanID, spanID[:])
	for i := range link.Attributes {
		b = appendKeyValue(b, fieldLinkAttributes, &link.Attributes[i])
	}
	b = appendVarint(b, fieldLinkDroppedAttributes, clampUint32(link.DroppedAttributeCount))
	b = appendFlags(b, fieldLinkFlags, link.SpanContext.TraceFlags(), link.SpanContext.IsRemote())
	return closeMessage(b, start, reserveSmall)
}

// appendStatus always writes the Status message, even when empty, because
// stock always sets Span.status.
func appendStatus(b []byte, st sdktrace.Status) []byte {
	b, start := openMessage(b, fieldSpanStatus, reserveSmall)
	b = appendString(b, fieldStatusMessage, st.Description)
	var code uint64
	switch st.Code {
	case codes.Ok:
		code = statusCodeOk
	case codes.Error:
		code = statusCodeError
	}
	b = appendVarint(b, fieldStatusCode, code)
	return closeMessage(b, start, reserveSmall)
}

func appendFlags(b []byte, num protowire.Number, tf trace.TraceFlags, remote bool) []byte {
	flags := uint32(tf) | spanFlagsContextHasIsRemote
	if remote {
		flags |= spanFlagsContextIsRemote
	}
	b = protowire.AppendTag(b, num, protowire.Fixed32Type)
	return protowire.AppendFixed32(b, flags)
}

// appendTraceState writes the W3C form that TraceState.String returns,
// without building the intermediate string.
func appendTraceState(b []byte, num protowire.Number, ts trace.TraceState) []byte {
	if ts.Len() == 0 {
		return b
	}
	size := -1 // no leading comma
	ts.Walk(func(key, value string) bool {
		size += 1 + len(key) + 1 + len(value)
		return true
	})
	b = appendTag(b, num, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(size))
	first := true
	ts.Walk(func(key, value string) bool {
		if !first {
			b = append(b, ',')
		}
		first = false
		b = append(b, key...)
		b = append(b, '=')
		b = append(b, value...)
		return true
	})
	return b
}

func spanKind(kind trace.SpanKind) uint64 {
	// OTLP's SpanKind numbering matches the API's for every valid kind.
	switch kind {
	case trace.SpanKindInternal, trace.SpanKindServer, trace.SpanKindClient,
		trace.SpanKindProducer, trace.SpanKindConsumer:
		return uint64(kind)
	default:
		return 0
	}
}

func clampUint32(v int) uint64 {
	return uint64(min(max(v, 0), math.MaxUint32))
}

// appendKeyValue sizes scalar attributes up front, since they are most of
// what spans carry, and falls back to a reserved length for the rest.
func appendKeyValue(b []byte, num protowire.Number, kv *attribute.KeyValue) []byte {
	key := validUTF8(string(kv.Key))
	keySize := 0
	if key != "" {
		keySize = 1 + protowire.SizeBytes(len(key))
	}
	var str string
	var scalar uint64
	anySize := 0 // of the AnyValue message, for the scalar types
	switch kv.Value.Type() {
	case attribute.STRING:
		str = validUTF8(kv.Value.AsString())
		anySize = 1 + protowire.SizeBytes(len(str))
	case attribute.INT64:
		scalar = uint64(kv.Value.AsInt64())
		anySize = 1 + protowire.SizeVarint(scalar)
	case attribute.BOOL:
		scalar = protowire.EncodeBool(kv.Value.AsBool())
		anySize = 2
	case attribute.FLOAT64:
		scalar = math.Float64bits(kv.Value.AsFloat64())
		anySize = 9
	default:
		b, start := openMessage(b, num, reserveSmall)
		b = appendString(b, fieldKeyValueKey, key)
		b = appendAnyValue(b, fieldKeyValueValue, kv.Value)
		return closeMessage(b, start, reserveSmall)
	}

	b = appendTag(b, num, protowire.BytesType)
	b = appendUvarint(b, uint64(keySize+1+protowire.SizeVarint(uint64(anySize))+anySize))
	if key != "" {
		b = appendTag(b, fieldKeyValueKey, protowire.BytesType)
		b = appendUvarint(b, uint64(len(key)))
		b = append(b, key...)
	}
	b = appendTag(b, fieldKeyValueValue, protowire.BytesType)
	b = appendUvarint(b, uint64(anySize))
	switch kv.Value.Type() {
	case attribute.STRING:
		b = appendTag(b, fieldAnyString, protowire.BytesType)
		b = appendUvarint(b, uint64(len(str)))
		return append(b, str...)
	case attribute.INT64:
		b = appendTag(b, fieldAnyInt, protowire.VarintType)
		return appendUvarint(b, scalar)
	case attribute.BOOL:
		return append(b, byte(protowire.EncodeTag(fieldAnyBool, protowire.VarintType)), byte(scalar))
	default: // FLOAT64
		b = appendTag(b, fieldAnyDouble, protowire.Fixed64Type)
		return protowire.AppendFixed64(b, scalar)
	}
}

// appendAnyValue writes the oneof member even when it holds a zero value:
// oneof fields have presence, so "" or false are not omitted.
func appendAnyValue(b []byte, num protowire.Number, v attribute.Value) []byte {
	b, start := openMessage(b, num, reserveSmall)
	var sub int // start of a nested ArrayValue or KeyValueList
	switch v.Type() {
	case attribute.EMPTY:
	case attribute.BOOL:
		b = appendTag(b, fieldAnyBool, protowire.VarintType)
		b = protowire.AppendVarint(b, protowire.EncodeBool(v.AsBool()))
	case attribute.INT64:
		b = appendTag(b, fieldAnyInt, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(v.AsInt64()))
	case attribute.FLOAT64:
		b = appendDouble(b, v.AsFloat64())
	case attribute.STRING:
		b = appendTag(b, fieldAnyString, protowire.BytesType)
		b = protowire.AppendString(b, validUTF8(v.AsString()))
	case attribute.BYTESLICE:
		b = appendTag(b, fieldAnyBytes, protowire.BytesType)
		b = protowire.AppendBytes(b, v.AsByteSlice())
	case attribute.BOOLSLICE:
		b, sub = openMessage(b, fieldAnyArray, reserveSmall)
		for _, x := range v.AsBoolSlice() {
			b = appendTag(b, fieldListValues, protowire.BytesType)
			b = append(b, 2, byte(fieldAnyBool)<<3|byte(protowire.VarintType), byte(protowire.EncodeBool(x)))
		}
		b = closeMessage(b, sub, reserveSmall)
	case attribute.INT64SLICE:
		b, sub = openMessage(b, fieldAnyArray, reserveSmall)
		for _, x := range v.AsInt64Slice() {
			b = appendTag(b, fieldListValues, protowire.BytesType)
			b = protowire.AppendVarint(b, uint64(1+protowire.SizeVarint(uint64(x))))
			b = appendTag(b, fieldAnyInt, protowire.VarintType)
			b = protowire.AppendVarint(b, uint64(x))
		}
		b = closeMessage(b, sub, reserveSmall)
	case attribute.FLOAT64SLICE:
		b, sub = openMessage(b, fieldAnyArray, reserveSmall)
		for _, x := range v.AsFloat64Slice() {
			b = appendTag(b, fieldListValues, protowire.BytesType)
			b = append(b, 9)
			b = appendDouble(b, x)
		}
		b = closeMessage(b, sub, reserveSmall)
	case attribute.STRINGSLICE:
		b, sub = openMessage(b, fieldAnyArray, reserveSmall)
		for _, x := range v.AsStringSlice() {
			x = validUTF8(x)
			b = appendTag(b, fieldListValues, protowire.BytesType)
			b = protowire.AppendVarint(b, uint64(1+protowire.SizeBytes(len(x))))
			b = appendTag(b, fieldAnyString, protowire.BytesType)
			b = protowire.AppendString(b, x)
		}
		b = closeMessage(b, sub, reserveSmall)
	case attribute.SLICE:
		b, sub = openMessage(b, fieldAnyArray, reserveSmall)
		for _, x := range v.AsSlice() {
			b = appendAnyValue(b, fieldListValues, x)
		}
		b = closeMessage(b, sub, reserveSmall)
	case attribute.MAP:
		b, sub = openMessage(b, fieldAnyKvlist, reserveSmall)
		kvs := v.AsMap()
		for i := range kvs {
			b = appendKeyValue(b, fieldListValues, &kvs[i])
		}
		b = closeMessage(b, sub, reserveSmall)
	default:
		// Stock's fallback for attribute types it does not know.
		b = appendTag(b, fieldAnyString, protowire.BytesType)
		b = protowire.AppendString(b, "INVALID")
	}
	return closeMessage(b, start, reserveSmall)
}

func appendDouble(b []byte, f float64) []byte {
	b = appendTag(b, fieldAnyDouble, protowire.Fixed64Type)
	return protowire.AppendFixed64(b, math.Float64bits(f))
}

// isASCII is the common case of validUTF8 at a fraction of
// utf8.ValidString's cost on short strings: one OR per 8 bytes.
func isASCII(s string) bool {
	if len(s) < 8 {
		var acc byte
		for i := 0; i < len(s); i++ {
			acc |= s[i]
		}
		return acc < 0x80
	}
	acc := load64(s, len(s)-8) // the tail, overlapping the last full word
	for i := 0; i+8 <= len(s); i += 8 {
		acc |= load64(s, i)
	}
	return acc&0x8080808080808080 == 0
}

// load64 compiles to a single 8-byte load.
func load64(s string, i int) uint64 {
	s = s[i : i+8]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}

// The scalar helpers below omit zero values, as proto3 does for fields
// without presence.

func appendString(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	s = validUTF8(s)
	b = appendTag(b, num, protowire.BytesType)
	b = appendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// validUTF8 replaces invalid UTF-8, which proto3 strings must not carry.
// Stock fails the whole batch there (proto.Marshal refuses), losing every
// span in it for one bad attribute; replacing keeps the batch.
func validUTF8(s string) string {
	if isASCII(s) || utf8.ValidString(s) {
		return s
	}
	return strings.ToValidUTF8(s, string(utf8.RuneError))
}

func appendBytes(b []byte, num protowire.Number, v []byte) []byte {
	if len(v) == 0 {
		return b
	}
	b = appendTag(b, num, protowire.BytesType)
	b = appendUvarint(b, uint64(len(v)))
	return append(b, v...)
}

func appendVarint(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = appendTag(b, num, protowire.VarintType)
	return appendUvarint(b, v)
}

func appendFixed64(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = appendTag(b, num, protowire.Fixed64Type)
	return protowire.AppendFixed64(b, v)
}

// appendTag writes a one-byte field key, which every field here but
// Span.flags (number 16, see appendFlags) has. Unlike protowire.AppendTag
// it inlines.
func appendTag(b []byte, num protowire.Number, typ protowire.Type) []byte {
	return append(b, byte(num)<<3|byte(typ))
}

// appendUvarint is protowire.AppendVarint with the one-byte case inlined:
// nearly every length here fits in a byte.
func appendUvarint(b []byte, v uint64) []byte {
	if v < 0x80 {
		return append(b, byte(v))
	}
	return protowire.AppendVarint(b, v)
}

// openMessage writes the tag of a length-delimited field and reserves
// reserve bytes for its length; closeMessage fills them in.
func openMessage(b []byte, num protowire.Number, reserve int) ([]byte, int) {
	b = appendTag(b, num, protowire.BytesType)
	start := len(b)
	switch reserve {
	case 1:
		b = append(b, 0)
	case 2:
		b = append(b, 0, 0)
	default:
		b = append(b, 0, 0, 0)
	}
	return b, start
}

func closeMessage(b []byte, start, reserve int) []byte {
	if n := len(b) - start - reserve; reserve == 1 && n < 0x80 {
		b[start] = byte(n)
		return b
	}
	return resizeLength(b, start, reserve)
}

var zeroPad [binary.MaxVarintLen64]byte

func resizeLength(b []byte, start, reserve int) []byte {
	n := len(b) - start - reserve
	width := protowire.SizeVarint(uint64(n))
	switch {
	case width > reserve:
		b = append(b, zeroPad[:width-reserve]...)
		copy(b[start+width:], b[start+reserve:start+reserve+n])
	case width < reserve:
		copy(b[start+width:], b[start+reserve:])
		b = b[:start+width+n]
	}
	protowire.AppendVarint(b[start:start], uint64(n))
	return b
}
