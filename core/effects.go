package core

import "slices"

// Memory follows durability. Deciding a request (a settle, a redrive, a
// seek, an admin change) reads memory and produces the batch's writes plus
// an effect: what the batch changes in a subscription's memory. The
// appender hands the effect over once its batch is durable (or failed),
// and the subscription applies it, in commit order, in catchUpLocked —
// before anything reads or changes it under its lock. The appender never
// waits for a subscription's lock itself: a pull holds it across store
// reads, and every commit would wait behind them.
//
// Between deciding and applying, the deliveries an effect settles are
// marked (delivery.settling), so nobody settles them twice and the
// watermark a later decision writes counts them as done.

// settleState marks a delivery whose settlement is decided and not yet
// applied, saying what it will be.
type settleState uint8

const (
	notSettling settleState = iota
	// settlingDone: acked or dead-lettered; its offset is done.
	settlingDone
	// settlingRetry: nacked out of its queue into a parked retry; its
	// offset is done.
	settlingRetry
	// settlingKeep: nacked in place (an orderly suspension, or a retry
	// parked again); it stays outstanding.
	settlingKeep
)

// settlement is one delivery's decided outcome.
type settlement struct {
	d       *delivery
	outcome settleKind
	// retry is the parked retry a first nack makes of a queue message.
	retry *delivery
	// dueMs is when a nacked delivery is due again.
	dueMs int64
	// suspend: an orderly nack keeps the message in place, suspending its key.
	suspend bool
}

// effect is what one durable batch changes in one subscription.
type effect struct {
	c        *cursor // the cursor settled, redriven to or sought
	settled  []settlement
	redriven []*delivery
	// seek holds new start offsets of c's queues by queue id.
	seek map[uint32]uint64
	// member is a broadcast consumer's new cursor.
	member *cursor
	// rec and filter replace the subscription's definition.
	rec    *SubscriptionRecord
	filter *tagFilter
	// growTo is the topic's new queue count.
	growTo  int
	deleted bool
	// wake says the effect may make a message ready (or end the
	// subscription), so parked pulls should look again.
	wake bool
}

// subEffect is an effect for the subscription it changes.
type subEffect struct {
	s *subscription
	e *effect
}

// handOver gives the subscription an effect whose batch is done; failed
// says the batch did not become durable, so the decision is undone.
func (s *subscription) handOver(e *effect, failed bool) {
	s.effectsMu.Lock()
	s.effects = append(s.effects, pendingEffect{e, failed})
	s.nEffects.Store(int32(len(s.effects)))
	s.effectsMu.Unlock()
	if e.wake || failed {
		s.wake()
	}
}

type pendingEffect struct {
	e      *effect
	failed bool
}

// lock takes the subscription's lock with every durable effect applied.
func (s *subscription) lock() {
	s.mu.Lock()
	s.catchUpLocked()
}

// catchUpLocked applies the effects handed over so far, oldest first.
// Caller holds s.mu.
func (s *subscription) catchUpLocked() {
	if s.nEffects.Load() == 0 {
		return
	}
	s.effectsMu.Lock()
	list := s.effects
	s.effects = nil
	s.nEffects.Store(0)
	s.effectsMu.Unlock()
	var noted []*cursor
	for _, pe := range list {
		if pe.failed {
			s.undoLocked(pe.e)
		} else {
			s.applyLocked(pe.e)
		}
		if c := pe.e.c; c != nil && !slices.Contains(noted, c) {
			noted = append(noted, c)
		}
	}
	for _, c := range noted {
		// Applying may move a watermark past offsets a scan skipped
		// meanwhile, which no decided write holds yet.
		s.persistSkippedLocked(c)
		s.noteLocked(c)
	}
}

// applyLocked makes memory what a durable batch says.
func (s *subscription) applyLocked(e *effect) {
	c := e.c
	var advanced []uint32
	for _, st := range e.settled {
		d := st.d
		d.settling = notSettling
		if !d.isRetry() && !st.suspend && !slices.Contains(advanced, d.queue) {
			advanced = append(advanced, d.queue)
		}
		switch {
		case st.outcome == settleAck:
			c.done(d)
		case st.outcome == settleDead:
			c.done(d)
			s.nDead++
		case st.suspend:
			c.suspend(d, st.dueMs)
			d.leaseID = 0 // the nacked lease's handle is spent
		case st.retry != nil:
			c.done(d)
			st.retry.dueMs = st.dueMs
			c.addRetry(st.retry)
		default: // a retry parked again
			d.leased, d.ready, d.dueMs = false, false, st.dueMs
			d.leaseID = 0
		}
	}
	for _, qid := range advanced {
		c.advance(c.queues[qid])
	}
	for _, d := range e.redriven {
		c.addRetry(d)
		c.makeReady(d)
		s.nDead--
	}
	for qid, start := range e.seek {
		if int(qid) >= len(c.queues) {
			continue
		}
		for k, d := range c.deliveries {
			if k.queue == qid {
				if d.heapIndex >= 0 {
					heapRemove(&c.leases, d)
				}
				d.ready = false
				delete(c.deliveries, k)
			}
		}
		c.queues[qid] = newSubQueue(qid, start)
		c.readyNow = true
	}
	if m := e.member; m != nil && !s.deleted {
		s.members[m.consumerID] = m
		s.byID[m.id] = m
	}
	if e.rec != nil {
		if e.rec.Filter != s.rec.Filter {
			// Offsets the old filter skipped above an outstanding one are
			// done only in memory: like a restart, read on from the
			// watermark, passing what is outstanding or acked.
			for _, c := range s.byID {
				for _, sq := range c.queues {
					sq.rescanTo = max(sq.rescanTo, sq.next)
					sq.next = sq.acked
				}
				c.readyNow = true
			}
		}
		s.rec, s.filter = e.rec, e.filter
	}
	if e.growTo > 0 {
		for _, c := range s.byID {
			c.growQueues(e.growTo)
		}
	}
	if e.deleted {
		s.deleted = true
		s.stopWakeTimerLocked()
	}
}

// undoLocked takes back a decision whose batch failed: its deliveries are
// outstanding as before, leased until their leases end.
func (s *subscription) undoLocked(e *effect) {
	c := e.c
	if len(e.settled) == 0 {
		return // nothing else was changed before the batch was durable
	}
	for _, st := range e.settled {
		d := st.d
		d.settling = notSettling
		switch {
		case d.leased && d.heapIndex < 0:
			heapPush(&c.leases, d)
		case !d.leased && !d.ready && !d.suspended && !d.isRetry():
			c.readyIfHead(d) // an expired lease on its way to the DLQ
		}
	}
	// What this run believes is on disk may be ahead of it: write the
	// watermark and acks again with the next decision.
	for _, sq := range c.queues {
		sq.persistedWM = ^uint64(0)
		clear(sq.durableAcks)
	}
}
