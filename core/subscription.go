package core

import (
	"container/heap"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultRetryDelays is RocketMQ's retry schedule; the last step repeats.
var DefaultRetryDelays = []time.Duration{
	10 * time.Second, 30 * time.Second, time.Minute, 2 * time.Minute, 3 * time.Minute,
	4 * time.Minute, 5 * time.Minute, 6 * time.Minute, 7 * time.Minute, 8 * time.Minute,
	9 * time.Minute, 10 * time.Minute, 20 * time.Minute, 30 * time.Minute, time.Hour, 2 * time.Hour,
}

const (
	DefaultMaxRetries = 5
	MaxMaxRetries     = 32
)

// SubscriptionConfig is what a client may set. Nil and zero fields take
// defaults; StartFrom matters only when the subscription is created.
type SubscriptionConfig struct {
	Mode        string
	Orderly     bool
	Filter      string
	MaxRetries  *int
	StartFrom   string
	RetryDelays []time.Duration
}

type subscription struct {
	b     *Broker
	topic *topic

	mu         sync.Mutex
	rec        *SubscriptionRecord
	filter     *tagFilter
	queues     []*subQueue
	deliveries map[dkey]*delivery
	leases     leaseHeap
	released   []*delivery // waiting to be delivered again, oldest first
	rr         int
	consumers  map[string]*consumerSeen
	deleted    bool
	nRetry     int64 // parked retries (waiting, ready or leased)
	nDead      int64

	// notify is closed and replaced whenever new messages may be ready.
	// Waiters load it before looking for messages, so no wake-up is missed.
	notify atomic.Pointer[chan struct{}]
}

type dkey struct {
	queue  uint32
	offset uint64
}

// retryQueue is the queue id of deliveries of parked retries; their offset
// is the parked record's id.
const retryQueue = ^uint32(0)

// delivery is an outstanding message: leased, waiting to go out again
// (ready), or a parked retry waiting for its timer.
type delivery struct {
	queue     uint32
	offset    uint64
	seq       uint64
	attempt   int // deliveries made so far
	leaseID   uint64
	deadline  int64 // Unix ms; meaningful while leased
	leased    bool
	ready     bool  // in subscription.released
	dueMs     int64 // parked retries: when the timer makes it ready
	consumer  string
	heapIndex int
}

func (d *delivery) isRetry() bool { return d.queue == retryQueue }

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
	persistedWM uint64
}

type consumerSeen struct {
	lastSeen time.Time
	queues   map[uint32]bool
}

func newSubscription(b *Broker, t *topic, rec *SubscriptionRecord) (*subscription, error) {
	f, err := ParseFilter(rec.Filter)
	if err != nil {
		return nil, err
	}
	s := &subscription{
		b: b, topic: t, rec: rec, filter: f,
		deliveries: map[dkey]*delivery{},
		consumers:  map[string]*consumerSeen{},
	}
	ch := make(chan struct{})
	s.notify.Store(&ch)
	return s, nil
}

// restore sets the queues from their durable positions.
func (s *subscription) restore(acks []QueueAcks) {
	b := s.b
	b.mu.RLock()
	n := len(s.topic.queues)
	b.mu.RUnlock()
	s.growQueues(n)
	for _, a := range acks {
		if int(a.QueueID) >= len(s.queues) {
			continue
		}
		sq := s.queues[a.QueueID]
		sq.acked, sq.next, sq.persistedWM = a.Watermark, a.Watermark, a.Watermark
		for _, o := range a.Acked {
			if o >= a.Watermark {
				sq.preAcked[o] = true
			}
			sq.durableAcks[o] = true
		}
	}
}

func (s *subscription) growQueues(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := len(s.queues); i < n; i++ {
		s.queues = append(s.queues, &subQueue{id: uint32(i), preAcked: map[uint64]bool{}, durableAcks: map[uint64]bool{}})
	}
}

func (s *subscription) wake() {
	ch := make(chan struct{})
	old := s.notify.Swap(&ch)
	close(*old)
}

func (s *subscription) markDeleted() {
	s.mu.Lock()
	s.deleted = true
	s.mu.Unlock()
	s.wake()
}

func (b *Broker) wakeSubscriptions(t *topic) {
	b.mu.RLock()
	subs := make([]*subscription, 0, len(t.subs))
	for _, s := range t.subs {
		subs = append(subs, s)
	}
	b.mu.RUnlock()
	for _, s := range subs {
		s.wake()
	}
}

func (b *Broker) subscription(topicName, group string) (*subscription, error) {
	if err := ValidateName("topic", topicName); err != nil {
		return nil, err
	}
	if err := ValidateName("group", group); err != nil {
		return nil, err
	}
	b.mu.RLock()
	defer b.mu.RUnlock()
	t := b.topics[topicName]
	if t == nil {
		return nil, fmt.Errorf("%w: %s", ErrTopicNotFound, topicName)
	}
	s := t.subs[group]
	if s == nil {
		return nil, fmt.Errorf("%w: %s/%s", ErrSubscriptionNotFound, topicName, group)
	}
	return s, nil
}

// validateSubscriptionConfig fills defaults and checks every field.
func validateSubscriptionConfig(cfg SubscriptionConfig, now time.Time) (SubscriptionConfig, error) {
	switch cfg.Mode {
	case "":
		cfg.Mode = ModeClustering
	case ModeClustering, ModeBroadcast:
	default:
		return cfg, invalid("/mode", "must be clustering or broadcast")
	}
	if cfg.Filter == "" {
		cfg.Filter = "*"
	}
	if _, err := ParseFilter(cfg.Filter); err != nil {
		return cfg, err
	}
	if cfg.MaxRetries == nil {
		n := DefaultMaxRetries
		cfg.MaxRetries = &n
	} else if *cfg.MaxRetries < 0 || *cfg.MaxRetries > MaxMaxRetries {
		return cfg, invalid("/maxRetries", "must be between 0 and %d", MaxMaxRetries)
	}
	if len(cfg.RetryDelays) == 0 {
		cfg.RetryDelays = DefaultRetryDelays
	}
	for i, d := range cfg.RetryDelays {
		if d < 0 || d > 24*time.Hour {
			return cfg, invalid(fmt.Sprintf("/retryDelays/%d", i), "must be between 0s and 24h")
		}
	}
	switch cfg.StartFrom {
	case "":
		cfg.StartFrom = "earliest"
	case "earliest", "latest":
	default:
		if _, err := time.Parse(time.RFC3339Nano, cfg.StartFrom); err != nil {
			return cfg, invalid("/startFrom", "must be earliest, latest or an RFC 3339 time")
		}
	}
	return cfg, nil
}

// PutSubscription creates or updates a subscription; it reports whether it
// was created. A missing topic is created when auto-create is on.
func (b *Broker) PutSubscription(ctx context.Context, topicName, group string, cfg SubscriptionConfig) (SubscriptionInfo, bool, error) {
	if err := ValidateName("topic", topicName); err != nil {
		return SubscriptionInfo{}, false, err
	}
	if err := ValidateName("group", group); err != nil {
		return SubscriptionInfo{}, false, err
	}
	cfg, err := validateSubscriptionConfig(cfg, b.now())
	if err != nil {
		return SubscriptionInfo{}, false, err
	}
	t, err := b.topicForSend(ctx, topicName)
	if err != nil {
		return SubscriptionInfo{}, false, err
	}
	b.adminMu.Lock()
	defer b.adminMu.Unlock()
	b.mu.RLock()
	existing := t.subs[group]
	b.mu.RUnlock()
	if t.deleted.Load() {
		return SubscriptionInfo{}, false, fmt.Errorf("%w: %s", ErrTopicNotFound, topicName)
	}
	if existing != nil {
		existing.mu.Lock()
		rec := *existing.rec
		existing.mu.Unlock()
		rec.Mode, rec.Orderly, rec.Filter = cfg.Mode, cfg.Orderly, cfg.Filter
		rec.MaxRetries, rec.RetryDelays = *cfg.MaxRetries, cfg.RetryDelays
		if err := b.submit(ctx, &request{kind: reqAdmin, admin: func(batch Batch) { batch.PutSubscription(&rec) }}); err != nil {
			return SubscriptionInfo{}, false, err
		}
		f, _ := ParseFilter(rec.Filter)
		existing.mu.Lock()
		existing.rec, existing.filter = &rec, f
		existing.mu.Unlock()
		existing.wake()
		return existing.info(), false, nil
	}
	rec := &SubscriptionRecord{
		ID: b.lastSub + 1, TopicID: t.rec.ID, Group: group, Mode: cfg.Mode, Orderly: cfg.Orderly,
		Filter: cfg.Filter, MaxRetries: *cfg.MaxRetries, StartFrom: cfg.StartFrom,
		RetryDelays: cfg.RetryDelays, CreatedAtMs: b.now().UnixMilli(),
	}
	s, err := newSubscription(b, t, rec)
	if err != nil {
		return SubscriptionInfo{}, false, err
	}
	b.mu.RLock()
	queues := t.queues
	b.mu.RUnlock()
	s.growQueues(len(queues))
	for i, q := range queues {
		start, err := b.startOffset(t, q, cfg.StartFrom)
		if err != nil {
			return SubscriptionInfo{}, false, err
		}
		sq := s.queues[i]
		sq.acked, sq.next, sq.persistedWM = start, start, start
	}
	err = b.submit(ctx, &request{kind: reqAdmin, admin: func(batch Batch) {
		batch.PutSubscription(rec)
		for _, sq := range s.queues {
			batch.PutAckWatermark(rec.ID, sq.id, sq.acked)
		}
	}})
	if err != nil {
		return SubscriptionInfo{}, false, err
	}
	b.mu.Lock()
	b.lastSub = rec.ID
	t.subs[group] = s
	b.subsByID[rec.ID] = s
	b.mu.Unlock()
	b.log.Info("subscription created", "topic", topicName, "group", group, "mode", rec.Mode, "start_from", rec.StartFrom)
	return s.info(), true, nil
}

// startOffset resolves earliest, latest or a time to an offset of q.
func (b *Broker) startOffset(t *topic, q *queue, from string) (uint64, error) {
	switch from {
	case "earliest":
		return q.min.Load(), nil
	case "latest":
		return q.next.Load(), nil
	}
	at, err := time.Parse(time.RFC3339Nano, from)
	if err != nil {
		return 0, invalid("/startFrom", "must be earliest, latest or an RFC 3339 time")
	}
	off, ok, err := b.store.OffsetAtTime(t.rec.ID, q.id, at.UnixMilli())
	if err != nil {
		return 0, err
	}
	if !ok {
		return q.next.Load(), nil
	}
	return max(off, q.min.Load()), nil
}

// subscriptionForPull returns the subscription, creating it with defaults
// when auto-create is on.
func (b *Broker) subscriptionForPull(ctx context.Context, topicName, group string) (*subscription, error) {
	s, err := b.subscription(topicName, group)
	if err == nil || !b.opts.AutoCreate || !isNotFound(err) {
		return s, err
	}
	if _, _, err := b.PutSubscription(ctx, topicName, group, SubscriptionConfig{}); err != nil {
		return nil, err
	}
	return b.subscription(topicName, group)
}

func isNotFound(err error) bool {
	return errorsIs(err, ErrTopicNotFound) || errorsIs(err, ErrSubscriptionNotFound)
}

// DeleteSubscription removes a subscription and its consumer state.
func (b *Broker) DeleteSubscription(ctx context.Context, topicName, group string) error {
	b.adminMu.Lock()
	defer b.adminMu.Unlock()
	s, err := b.subscription(topicName, group)
	if err != nil {
		return err
	}
	s.mu.Lock()
	var retries []*Parked
	for k := range s.deliveries {
		if k.queue == retryQueue {
			retries = append(retries, &Parked{ID: k.offset, Kind: ParkedRetry})
		}
	}
	s.mu.Unlock()
	err = b.submit(ctx, &request{kind: reqAdmin, admin: func(batch Batch) {
		for _, p := range retries {
			batch.DeleteParked(p)
		}
		batch.DeleteSubscription(s.rec)
	}})
	if err != nil {
		return err
	}
	b.mu.Lock()
	delete(s.topic.subs, group)
	delete(b.subsByID, s.rec.ID)
	b.mu.Unlock()
	s.markDeleted()
	b.log.Info("subscription deleted", "topic", topicName, "group", group)
	return nil
}

// SubscriptionInfo is a subscription's configuration and consumption state.
type SubscriptionInfo struct {
	Topic, Group string
	Config       SubscriptionRecord
	CreatedAt    time.Time
	Queues       []SubQueueStat
	Lag          int64
	Inflight     int64
	Retrying     int64
	DLQ          int64
	Consumers    []ConsumerStat
}

// SubQueueStat is a subscription's position in one queue.
type SubQueueStat struct {
	QueueID     int
	MaxOffset   uint64
	AckedOffset uint64
	Inflight    int64
	Lag         int64
}

// ConsumerStat is one consumer seen pulling.
type ConsumerStat struct {
	ConsumerID string
	LastSeen   time.Time
	Queues     []int
}

// GetSubscription describes one subscription.
func (b *Broker) GetSubscription(topicName, group string) (SubscriptionInfo, error) {
	s, err := b.subscription(topicName, group)
	if err != nil {
		return SubscriptionInfo{}, err
	}
	return s.info(), nil
}

// ListSubscriptions describes a topic's subscriptions, sorted by group.
func (b *Broker) ListSubscriptions(topicName string) ([]SubscriptionInfo, error) {
	if err := ValidateName("topic", topicName); err != nil {
		return nil, err
	}
	t, err := b.topic(topicName)
	if err != nil {
		return nil, err
	}
	b.mu.RLock()
	subs := make([]*subscription, 0, len(t.subs))
	for _, s := range t.subs {
		subs = append(subs, s)
	}
	b.mu.RUnlock()
	out := make([]SubscriptionInfo, 0, len(subs))
	for _, s := range subs {
		out = append(out, s.info())
	}
	slices.SortFunc(out, func(a, b SubscriptionInfo) int { return strings.Compare(a.Group, b.Group) })
	return out, nil
}

func (s *subscription) info() SubscriptionInfo {
	b := s.b
	b.mu.RLock()
	queues := s.topic.queues
	topicName := s.topic.rec.Name
	b.mu.RUnlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	info := SubscriptionInfo{
		Topic: topicName, Group: s.rec.Group, Config: *s.rec,
		CreatedAt: time.UnixMilli(s.rec.CreatedAtMs).UTC(),
		Queues:    make([]SubQueueStat, 0, len(s.queues)),
	}
	inflight := make([]int64, len(s.queues))
	for _, d := range s.deliveries {
		if d.leased && !d.isRetry() && int(d.queue) < len(inflight) {
			inflight[d.queue]++
		}
	}
	for i, sq := range s.queues {
		if i >= len(queues) {
			break
		}
		q := queues[i]
		maxOff, minOff := q.next.Load(), q.min.Load()
		// Lag counts what is stored and not yet acked: the outstanding
		// offsets behind the cursor plus everything ahead of it. Messages
		// the filter skips count as acked once the cursor passed them.
		lag := int64(sq.nOut)
		if cursor := max(sq.next, minOff); maxOff > cursor {
			lag += int64(maxOff - cursor)
		}
		info.Queues = append(info.Queues, SubQueueStat{
			QueueID: i, MaxOffset: maxOff, AckedOffset: max(sq.acked, minOff),
			Inflight: inflight[i], Lag: lag,
		})
		info.Lag += lag
		info.Inflight += inflight[i]
	}
	for _, d := range s.deliveries {
		if d.isRetry() && d.leased {
			info.Inflight++
		}
	}
	info.Retrying, info.DLQ = s.nRetry, s.nDead
	ids := make([]string, 0, len(s.consumers))
	for id := range s.consumers {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		c := s.consumers[id]
		qs := make([]int, 0, len(c.queues))
		for q := range c.queues {
			qs = append(qs, int(q))
		}
		slices.Sort(qs)
		info.Consumers = append(info.Consumers, ConsumerStat{ConsumerID: id, LastSeen: c.lastSeen, Queues: qs})
	}
	return info
}

// leaseHeap orders leased deliveries by deadline.
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
