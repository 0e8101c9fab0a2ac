package core

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
)

type settleKind int

const (
	settleAck settleKind = iota
	settleNack
	settleDead
)

// MaxReasonLen caps a nack or dead-letter reason.
const MaxReasonLen = 1024

// Ack settles messages as consumed. It answers per handle; the whole call
// fails only when the subscription does not exist or the store fails.
func (b *Broker) Ack(ctx context.Context, topicName, group string, handles []string) (int, []HandleResult, error) {
	return b.settle(ctx, topicName, group, handles, settleAck, "", -1)
}

// Nack hands messages back for delivery after delay, or after the
// subscription's next retry delay when delay < 0. A message whose last
// allowed delivery failed goes to the DLQ instead.
func (b *Broker) Nack(ctx context.Context, topicName, group string, handles []string, delay time.Duration, reason string) (int, []HandleResult, error) {
	if len(reason) > MaxReasonLen {
		return 0, nil, invalid("/reason", "at most %d bytes", MaxReasonLen)
	}
	return b.settle(ctx, topicName, group, handles, settleNack, reason, delay)
}

// DeadLetter moves messages to the DLQ at once.
func (b *Broker) DeadLetter(ctx context.Context, topicName, group string, handles []string, reason string) (int, []HandleResult, error) {
	if len(reason) > MaxReasonLen {
		return 0, nil, invalid("/reason", "at most %d bytes", MaxReasonLen)
	}
	return b.settle(ctx, topicName, group, handles, settleDead, reason, -1)
}

// handlesTarget checks a list of receipt handles and finds the
// subscription they are for, with its topic's queues.
func (b *Broker) handlesTarget(topicName, group string, handles []string) (*subscription, []*queue, error) {
	if len(handles) == 0 || len(handles) > MaxMaxMessages {
		return nil, nil, invalid("/receiptHandles", "must hold 1-%d handles", MaxMaxMessages)
	}
	s, err := b.subscription(topicName, group)
	if err != nil {
		return nil, nil, err
	}
	b.mu.RLock()
	defer b.mu.RUnlock()
	return s, s.topic.queues, nil
}

// distinctHandles is handles with each listed once, first place kept: a
// handle listed twice is settled, counted and reported once. Short lists,
// the common case, are checked in place without allocating.
func distinctHandles(handles []string) []string {
	if len(handles) <= 32 {
		for i := 1; i < len(handles); i++ {
			if slices.Contains(handles[:i], handles[i]) {
				return distinctFrom(handles)
			}
		}
		return handles
	}
	return distinctFrom(handles)
}

func distinctFrom(handles []string) []string {
	seen := make(map[string]struct{}, len(handles))
	out := make([]string, 0, len(handles))
	for _, h := range handles {
		if _, dup := seen[h]; !dup {
			seen[h] = struct{}{}
			out = append(out, h)
		}
	}
	return out
}

func (b *Broker) settle(ctx context.Context, topicName, group string, handles []string, kind settleKind, reason string, delay time.Duration) (int, []HandleResult, error) {
	s, queues, err := b.handlesTarget(topicName, group, handles)
	if err != nil {
		return 0, nil, err
	}
	handles = distinctHandles(handles)
	nowMs := b.now().UnixMilli()
	var failed []HandleResult
	n := 0
	s.lock()
	byCursor := map[*cursor][]*delivery{}
	var preRestart map[*cursor]map[uint32][]uint64 // rare: acks of leases from before a restart
	var handleOf map[*delivery]string              // orderly failures: a failure revokes the key's later handles
	if s.rec.Orderly && kind != settleAck {
		handleOf = map[*delivery]string{}
	}
	for _, h := range handles {
		c, d, err := s.lookupLocked(queues, h)
		switch {
		case errors.Is(err, errAlreadyDone) && kind == settleAck:
			n++
		case errors.Is(err, errPreRestart) && kind == settleAck:
			c.queues[d.queue].preAcked[d.offset] = true
			if preRestart == nil {
				preRestart = map[*cursor]map[uint32][]uint64{}
			}
			if preRestart[c] == nil {
				preRestart[c] = map[uint32][]uint64{}
			}
			preRestart[c][d.queue] = append(preRestart[c][d.queue], d.offset)
			n++
		case errors.Is(err, errAlreadyDone), errors.Is(err, errPreRestart):
			// Only an ack can settle what this run no longer tracks.
			failed = append(failed, HandleResult{ReceiptHandle: h, Err: ErrReceiptExpired})
		case err != nil:
			failed = append(failed, HandleResult{ReceiptHandle: h, Err: err})
		default:
			byCursor[c] = append(byCursor[c], d)
			if handleOf != nil {
				handleOf[d] = h
			}
			n++
		}
	}
	if handleOf != nil {
		for c, ds := range byCursor {
			kept := ds[:0]
			for _, d := range ds {
				if c.failsAfter(d, handleOf) {
					// An earlier message of its key fails in this call:
					// that revokes this handle, as it would a moment later.
					failed = append(failed, HandleResult{ReceiptHandle: handleOf[d], Err: ErrReceiptExpired})
					n--
					continue
				}
				kept = append(kept, d)
			}
			byCursor[c] = kept
		}
	}
	var reqs []*request
	for c, ds := range byCursor {
		var extra []func(Batch)
		if touched := preRestart[c]; touched != nil {
			extra = c.ackWrites(nil, touched)
			delete(preRestart, c)
		}
		req, err := s.settleLocked(c, ds, kind, reason, delay, nowMs, extra)
		if err != nil {
			s.mu.Unlock()
			return 0, nil, err
		}
		if req != nil {
			reqs = append(reqs, req)
		}
	}
	for c, touched := range preRestart {
		if req := s.queueWritesLocked(c.ackWrites(nil, touched), nil); req != nil {
			reqs = append(reqs, req)
		}
	}
	s.mu.Unlock()
	for _, req := range reqs {
		if err := <-req.done; err != nil {
			return 0, nil, err
		}
	}
	if kind == settleNack {
		b.timers.poke()
	}
	return n, failed, nil
}

// queueWritesLocked hands writes to the appender while the subscription
// lock is held, so the writes of one subscription reach the store in the
// order they were decided, with the effect they have on it. The caller
// waits on the request after unlocking. It queues nothing (nil) when
// there is nothing to write or change.
func (s *subscription) queueWritesLocked(writes []func(Batch), after func(), effects ...*effect) *request {
	if len(writes) == 0 && len(effects) == 0 {
		return nil
	}
	req := &request{kind: reqWrite, writes: writes, after: after, done: make(chan error, 1)}
	for _, e := range effects {
		req.effects = append(req.effects, subEffect{s, e})
	}
	if err := s.b.enqueue(context.Background(), req); err != nil {
		for _, e := range effects {
			s.handOver(e, true)
		}
		req.done <- err
	}
	return req
}

// history is the record of one finished delivery attempt.
func (s *subscription) history(c *cursor, d *delivery, outcome byte, reason string, nowMs int64) *HistoryRecord {
	return &HistoryRecord{
		ID: s.b.ids.Add(1), TopicID: s.rec.TopicID, QueueID: d.origQueue, Offset: d.origOffset, StateID: c.id,
		Attempt: d.attempt, ConsumerID: d.consumer, DeliveredAtMs: d.leasedAtMs,
		Outcome: outcome, Reason: reason, SettledAtMs: nowMs,
	}
}

// settleLocked decides the outcome of deliveries: it queues the writes
// that record it (with extra ones) to the appender, marks the deliveries
// settling, and leaves the change of memory to the request's effect,
// applied once the writes are durable.
func (s *subscription) settleLocked(c *cursor, ds []*delivery, kind settleKind, reason string, delay time.Duration, nowMs int64, extra []func(Batch)) (*request, error) {
	b := s.b
	touched := map[uint32][]uint64{}
	writes := extra
	var firstDue int64
	subID, topicID := s.id, s.rec.TopicID
	e := &effect{c: c, settled: make([]settlement, 0, len(ds))}
	// For the spans: the topic's name and the time, taken at the first;
	// each span's attributes, in one buffer in turn.
	var topic string
	var spanAt time.Time
	var attrs []attribute.KeyValue
	for _, d := range ds {
		outcome := kind
		if outcome == settleNack && d.attempt >= s.rec.MaxRetries+1 {
			outcome = settleDead
		}
		var msg *Message
		var parked *Parked
		if outcome != settleAck && !(outcome == settleNack && s.rec.Orderly && !d.isRetry()) {
			var err error
			msg, parked, err = s.readForSettle(d)
			if errors.Is(err, ErrMessageNotFound) {
				outcome = settleAck // retention removed it: nothing left to retry
			} else if err != nil {
				return nil, err
			}
		}
		if d.leased {
			var ho byte
			var span string
			switch outcome {
			case settleAck:
				ho, span = OutcomeAck, SpanAck
			case settleNack:
				ho, span = OutcomeNack, SpanNack
			default:
				ho, span = OutcomeDeadLetter, SpanDead
			}
			if b.tel.tracing {
				if topic == "" {
					topic, spanAt = b.topicName(s.topic), b.now()
				}
				attrs = s.appendSettleAttrs(attrs[:0], topic, d)
				if reason != "" {
					attrs = append(attrs, attribute.String("tidemq.reason", reason))
				}
				b.tel.event(d.trace, span, spanAt, attrs...)
			}
			h := s.history(c, d, ho, reason, nowMs)
			writes = append(writes, func(b Batch) { b.PutHistory(h) })
		}
		st := settlement{d: d, outcome: outcome}
		if d.recorded {
			// Done, parked as a retry (which keeps its attempts) or
			// recorded anew below: the record has served.
			d.recorded = false
			id, qid, off := c.id, d.queue, d.offset
			writes = append(writes, func(b Batch) { b.DeleteAttempt(id, qid, off) })
		}
		switch outcome {
		case settleAck:
			if d.isRetry() {
				p := &Parked{ID: d.offset, Kind: ParkedRetry}
				writes = append(writes, func(b Batch) { b.DeleteParked(p) })
			} else {
				touched[d.queue] = append(touched[d.queue], d.offset)
			}
		case settleDead:
			if !d.leased && b.tel.tracing {
				b.tel.event(d.trace, SpanDead, b.now(), append(s.settleAttrs(d), attribute.String("tidemq.reason", reason))...)
			}
			dead := &Dead{ID: b.ids.Add(1), SubID: subID, CursorID: c.id, DeadAtMs: nowMs, Attempt: d.attempt, Reason: reason, Msg: msg}
			writes = append(writes, func(b Batch) { b.PutDead(dead) })
			if parked != nil {
				writes = append(writes, func(b Batch) { b.DeleteParked(parked) })
			} else {
				touched[d.queue] = append(touched[d.queue], d.offset)
			}
		case settleNack:
			wait := delay
			if wait < 0 {
				wait = retryDelay(s.rec.RetryDelays, d.attempt)
			}
			st.dueMs = dueAfter(b.now(), wait)
			if s.rec.Orderly && !d.isRetry() {
				// Orderly: the message keeps its place and suspends its
				// key alone; other keys keep flowing.
				st.suspend = true
				rec := AttemptRecord{CursorID: c.id, QueueID: d.queue, Offset: d.offset, Attempt: d.attempt, DueMs: st.dueMs}
				d.recorded = true
				writes = append(writes, func(b Batch) { b.PutAttempt(rec) })
				e.settled = append(e.settled, st)
				continue
			}
			if parked == nil {
				// First failure: the message leaves its queue (the offset is
				// acked) and lives on as a parked retry of this cursor.
				parked = &Parked{ID: b.ids.Add(1), Kind: ParkedRetry, SubID: c.id, TopicID: topicID, Msg: msg}
				touched[d.queue] = append(touched[d.queue], d.offset)
				st.retry = &delivery{queue: RetryQueue, offset: parked.ID, attempt: d.attempt, consumer: d.consumer,
					origQueue: d.origQueue, origOffset: d.origOffset, heapIndex: -1, msgID: d.msgID, trace: d.trace}
			}
			parked.DueMs, parked.Attempt, parked.Reason = st.dueMs, d.attempt, reason
			p := parked
			writes = append(writes, func(b Batch) {
				b.PutParked(p)
				b.PutTimer(p.DueMs, p.ID, ParkedRetry)
			})
			if firstDue == 0 || st.dueMs < firstDue {
				firstDue = st.dueMs
			}
		}
		e.settled = append(e.settled, st)
	}
	for _, st := range e.settled {
		st.d.settling = st.state()
		if st.d.heapIndex >= 0 {
			heap.Remove(&c.leases, st.d.heapIndex) // no lease end while it settles; still leased
		}
		if st.suspend || st.outcome == settleDead && s.rec.Orderly {
			// A failure of an orderly message revokes the leases of its
			// key's messages after it; they go out again after it.
			if ks := c.keyOf(st.d); ks != nil {
				c.revokeAfter(ks, st.d)
			}
		}
		// The next message of an orderly key, a freed lease slot or a
		// suspension: what parked pulls may be waiting for.
		if s.rec.Orderly || st.suspend || !st.d.isRetry() && c.queues[st.d.queue].capped {
			e.wake = true
		}
	}
	var after func()
	if firstDue > 0 {
		after = func() { b.timerCommitted(firstDue) }
	}
	if len(e.settled) == 0 {
		return s.queueWritesLocked(c.ackWrites(writes, touched), after), nil
	}
	return s.queueWritesLocked(c.ackWrites(writes, touched), after, e), nil
}

// state is the mark a delivery carries while its settlement is applied.
func (st settlement) state() settleState {
	switch {
	case st.outcome != settleNack:
		return settlingDone
	case st.retry != nil:
		return settlingRetry
	default:
		return settlingKeep
	}
}

// readForSettle reads the full message of a delivery (and its parked record
// for a retry), needed to park it again or to dead-letter it.
func (s *subscription) readForSettle(d *delivery) (*Message, *Parked, error) {
	if d.isRetry() {
		p, err := s.b.store.ReadParked(ParkedRetry, d.offset)
		if err != nil {
			return nil, nil, err
		}
		return p.Msg, p, nil
	}
	m, err := s.b.store.ReadMessage(d.seq)
	return m, nil, err
}

// retryDelay is the delay after the attempt-th failed delivery; the last
// step of the schedule repeats.
func retryDelay(delays []time.Duration, attempt int) time.Duration {
	if len(delays) == 0 {
		delays = DefaultRetryDelays
	}
	i := min(max(attempt-1, 0), len(delays)-1)
	return delays[i]
}

// Extend keeps leased messages invisible for another invisible, counted
// from now. A handle whose lease ran out but whose message was not handed
// out again is leased anew.
func (b *Broker) Extend(ctx context.Context, topicName, group string, handles []string, invisible time.Duration) (int, []HandleResult, error) {
	if invisible < time.Second || invisible > MaxInvisibleSeconds*time.Second {
		return 0, nil, invalid("/invisibleSeconds", "must be between 1 and %d", MaxInvisibleSeconds)
	}
	s, queues, err := b.handlesTarget(topicName, group, handles)
	if err != nil {
		return 0, nil, err
	}
	handles = distinctHandles(handles)
	deadline := dueAfter(b.now(), invisible)
	s.lock()
	defer s.mu.Unlock()
	n := 0
	var failed []HandleResult
	var touched []*cursor
	var revived []func(Batch)
	for _, h := range handles {
		c, d, err := s.lookupLocked(queues, h)
		if errors.Is(err, errAlreadyDone) || errors.Is(err, errPreRestart) {
			err = ErrReceiptExpired
		}
		if err == nil && !d.leased && !d.ready {
			err = ErrReceiptExpired // parked for a retry meanwhile
		}
		if err != nil {
			failed = append(failed, HandleResult{ReceiptHandle: h, Err: err})
			continue
		}
		d.deadline = deadline
		if d.leased {
			heapFix(&c.leases, d)
		} else {
			// The consumer still holds the attempt whose lease ran out: it
			// was not a failed one after all.
			d.ready, d.leased = false, true
			heapPush(&c.leases, d)
			if d.recorded {
				revived = append(revived, c.unexpireWrite(d))
			}
		}
		if !slices.Contains(touched, c) {
			touched = append(touched, c)
		}
		n++
	}
	// A lease made shorter ends sooner than the waiters know.
	for _, c := range touched {
		s.noteLocked(c)
	}
	// Nobody waits for the record to be taken back: a restart before it
	// lands counts the attempt as failed, as it was when the lease ran out.
	s.queueWritesLocked(revived, nil)
	return n, failed, nil
}

// DeadMessage is one message of a DLQ.
type DeadMessage struct {
	Message *Message
	Topic   string
	Attempt int
	Reason  string
	DeadAt  time.Time
	Cursor  DLQCursor
}

// DLQCursor continues a DLQ listing after the entry it names.
type DLQCursor struct {
	DeadAtMs int64
	ID       uint64
}

// ListDead lists a subscription's DLQ, oldest first, limit per page.
func (b *Broker) ListDead(topicName, group string, limit int, after DLQCursor) ([]DeadMessage, *DLQCursor, error) {
	if limit < 1 || limit > MaxMaxMessages {
		return nil, nil, invalid("/limit", "must be between 1 and %d", MaxMaxMessages)
	}
	s, err := b.subscription(topicName, group)
	if err != nil {
		return nil, nil, err
	}
	var out []DeadMessage
	var next *DLQCursor
	err = b.store.ScanDead(s.id, 0, maxTimeMs, after.DeadAtMs, after.ID, func(d *Dead) bool {
		if len(out) == limit {
			next = &out[len(out)-1].Cursor
			return false
		}
		out = append(out, DeadMessage{Message: d.Msg, Topic: topicName, Attempt: d.Attempt, Reason: d.Reason,
			DeadAt: time.UnixMilli(d.DeadAtMs).UTC(), Cursor: DLQCursor{DeadAtMs: d.DeadAtMs, ID: d.ID}})
		return true
	})
	return out, next, err
}

const maxTimeMs = int64(1) << 62

// RedriveFilter chooses dead messages: by ids, or by tag and deadAt range;
// the zero value chooses all.
type RedriveFilter struct {
	MessageIDs []string
	Tag        string
	From, To   time.Time
	DryRun     bool
}

// Redrive puts dead messages back for delivery with fresh retries, each to
// the cursor it failed on. With DryRun it only counts them.
func (b *Broker) Redrive(ctx context.Context, topicName, group string, f RedriveFilter) (int, error) {
	s, err := b.subscription(topicName, group)
	if err != nil {
		return 0, err
	}
	ids := map[string]bool{}
	for _, id := range f.MessageIDs {
		ids[id] = true
	}
	fromMs, toMs := int64(0), maxTimeMs
	if !f.From.IsZero() {
		fromMs = f.From.UnixMilli()
	}
	if !f.To.IsZero() {
		toMs = f.To.UnixMilli()
	}
	var chosen []*Dead
	err = b.store.ScanDead(s.id, fromMs, toMs, 0, 0, func(d *Dead) bool {
		if len(ids) > 0 && !ids[d.Msg.ID] || f.Tag != "" && d.Msg.Tag != f.Tag {
			return true
		}
		chosen = append(chosen, d)
		return true
	})
	if err != nil || f.DryRun || len(chosen) == 0 {
		return len(chosen), err
	}
	nowMs := b.now().UnixMilli()
	s.lock()
	if s.deleted {
		s.mu.Unlock()
		return 0, fmt.Errorf("%w: %s", ErrSubscriptionNotFound, group)
	}
	writes := make([]func(Batch), 0, len(chosen))
	var effects []*effect
	byCursor := map[*cursor]*effect{}
	redriven := 0
	for _, d := range chosen {
		c := s.byID[d.CursorID]
		if c == nil {
			c = s.main
		}
		dead := d
		if c == nil {
			// Its broadcast consumer is gone: nothing to deliver it to.
			continue
		}
		p := &Parked{ID: b.ids.Add(1), Kind: ParkedRetry, SubID: c.id, TopicID: s.rec.TopicID, DueMs: nowMs, Msg: d.Msg, Reason: d.Reason}
		writes = append(writes, func(b Batch) {
			b.DeleteDead(dead)
			b.PutParked(p)
		})
		nd := &delivery{queue: RetryQueue, offset: p.ID, heapIndex: -1, dueMs: nowMs,
			origQueue: d.Msg.QueueID, origOffset: d.Msg.Offset, msgID: strings.Clone(d.Msg.ID)}
		if b.tel.tracing {
			nd.trace = b.tel.event(parseTraceparent(d.Msg.Traceparent), SpanRedrive,
				b.now(), append(messageAttrs(topicName, d.Msg), attribute.String("messaging.consumer.group.name", group))...)
		}
		e := byCursor[c]
		if e == nil {
			e = &effect{c: c, wake: true}
			byCursor[c] = e
			effects = append(effects, e)
		}
		e.redriven = append(e.redriven, nd)
		redriven++
	}
	var req *request
	if len(writes) > 0 {
		req = s.queueWritesLocked(writes, nil, effects...)
	}
	s.mu.Unlock()
	if req != nil {
		if err := <-req.done; err != nil {
			return 0, err
		}
	}
	s.wake()
	b.log.Info("dead messages redriven", "topic", topicName, "group", group, "count", redriven)
	return redriven, nil
}

// settleAttrs are the attributes of a settle span of a delivery.
func (s *subscription) settleAttrs(d *delivery) []attribute.KeyValue {
	return s.appendSettleAttrs(make([]attribute.KeyValue, 0, 10), s.b.topicName(s.topic), d)
}

// appendSettleAttrs is settleAttrs into dst, for a topic name the caller
// has: a settle of many deliveries reuses one buffer.
func (s *subscription) appendSettleAttrs(dst []attribute.KeyValue, topic string, d *delivery) []attribute.KeyValue {
	return appendAttemptAttrs(dst, topic, s.group, d.origQueue, d.origOffset, d.attempt, d.consumer, d.msgID)
}

// dueAfter is now+wait in Unix ms, rounded up: a retry is never due before
// its delay is over.
func dueAfter(now time.Time, wait time.Duration) int64 {
	return (now.Add(wait).UnixNano() + 999_999) / 1e6
}
