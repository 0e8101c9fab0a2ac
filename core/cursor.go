package core

import (
	"container/heap"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// A cursor is one consumer position over a topic: the subscription's for
// clustering mode, one per consumer for broadcast mode. Its id names its
// durable state (watermarks, acks, parked retries) and appears in receipt
// handles. All fields are guarded by the subscription's mutex.
type cursor struct {
	id         uint32
	consumerID string // broadcast members only
	queues     []*subQueue
	deliveries map[dkey]*delivery
	leases     leaseHeap   // leased, and (orderly) suspended, deliveries by deadline
	released   []*delivery // ready to go out again, oldest first
	rr         int
	nRetry     int64 // parked retries: waiting, ready or leased
	// retryOf finds the live retry of a queue position, so a handle of the
	// delivery that was nacked is told apart from one that was acked.
	retryOf map[dkey]*delivery
	// readyNow notes that a change under the lock made a delivery ready
	// (or freed a lease slot a scan stopped at); the subscription's
	// noteLocked turns it into a wake-up of the parked pulls.
	readyNow bool
}

type dkey struct {
	queue  uint32
	offset uint64
}

// delivery is an outstanding message: leased, ready to go out again,
// suspended (orderly: its key waits out a retry delay), or a parked retry
// waiting for its timer.
type delivery struct {
	queue      uint32
	offset     uint64
	seq        uint64
	keyHash    uint32
	origQueue  uint32 // where the message lives in its topic (for history)
	origOffset uint64
	attempt    int // deliveries made so far
	leaseID    uint64
	deadline   int64 // Unix ms: lease end, or end of a suspension
	leased     bool
	suspended  bool
	ready      bool // in cursor.released
	// settling marks a decided settlement not yet applied (effects.go).
	settling settleState
	// recorded says an AttemptRecord of it is stored (or decided), to be
	// deleted when it is done.
	recorded   bool
	dueMs      int64 // parked retries: when the timer makes it ready
	consumer   string
	leasedAtMs int64
	heapIndex  int
	// Known once the message was read for its first delivery: its id (a
	// copy: a read message's strings share its body's allocation), and the
	// span context its later spans (ack, nack, …) are children of.
	msgID string
	trace trace.SpanContext
}

func (d *delivery) isRetry() bool { return d.queue == RetryQueue }

type subQueue struct {
	id    uint32
	acked uint64 // watermark: every offset below it is done
	next  uint64 // cursor: offsets at or above it were never handed out
	out   window // outstanding offsets in [acked, next)
	nOut  int
	// preAcked holds acks above the watermark restored at open: the cursor
	// skips them when it gets there.
	preAcked map[uint64]bool
	// durableAcks are acks above the persisted watermark that are on disk.
	durableAcks map[uint64]bool
	// rescanTo is where next stood when a filter change sent it back to
	// the watermark: offsets below it may be outstanding or acked already.
	rescanTo uint64
	// attempts holds the stored progress of offsets above the watermark
	// not handed out since the start: the scan gives it back to them.
	attempts    map[uint64]AttemptRecord
	persistedWM uint64
	// capped is set when a scan stopped at the lease cap: the next done
	// makes room for a message the parked pulls may take.
	capped bool
	// keys holds, for orderly subscriptions, every sharding key with an
	// outstanding message: its one head delivery and the later messages
	// of the key the cursor passed while the head was out.
	keys map[uint32]*keyState
}

type keyState struct {
	head    *delivery
	waiting []IndexEntry
}

func newCursor(id uint32, consumerID string) *cursor {
	return &cursor{id: id, consumerID: consumerID, deliveries: map[dkey]*delivery{}, retryOf: map[dkey]*delivery{}}
}

func newSubQueue(id uint32, start uint64) *subQueue {
	return &subQueue{id: id, acked: start, next: start, persistedWM: start,
		preAcked: map[uint64]bool{}, durableAcks: map[uint64]bool{}, keys: map[uint32]*keyState{}}
}

func (c *cursor) growQueues(n int) {
	for i := len(c.queues); i < n; i++ {
		c.queues = append(c.queues, newSubQueue(uint32(i), 0))
	}
}

// restore sets the queues from their durable positions.
func (c *cursor) restore(n int, acks []QueueAcks) {
	c.growQueues(n)
	for _, a := range acks {
		if int(a.QueueID) >= len(c.queues) {
			continue
		}
		sq := c.queues[a.QueueID]
		sq.acked, sq.next, sq.persistedWM = a.Watermark, a.Watermark, a.Watermark
		for _, o := range a.Acked {
			if o >= a.Watermark {
				sq.preAcked[o] = true
			}
			sq.durableAcks[o] = true
		}
	}
}

// restoreAttempts gives the cursor the attempts stored for its
// deliveries: parked retries at once, queue offsets when the scan reaches
// them. Records below the watermark are stale (the offset is done).
func (c *cursor) restoreAttempts(recs []AttemptRecord) {
	for _, r := range recs {
		if r.QueueID == RetryQueue {
			if d := c.deliveries[dkey{RetryQueue, r.Offset}]; d != nil {
				d.attempt, d.recorded = max(d.attempt, r.Attempt), true
			}
			continue
		}
		if int(r.QueueID) >= len(c.queues) {
			continue
		}
		sq := c.queues[r.QueueID]
		if r.Offset < sq.acked || sq.preAcked[r.Offset] {
			continue
		}
		if sq.attempts == nil {
			sq.attempts = map[uint64]AttemptRecord{}
		}
		sq.attempts[r.Offset] = r
	}
}

// unexpireWrite takes back the failed attempt stored when d's lease ran
// out (Extend revived the lease).
func (c *cursor) unexpireWrite(d *delivery) func(Batch) {
	rec := AttemptRecord{CursorID: c.id, QueueID: d.queue, Offset: d.offset, Attempt: d.attempt - 1}
	if rec.Attempt > 0 {
		return func(b Batch) { b.PutAttempt(rec) }
	}
	d.recorded = false
	return func(b Batch) { b.DeleteAttempt(rec.CursorID, rec.QueueID, rec.Offset) }
}

// leaseWork is what one pull asks of a cursor.
type leaseWork struct {
	max       int
	deadline  int64 // lease end
	nowMs     int64
	now       time.Time
	consumer  string
	orderly   bool
	filter    *tagFilter
	maxRetry  int
	delays    []time.Duration
	maxLeases int
	more      bool // a scan stopped at its bound with entries left
}

// leased is a handed-out delivery, read outside the lock.
type leased struct {
	queue   uint32
	offset  uint64
	seq     uint64
	attempt int
	leaseID uint64
}

func (c *cursor) take(s *subscription, w *leaseWork, d *delivery, out []leased) []leased {
	d.ready, d.suspended = false, false
	d.attempt++
	d.leaseID = s.b.leaseIDs.Add(1)
	d.deadline = w.deadline
	d.leased = true
	d.consumer = w.consumer
	d.leasedAtMs = w.nowMs
	heap.Push(&c.leases, d)
	return append(out, leased{queue: d.queue, offset: d.offset, seq: d.seq, attempt: d.attempt, leaseID: d.leaseID})
}

// scan reads new index entries of one queue into deliveries. It notes in w
// when it stopped at its bound with entries left (the pull should look
// again rather than wait).
func (c *cursor) scan(s *subscription, w *leaseWork, q *queue, sq *subQueue, out []leased) ([]leased, error) {
	if minOff := q.min.Load(); sq.next < minOff {
		// Retention removed messages this cursor never got.
		sq.next = minOff
		c.advance(sq)
		for o := range sq.attempts {
			if o < minOff {
				delete(sq.attempts, o)
			}
		}
	}
	visible := q.next.Load()
	if sq.next >= visible {
		return out, nil
	}
	if sq.nOut >= w.maxLeases {
		sq.capped = true
		return out, nil
	}
	want := w.max - len(out)
	if !w.filter.all() || w.orderly {
		// A selective filter or busy keys may skip many entries; bound
		// the scan so one pull's work stays small.
		want = max(want, 4096)
	}
	limit := min(visible, sq.next+uint64(want))
	if limit < visible {
		w.more = true
	}
	err := s.b.store.ScanQueue(q.topicID, sq.id, sq.next, limit, func(e IndexEntry) bool {
		sq.next = e.Offset + 1
		if sq.preAcked[e.Offset] {
			delete(sq.preAcked, e.Offset)
			return true
		}
		if e.Offset < sq.rescanTo && (sq.out.has(e.Offset) || sq.durableAcks[e.Offset]) {
			return true // read again after a filter change: outstanding, or acked
		}
		if !w.filter.mayMatch(e.TagHash) {
			return true
		}
		sq.out.set(e.Offset)
		sq.nOut++
		if w.orderly {
			if ks := sq.keys[e.KeyHash]; ks != nil {
				ks.waiting = append(ks.waiting, e)
				return sq.nOut < w.maxLeases
			}
		}
		d, dueMs := sq.newDelivery(e)
		c.deliveries[dkey{sq.id, e.Offset}] = d
		if w.orderly {
			sq.keys[e.KeyHash] = &keyState{head: d}
		}
		if dueMs > w.nowMs {
			c.suspend(d, dueMs) // its key was suspended before the restart
			return sq.nOut < w.maxLeases
		}
		out = c.take(s, w, d, out)
		return len(out) < w.max && sq.nOut < w.maxLeases
	})
	if sq.nOut >= w.maxLeases {
		sq.capped = true
	}
	// Offsets the filter skipped or that were acked already count as done.
	c.advance(sq)
	return out, err
}

func newQueueDelivery(queueID uint32, e IndexEntry) *delivery {
	return &delivery{queue: queueID, offset: e.Offset, seq: e.Seq, keyHash: e.KeyHash,
		origQueue: queueID, origOffset: e.Offset, heapIndex: -1}
}

// newDelivery makes the delivery of an index entry, with the attempts
// stored for it before the start and the end of its key's suspension
// (0: none).
func (sq *subQueue) newDelivery(e IndexEntry) (*delivery, int64) {
	d := newQueueDelivery(sq.id, e)
	rec, ok := sq.attempts[e.Offset]
	if !ok {
		return d, 0
	}
	delete(sq.attempts, e.Offset)
	d.attempt, d.recorded = rec.Attempt, true
	return d, rec.DueMs
}

// advance moves the watermark to the lowest outstanding offset.
func (c *cursor) advance(sq *subQueue) bool {
	wm := sq.next
	if o, ok := sq.out.first(sq.acked); ok && o < wm {
		wm = o
	}
	if wm <= sq.acked {
		return false
	}
	sq.acked = wm
	sq.out.trim(wm)
	return true
}

// expire ends leases and suspensions that ran out by nowMs. A lease that
// ran out is a failed attempt: it goes out again at once (clustering), or
// its key is suspended for the retry delay (orderly); past maxRetries it
// is returned to be dead-lettered. A suspension that ran out makes its
// delivery ready.
func (c *cursor) expire(w *leaseWork) (expired, dead []*delivery) {
	for len(c.leases) > 0 && c.leases[0].deadline <= w.nowMs {
		d := heap.Pop(&c.leases).(*delivery)
		if d.suspended {
			d.suspended = false
			c.makeReady(d)
			continue
		}
		d.leased = false
		expired = append(expired, d)
		switch {
		case d.attempt >= w.maxRetry+1:
			dead = append(dead, d)
		case w.orderly && !d.isRetry():
			c.suspend(d, dueAfter(w.now, retryDelay(w.delays, d.attempt)))
		default:
			c.makeReady(d)
		}
	}
	return expired, dead
}

// makeReady queues a delivery to go out again and notes it for the
// parked pulls.
func (c *cursor) makeReady(d *delivery) {
	d.ready = true
	c.released = append(c.released, d)
	c.readyNow = true
}

// suspend holds an orderly delivery (and so its key) until untilMs.
func (c *cursor) suspend(d *delivery, untilMs int64) {
	if d.heapIndex >= 0 {
		heap.Remove(&c.leases, d.heapIndex)
	}
	d.leased = false
	d.ready = false
	d.suspended = true
	d.deadline = untilMs
	heap.Push(&c.leases, d)
}

// done removes an outstanding delivery; for an orderly queue the next
// message of its key becomes ready. Both that and a freed lease slot are
// noted for the parked pulls.
func (c *cursor) done(d *delivery) {
	if d.heapIndex >= 0 {
		heap.Remove(&c.leases, d.heapIndex)
	}
	d.leased, d.suspended, d.ready = false, false, false
	delete(c.deliveries, dkey{d.queue, d.offset})
	if d.isRetry() {
		c.nRetry--
		if k := (dkey{d.origQueue, d.origOffset}); c.retryOf[k] == d {
			delete(c.retryOf, k)
		}
		return
	}
	sq := c.queues[d.queue]
	sq.out.clear(d.offset)
	sq.nOut--
	if sq.capped {
		sq.capped = false
		c.readyNow = true
	}
	if ks := sq.keys[d.keyHash]; ks != nil && ks.head == d {
		if len(ks.waiting) == 0 {
			delete(sq.keys, d.keyHash)
			return
		}
		e := ks.waiting[0]
		ks.waiting = ks.waiting[1:]
		nd, dueMs := sq.newDelivery(e)
		c.deliveries[dkey{sq.id, e.Offset}] = nd
		ks.head = nd
		if dueMs > 0 {
			c.suspend(nd, dueMs) // the next lease-end check makes it ready once due
		} else {
			c.makeReady(nd)
		}
	}
}

// release gives a lease back without counting the attempt: the client
// never saw the message.
func (c *cursor) release(l leased) bool {
	d := c.deliveries[dkey{l.queue, l.offset}]
	if d == nil || d.leaseID != l.leaseID || !d.leased || d.settling != notSettling {
		return false
	}
	heap.Remove(&c.leases, d.heapIndex)
	d.leased = false
	d.attempt--
	d.ready = true
	c.released = append([]*delivery{d}, c.released...)
	c.readyNow = true
	return true
}

// ackWrites makes acks of queue offsets durable: the watermark each
// touched queue will have once the decided settlements are applied, acks
// above it, and the acks it has passed. persistedWM and durableAcks say
// what the decided writes hold, so each is written once.
func (c *cursor) ackWrites(batch []func(Batch), touched map[uint32][]uint64) []func(Batch) {
	for qid, offsets := range touched {
		sq := c.queues[qid]
		wm := c.projectedWatermark(sq)
		id := c.id
		var put, del []uint64
		setWM := false
		if wm != sq.persistedWM {
			setWM = true
			sq.persistedWM = wm
			for o := range sq.durableAcks {
				if o < wm {
					del = append(del, o)
					delete(sq.durableAcks, o)
				}
			}
		}
		for _, o := range offsets {
			if o >= wm && !sq.durableAcks[o] {
				put = append(put, o)
				sq.durableAcks[o] = true
			}
		}
		if setWM || len(put) > 0 || len(del) > 0 {
			batch = append(batch, func(b Batch) {
				if setWM {
					b.PutAckWatermark(id, qid, wm)
				}
				for _, o := range put {
					b.PutAck(id, qid, o)
				}
				for _, o := range del {
					b.DeleteAck(id, qid, o)
				}
			})
		}
	}
	return batch
}

// projectedWatermark is where sq's watermark will be once the decided
// settlements are applied: the lowest outstanding offset not settling to
// done.
func (c *cursor) projectedWatermark(sq *subQueue) uint64 {
	from := sq.acked
	for {
		o, ok := sq.out.first(from)
		if !ok || o >= sq.next {
			return sq.next
		}
		if d := c.deliveries[dkey{sq.id, o}]; d == nil || (d.settling != settlingDone && d.settling != settlingRetry) {
			return o
		}
		from = o + 1
	}
}

// leaseHeap orders leased and suspended deliveries by deadline.
type leaseHeap []*delivery

func (h leaseHeap) Len() int           { return len(h) }
func (h leaseHeap) Less(i, j int) bool { return h[i].deadline < h[j].deadline }
func (h leaseHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].heapIndex, h[j].heapIndex = i, j
}
func (h *leaseHeap) Push(x any) {
	d := x.(*delivery)
	d.heapIndex = len(*h)
	*h = append(*h, d)
}
func (h *leaseHeap) Pop() any {
	old := *h
	d := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	d.heapIndex = -1
	return d
}

var _ heap.Interface = (*leaseHeap)(nil)

// addRetry tracks a parked retry delivery.
func (c *cursor) addRetry(d *delivery) {
	c.deliveries[dkey{RetryQueue, d.offset}] = d
	c.retryOf[dkey{d.origQueue, d.origOffset}] = d
	c.nRetry++
}
