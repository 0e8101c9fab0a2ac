package core

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// Pull limits of SPEC §2.
const (
	DefaultMaxMessages      = 32
	MaxMaxMessages          = 1000
	MaxWaitSeconds          = 30
	DefaultInvisibleSeconds = 30
	MaxInvisibleSeconds     = 43200
	MaxConsumerIDLen        = 128
)

// PullRequest asks for up to MaxMessages, waiting up to Wait for the first.
type PullRequest struct {
	MaxMessages int
	Wait        time.Duration
	Invisible   time.Duration
	// ConsumerID names the consumer; required for broadcast subscriptions.
	ConsumerID string
	// ClientAddr names a clustering consumer that gave no ConsumerID.
	ClientAddr string
	// Push marks the broker's own push deliverer, the only puller a push
	// subscription accepts.
	Push bool
}

// Delivered is one leased message.
type Delivered struct {
	Message       *Message
	Topic         string
	Attempt       int
	ReceiptHandle string
	// Traceparent is the delivery span's context, for the consumer to
	// continue the message's trace.
	Traceparent string
}

// Pull leases up to MaxMessages ready messages to the caller. With Wait > 0
// it parks until at least one message is ready, the wait ends, ctx ends or
// polling stops (then it answers with what it has: nothing).
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
	if len(req.ConsumerID) > MaxConsumerIDLen {
		return nil, invalid("/consumerId", "at most %d bytes", MaxConsumerIDLen)
	}
	s, err := b.subscriptionForPull(ctx, topicName, group)
	if err != nil {
		return nil, err
	}
	var c *cursor
	s.lock()
	broadcast, push := s.rec.Mode == ModeBroadcast, s.rec.Push != nil
	c = s.main
	s.mu.Unlock()
	if push != req.Push {
		if push {
			return nil, fmt.Errorf("%w: %s/%s is a push subscription: the broker delivers its messages", ErrModeConflict, topicName, group)
		}
		return nil, fmt.Errorf("%w: %s/%s is not a push subscription", ErrModeConflict, topicName, group)
	}
	if broadcast {
		if req.ConsumerID == "" {
			return nil, invalid("/consumerId", "is required by broadcast subscriptions: each consumer has its own position")
		}
		if c, err = b.member(ctx, s, req.ConsumerID); err != nil {
			return nil, err
		}
	} else if req.ConsumerID == "" {
		req.ConsumerID = req.ClientAddr
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
		got, more, err := s.lease(c, req)
		if err != nil {
			return nil, err
		}
		if len(got) == 0 && more && ctx.Err() == nil {
			continue // the filter skipped a bounded stretch; read on
		}
		if len(got) > 0 {
			out, err := b.readDeliveries(s, c, got, req.ConsumerID)
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
		// Whatever makes a message ready while this pull waits closes
		// ready: a send, a release, a retry's timer, and the
		// subscription's wake-up timer at the next lease or suspension end.
		wait := deadline.Sub(now)
		if b.tel.longPolls.Add(1) > b.opts.MaxParkedPulls {
			b.tel.longPolls.Add(-1)
			return nil, fmt.Errorf("%w: %d long polls are already waiting", ErrTooManyRequests, b.opts.MaxParkedPulls)
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
			b.tel.longPolls.Add(-1)
			return nil, nil
		case <-b.polling:
			b.tel.longPolls.Add(-1)
			return nil, nil
		}
		b.tel.longPolls.Add(-1)
	}
}

// lease takes up to req.MaxMessages deliveries from a cursor: those ready
// to go out again first, then new ones round-robin over the queues. It
// reports whether a scan stopped at its bound with entries left.
func (s *subscription) lease(c *cursor, req PullRequest) ([]leased, bool, error) {
	b := s.b
	b.mu.RLock()
	queues := s.topic.queues
	b.mu.RUnlock()
	now := b.now()
	s.lock()
	defer s.mu.Unlock()
	if s.deleted {
		return nil, false, fmt.Errorf("%w: %s", ErrSubscriptionNotFound, s.group)
	}
	w := &leaseWork{
		max: req.MaxMessages, deadline: dueAfter(now, req.Invisible), nowMs: now.UnixMilli(), now: now,
		consumer: req.ConsumerID, orderly: s.rec.Orderly, filter: s.filter, maxRetry: s.rec.MaxRetries,
		delays: s.rec.RetryDelays, maxLeases: b.opts.MaxLeasesPerQueue,
	}
	seen := s.consumers[req.ConsumerID]
	if seen == nil {
		seen = &consumerSeen{queues: map[uint32]bool{}}
		s.consumers[req.ConsumerID] = seen
	}
	seen.lastSeen = now.UTC()
	defer s.noteLocked(c) // expired leases and new ones change what the waiters wait for
	s.expireLocked(c, w)
	c.pulls++
	w.pull = c.pulls
	var out []leased
	for len(c.released) > 0 && len(out) < w.max {
		d := c.released[0]
		c.released = c.released[1:]
		if c.deliveries[dkey{d.queue, d.offset}] == d && d.ready && !d.leased {
			out = c.take(s, w, d, out)
			if w.orderly {
				if ks := c.keyOf(d); ks != nil {
					// An orderly key's head: the pull takes the key's
					// next messages too.
					out = c.takeFollowers(s, w, c.queues[d.queue], ks, out)
				}
			}
		}
	}
	n := min(len(queues), len(c.queues))
	for i := 0; i < n && len(out) < w.max; i++ {
		qi := (c.rr + i) % n
		var err error
		if out, err = c.scan(s, w, queues[qi], c.queues[qi], out); err != nil {
			return out, false, err
		}
	}
	if n > 0 {
		c.rr = (c.rr + 1) % n
	}
	for _, l := range out {
		if l.queue != RetryQueue {
			seen.queues[l.queue] = true
		}
	}
	s.persistSkippedLocked(c)
	return out, w.more, nil
}

// persistSkippedLocked writes watermarks that moved without an ack (past
// messages the filter skipped), so lag does not come back after a restart.
// Nobody waits for the write.
func (s *subscription) persistSkippedLocked(c *cursor) {
	var touched map[uint32][]uint64
	for _, sq := range c.queues {
		if sq.acked > sq.persistedWM {
			if touched == nil {
				touched = map[uint32][]uint64{}
			}
			touched[sq.id] = nil
		}
	}
	if touched == nil {
		return
	}
	// The appender logs a failed commit; nobody waits for this one.
	s.queueWritesLocked(c.ackWrites(nil, touched), nil)
}

// expireLocked ends the leases that ran out: each is a failed attempt,
// kept in the message's history; past maxRetries the message moves to the
// DLQ. Nobody waits for these writes: if they fail the messages stay
// outstanding and are delivered again after a restart.
func (s *subscription) expireLocked(c *cursor, w *leaseWork) {
	if len(c.leases) == 0 || c.leases[0].deadline > w.nowMs {
		return
	}
	expired, dead := c.expire(w)
	if len(expired) == 0 {
		return
	}
	writes := make([]func(Batch), 0, len(expired))
	for _, d := range expired {
		s.b.tel.event(d.trace, SpanLeaseExpired, s.b.now(), s.settleAttrs(d)...)
		// Also for the last allowed attempt: the DLQ move below records no
		// attempt of its own (the lease is already gone).
		h := s.history(c, d, OutcomeLeaseExpired, "lease expired", w.nowMs)
		writes = append(writes, func(b Batch) { b.PutHistory(h) })
		if !slices.Contains(dead, d) {
			// The failed attempt (and an orderly key's suspension) outlives
			// a restart or a change of leader.
			rec := AttemptRecord{CursorID: c.id, QueueID: d.queue, Offset: d.offset, Attempt: d.attempt}
			if d.suspended {
				rec.DueMs = d.deadline
			}
			d.recorded = true
			writes = append(writes, func(b Batch) { b.PutAttempt(rec) })
		}
	}
	// The appender logs a failed commit; nobody waits for this one.
	if _, err := s.settleLocked(c, dead, settleDead, "lease expired", -1, w.nowMs, writes); err != nil {
		s.b.log.Error("settling expired leases", "err", err, "group", s.group)
	}
}

// readDeliveries reads the bodies of leased messages. A message that
// retention removed meanwhile, or whose tag only collided with the filter's,
// is settled as done and left out.
func (b *Broker) readDeliveries(s *subscription, c *cursor, got []leased, consumer string) ([]Delivered, error) {
	b.mu.RLock()
	topicName := s.topic.rec.Name
	b.mu.RUnlock()
	s.lock()
	filter, group := s.filter, s.group
	s.mu.Unlock()
	out := make([]Delivered, 0, len(got))
	traces := make([]trace.SpanContext, 0, len(got))
	kept := make([]leased, 0, len(got))
	var drop []leased
	var spanAttrs []attribute.KeyValue // each delivery's, in turn
	now := b.now()
	var bytes int64
	msgs, err := b.readAllLeased(got)
	if err != nil {
		s.releaseLeases(c, got)
		return nil, err
	}
	for i, l := range got {
		m := msgs[i]
		if m == nil || !filter.matches(m.Tag) { // removed by retention, or filtered
			drop = append(drop, l)
			continue
		}
		parent := parseTraceparent(m.Traceparent)
		sc := parent
		if b.tel.tracing {
			spanAttrs = appendAttemptAttrs(spanAttrs[:0], topicName, group, m.QueueID, m.Offset, l.attempt, consumer, m.ID)
			sc = b.tel.event(parent, SpanDeliver, now, spanAttrs...)
		}
		traces = append(traces, sc)
		kept = append(kept, l)
		bytes += int64(len(m.Body))
		out = append(out, Delivered{
			Message: m, Topic: topicName, Attempt: l.attempt, Traceparent: formatTraceparent(sc),
			ReceiptHandle: b.receipts.seal(receipt{group: b.group, epoch: b.epoch, subID: c.id, queueID: l.queue, offset: l.offset, leaseID: l.leaseID}),
		})
	}
	if len(drop) > 0 {
		s.dropLeases(c, drop)
	}
	s.lock()
	for i, l := range kept {
		if d := c.deliveries[dkey{l.queue, l.offset}]; d != nil && d.leaseID == l.leaseID {
			d.msgID, d.trace = strings.Clone(out[i].Message.ID), traces[i] // not the record it came in: it lives until settled
		}
	}
	s.mu.Unlock()
	attrs := metric.WithAttributes(attribute.String("topic", topicName), attribute.String("group", group))
	b.tel.msgsOut.Add(context.Background(), int64(len(out)), attrs)
	b.tel.bytesOut.Add(context.Background(), bytes, attrs)
	return out, nil
}

// readAllLeased reads the messages of got (nil where retention removed
// one): the log's in one pass in seq order, retries one by one.
func (b *Broker) readAllLeased(got []leased) ([]*Message, error) {
	out := make([]*Message, len(got))
	order := make([]int, 0, len(got))
	for i, l := range got {
		if l.queue != RetryQueue {
			order = append(order, i)
			continue
		}
		m, err := b.readLeased(l)
		if err != nil && !errors.Is(err, ErrMessageNotFound) {
			return nil, err
		}
		out[i] = m
	}
	slices.SortFunc(order, func(x, y int) int { return cmp.Compare(got[x].seq, got[y].seq) })
	seqs := make([]uint64, len(order))
	for j, i := range order {
		seqs[j] = got[i].seq
	}
	read := make([]*Message, len(order))
	if err := b.store.ReadMessages(seqs, read); err != nil {
		return nil, err
	}
	for j, i := range order {
		out[i] = read[j]
	}
	return out, nil
}

func (b *Broker) readLeased(l leased) (*Message, error) {
	if l.queue != RetryQueue {
		return b.store.ReadMessage(l.seq)
	}
	p, err := b.store.ReadParked(ParkedRetry, l.offset)
	if err != nil {
		return nil, err
	}
	return p.Msg, nil
}

// dropLeases settles leased messages as done without a client ack.
func (s *subscription) dropLeases(c *cursor, ls []leased) {
	s.lock()
	defer s.mu.Unlock()
	var ds []*delivery
	for _, l := range ls {
		if d := c.deliveries[dkey{l.queue, l.offset}]; d != nil && d.leaseID == l.leaseID {
			ds = append(ds, d)
		}
	}
	if _, err := s.settleLocked(c, ds, settleAck, "", -1, s.b.now().UnixMilli(), nil); err != nil {
		s.b.log.Error("settling dropped messages", "err", err)
	}
}

// releaseLeases gives leases back at once, without counting an attempt.
func (s *subscription) releaseLeases(c *cursor, ls []leased) {
	s.lock()
	for _, l := range ls {
		c.release(l)
	}
	s.noteLocked(c)
	s.mu.Unlock()
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
	s.lock()
	var touched []*cursor
	for _, h := range handles {
		if r, ok := b.receipts.open(h); ok && r.group == b.group && r.epoch == b.epoch {
			if c := s.byID[r.subID]; c != nil && c.release(leased{queue: r.queueID, offset: r.offset, leaseID: r.leaseID}) && !slices.Contains(touched, c) {
				touched = append(touched, c)
			}
		}
	}
	for _, c := range touched {
		s.noteLocked(c)
	}
	s.mu.Unlock()
}

var (
	errAlreadyDone = errors.New("already done")
	errPreRestart  = errors.New("leased before restart")
)

// lookupLocked finds the cursor and delivery a handle names. An ack for a
// lease that ran out still counts while nobody else got the message.
func (s *subscription) lookupLocked(queues []*queue, h string) (*cursor, *delivery, error) {
	r, ok := s.b.receipts.open(h)
	if !ok || r.group != s.b.group || r.epoch > s.b.epoch {
		return nil, nil, ErrReceiptInvalid
	}
	// An earlier epoch's lease ids counted from 1 as this one's do: they
	// say nothing about this run's leases.
	before := r.epoch < s.b.epoch
	c := s.byID[r.subID]
	if c == nil || (int(r.queueID) >= len(c.queues) && r.queueID != RetryQueue) {
		return nil, nil, ErrReceiptInvalid
	}
	d := c.deliveries[dkey{r.queueID, r.offset}]
	if d == nil && r.queueID == RetryQueue {
		// A settled retry: acked, dead, or parked again.
		return c, nil, errAlreadyDone
	}
	if d == nil {
		sq := c.queues[r.queueID]
		if c.retryOf[dkey{r.queueID, r.offset}] != nil {
			// Nacked: the message lives on as a retry with handles of its own.
			return c, nil, ErrReceiptExpired
		}
		if r.offset < sq.next && sq.out.has(r.offset) {
			// Outstanding without a delivery: a message of a busy orderly
			// key, leased before a restart as one of its pull's run of the
			// key. It goes out again after the key's earlier messages.
			return c, nil, ErrReceiptExpired
		}
		if r.offset < sq.next {
			// Not outstanding: acked already (a retried ack) or settled.
			return c, nil, errAlreadyDone
		}
		if before && int(r.queueID) < len(queues) && r.offset < queues[r.queueID].next.Load() {
			// Leased before a restart and not handed out since: an ack
			// still counts (the caller marks it so the cursor skips it).
			return c, &delivery{queue: r.queueID, offset: r.offset, heapIndex: -1}, errPreRestart
		}
		return nil, nil, ErrReceiptInvalid
	}
	if before {
		// Handed out again since the restart.
		return c, nil, ErrReceiptExpired
	}
	if d.leaseID == 0 {
		// Nacked in place (a retry parked again, an orderly key
		// suspended): its handles are spent, even once it is due.
		return c, nil, ErrReceiptExpired
	}
	if d.leaseID != r.leaseID {
		if r.leaseID > d.leaseID {
			return nil, nil, ErrReceiptInvalid
		}
		return c, nil, ErrReceiptExpired
	}
	if d.suspended {
		// Nacked (orderly): the handle is spent.
		return c, nil, ErrReceiptExpired
	}
	switch d.settling {
	case settlingDone:
		// Acked or dead-lettered, the writes on their way: as once they land.
		return c, nil, errAlreadyDone
	case settlingRetry, settlingKeep:
		return c, nil, ErrReceiptExpired
	}
	return c, d, nil
}

func (b *Broker) pollingStopped() bool {
	select {
	case <-b.polling:
		return true
	default:
		return false
	}
}

// ParkedPulls is the number of long polls waiting now.
func (b *Broker) ParkedPulls() int64 { return b.tel.longPolls.Load() }
