package core

import (
	"container/heap"
	"context"
	"strings"

	"errors"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
)

func heapRemove(h *leaseHeap, d *delivery) {
	if d.heapIndex >= 0 {
		heap.Remove(h, d.heapIndex)
	}
	d.leased = false
}

func heapFix(h *leaseHeap, d *delivery) { heap.Fix(h, d.heapIndex) }

func heapPush(h *leaseHeap, d *delivery) { heap.Push(h, d) }

// timerWake lets the timer loop sleep until the earliest due time it knows
// of, and be woken early when a sooner timer is added.
type timerWake struct {
	mu   sync.Mutex
	next int64 // earliest due time added since the last scan; 0 = none
	kick chan struct{}
}

func newTimerWake() *timerWake { return &timerWake{kick: make(chan struct{}, 1)} }

// wantAt asks for a scan at dueMs or sooner.
func (w *timerWake) wantAt(dueMs int64) {
	w.mu.Lock()
	sooner := w.next == 0 || dueMs < w.next
	if sooner {
		w.next = dueMs
	}
	w.mu.Unlock()
	if sooner {
		w.poke()
	}
}

func (w *timerWake) poke() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// passed forgets the wanted due time once the scan at nowMs has covered
// it; a due time still ahead is kept, so the loop sleeps only until then.
func (w *timerWake) passed(nowMs int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.next <= nowMs {
		w.next = 0
	}
}

// Timer loop pacing.
const (
	timerIdleScan     = time.Second
	retentionEvery    = 30 * time.Second
	timerCleanupEvery = time.Minute
	maxFiresPerScan   = 4096
)

// timerLoop is the one timer loop of the broker. It scans the timer index
// from the last due time it processed (never from the start: a queue's
// head collects tombstones), makes due retries ready and appends due
// delayed messages, and runs retention.
func (b *Broker) timerLoop() {
	idle := time.NewTimer(0)
	defer idle.Stop()
	var lastRetention, lastCleanup time.Time
	for {
		select {
		case <-b.closing:
			return
		case <-idle.C:
		case <-b.timers.kick:
		}
		now := b.now()
		b.timers.passed(now.UnixMilli())
		more := b.fireDue(now.UnixMilli())
		if now.Sub(lastRetention) >= retentionEvery {
			lastRetention = now
			if err := b.EnforceRetention(); err != nil && !errors.Is(err, ErrClosed) {
				b.log.Error("retention", "err", err)
			}
		}
		if now.Sub(lastCleanup) >= timerCleanupEvery {
			lastCleanup = now
			b.cleanupTimers()
		}
		wait := timerIdleScan
		if more {
			wait = 0
		}
		b.timers.mu.Lock()
		if n := b.timers.next; n > 0 {
			wait = min(wait, max(time.Duration(n-b.now().UnixMilli())*time.Millisecond, 0))
		}
		b.timers.mu.Unlock()
		idle.Reset(wait)
	}
}

// fireDue processes timers due up to nowMs. It reports whether it stopped
// early with more due.
func (b *Broker) fireDue(nowMs int64) bool {
	from := b.timerCursor.Load()
	// Timers committed behind the cursor since the last scan: taken before
	// the scan opens its iterator, so one committed after this point is
	// either seen by this scan or left for the next.
	if low := b.timerLow.Swap(0); low > 0 && low < from {
		from = low
	}
	type fire struct {
		due  int64
		id   uint64
		kind byte
	}
	var fires []fire
	err := b.store.ScanTimers(from, nowMs, func(due int64, id uint64, kind byte) bool {
		fires = append(fires, fire{due, id, kind})
		return len(fires) < maxFiresPerScan
	})
	if err != nil {
		if !errors.Is(err, ErrClosed) {
			b.log.Error("scanning timers", "err", err)
		}
		return false
	}
	var delayed []*Parked
	for _, f := range fires {
		switch f.kind {
		case ParkedRetry:
			b.fireRetry(f.id, f.due)
		case TimerTransaction:
			b.fireTransaction(f.id, f.due)
		case ParkedDelayed:
			p, err := b.store.ReadParked(ParkedDelayed, f.id)
			if err != nil {
				if !errors.Is(err, ErrMessageNotFound) {
					b.log.Error("reading a delayed message", "err", err, "id", f.id)
					return false
				}
				continue
			}
			if p.DueMs == f.due {
				delayed = append(delayed, p)
			}
		}
	}
	if len(delayed) > 0 {
		if err := b.appendDelayed(delayed); err != nil {
			b.log.Error("appending delayed messages", "err", err)
			return false
		}
	}
	if len(fires) == maxFiresPerScan {
		last := fires[len(fires)-1]
		// Resume at the same millisecond: ids in it past the last one
		// are fired on the next scan (a retry fired twice is a no-op;
		// a delayed message is deleted when appended).
		b.timerCursor.Store(last.due)
		return true
	}
	b.timerCursor.Store(nowMs + 1)
	return false
}

// timerCommitted is called once a timer due at dueMs is durable. The next
// scan starts no later than dueMs, so a timer committed while a scan was
// passing its time (a nack with no delay) is never skipped.
func (b *Broker) timerCommitted(dueMs int64) {
	for {
		low := b.timerLow.Load()
		if low != 0 && low <= dueMs || b.timerLow.CompareAndSwap(low, dueMs) {
			break
		}
	}
	b.timers.wantAt(dueMs)
}

// fireRetry makes a parked retry ready for delivery.
func (b *Broker) fireRetry(id uint64, due int64) {
	p, err := b.store.ReadParked(ParkedRetry, id)
	if err != nil {
		if !errors.Is(err, ErrMessageNotFound) {
			b.log.Error("reading a parked retry", "err", err, "id", id)
		}
		return
	}
	b.mu.RLock()
	s := b.subsByID[p.SubID]
	b.mu.RUnlock()
	if s == nil {
		return
	}
	s.lock()
	if c := s.byID[p.SubID]; c != nil {
		d := c.deliveries[dkey{RetryQueue, id}]
		if d != nil && !d.leased && !d.ready && d.dueMs == due {
			c.makeReady(d)
			if !d.trace.IsValid() {
				d.trace = parseTraceparent(p.Msg.Traceparent)
				d.msgID = strings.Clone(p.Msg.ID)
			}
			if b.tel.tracing {
				b.tel.event(d.trace, SpanRetry, b.now(), append(s.settleAttrs(d), attribute.String("tidemq.reason", p.Reason))...)
			}
			s.noteLocked(c)
		}
	}
	s.mu.Unlock()
}

// appendDelayed appends due delayed messages to their queues and deletes
// their parked records in the same batch, so none is appended twice.
func (b *Broker) appendDelayed(ps []*Parked) error {
	byTopic := map[uint32][]*Parked{}
	for _, p := range ps {
		byTopic[p.TopicID] = append(byTopic[p.TopicID], p)
	}
	for topicID, ps := range byTopic {
		b.mu.RLock()
		t := b.topicsByID[topicID]
		var nq uint32
		if t != nil {
			nq = uint32(len(t.queues))
		}
		b.mu.RUnlock()
		parked := ps
		if t == nil {
			// The topic was deleted: drop its delayed messages.
			req := &request{kind: reqWrite, writes: []func(Batch){func(batch Batch) {
				for _, p := range parked {
					batch.DeleteParked(p)
				}
			}}}
			if err := b.submit(context.Background(), req); err != nil {
				return err
			}
			continue
		}
		msgs := make([]*Message, len(ps))
		now := b.now()
		for i, p := range ps {
			m := p.Msg
			if b.tel.tracing {
				b.tel.event(parseTraceparent(m.Traceparent), SpanDelayFire, now, messageAttrs(t.rec.Name, m)...)
			}
			m.TopicID = topicID
			if m.QueueID >= nq {
				m.QueueID %= nq
			}
			m.DeliverAtMs = 0
			m.DedupKey = ""
			msgs[i] = m
		}
		req := &request{kind: reqAppend, topic: t, msgs: msgs, writes: []func(Batch){func(batch Batch) {
			for _, p := range parked {
				batch.DeleteParked(p)
			}
		}}}
		if err := b.submit(context.Background(), req); err != nil {
			return err
		}
	}
	return nil
}

// cleanupTimers drops processed timers with one range tombstone. It is a
// batch of its own and takes its bound when applied: every timer committed
// before it has then reported itself (timerLow), so none that still has to
// fire is below the bound, and none in the same batch is covered.
func (b *Broker) cleanupTimers() {
	req := &request{kind: reqAdmin, admin: func(batch Batch) {
		bound := b.timerCursor.Load()
		if low := b.timerLow.Load(); low > 0 && low < bound {
			bound = low
		}
		if bound > 0 {
			batch.DeleteTimersBefore(bound)
		}
	}}
	if err := b.submit(context.Background(), req); err != nil && !errors.Is(err, ErrClosed) {
		b.log.Error("cleaning up timers", "err", err)
	}
}
