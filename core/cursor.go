package core

import (
	"container/heap"
	"slices"
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
	// pulls numbers the cursor's pulls, so an orderly key knows the pull
	// that holds all of it (keyState.open).
	pulls uint64
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
	// outstanding message (messages without a key share key 0).
	keys map[uint32]*keyState
}

// keyState is one orderly key's outstanding messages, in offset order:
// those with a delivery, then the ones the cursor passed while the key was
// busy. Only the pull that takes group[0], the head, leases more of the
// key: the members after it while they are idle, then waiting messages,
// and, while it holds the whole key (open), the key's messages its scan
// meets. So the leased members of a key are always one pull's.
//
// A failure of a leased member (nack, dead-letter, lease end, release)
// revokes the leases of the members after it (revokeAfter): they stay in
// the group, idle, and go out again after it, in order. A member that is
// not the head and not leased waits for the members before it: a
// suspension of it that ends leaves it idle, and it is made ready only
// once it is the head (nextOfKey).
type keyState struct {
	group   []*delivery
	waiting []IndexEntry
	// open is the pull (cursor.pulls) that leased every outstanding
	// message of the key; 0: none.
	open uint64
}

// idle says an orderly delivery waits for the members of its key before
// it: not leased, not suspended, not ready, not settling.
func (d *delivery) idle() bool {
	return !d.leased && !d.suspended && !d.ready && d.settling == notSettling
}

// keyOf is the orderly key state a queue delivery belongs to, or nil
// (retries, and every delivery of a subscription that is not orderly).
func (c *cursor) keyOf(d *delivery) *keyState {
	if d.isRetry() {
		return nil
	}
	return c.queues[d.queue].keys[d.keyHash]
}

// readyIfHead makes a delivery that is out of lease ready, unless it is
// an orderly one behind other members of its key: it stays idle until
// they are done.
func (c *cursor) readyIfHead(d *delivery) {
	if ks := c.keyOf(d); ks != nil && len(ks.group) > 0 && ks.group[0] != d {
		return
	}
	c.makeReady(d)
}

// revokeAfter ends, without counting an attempt, the leases of the members
// of d's key after d (a failure of d): their handles are spent, and they
// go out again after d, in order. Suspended and settling members keep
// what they were decided to be.
func (c *cursor) revokeAfter(ks *keyState, d *delivery) {
	ks.open = 0
	i := slices.Index(ks.group, d)
	if i < 0 {
		return
	}
	for _, m := range ks.group[i+1:] {
		if !m.leased || m.settling != notSettling {
			continue
		}
		if m.heapIndex >= 0 {
			heap.Remove(&c.leases, m.heapIndex)
		}
		m.leased = false
		m.attempt--
		m.leaseID = 0
	}
}

// failsAfter says an earlier member of d's orderly key is among failing,
// the deliveries one call nacks or dead-letters.
func (c *cursor) failsAfter(d *delivery, failing map[*delivery]string) bool {
	ks := c.keyOf(d)
	if ks == nil {
		return false
	}
	for _, m := range ks.group {
		if m == d {
			return false
		}
		if _, ok := failing[m]; ok {
			return true
		}
	}
	return false
}

// takeFollowers leases, after the head of ks that this pull took, the
// key's next messages in offset order while the pull has room: idle
// members, then waiting messages. A member that is not idle, or a waiting
// message whose key was suspended before a restart, stops it. Having taken
// every outstanding message of the key, the pull holds it open.
func (c *cursor) takeFollowers(s *subscription, w *leaseWork, sq *subQueue, ks *keyState, out []leased) []leased {
	for _, m := range ks.group[1:] {
		if len(out) >= w.max || !m.idle() {
			return out
		}
		out = c.take(s, w, m, out)
	}
	for len(ks.waiting) > 0 && len(out) < w.max {
		e := ks.waiting[0]
		ks.waiting = ks.waiting[1:]
		d, dueMs := sq.newDelivery(e)
		c.deliveries[dkey{sq.id, e.Offset}] = d
		ks.group = append(ks.group, d)
		if dueMs > w.nowMs {
			c.suspend(d, dueMs)
			return out
		}
		out = c.take(s, w, d, out)
	}
	if len(ks.waiting) == 0 {
		ks.open = w.pull
	}
	return out
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
	more      bool   // a scan stopped at its bound with entries left
	pull      uint64 // the cursor's number of this pull (0: no pull)
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
		var ks *keyState
		if w.orderly {
			if ks = sq.keys[e.KeyHash]; ks != nil && (ks.open != w.pull || len(out) >= w.max) {
				ks.waiting = append(ks.waiting, e)
				return sq.nOut < w.maxLeases
			}
		}
		d, dueMs := sq.newDelivery(e)
		c.deliveries[dkey{sq.id, e.Offset}] = d
		if w.orderly {
			if ks == nil {
				ks = &keyState{}
				sq.keys[e.KeyHash] = ks
			}
			// A new head, or the next message of a key this pull holds.
			ks.group = append(ks.group, d)
			ks.open = 0
		}
		if dueMs > w.nowMs {
			c.suspend(d, dueMs) // its key was suspended before the restart
			return sq.nOut < w.maxLeases
		}
		out = c.take(s, w, d, out)
		if ks != nil {
			ks.open = w.pull
		}
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
			c.readyIfHead(d)
			continue
		}
		var ks *keyState
		if w.orderly {
			if ks = c.keyOf(d); ks != nil {
				d = c.firstExpired(ks, d)
			}
		}
		d.leased = false
		expired = append(expired, d)
		switch {
		case d.attempt >= w.maxRetry+1:
			dead = append(dead, d)
		case ks != nil:
			c.suspend(d, dueAfter(w.now, retryDelay(w.delays, d.attempt)))
		default:
			c.makeReady(d)
		}
		if ks != nil {
			c.revokeAfter(ks, d)
		}
	}
	return expired, dead
}

// firstExpired is, of the members of d's key whose leases end when d's
// does (d was popped from the lease heap as the first to end), the first
// in offset order: a pull's leases of a key end together, and the first
// of them is the failed one. d goes back to the heap if it is not that one
// (the failure then revokes it). Leases that end at different times fail
// in the order they end, as if each was looked at when it ended.
func (c *cursor) firstExpired(ks *keyState, d *delivery) *delivery {
	for _, m := range ks.group {
		if m == d {
			return d
		}
		if m.leased && m.heapIndex >= 0 && m.deadline <= d.deadline {
			heap.Remove(&c.leases, m.heapIndex)
			heap.Push(&c.leases, d)
			return m
		}
	}
	return d
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
	if ks := sq.keys[d.keyHash]; ks != nil {
		// Acks of a pull's members of a key come in any order.
		if i := slices.Index(ks.group, d); i >= 0 {
			ks.group = slices.Delete(ks.group, i, i+1)
			if i == 0 {
				c.nextOfKey(sq, d.keyHash, ks)
			}
		}
	}
}

// nextOfKey gives an orderly key whose head is done its next head: the
// next member, made ready if idle (a leased one is its pull's already, a
// suspended one is made ready when its suspension ends), or else the
// first waiting message.
func (c *cursor) nextOfKey(sq *subQueue, keyHash uint32, ks *keyState) {
	if len(ks.group) > 0 {
		if h := ks.group[0]; h.idle() {
			c.makeReady(h)
		}
		return
	}
	if len(ks.waiting) == 0 {
		delete(sq.keys, keyHash)
		return
	}
	e := ks.waiting[0]
	ks.waiting = ks.waiting[1:]
	nd, dueMs := sq.newDelivery(e)
	c.deliveries[dkey{sq.id, e.Offset}] = nd
	ks.group = append(ks.group, nd)
	if dueMs > 0 {
		c.suspend(nd, dueMs) // the next lease-end check makes it ready once due
	} else {
		c.makeReady(nd)
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
	if ks := c.keyOf(d); ks != nil {
		// The client saw none of its pull: the key's later members go
		// back too, and a member behind others waits for them idle.
		c.revokeAfter(ks, d)
		if len(ks.group) > 0 && ks.group[0] != d {
			return true
		}
	}
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
