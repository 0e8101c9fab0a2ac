package core

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"time"
)

func errorsIs(err, target error) bool { return errors.Is(err, target) }

// Pull limits of SPEC §2.
const (
	DefaultMaxMessages      = 32
	MaxMaxMessages          = 1000
	MaxWaitSeconds          = 30
	DefaultInvisibleSeconds = 30
	MaxInvisibleSeconds     = 43200
)

// PullRequest asks for up to MaxMessages, waiting up to Wait for the first.
type PullRequest struct {
	MaxMessages int
	Wait        time.Duration
	Invisible   time.Duration
	ConsumerID  string
}

// Delivered is one leased message.
type Delivered struct {
	Message       *Message
	Topic         string
	Attempt       int
	ReceiptHandle string
}

// Pull leases up to MaxMessages ready messages to the caller. With Wait > 0
// it parks until at least one message is ready, the wait ends, ctx ends or
// the broker closes (then it answers with what it has: nothing).
func (b *Broker) Pull(ctx context.Context, topicName, group string, req PullRequest) ([]Delivered, error) {
	if req.MaxMessages == 0 {
		req.MaxMessages = DefaultMaxMessages
	}
	if req.MaxMessages < 1 || req.MaxMessages > MaxMaxMessages {
		return nil, invalid("/maxMessages", "must be between 1 and %d", MaxMaxMessages)
	}
	if req.Wait < 0 || req.Wait > MaxWaitSeconds*time.Second {
		return nil, invalid("/waitSeconds", "must be between 0 and %d", MaxWaitSeconds)
	}
	if req.Invisible == 0 {
		req.Invisible = DefaultInvisibleSeconds * time.Second
	}
	if req.Invisible < time.Second || req.Invisible > MaxInvisibleSeconds*time.Second {
		return nil, invalid("/invisibleSeconds", "must be between 1 and %d", MaxInvisibleSeconds)
	}
	s, err := b.subscriptionForPull(ctx, topicName, group)
	if err != nil {
		return nil, err
	}
	deadline := b.now().Add(req.Wait)
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		ready := s.notify.Load()
		got, nextExpiry, err := s.lease(req)
		if err != nil {
			return nil, err
		}
		if len(got) > 0 {
			out, err := b.readDeliveries(s, got)
			if err != nil {
				return nil, err
			}
			if len(out) > 0 {
				return out, nil
			}
			continue // every leased message was gone; look again
		}
		now := b.now()
		if !now.Before(deadline) || b.pollingStopped() {
			return nil, nil
		}
		wait := deadline.Sub(now)
		if nextExpiry > 0 {
			wait = min(wait, time.Duration(nextExpiry-now.UnixMilli()+1)*time.Millisecond)
		}
		if timer == nil {
			timer = time.NewTimer(wait)
		} else {
			timer.Reset(wait)
		}
		select {
		case <-*ready:
		case <-timer.C:
		case <-ctx.Done():
			return nil, nil
		case <-b.polling:
			return nil, nil
		}
	}
}

// leased is what lease hands out, read outside the lock.
type leased struct {
	queue   uint32
	offset  uint64
	seq     uint64
	attempt int
	leaseID uint64
}

// lease takes up to req.MaxMessages deliveries: expired leases first, then
// messages waiting to go out again, then new ones round-robin over queues.
// It returns the earliest lease deadline still pending (0 if none), so a
// parked pull can wake when a lease runs out.
func (s *subscription) lease(req PullRequest) ([]leased, int64, error) {
	b := s.b
	b.mu.RLock()
	queues := s.topic.queues
	topicID := s.topic.rec.ID
	b.mu.RUnlock()
	now := b.now()
	nowMs := now.UnixMilli()
	deadline := now.Add(req.Invisible).UnixMilli()

	s.mu.Lock()
	defer s.mu.Unlock()
	if s.deleted {
		return nil, 0, fmt.Errorf("%w: %s", ErrSubscriptionNotFound, s.rec.Group)
	}
	if req.ConsumerID != "" {
		c := s.consumers[req.ConsumerID]
		if c == nil {
			c = &consumerSeen{queues: map[uint32]bool{}}
			s.consumers[req.ConsumerID] = c
		}
		c.lastSeen = now.UTC()
	}
	s.expireLocked(nowMs)
	var out []leased
	take := func(d *delivery) {
		d.ready = false
		d.attempt++
		d.leaseID = b.leaseIDs.Add(1)
		d.deadline = deadline
		d.leased = true
		d.consumer = req.ConsumerID
		heap.Push(&s.leases, d)
		out = append(out, leased{queue: d.queue, offset: d.offset, seq: d.seq, attempt: d.attempt, leaseID: d.leaseID})
		if c := s.consumers[req.ConsumerID]; c != nil {
			c.queues[d.queue] = true
		}
	}
	for len(s.released) > 0 && len(out) < req.MaxMessages {
		d := s.released[0]
		s.released = s.released[1:]
		if s.deliveries[dkey{d.queue, d.offset}] == d && d.ready && !d.leased {
			take(d)
		}
	}
	n := min(len(queues), len(s.queues))
	for i := 0; i < n && len(out) < req.MaxMessages; i++ {
		qi := (s.rr + i) % n
		q, sq := queues[qi], s.queues[qi]
		if minOff := q.min.Load(); sq.next < minOff {
			// Retention removed messages this subscription never got.
			sq.next = minOff
			s.advanceLocked(sq)
		}
		visible := q.next.Load()
		if sq.next >= visible || sq.nOut >= b.opts.MaxLeasesPerQueue {
			continue
		}
		want := req.MaxMessages - len(out)
		limit := visible
		if !s.filter.all() {
			// A selective filter may skip many entries; bound the scan
			// so one pull's work stays small.
			want = max(want, 4096)
		}
		limit = min(limit, sq.next+uint64(want))
		var scanErr error
		err := b.store.ScanQueue(topicID, sq.id, sq.next, limit, func(e IndexEntry) bool {
			sq.next = e.Offset + 1
			if sq.preAcked[e.Offset] {
				delete(sq.preAcked, e.Offset)
				return true
			}
			if !s.filter.mayMatch(e.TagHash) {
				return true
			}
			d := &delivery{queue: sq.id, offset: e.Offset, seq: e.Seq, heapIndex: -1}
			s.deliveries[dkey{sq.id, e.Offset}] = d
			sq.out.set(e.Offset)
			sq.nOut++
			take(d)
			return len(out) < req.MaxMessages && sq.nOut < b.opts.MaxLeasesPerQueue
		})
		if err != nil {
			scanErr = err
		}
		if scanErr != nil {
			return out, 0, scanErr
		}
		// Offsets skipped by the filter or already acked count as done.
		if sq.next == limit || len(out) == 0 {
			s.advanceLocked(sq)
		}
	}
	if n > 0 {
		s.rr = (s.rr + 1) % n
	}
	var nextExpiry int64
	if len(s.leases) > 0 {
		nextExpiry = s.leases[0].deadline
	}
	return out, nextExpiry, nil
}

// expireLocked turns leases that ran out into deliveries waiting to go out
// again; the attempt they used counts as failed.
func (s *subscription) expireLocked(nowMs int64) {
	var dead []*delivery
	for len(s.leases) > 0 && s.leases[0].deadline <= nowMs {
		d := heap.Pop(&s.leases).(*delivery)
		d.leased = false
		if d.attempt >= s.rec.MaxRetries+1 {
			dead = append(dead, d)
			continue
		}
		d.ready = true
		s.released = append(s.released, d)
	}
	if len(dead) > 0 {
		// Nobody waits for these writes; a failure leaves the messages
		// outstanding, to be delivered again after a restart.
		req, err := s.settleLocked(dead, settleDead, "lease expired", 0, nowMs)
		if err != nil {
			s.b.log.Error("moving expired messages to the DLQ", "err", err, "group", s.rec.Group)
		}
		if req != nil {
			s.b.wg.Go(func() {
				if err := <-req.done; err != nil {
					s.b.log.Error("moving expired messages to the DLQ", "err", err, "group", s.rec.Group)
				}
			})
		}
	}
}

// advanceLocked moves the watermark to the lowest outstanding offset.
// It reports whether it moved.
func (s *subscription) advanceLocked(sq *subQueue) bool {
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

// readDeliveries reads the bodies of leased messages. A message that
// retention removed meanwhile, or whose tag only collided with the filter's,
// is settled as done and left out.
func (b *Broker) readDeliveries(s *subscription, got []leased) ([]Delivered, error) {
	b.mu.RLock()
	topicName := s.topic.rec.Name
	b.mu.RUnlock()
	out := make([]Delivered, 0, len(got))
	var drop []leased
	for _, l := range got {
		m, err := b.readLeased(l)
		if errors.Is(err, ErrMessageNotFound) {
			drop = append(drop, l)
			continue
		}
		if err != nil {
			s.releaseLeases(got)
			return nil, err
		}
		if !s.filterMatches(m.Tag) {
			drop = append(drop, l)
			continue
		}
		out = append(out, Delivered{
			Message: m, Topic: topicName, Attempt: l.attempt,
			ReceiptHandle: receipt{subID: s.rec.ID, queueID: l.queue, offset: l.offset, leaseID: l.leaseID}.String(),
		})
	}
	if len(drop) > 0 {
		s.settle(drop)
	}
	return out, nil
}

func (b *Broker) readLeased(l leased) (*Message, error) {
	if l.queue != retryQueue {
		return b.store.ReadMessage(l.seq)
	}
	p, err := b.store.ReadParked(ParkedRetry, l.offset)
	if err != nil {
		return nil, err
	}
	return p.Msg, nil
}

func (s *subscription) filterMatches(tag string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.filter.matches(tag)
}

// settle marks leased messages done without a client ack.
func (s *subscription) settle(ls []leased) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, l := range ls {
		if d := s.deliveries[dkey{l.queue, l.offset}]; d != nil && d.leaseID == l.leaseID {
			s.doneLocked(d)
		}
	}
	for _, sq := range s.queues {
		s.advanceLocked(sq)
	}
}

// releaseLeases gives leases back at once, without counting an attempt:
// the client never saw the messages.
func (s *subscription) releaseLeases(ls []leased) {
	s.mu.Lock()
	for _, l := range ls {
		d := s.deliveries[dkey{l.queue, l.offset}]
		if d == nil || d.leaseID != l.leaseID || !d.leased {
			continue
		}
		heap.Remove(&s.leases, d.heapIndex)
		d.leased = false
		d.attempt--
		d.ready = true
		s.released = append([]*delivery{d}, s.released...)
	}
	s.mu.Unlock()
	s.wake()
}

// doneLocked removes an outstanding delivery.
func (s *subscription) doneLocked(d *delivery) {
	if d.leased {
		heap.Remove(&s.leases, d.heapIndex)
		d.leased = false
	}
	d.ready = false
	delete(s.deliveries, dkey{d.queue, d.offset})
	if d.isRetry() {
		s.nRetry--
		return
	}
	sq := s.queues[d.queue]
	sq.out.clear(d.offset)
	sq.nOut--
}

// HandleResult is the outcome for one receipt handle: nil or one of
// ErrReceiptExpired, ErrReceiptInvalid.
type HandleResult struct {
	ReceiptHandle string
	Err           error
}

// Release gives back the leases of messages a client never received (it
// went away before the answer was written), without counting an attempt.
func (b *Broker) Release(topicName, group string, handles []string) {
	s, err := b.subscription(topicName, group)
	if err != nil {
		return
	}
	var ls []leased
	for _, h := range handles {
		if r, ok := parseReceipt(h); ok && r.subID == s.rec.ID {
			ls = append(ls, leased{queue: r.queueID, offset: r.offset, leaseID: r.leaseID})
		}
	}
	s.releaseLeases(ls)
}

var (
	errAlreadyDone = errors.New("already done")
	errPreRestart  = errors.New("leased before restart")
)

// lookupLocked finds the delivery a handle names. An ack for a lease that
// ran out still counts while nobody else got the message.
func (s *subscription) lookupLocked(queues []*queue, h string) (*delivery, error) {
	r, ok := parseReceipt(h)
	if !ok || r.subID != s.rec.ID || (int(r.queueID) >= len(s.queues) && r.queueID != retryQueue) {
		return nil, ErrReceiptInvalid
	}
	d := s.deliveries[dkey{r.queueID, r.offset}]
	if d == nil && r.queueID == retryQueue {
		// A settled retry: acked, dead, or nacked and parked again.
		return nil, errAlreadyDone
	}
	if d == nil {
		sq := s.queues[r.queueID]
		if r.offset < sq.next {
			// Not outstanding: acked already (a retried ack) or settled.
			return nil, errAlreadyDone
		}
		if r.leaseID <= s.b.leaseBase && r.offset < queues[r.queueID].next.Load() {
			// Leased before a restart and not handed out since: the ack
			// still counts, and the cursor will skip the message.
			sq.preAcked[r.offset] = true
			return &delivery{queue: r.queueID, offset: r.offset, heapIndex: -1}, errPreRestart
		}
		return nil, ErrReceiptInvalid
	}
	if d.leaseID != r.leaseID {
		if r.leaseID > d.leaseID {
			return nil, ErrReceiptInvalid
		}
		return nil, ErrReceiptExpired
	}
	return d, nil
}

// ackWritesLocked makes acks of queue offsets durable: the new watermark
// of each touched queue, acks above it, and the acks it has passed.
func (s *subscription) ackWritesLocked(batch []func(Batch), touched map[uint32][]uint64) []func(Batch) {
	for qid, offsets := range touched {
		sq := s.queues[qid]
		s.advanceLocked(sq)
		subID := s.rec.ID
		var put, del []uint64
		setWM, wm := false, sq.acked
		if sq.acked != sq.persistedWM {
			setWM = true
			sq.persistedWM = sq.acked
			for o := range sq.durableAcks {
				if o < sq.acked {
					del = append(del, o)
					delete(sq.durableAcks, o)
				}
			}
		}
		for _, o := range offsets {
			if o >= sq.acked && !sq.durableAcks[o] {
				put = append(put, o)
				sq.durableAcks[o] = true
			}
		}
		if setWM || len(put) > 0 || len(del) > 0 {
			batch = append(batch, func(b Batch) {
				if setWM {
					b.PutAckWatermark(subID, qid, wm)
				}
				for _, o := range put {
					b.PutAck(subID, qid, o)
				}
				for _, o := range del {
					b.DeleteAck(subID, qid, o)
				}
			})
		}
	}
	return batch
}

func (b *Broker) pollingStopped() bool {
	select {
	case <-b.polling:
		return true
	default:
		return false
	}
}
