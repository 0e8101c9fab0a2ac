package core

import (
	"context"
	"encoding/hex"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
)

const instrumentationName = "github.com/tidemq/tidemq/core"

// Span names of a message's life (SPEC §3).
const (
	SpanSend         = "tidemq.send"
	SpanDeliver      = "tidemq.deliver"
	SpanAck          = "tidemq.ack"
	SpanNack         = "tidemq.nack"
	SpanDead         = "tidemq.dead"
	SpanLeaseExpired = "tidemq.lease_expired"
	SpanRetry        = "tidemq.retry"
	SpanRedrive      = "tidemq.redrive"
	SpanDelayFire    = "tidemq.delay.fire"
	SpanTxPrepare    = "tidemq.transaction.prepare"
	SpanTxCommit     = "tidemq.transaction.commit"
	SpanTxRollback   = "tidemq.transaction.rollback"
	SpanTxCheck      = "tidemq.transaction.check"
)

// telemetry holds the broker's tracer and instruments. Spans are exported
// by whatever TracerProvider the caller gave (a batch processor in the
// binary), so recording one never waits for the network.
type telemetry struct {
	tracer   trace.Tracer
	recorder spanRecorder // the tracer, when it records finished spans in one call
	tracing  bool
	msgsIn   metric.Int64Counter
	bytesIn  metric.Int64Counter
	msgsOut  metric.Int64Counter
	bytesOut metric.Int64Counter
	alerts   metric.Int64Counter
	// transactions counts transactions by outcome (prepared, committed,
	// rolled_back) and who decided; checks counts checks by answer.
	transactions metric.Int64Counter
	checks       metric.Int64Counter
	longPolls    atomic.Int64
	registered   metric.Registration
}

func newTelemetry(b *Broker, tp trace.TracerProvider, mp metric.MeterProvider) (*telemetry, error) {
	t := &telemetry{}
	if tp == nil {
		tp = tracenoop.NewTracerProvider()
	}
	_, isNoop := tp.(tracenoop.TracerProvider)
	t.tracing = !isNoop
	t.tracer = tp.Tracer(instrumentationName)
	t.recorder, _ = t.tracer.(spanRecorder)
	if mp == nil {
		mp = metricnoop.NewMeterProvider()
	}
	m := mp.Meter(instrumentationName)
	var err error
	counter := func(name, unit, desc string) metric.Int64Counter {
		if err != nil {
			return nil
		}
		var c metric.Int64Counter
		c, err = m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		return c
	}
	t.msgsIn = counter("tidemq.messages.in", "{message}", "Messages stored, per topic.")
	t.bytesIn = counter("tidemq.bytes.in", "By", "Message body bytes stored, per topic.")
	t.msgsOut = counter("tidemq.messages.out", "{message}", "Messages delivered, per topic and group.")
	t.bytesOut = counter("tidemq.bytes.out", "By", "Message body bytes delivered, per topic and group.")
	t.alerts = counter("tidemq.alerts", "{alert}", "Alert changes, per alert and status.")
	t.transactions = counter("tidemq.transactions", "{transaction}", "Transactions by outcome (prepared, committed, rolled_back) and decided_by (request, check, check_limit), per topic.")
	t.checks = counter("tidemq.transaction.checks", "{check}", "Transaction checks by status (commit, rollback, unknown, failed), per topic.")
	if err != nil {
		return nil, err
	}
	gauge := func(name, unit, desc string) metric.Int64ObservableGauge {
		if err != nil {
			return nil
		}
		var g metric.Int64ObservableGauge
		g, err = m.Int64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(desc))
		return g
	}
	lag := gauge("tidemq.subscription.lag", "{message}", "Messages stored and not yet acked, per subscription.")
	inflight := gauge("tidemq.subscription.inflight", "{message}", "Messages leased to consumers, per subscription.")
	retrying := gauge("tidemq.subscription.retrying", "{message}", "Messages waiting for a retry, per subscription.")
	dlq := gauge("tidemq.subscription.dlq", "{message}", "Messages in the dead-letter queue, per subscription.")
	parked := gauge("tidemq.long_polls.parked", "{request}", "Pulls waiting for messages.")
	topicMsgs := gauge("tidemq.topic.messages", "{message}", "Messages retained, per topic.")
	topicBytes := gauge("tidemq.topic.bytes", "By", "Body bytes retained, per topic.")
	storeBytes := gauge("tidemq.store.disk.bytes", "By", "Bytes the store occupies on disk.")
	mirrorLag := gauge("tidemq.mirror.lag", "{message}", "Messages of a mirror's source not yet copied here (its source subscription's lag), per mirror.")
	mirrorFailing := gauge("tidemq.mirror.failing", "{mirror}", "1 while a mirror's last attempt to read its source or store here failed, per mirror.")
	var mirrorCopied metric.Int64ObservableCounter
	if err == nil {
		mirrorCopied, err = m.Int64ObservableCounter("tidemq.mirror.copied", metric.WithUnit("{message}"),
			metric.WithDescription("Messages a mirror stored here, per mirror (kept across restarts)."))
	}
	halfMsgs := gauge("tidemq.topic.half_messages", "{message}", "Half messages of open transactions, per topic.")
	spansDropped := gauge("tidemq.trace.spans_dropped", "{span}", "Spans dropped since start because the export queue was full (OTEL_BSP_MAX_QUEUE_SIZE): the exporter fell behind.")
	if err != nil {
		return nil, err
	}
	// A tracer provider that drops spans under load (internal/otlpspans'
	// does, as the SDK's batch processor does) says how many: an operator
	// sees tracing go lossy instead of guessing from gaps in Jaeger.
	dropper, _ := tp.(interface{ Dropped() uint64 })
	t.registered, err = m.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		o.ObserveInt64(parked, t.longPolls.Load())
		for _, ti := range b.ListTopics() {
			attrs := metric.WithAttributes(attribute.String("topic", ti.Name))
			o.ObserveInt64(topicMsgs, ti.Messages, attrs)
			o.ObserveInt64(topicBytes, ti.Bytes, attrs)
			o.ObserveInt64(halfMsgs, ti.HalfMessages, attrs)
			subs, _ := b.eachSubscription(ti.Name, (*subscription).stats)
			for _, s := range subs {
				a := metric.WithAttributes(attribute.String("topic", ti.Name), attribute.String("group", s.Group))
				o.ObserveInt64(lag, s.Lag, a)
				o.ObserveInt64(inflight, s.Inflight, a)
				o.ObserveInt64(retrying, s.Retrying, a)
				o.ObserveInt64(dlq, s.DLQ, a)
			}
		}
		for _, mi := range b.ListMirrors() {
			a := metric.WithAttributes(attribute.String("mirror", mi.Name), attribute.String("topic", mi.Topic))
			o.ObserveInt64(mirrorLag, mi.Lag, a)
			o.ObserveInt64(mirrorCopied, int64(mi.Copied), a)
			failing := int64(0)
			if mi.State == MirrorFailing {
				failing = 1
			}
			o.ObserveInt64(mirrorFailing, failing, a)
		}
		if st, ok := b.store.(StatsReporter); ok {
			stats := st.Stats()
			o.ObserveInt64(storeBytes, stats.DiskBytes)
		}
		if dropper != nil {
			o.ObserveInt64(spansDropped, int64(dropper.Dropped()))
		}
		return nil
	}, lag, inflight, retrying, dlq, parked, topicMsgs, topicBytes, halfMsgs, storeBytes, spansDropped, mirrorLag, mirrorFailing, mirrorCopied)
	return t, err
}

// StatsReporter is implemented by stores that report their health.
type StatsReporter interface {
	Stats() StoreStats
}

// SpaceReporter is implemented by stores that know the space left on
// their disk; the broker refuses sends before the disk is full.
type SpaceReporter interface {
	FreeBytes() (int64, error)
}

// StoreStats is the store health the broker exports as metrics. A store's
// gauges of its own workings are its business (pebblestore registers its
// own).
type StoreStats struct {
	// DiskBytes is what the store occupies on disk.
	DiskBytes int64
}

// messageAttrs are the messaging semantic-convention attributes of a message.
func messageAttrs(topic string, m *Message) []attribute.KeyValue {
	return appendMessageAttrs(make([]attribute.KeyValue, 0, 9), topic, m)
}

func appendMessageAttrs(attrs []attribute.KeyValue, topic string, m *Message) []attribute.KeyValue {
	attrs = append(attrs,
		attribute.String("messaging.system", "tidemq"),
		attribute.String("messaging.destination.name", topic),
		attribute.String("messaging.message.id", m.ID),
		attribute.Int("messaging.destination.partition.id", int(m.QueueID)),
	)
	if m.Tag != "" {
		attrs = append(attrs, attribute.String("tidemq.tag", m.Tag))
	}
	if len(m.Keys) > 0 {
		attrs = append(attrs, attribute.StringSlice("tidemq.keys", m.Keys))
	}
	if m.ShardingKey != "" {
		attrs = append(attrs, attribute.String("tidemq.sharding_key", m.ShardingKey))
	}
	if m.ProducerGroup != "" {
		attrs = append(attrs, attribute.String("tidemq.producer_group", m.ProducerGroup))
	}
	return attrs
}

// parseTraceparent reads a W3C traceparent (version 00) into a remote span
// context, the parent of a stored message's later spans; anything else
// gives the empty one. core parses it itself: the OTel propagation package
// would pull net/http into core.
func parseTraceparent(tp string) trace.SpanContext {
	if len(tp) != 55 || tp[:3] != "00-" || tp[35] != '-' || tp[52] != '-' {
		return trace.SpanContext{}
	}
	var cfg trace.SpanContextConfig
	var flags [1]byte
	if _, err := hex.Decode(cfg.TraceID[:], []byte(tp[3:35])); err != nil {
		return trace.SpanContext{}
	}
	if _, err := hex.Decode(cfg.SpanID[:], []byte(tp[36:52])); err != nil {
		return trace.SpanContext{}
	}
	if _, err := hex.Decode(flags[:], []byte(tp[53:55])); err != nil {
		return trace.SpanContext{}
	}
	cfg.TraceFlags = trace.TraceFlags(flags[0]) & trace.FlagsSampled
	cfg.Remote = true
	if sc := trace.NewSpanContext(cfg); sc.IsValid() {
		return sc
	}
	return trace.SpanContext{} // all-zero ids: no parent at all
}

// formatTraceparent writes a span context in W3C form, "" when invalid.
func formatTraceparent(sc trace.SpanContext) string {
	if !sc.IsValid() {
		return ""
	}
	tid, sid := sc.TraceID(), sc.SpanID()
	b := make([]byte, 0, 55)
	b = append(b, "00-"...)
	b = hex.AppendEncode(b, tid[:])
	b = append(b, '-')
	b = hex.AppendEncode(b, sid[:])
	b = append(b, '-')
	return string(hex.AppendEncode(b, []byte{byte(sc.TraceFlags())}))
}

// spanRecorder is a tracer that records a finished span in one call, with
// no span object (internal/otlpspans' tracers are): NewSpanContext decides
// the span's ids and sampling when it begins, RecordSpan records it when
// it is over. A message's life is 2–3 spans, so this is worth an interface.
type spanRecorder interface {
	NewSpanContext(parent trace.SpanContext, name string, kind trace.SpanKind) trace.SpanContext
	RecordSpan(sc, parent trace.SpanContext, name string, kind trace.SpanKind, start, end time.Time, attrs []attribute.KeyValue)
}

// event records one finished lifecycle step of a message as a span,
// child of parent (the message's trace), at time at.
//
// With another tracer it allocates as little as the OTel API lets it: one
// timestamp option for start and end, the kind option made once, and the
// attributes set on the span rather than copied into a start option first.
func (t *telemetry) event(parent trace.SpanContext, name string, at time.Time, attrs ...attribute.KeyValue) trace.SpanContext {
	if !t.tracing || !parent.IsValid() {
		return parent
	}
	if t.recorder != nil {
		sc := t.recorder.NewSpanContext(parent, name, trace.SpanKindConsumer)
		t.recorder.RecordSpan(sc, parent, name, trace.SpanKindConsumer, at, at, attrs)
		return sc
	}
	ctx := trace.ContextWithRemoteSpanContext(context.Background(), parent)
	ts := trace.WithTimestamp(at)
	_, span := t.tracer.Start(ctx, name, ts, consumerKind)
	span.SetAttributes(attrs...)
	sc := span.SpanContext()
	span.End(ts)
	return sc
}

var consumerKind = trace.WithSpanKind(trace.SpanKindConsumer)

// sendSpans are the tidemq.send spans of one Send, one per message: each
// message is one trace (or joins the producer's), and its stored
// traceparent parents every later step.
type sendSpans struct {
	tel    *telemetry
	parent trace.SpanContext
	start  time.Time
	spans  []trace.Span        // with a plain tracer
	scs    []trace.SpanContext // with a spanRecorder
	// parents, when set, are each message's own parent (beginLinkedSends).
	parents []trace.SpanContext
}

// parentOf is the parent of message i's send span.
func (s sendSpans) parentOf(i int) trace.SpanContext {
	if s.parents != nil {
		return s.parents[i]
	}
	return s.parent
}

// beginLinkedSends is beginSends for messages that continue traces of
// their own: mirrored copies, whose Traceparent is their source message's.
// Each send span is a child of its message's traceparent, and the message
// carries the send span's; without tracing, the source's stays.
func (t *telemetry) beginLinkedSends(ctx context.Context, msgs []*Message, now time.Time) sendSpans {
	s := sendSpans{tel: t, start: now}
	if !t.tracing {
		return s
	}
	s.parents = make([]trace.SpanContext, len(msgs))
	for i, m := range msgs {
		s.parents[i] = parseTraceparent(m.Traceparent)
	}
	if t.recorder != nil {
		s.scs = make([]trace.SpanContext, len(msgs))
		for i, m := range msgs {
			s.scs[i] = t.recorder.NewSpanContext(s.parents[i], SpanSend, trace.SpanKindProducer)
			m.Traceparent = formatTraceparent(s.scs[i])
		}
		return s
	}
	s.spans = make([]trace.Span, len(msgs))
	startOpts := []trace.SpanStartOption{producerKind, trace.WithTimestamp(now)}
	for i, m := range msgs {
		_, s.spans[i] = t.tracer.Start(trace.ContextWithRemoteSpanContext(ctx, s.parents[i]), SpanSend, startOpts...)
		m.Traceparent = formatTraceparent(s.spans[i].SpanContext())
	}
	return s
}

// beginSends starts the send spans and stamps each message with its
// traceparent; without tracing, messages carry the caller's.
func (t *telemetry) beginSends(ctx context.Context, msgs []*Message, now time.Time) sendSpans {
	s := sendSpans{tel: t, parent: trace.SpanContextFromContext(ctx), start: now}
	switch {
	case !t.tracing:
		if tp := formatTraceparent(s.parent); tp != "" {
			for _, m := range msgs {
				m.Traceparent = tp
			}
		}
	case t.recorder != nil:
		s.scs = make([]trace.SpanContext, len(msgs))
		for i, m := range msgs {
			s.scs[i] = t.recorder.NewSpanContext(s.parent, SpanSend, trace.SpanKindProducer)
			m.Traceparent = formatTraceparent(s.scs[i])
		}
	default:
		s.spans = make([]trace.Span, len(msgs))
		startOpts := []trace.SpanStartOption{producerKind, trace.WithTimestamp(now)}
		for i, m := range msgs {
			_, s.spans[i] = t.tracer.Start(ctx, SpanSend, startOpts...)
			m.Traceparent = formatTraceparent(s.spans[i].SpanContext())
		}
	}
	return s
}

var producerKind = trace.WithSpanKind(trace.SpanKindProducer)

// end ends the spans with each message's outcome: its offset, or err.
func (s sendSpans) end(topic string, msgs []*Message, results []SendResult, err error) {
	n := max(len(s.spans), len(s.scs))
	if n == 0 {
		return
	}
	// One attribute buffer for all: spans copy it.
	attrs := make([]attribute.KeyValue, 0, 12)
	now := time.Now()
	for i := range n {
		attrs = appendMessageAttrs(attrs[:0], topic, msgs[i])
		if err == nil {
			r := results[i]
			attrs = append(attrs, attribute.Bool("tidemq.duplicate", r.Duplicate), attribute.Bool("tidemq.delayed", r.Delayed))
			if !r.Delayed {
				attrs = append(attrs, attribute.Int64("messaging.message.offset", int64(r.Offset)))
			}
		}
		if s.scs != nil && err == nil {
			s.tel.recorder.RecordSpan(s.scs[i], s.parentOf(i), SpanSend, trace.SpanKindProducer, s.start, now, attrs)
			continue
		}
		var sp trace.Span
		if s.spans != nil {
			sp = s.spans[i]
		} else {
			// A failed send through a recorder: the error needs a span of
			// its own (the message was not stored, so nothing refers to
			// the context it was given).
			_, sp = s.tel.tracer.Start(trace.ContextWithSpanContext(context.Background(), s.parentOf(i)), SpanSend,
				producerKind, trace.WithTimestamp(s.start))
		}
		sp.SetAttributes(attrs...)
		if err != nil {
			sp.RecordError(err)
			sp.SetStatus(codes.Error, err.Error())
		}
		sp.End()
	}
}

// appendAttemptAttrs appends the attributes of one delivery attempt's
// spans to dst; msgID is left out when unknown. A pull or an ack of many
// messages reuses one buffer, as spans copy (or encode) their attributes.
func appendAttemptAttrs(dst []attribute.KeyValue, topic, group string, queue uint32, offset uint64, attempt int, consumer, msgID string) []attribute.KeyValue {
	dst = append(dst,
		attribute.String("messaging.system", "tidemq"),
		attribute.String("messaging.destination.name", topic),
		attribute.String("messaging.consumer.group.name", group),
		attribute.Int("messaging.destination.partition.id", int(queue)),
		attribute.Int64("messaging.message.offset", int64(offset)),
		attribute.Int("tidemq.delivery_attempt", attempt),
		attribute.String("messaging.client.id", consumer),
	)
	if msgID != "" {
		dst = append(dst, attribute.String("messaging.message.id", msgID))
	}
	return dst
}
