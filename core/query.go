package core

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Message states for one subscription (SPEC §2 Query).
const (
	StatePending  = "pending"
	StateInflight = "inflight"
	StateAcked    = "acked"
	StateRetrying = "retrying"
	StateDead     = "dead"
	StateFiltered = "filtered"
	// StateHalf: a half message of an open transaction, delivered to no
	// subscription until it commits.
	StateHalf = "half"
)

// MessageState is where a message is for one subscription (one consumer,
// for broadcast subscriptions).
type MessageState struct {
	Group      string
	ConsumerID string // broadcast only
	State      string
	Attempt    int
	LastReason string
	History    []Attempt
}

// Attempt is one delivery of a message. Outcome is ack, nack,
// lease_expired, deadletter or pending (still leased); SettledAt is zero
// while pending.
type Attempt struct {
	Attempt     int
	ConsumerID  string
	DeliveredAt time.Time
	Outcome     string
	Reason      string
	SettledAt   time.Time
}

var outcomeNames = map[byte]string{
	OutcomeAck: "ack", OutcomeNack: "nack", OutcomeLeaseExpired: "lease_expired", OutcomeDeadLetter: "deadletter",
}

// indexBuckets is the range of secondary index buckets that can hold a
// topic's retained messages.
func (b *Broker) indexBuckets(rec *TopicRecord) (uint32, uint32) {
	now := b.now()
	from := now.Add(-time.Duration(rec.RetentionHours)*time.Hour - time.Hour).UnixMilli()
	return IndexBucket(from), IndexBucket(now.Add(time.Hour).UnixMilli())
}

// GetMessage finds a message by id through the secondary index and tells,
// for every subscription, where it is and how each delivery went.
func (b *Broker) GetMessage(topicName, id string) (*Message, []MessageState, error) {
	t, err := b.topic(topicName)
	if err != nil {
		return nil, nil, err
	}
	rec, subs := b.subsOf(t)
	found, err := b.findByID(rec, id)
	if err != nil {
		return nil, nil, err
	}
	if found == nil {
		if found, err = b.findDelayed(rec, id); err != nil {
			return nil, nil, err
		}
	}
	if found == nil {
		if found, err = b.findHalf(rec.ID, id); err != nil {
			return nil, nil, err
		}
	}
	if found == nil {
		return nil, nil, fmt.Errorf("%w: %s", ErrMessageNotFound, id)
	}
	slices.SortFunc(subs, func(a, b *subscription) int { return strings.Compare(a.group, b.group) })
	var states []MessageState
	for _, s := range subs {
		st, err := b.messageStates(s, found)
		if err != nil {
			return nil, nil, err
		}
		states = append(states, st...)
	}
	return found, states, nil
}

// findDelayed looks id up among the topic's delayed messages not yet due
// (IndexDelayed). The message it returns has DeliverAtMs set and no
// offset yet.
func (b *Broker) findDelayed(rec *TopicRecord, id string) (*Message, error) {
	now := b.now()
	// From an hour back: a message just due may wait for the timer loop.
	from := IndexBucket(now.Add(-time.Hour).UnixMilli())
	to := IndexBucket(now.Add(MaxDelaySeconds*time.Second + time.Hour).UnixMilli())
	var found *Message
	err := b.store.ScanIndex(rec.ID, IndexDelayed, IndexHash(id), from, to, 0, 0, func(_ uint32, parkedID uint64) bool {
		p, err := b.store.ReadParked(ParkedDelayed, parkedID)
		if err == nil && p.TopicID == rec.ID && p.Msg.ID == id {
			found = p.Msg
			found.TopicID, found.DeliverAtMs = rec.ID, p.DueMs
			return false
		}
		return true
	})
	return found, err
}

// findByID looks id up in the topic's id index, under its kind.
func (b *Broker) findByID(rec *TopicRecord, id string) (*Message, error) {
	from, to := b.indexBuckets(rec)
	kind, digest := IDIndex(id)
	var found *Message
	err := b.store.ScanIndex(rec.ID, kind, digest, from, to, 0, 0, func(_ uint32, seq uint64) bool {
		m, err := b.store.ReadMessage(seq)
		if err == nil && m.ID == id && m.TopicID == rec.ID {
			found = m
			return false
		}
		return true
	})
	return found, err
}

func (b *Broker) messageStates(s *subscription, m *Message) ([]MessageState, error) {
	// A delayed message not yet due (findDelayed) has no offset, so no
	// history and no delivery: it is pending, or filtered out, everywhere.
	waiting := m.DeliverAtMs > 0 || m.Half
	var hist []*HistoryRecord
	dead := map[uint32]*Dead{}
	if !waiting {
		err := b.store.ScanHistory(m.TopicID, m.QueueID, m.Offset, func(h *HistoryRecord) bool {
			hist = append(hist, h)
			return true
		})
		if err != nil {
			return nil, err
		}
		err = b.store.ScanDead(s.id, 0, maxTimeMs, 0, 0, func(d *Dead) bool {
			if d.Msg.ID == m.ID {
				dead[d.CursorID] = d
			}
			return true
		})
		if err != nil {
			return nil, err
		}
	}
	s.lock()
	defer s.mu.Unlock()
	untouched := StatePending
	switch {
	case m.Half:
		untouched = StateHalf
	case !s.filter.matches(m.Tag):
		untouched = StateFiltered
	}
	var out []MessageState
	if len(s.cursors()) == 0 {
		// A broadcast subscription no consumer has joined yet: each
		// consumer will get the message when it does (from startFrom).
		return []MessageState{{Group: s.group, State: untouched, History: []Attempt{}}}, nil
	}
	for _, c := range s.cursors() {
		st := MessageState{Group: s.group, ConsumerID: c.consumerID}
		if waiting {
			st.State = untouched
			out = append(out, st)
			continue
		}
		for _, h := range hist {
			if h.StateID != c.id {
				continue
			}
			st.History = append(st.History, Attempt{
				Attempt: h.Attempt, ConsumerID: h.ConsumerID, DeliveredAt: time.UnixMilli(h.DeliveredAtMs).UTC(),
				Outcome: outcomeNames[h.Outcome], Reason: h.Reason, SettledAt: time.UnixMilli(h.SettledAtMs).UTC(),
			})
		}
		st.State = StatePending
		var live *delivery
		if d := c.deliveries[dkey{m.QueueID, m.Offset}]; d != nil {
			live = d
		} else {
			for k, d := range c.deliveries {
				if k.queue == RetryQueue && d.origQueue == m.QueueID && d.origOffset == m.Offset {
					live = d
					break
				}
			}
		}
		var sq *subQueue
		if int(m.QueueID) < len(c.queues) {
			sq = c.queues[m.QueueID]
		}
		switch {
		case untouched == StateFiltered:
			st.State = StateFiltered
		case dead[c.id] != nil:
			st.State = StateDead
			st.Attempt = dead[c.id].Attempt
		case live != nil && live.leased:
			st.State = StateInflight
			st.History = append(st.History, Attempt{Attempt: live.attempt, ConsumerID: live.consumer,
				DeliveredAt: time.UnixMilli(live.leasedAtMs).UTC(), Outcome: "pending"})
		case live != nil && (live.isRetry() || live.suspended):
			st.State = StateRetrying
		case live != nil:
			st.State = StatePending
		case sq != nil && m.Offset < sq.next:
			st.State = StateAcked
		}
		for _, h := range st.History {
			st.Attempt = max(st.Attempt, h.Attempt)
			if h.Reason != "" {
				st.LastReason = h.Reason
			}
		}
		if live != nil {
			st.Attempt = max(st.Attempt, live.attempt)
		}
		out = append(out, st)
	}
	return out, nil
}

// Query chooses stored messages: by key or tag through the secondary
// index, by store time range, or from a queue offset. Filters combine.
type Query struct {
	Key, Tag string
	From, To time.Time
	QueueID  *int
	Offset   *uint64
	Limit    int
	Cursor   *QueryCursor
}

// QueryCursor continues a query after the last message of a page: in the
// index (Bucket, Seq) or in a queue walk (QueueID, Offset).
type QueryCursor struct {
	Bucket  uint32
	Seq     uint64
	QueueID uint32
	Offset  uint64
}

// QueryMessages answers a Query, limit messages a page.
func (b *Broker) QueryMessages(ctx context.Context, topicName string, q Query) ([]*Message, *QueryCursor, error) {
	if q.Limit == 0 {
		q.Limit = 100
	}
	if q.Limit < 1 || q.Limit > MaxMaxMessages {
		return nil, nil, invalid("/limit", "must be between 1 and %d", MaxMaxMessages)
	}
	if !q.From.IsZero() && !q.To.IsZero() && q.To.Before(q.From) {
		return nil, nil, invalid("/to", "must not be before from")
	}
	t, err := b.topic(topicName)
	if err != nil {
		return nil, nil, err
	}
	b.mu.RLock()
	rec, queues := t.rec, t.queues
	b.mu.RUnlock()
	fromMs, toMs := int64(0), maxTimeMs
	if !q.From.IsZero() {
		fromMs = q.From.UnixMilli()
	}
	if !q.To.IsZero() {
		toMs = q.To.UnixMilli()
	}
	keep := func(m *Message) bool {
		return m.TopicID == rec.ID && m.StoredAtMs >= fromMs && m.StoredAtMs <= toMs &&
			(q.Key == "" || slices.Contains(m.Keys, q.Key)) && (q.Tag == "" || m.Tag == q.Tag) &&
			(q.QueueID == nil || int(m.QueueID) == *q.QueueID)
	}
	var out []*Message
	var next *QueryCursor
	var scanErr error
	// take reads one candidate and keeps it when it matches; a message
	// retention removed meanwhile is skipped. It reports whether to go on.
	take := func(seq uint64) bool {
		m, err := b.store.ReadMessage(seq)
		if errors.Is(err, ErrMessageNotFound) {
			return true
		}
		if err != nil {
			scanErr = err
			return false
		}
		if keep(m) {
			out = append(out, m)
		}
		return true
	}
	if q.Key != "" || q.Tag != "" {
		kind, value := IndexKey, q.Key
		if q.Key == "" {
			kind, value = IndexTag, q.Tag
		}
		from, to := b.indexBuckets(rec)
		from = max(from, IndexBucket(fromMs))
		if toMs < maxTimeMs {
			to = min(to, IndexBucket(toMs))
		}
		var afterB uint32
		var afterS uint64
		if q.Cursor != nil {
			afterB, afterS = q.Cursor.Bucket, q.Cursor.Seq
		}
		err := b.store.ScanIndex(rec.ID, kind, IndexHash(value), from, to, afterB, afterS, func(bucket uint32, seq uint64) bool {
			if ctx.Err() != nil {
				scanErr = ctx.Err()
				return false
			}
			if len(out) == q.Limit {
				last := out[len(out)-1]
				next = &QueryCursor{Bucket: IndexBucket(last.StoredAtMs), Seq: last.Seq}
				return false
			}
			return take(seq)
		})
		return out, next, errors.Join(err, scanErr)
	}
	// A walk over queues in order, each from its first offset in range
	// (with no filter at all: every retained message, queue by queue).
	first := 0
	if q.QueueID != nil {
		if *q.QueueID < 0 || *q.QueueID >= len(queues) {
			return nil, nil, invalid("/queueId", "topic %s has queues 0-%d", rec.Name, len(queues)-1)
		}
		first = *q.QueueID
	}
	if q.Cursor != nil {
		first = int(q.Cursor.QueueID)
	}
	for qi := first; qi < len(queues) && next == nil; qi++ {
		if q.QueueID != nil && qi != *q.QueueID {
			break
		}
		qu := queues[qi]
		start, end := qu.min.Load(), qu.next.Load()
		if q.Offset != nil && q.QueueID != nil {
			start = max(start, *q.Offset)
		}
		if fromMs > 0 {
			off, ok, err := b.store.OffsetAtTime(rec.ID, qu.id, fromMs)
			if err != nil {
				return nil, nil, err
			}
			if !ok {
				continue
			}
			start = max(start, off)
		}
		if q.Cursor != nil && qi == int(q.Cursor.QueueID) {
			start = max(start, q.Cursor.Offset)
		}
		err := b.store.ScanQueue(rec.ID, qu.id, start, end, func(e IndexEntry) bool {
			if e.StoredAtMs > toMs {
				return false
			}
			if len(out) == q.Limit {
				next = &QueryCursor{QueueID: qu.id, Offset: e.Offset}
				return false
			}
			return take(e.Seq)
		})
		if err := errors.Join(err, scanErr); err != nil {
			return nil, nil, err
		}
	}
	return out, next, nil
}

// SeekResult is how many messages per queue a seek delivers again.
type SeekResult struct {
	Queues []SeekQueue
	Total  int64
}

// SeekQueue is one queue's share of a seek.
type SeekQueue struct {
	QueueID int
	Count   int64
}

// Seek moves every queue of a subscription (or of one broadcast consumer)
// to the first message stored at or after to ("earliest", "latest" or an
// RFC 3339 time). Messages from there on are delivered again (those already
// delivered are counted). With dryRun nothing moves.
func (b *Broker) Seek(ctx context.Context, topicName, group, to, consumerID string, dryRun bool) (SeekResult, error) {
	if to != "earliest" && to != "latest" {
		if _, err := time.Parse(time.RFC3339Nano, to); err != nil {
			return SeekResult{}, invalid("/to", "must be earliest, latest or an RFC 3339 time")
		}
	}
	s, err := b.subscription(topicName, group)
	if err != nil {
		return SeekResult{}, err
	}
	starts, err := b.startOffsets(s.topic, to)
	if err != nil {
		return SeekResult{}, err
	}
	res := SeekResult{Queues: make([]SeekQueue, len(starts))}
	s.lock()
	var cursors []*cursor
	for _, c := range s.cursors() {
		if consumerID == "" || c.consumerID == consumerID {
			cursors = append(cursors, c)
		}
	}
	if consumerID != "" && len(cursors) == 0 {
		s.mu.Unlock()
		return SeekResult{}, invalid("/consumerId", "no consumer %q in %s", consumerID, group)
	}
	var writes []func(Batch)
	var effects []*effect
	for _, c := range cursors {
		if !dryRun {
			effects = append(effects, &effect{c: c, seek: map[uint32]uint64{}, wake: true})
		}
	}
	for i, start := range starts {
		res.Queues[i].QueueID = i
		for j, c := range cursors {
			if i >= len(c.queues) {
				continue
			}
			sq := c.queues[i]
			if start < sq.next {
				res.Queues[i].Count += int64(sq.next - start)
			}
			if dryRun {
				continue
			}
			effects[j].seek[uint32(i)] = start
			id, qid, wm := c.id, uint32(i), start
			writes = append(writes, func(b Batch) {
				b.DeleteCursorQueue(id, qid)
				b.PutAckWatermark(id, qid, wm)
			})
		}
		res.Total += res.Queues[i].Count
	}
	var req *request
	if !dryRun && len(writes) > 0 {
		req = s.queueWritesLocked(writes, nil, effects...)
	}
	s.mu.Unlock()
	if req != nil {
		if err := <-req.done; err != nil {
			return SeekResult{}, err
		}
		b.log.Info("subscription seeked", "topic", topicName, "group", group, "to", to, "redelivered", res.Total)
	}
	return res, nil
}
