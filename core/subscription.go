package core

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/url"
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
// defaults; StartFrom matters only when the subscription is created, and
// Mode and Orderly cannot change afterwards.
type SubscriptionConfig struct {
	Mode        string
	Orderly     bool
	Filter      string
	MaxRetries  *int
	StartFrom   string
	RetryDelays []time.Duration
	Alerts      *AlertConfig
	Push        *PushConfig
}

type subscription struct {
	b     *Broker
	topic *topic
	// id and group never change; rec (replaced on update) is read under mu.
	id    uint32
	group string

	mu        sync.Mutex
	rec       *SubscriptionRecord
	filter    *tagFilter
	main      *cursor            // clustering mode
	members   map[string]*cursor // broadcast mode, by consumer id
	byID      map[uint32]*cursor
	consumers map[string]*consumerSeen
	deleted   bool
	nDead     int64
	pushState string // the push endpoint's breaker, as the pusher reports it

	// effects are the durable batches' changes not yet applied
	// (effects.go); nEffects lets lock skip effectsMu when there are none.
	effectsMu sync.Mutex
	effects   []pendingEffect
	nEffects  atomic.Int32

	// notify is closed and replaced whenever new messages may be ready.
	// Waiters load it before looking for messages, so no wake-up is missed.
	notify atomic.Pointer[chan struct{}]
	// wakeTimer wakes the waiters at wakeAtMs (0: not armed), the earliest
	// lease or suspension end of any cursor known when it was armed: the
	// time a delivery becomes ready again without anyone acting.
	wakeTimer *time.Timer
	wakeAtMs  int64
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
		b: b, topic: t, rec: rec, filter: f, id: rec.ID, group: rec.Group,
		members:   map[string]*cursor{},
		byID:      map[uint32]*cursor{},
		consumers: map[string]*consumerSeen{},
	}
	if rec.Mode != ModeBroadcast {
		s.main = newCursor(rec.ID, "")
		s.byID[rec.ID] = s.main
	}
	ch := make(chan struct{})
	s.notify.Store(&ch)
	return s, nil
}

// cursors lists the subscription's cursors. Caller holds s.mu.
func (s *subscription) cursors() []*cursor {
	if s.main != nil {
		return []*cursor{s.main}
	}
	out := make([]*cursor, 0, len(s.members))
	for _, c := range s.members {
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b *cursor) int { return strings.Compare(a.consumerID, b.consumerID) })
	return out
}

func (s *subscription) wake() {
	ch := make(chan struct{})
	old := s.notify.Swap(&ch)
	close(*old)
}

// noteLocked passes on to the parked pulls what changes to c under the
// lock mean for them: a delivery ready now wakes them, and the earliest
// deadline of c's leases and suspensions arms the wake-up timer. Every
// change to a cursor's deliveries ends with it. Caller holds s.mu.
func (s *subscription) noteLocked(c *cursor) {
	if c.readyNow {
		c.readyNow = false
		s.wake()
	}
	if len(c.leases) > 0 {
		s.wakeAtLocked(c.leases[0].deadline)
	}
}

// wakeAtLocked arms the wake-up timer for atMs unless it is armed for that
// time or sooner (the pulls woken then arm it again for what is left).
// Caller holds s.mu.
func (s *subscription) wakeAtLocked(atMs int64) {
	if s.deleted || s.b.closed.Load() || (s.wakeAtMs != 0 && s.wakeAtMs <= atMs) {
		return
	}
	s.wakeAtMs = atMs
	// One millisecond more: a deadline is over once the clock's
	// millisecond has reached it.
	d := time.Duration(atMs-s.b.now().UnixMilli()+1) * time.Millisecond
	if s.wakeTimer == nil {
		s.wakeTimer = time.AfterFunc(d, s.wakeTimerFired)
	} else {
		s.wakeTimer.Reset(d)
	}
}

func (s *subscription) wakeTimerFired() {
	s.lock()
	s.wakeAtMs = 0
	s.mu.Unlock()
	s.wake()
}

// stopWakeTimerLocked disarms the wake-up timer for good (the subscription
// is deleted or the broker closed). Caller holds s.mu.
func (s *subscription) stopWakeTimerLocked() {
	if s.wakeTimer != nil {
		s.wakeTimer.Stop()
	}
	s.wakeAtMs = 0
}

// subscriptions lists every subscription of every topic.
func (b *Broker) subscriptions() []*subscription {
	b.mu.RLock()
	defer b.mu.RUnlock()
	var subs []*subscription
	for _, t := range b.topics {
		for _, s := range t.subs {
			subs = append(subs, s)
		}
	}
	return subs
}

// stopWakeTimers disarms every subscription's wake-up timer, once the
// broker is closed (no timer is armed after that).
func (b *Broker) stopWakeTimers() {
	for _, s := range b.subscriptions() {
		s.lock()
		s.stopWakeTimerLocked()
		s.mu.Unlock()
	}
}

// wakeSubscriptions runs after every commit that appends to t. wake only
// swaps a channel (no lock), so it is done under the read lock, with no copy.
func (b *Broker) wakeSubscriptions(t *topic) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	for _, s := range t.subs {
		s.wake()
	}
}

// subsOf snapshots a topic's record and subscriptions, for work that must
// not hold Broker.mu (anything that takes a subscription's lock).
func (b *Broker) subsOf(t *topic) (*TopicRecord, []*subscription) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	subs := make([]*subscription, 0, len(t.subs))
	for _, s := range t.subs {
		subs = append(subs, s)
	}
	return t.rec, subs
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
func validateSubscriptionConfig(cfg SubscriptionConfig) (SubscriptionConfig, error) {
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
	if a := cfg.Alerts; a != nil {
		if a.MaxLag != nil && *a.MaxLag < 0 {
			return cfg, invalid("/alerts/maxLag", "must not be negative")
		}
		if a.MaxDLQ != nil && *a.MaxDLQ < 0 {
			return cfg, invalid("/alerts/maxDlq", "must not be negative")
		}
		if a.WebhookURL != "" && !strings.HasPrefix(a.WebhookURL, "http://") && !strings.HasPrefix(a.WebhookURL, "https://") {
			return cfg, invalid("/alerts/webhookUrl", "must be an http or https URL")
		}
	}
	if p := cfg.Push; p != nil {
		u, err := url.Parse(p.Endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return cfg, invalid("/push/endpoint", "must be an http or https URL")
		}
		if cfg.Mode == ModeBroadcast {
			return cfg, invalid("/push", "push delivery is for clustering subscriptions: one endpoint gets each message once")
		}
		if p.MaxInFlight == 0 {
			p.MaxInFlight = 16
		}
		if p.MaxInFlight < 1 || p.MaxInFlight > 1000 {
			return cfg, invalid("/push/maxInFlight", "must be between 1 and 1000")
		}
		if p.TimeoutSeconds == 0 {
			p.TimeoutSeconds = 30
		}
		if p.TimeoutSeconds < 1 || p.TimeoutSeconds > 300 {
			return cfg, invalid("/push/timeoutSeconds", "must be between 1 and 300")
		}
		if p.Secret != "" && (len(p.Secret) < 16 || len(p.Secret) > 256) {
			return cfg, invalid("/push/secret", "must be 16-256 characters")
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
	cfg, err := validateSubscriptionConfig(cfg)
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
		existing.lock()
		rec := *existing.rec
		existing.mu.Unlock()
		if rec.Mode != cfg.Mode || rec.Orderly != cfg.Orderly {
			return SubscriptionInfo{}, false, fmt.Errorf("%w: %s/%s is %s (orderly=%t); mode and orderly cannot change, delete and re-create it",
				ErrModeConflict, topicName, group, rec.Mode, rec.Orderly)
		}
		rec.Filter, rec.MaxRetries, rec.RetryDelays, rec.Alerts, rec.Push = cfg.Filter, *cfg.MaxRetries, cfg.RetryDelays, cfg.Alerts, cfg.Push
		f, _ := ParseFilter(rec.Filter)
		req := &request{kind: reqAdmin, admin: func(batch Batch) { batch.PutSubscription(&rec) },
			effects: []subEffect{{existing, &effect{rec: &rec, filter: f, wake: true}}}}
		if err := b.submit(ctx, req); err != nil {
			return SubscriptionInfo{}, false, err
		}
		return existing.info(), false, nil
	}
	rec := &SubscriptionRecord{
		ID: b.lastSub + 1, TopicID: t.rec.ID, Group: group, Mode: cfg.Mode, Orderly: cfg.Orderly,
		Filter: cfg.Filter, MaxRetries: *cfg.MaxRetries, StartFrom: cfg.StartFrom,
		RetryDelays: cfg.RetryDelays, CreatedAtMs: b.now().UnixMilli(), Alerts: cfg.Alerts, Push: cfg.Push,
	}
	s, err := newSubscription(b, t, rec)
	if err != nil {
		return SubscriptionInfo{}, false, err
	}
	var starts []uint64
	if s.main != nil {
		if starts, err = b.startOffsets(t, rec.StartFrom); err != nil {
			return SubscriptionInfo{}, false, err
		}
		for i, start := range starts {
			s.main.queues = append(s.main.queues, newSubQueue(uint32(i), start))
		}
	}
	lastTopic := b.lastTopic
	err = b.submit(ctx, &request{kind: reqAdmin, admin: func(batch Batch) {
		batch.PutSubscription(rec)
		batch.PutLastIDs(lastTopic, rec.ID)
		for i, start := range starts {
			batch.PutAckWatermark(rec.ID, uint32(i), start)
		}
	}, after: func() {
		b.mu.Lock()
		b.lastSub = rec.ID
		t.subs[group] = s
		b.subsByID[rec.ID] = s
		b.mu.Unlock()
	}})
	if err != nil {
		return SubscriptionInfo{}, false, err
	}
	b.log.Info("subscription created", "topic", topicName, "group", group, "mode", rec.Mode, "orderly", rec.Orderly, "start_from", rec.StartFrom)
	return s.info(), true, nil
}

// startOffsets resolves earliest, latest or a time to an offset per queue.
func (b *Broker) startOffsets(t *topic, from string) ([]uint64, error) {
	b.mu.RLock()
	queues := t.queues
	b.mu.RUnlock()
	out := make([]uint64, len(queues))
	for i, q := range queues {
		off, err := b.startOffset(t, q, from)
		if err != nil {
			return nil, err
		}
		out[i] = off
	}
	return out, nil
}

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
	next := q.next.Load()
	off, ok, err := b.store.OffsetAtTime(q.topicID, q.id, at.UnixMilli())
	if err != nil {
		return 0, err
	}
	if !ok {
		return next, nil
	}
	return min(max(off, q.min.Load()), next), nil
}

// member returns the cursor of a broadcast consumer, creating it (from the
// subscription's startFrom) the first time the consumer pulls.
func (b *Broker) member(ctx context.Context, s *subscription, consumerID string) (*cursor, error) {
	s.lock()
	c := s.members[consumerID]
	s.mu.Unlock()
	if c != nil {
		return c, nil
	}
	b.adminMu.Lock()
	defer b.adminMu.Unlock()
	s.lock()
	c, rec := s.members[consumerID], s.rec
	s.mu.Unlock()
	if c != nil {
		return c, nil
	}
	starts, err := b.startOffsets(s.topic, rec.StartFrom)
	if err != nil {
		return nil, err
	}
	c = newCursor(b.lastSub+1, consumerID)
	for i, start := range starts {
		c.queues = append(c.queues, newSubQueue(uint32(i), start))
	}
	lastTopic := b.lastTopic
	err = b.submit(ctx, &request{kind: reqAdmin, admin: func(batch Batch) {
		batch.PutMember(rec.ID, consumerID, c.id)
		batch.PutLastIDs(lastTopic, c.id)
		for i, start := range starts {
			batch.PutAckWatermark(c.id, uint32(i), start)
		}
	}, after: func() {
		b.mu.Lock()
		b.lastSub = c.id
		b.subsByID[c.id] = s
		b.mu.Unlock()
	}, effects: []subEffect{{s, &effect{member: c}}}})
	if err != nil {
		return nil, err
	}
	s.lock()
	defer s.mu.Unlock()
	if s.deleted {
		return nil, fmt.Errorf("%w: %s", ErrSubscriptionNotFound, rec.Group)
	}
	b.log.Info("broadcast consumer joined", "group", rec.Group, "consumer", consumerID)
	return c, nil
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
	return errors.Is(err, ErrTopicNotFound) || errors.Is(err, ErrSubscriptionNotFound)
}

// retriesOf lists the parked retries of a subscription's cursors, so that
// deleting it deletes them too.
func (s *subscription) retriesOf() (retries []*Parked, cursorIDs []uint32) {
	s.lock()
	defer s.mu.Unlock()
	for _, c := range s.byID {
		cursorIDs = append(cursorIDs, c.id)
		for k := range c.deliveries {
			if k.queue == RetryQueue {
				retries = append(retries, &Parked{ID: k.offset, Kind: ParkedRetry})
			}
		}
	}
	return retries, cursorIDs
}

func deleteSubscriptionWrites(batch Batch, s *subscription, retries []*Parked, cursorIDs []uint32) {
	for _, p := range retries {
		batch.DeleteParked(p)
	}
	for _, id := range cursorIDs {
		batch.DeleteCursor(id)
	}
	batch.DeleteSubscription(s.rec)
}

// DeleteSubscription removes a subscription and its consumer state.
func (b *Broker) DeleteSubscription(ctx context.Context, topicName, group string) error {
	b.adminMu.Lock()
	defer b.adminMu.Unlock()
	s, err := b.subscription(topicName, group)
	if err != nil {
		return err
	}
	retries, cursorIDs := s.retriesOf()
	err = b.submit(ctx, &request{kind: reqAdmin, admin: func(batch Batch) { deleteSubscriptionWrites(batch, s, retries, cursorIDs) }, after: func() {
		b.mu.Lock()
		delete(s.topic.subs, group)
		for _, id := range cursorIDs {
			delete(b.subsByID, id)
		}
		delete(b.subsByID, s.id)
		b.mu.Unlock()
	}, effects: []subEffect{{s, &effect{deleted: true, wake: true}}}})
	if err != nil {
		return err
	}
	b.log.Info("subscription deleted", "topic", topicName, "group", group)
	return nil
}

// SubscriptionInfo is a subscription's configuration and consumption state.
// For broadcast subscriptions the per-queue figures are those of the
// slowest consumer (lowest acked offset, largest lag) and inflight sums.
type SubscriptionInfo struct {
	Topic, Group string
	Config       SubscriptionRecord
	// PushState is the push endpoint's circuit breaker: closed, open or
	// half-open ("" for pull subscriptions).
	PushState string
	CreatedAt time.Time
	Queues    []SubQueueStat
	Lag       int64
	Inflight  int64
	Retrying  int64
	DLQ       int64
	Consumers []ConsumerStat
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
	return b.eachSubscription(topicName, (*subscription).info)
}

// SubscriptionConfigs lists a topic's subscriptions, sorted by group, with
// their Topic, Group, Config and CreatedAt alone: what a caller that polls
// for configuration changes (the push workers' reconciler, every second)
// needs, without the stats' work (lag scans, the consumer list) under
// each subscription's lock.
func (b *Broker) SubscriptionConfigs(topicName string) ([]SubscriptionInfo, error) {
	return b.eachSubscription(topicName, func(s *subscription) SubscriptionInfo {
		s.lock()
		defer s.mu.Unlock()
		return s.configInfo(topicName)
	})
}

// configInfo is the subscription's name and configuration, the part of
// SubscriptionInfo every listing has. The caller holds s.mu.
func (s *subscription) configInfo(topicName string) SubscriptionInfo {
	return SubscriptionInfo{Topic: topicName, Group: s.group, Config: *s.rec,
		CreatedAt: time.UnixMilli(s.rec.CreatedAtMs).UTC()}
}

// eachSubscription describes each of a topic's subscriptions with
// describe, sorted by group.
func (b *Broker) eachSubscription(topicName string, describe func(*subscription) SubscriptionInfo) ([]SubscriptionInfo, error) {
	if err := ValidateName("topic", topicName); err != nil {
		return nil, err
	}
	t, err := b.topic(topicName)
	if err != nil {
		return nil, err
	}
	_, subs := b.subsOf(t)
	out := make([]SubscriptionInfo, 0, len(subs))
	for _, s := range subs {
		out = append(out, describe(s))
	}
	slices.SortFunc(out, func(a, b SubscriptionInfo) int { return strings.Compare(a.Group, b.Group) })
	return out, nil
}

// stats is info without the consumer list: the broker's own periodic
// readers (alerts, metrics) need the counts alone.
func (s *subscription) stats() SubscriptionInfo { return s.infoOf(false) }

func (s *subscription) info() SubscriptionInfo { return s.infoOf(true) }

// infoOf describes the subscription, its consumers only when consumers is
// set: with thousands of consumers (a parked long poll each) the sorted
// list is megabytes a call, made holding the lock pulls wait for. Expired
// consumers are dropped either way.
func (s *subscription) infoOf(consumers bool) SubscriptionInfo {
	b := s.b
	b.mu.RLock()
	queues := s.topic.queues
	topicName := s.topic.rec.Name
	b.mu.RUnlock()
	now := b.now()
	s.lock()
	defer s.mu.Unlock()
	info := s.configInfo(topicName)
	info.Queues = make([]SubQueueStat, len(queues))
	info.DLQ = s.nDead
	if s.rec.Push != nil {
		info.PushState = s.pushState
		if info.PushState == "" {
			info.PushState = "closed"
		}
	}
	for i, q := range queues {
		info.Queues[i] = SubQueueStat{QueueID: i, MaxOffset: q.next.Load(), AckedOffset: q.next.Load()}
	}
	for ci, c := range s.cursors() {
		inflight := make([]int64, len(queues))
		for _, d := range c.deliveries {
			if d.suspended {
				info.Retrying++ // an orderly key waiting out its retry delay
			}
			switch {
			case !d.leased:
			case d.isRetry():
				info.Inflight++
			case int(d.queue) < len(inflight):
				inflight[d.queue]++
			}
		}
		info.Retrying += c.nRetry
		for i, sq := range c.queues {
			if i >= len(queues) {
				break
			}
			q := queues[i]
			minOff := q.min.Load()
			lag := s.queueLag(q, sq)
			st := &info.Queues[i]
			acked := max(sq.acked, minOff)
			if ci == 0 || acked < st.AckedOffset {
				st.AckedOffset = acked
			}
			st.Lag = max(st.Lag, lag)
			st.Inflight += inflight[i]
		}
	}
	for _, st := range info.Queues {
		info.Lag += st.Lag
		info.Inflight += st.Inflight
	}
	// A nacked message left its queue for a retry but is not acked yet
	// (an orderly one that waits is still counted in its queue).
	for _, c := range s.cursors() {
		info.Lag += c.nRetry
	}
	for id, c := range s.consumers {
		if now.Sub(c.lastSeen) > b.opts.ConsumerExpiry {
			delete(s.consumers, id)
		}
	}
	if !consumers {
		return info
	}
	for _, id := range slices.Sorted(maps.Keys(s.consumers)) {
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

// lagScanMax bounds the index entries queueLag reads per queue: it holds
// the subscription's lock, which pulls wait for.
const lagScanMax = 1 << 14

// queueLag counts the messages of q that are stored and not yet acked, for
// sq's cursor. Messages the filter skips count as acked (SPEC §2) whether
// or not the cursor has passed them, and so do outstanding ones the filter
// no longer takes (their next delivery drops them): lag is a function of
// the stored state, and a broker rebuilt after a restart, whose cursor
// starts again at the watermark with no leases, reports what the running
// one did. With a selective filter it reads the index ahead of the cursor
// (and, while a filter change's rescan is under way, from the watermark);
// past lagScanMax entries every message counts. Caller holds s.mu.
func (s *subscription) queueLag(q *queue, sq *subQueue) int64 {
	maxOff, minOff := q.next.Load(), q.min.Load()
	lag := int64(sq.nOut)
	// Outstanding offsets that retention removed are no longer stored
	// (their deliveries end when next touched).
	for o, ok := sq.out.first(sq.acked); ok && o < minOff; o, ok = sq.out.first(o + 1) {
		lag--
	}
	// No early return when the cursor is at the end: outstanding offsets
	// from before a filter change may still need leaving out.
	cursor, from := max(sq.next, minOff), max(sq.next, minOff)
	scanTo := from // no filter: nothing to read
	if !s.filter.all() {
		if low := max(sq.acked, minOff); sq.rescanTo > low {
			from = low // outstanding offsets from before the filter changed
		}
		scanTo = min(maxOff, from+lagScanMax)
	}
	var m int64
	if scanTo > from {
		// The choices the cursor's scan makes (cursor.scan).
		err := s.b.store.ScanQueue(q.topicID, sq.id, from, scanTo, func(e IndexEntry) bool {
			o, match := e.Offset, s.filter.mayMatch(e.TagHash)
			switch {
			case o < sq.rescanTo && sq.out.has(o):
				if !match {
					m-- // counted in nOut
				}
			case o < cursor, sq.preAcked[o], o < sq.rescanTo && sq.durableAcks[o], !match:
			default:
				m++
			}
			return true
		})
		if err != nil {
			// Stats must not fail: count as past the scan.
			s.b.log.Warn("lag: reading the queue index", "topic_id", q.topicID, "queue", sq.id, "err", err)
			m, scanTo = 0, cursor
		}
	}
	// Past the scan every message counts but those the cursor will pass.
	if rest := max(scanTo, cursor); maxOff > rest {
		m += int64(maxOff-rest) - sq.passed(rest, maxOff)
	}
	return lag + m
}

// passed counts the offsets of [lo, hi) the cursor's scan will pass
// without a delivery: acks restored from before a restart and, below
// rescanTo, offsets outstanding (counted in nOut) or acked.
func (sq *subQueue) passed(lo, hi uint64) int64 {
	var n int64
	for o := range sq.preAcked {
		if o >= lo && o < hi {
			n++
		}
	}
	top := min(hi, sq.rescanTo)
	for o := range sq.durableAcks {
		if o >= lo && o < top && !sq.preAcked[o] {
			n++
		}
	}
	for o, ok := sq.out.first(lo); ok && o < top; o, ok = sq.out.first(o + 1) {
		if !sq.preAcked[o] && !sq.durableAcks[o] {
			n++
		}
	}
	return n
}

// SetPushState records the push endpoint's breaker state for stats.
func (b *Broker) SetPushState(topicName, group, state string) {
	if s, err := b.subscription(topicName, group); err == nil {
		s.lock()
		s.pushState = state
		s.mu.Unlock()
	}
}
