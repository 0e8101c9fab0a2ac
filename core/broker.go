package core

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// Defaults applied where an Options or request field is zero.
const (
	DefaultQueues            = 8
	DefaultRetentionHours    = 24
	DefaultMaxMessageBytes   = 4 << 20
	DefaultMaxLeasesPerQueue = 10000
	MaxQueues                = 1024
	MaxRetentionHours        = 8760
	MaxBatchMessages         = 1000
)

// Options configures a Broker. The zero value works: auto-create off, fsync on.
type Options struct {
	Logger *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// AutoCreate creates a missing topic on send and a missing subscription
	// on pull, with defaults.
	AutoCreate bool
	// NoSync commits without fsync (--fsync=never): a crash may lose the
	// last moments of acknowledged sends.
	NoSync bool
	// MaxMessageBytes caps one message body (default 4 MiB).
	MaxMessageBytes int
	// MaxLeasesPerQueue caps leased messages per subscription queue: flow
	// control for consumers that pull and never ack (default 10000).
	MaxLeasesPerQueue int
	// MaxCommitBytes caps one appender batch (default 8 MiB).
	MaxCommitBytes int
	// ConsumerExpiry is how long a consumer that stopped pulling stays in
	// subscription stats (default 2 minutes).
	ConsumerExpiry time.Duration
	// TracerProvider records the spans of every message's life; nil
	// records nothing.
	TracerProvider trace.TracerProvider
	// MeterProvider records broker metrics; nil records nothing.
	MeterProvider metric.MeterProvider
	// Notifier receives alert changes; nil only logs them.
	Notifier Notifier
	// AlertInterval is how often alert thresholds are checked (default 5s).
	AlertInterval time.Duration
	// MaxQueuedBytes bounds the message bytes waiting for the appender;
	// past it sends are refused with ErrTooManyRequests (default 256 MiB).
	MaxQueuedBytes int64
	// MaxParkedPulls bounds the long polls waiting at once; past it a pull
	// that would wait is refused with ErrTooManyRequests (default 10000).
	MaxParkedPulls int64
	// MinFreeBytes is the disk space kept free: below it sends are refused
	// with ErrInsufficientStorage (and stored again once space returns),
	// so the store never meets a full disk, which Pebble treats as fatal.
	// Acks and other small writes go on. Default 128 MiB.
	MinFreeBytes int64
	// ReceiptKey signs receipt handles (receipt.go), so clients cannot
	// forge them. Empty means a random key for the broker's lifetime:
	// then handles do not survive a restart.
	ReceiptKey []byte
	// TransactionChecker asks producers about undecided transactions; nil
	// makes every check fail (and the transaction roll back after its
	// last). Only the broker serving a topic runs: a cluster's leader.
	TransactionChecker TransactionChecker
	// Proposer makes each batch the broker commits durable; nil commits to
	// the store (synced unless NoSync). A cluster's proposer hands
	// batch.Repr() to raft and every replica applies it with
	// Store.ApplyBatch, so replicas hold the leader's bytes.
	Proposer Proposer
	// DedupWindow is how long a send's dedup key is remembered (default
	// 5 minutes, SPEC §2); tests shorten it.
	DedupWindow time.Duration
}

func (o *Options) withDefaults() {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.MaxMessageBytes <= 0 {
		o.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if o.MaxLeasesPerQueue <= 0 {
		o.MaxLeasesPerQueue = DefaultMaxLeasesPerQueue
	}
	if o.MaxCommitBytes <= 0 {
		o.MaxCommitBytes = 8 << 20
	}
	if o.ConsumerExpiry <= 0 {
		o.ConsumerExpiry = 2 * time.Minute
	}
	if o.AlertInterval <= 0 {
		o.AlertInterval = 5 * time.Second
	}
	if o.MaxQueuedBytes <= 0 {
		o.MaxQueuedBytes = 256 << 20
	}
	if o.MaxParkedPulls <= 0 {
		o.MaxParkedPulls = 10000
	}
	if o.MinFreeBytes <= 0 {
		o.MinFreeBytes = 128 << 20
	}
	if o.DedupWindow <= 0 {
		o.DedupWindow = DedupWindow
	}
}

// Broker is the single-node message broker. All methods are safe for
// concurrent use.
type Broker struct {
	opts     Options
	store    Store
	proposer Proposer // commits every batch (Options.Proposer)
	log      *slog.Logger

	// adminMu serializes topic and subscription definition changes, which
	// are rare; sends, pulls and acks never take it.
	adminMu     sync.Mutex
	retentionMu sync.Mutex

	mu         sync.RWMutex // guards the maps below
	topics     map[string]*topic
	topicsByID map[uint32]*topic
	lastTopic  uint32
	lastSub    uint32

	requests chan *request
	// closeMu makes queueing a request and Close exclude each other, so no
	// request lands in the channel after the appender stopped reading it.
	closeMu sync.RWMutex
	// queuedBytes counts the message bytes of sends waiting for the appender.
	queuedBytes atomic.Int64
	// polling is closed by StopPolling: parked pulls answer at once and
	// new pulls do not wait, while sends and acks still work.
	polling     chan struct{}
	stopPolling sync.Once
	closing     chan struct{}
	closed      atomic.Bool
	// lingering is set while the appender waits for a group to gather
	// (gather with a timer): a send then joins it instead of committing alone.
	lingering atomic.Bool
	// inFlight counts requests handed to submit and not yet answered,
	// arriving the API's writing requests from their arrival (Arriving), and
	// expected is how many the group commit expects per round (appender.go).
	inFlight    atomic.Int64
	arriving    atomic.Int64
	arrivedFunc func() // b.arrived, made once: Arriving runs for every write request
	expected    atomic.Int64
	// groupUntil is when the round after the last commit stops waiting for
	// the expected requests (UnixNano; 0: it does not wait).
	groupUntil atomic.Int64
	// commitTime is the moving average of a proposal's duration, in ns,
	// written under commitMu and read by the appender before it takes it;
	// lingerMisses and skipRounds say whether waiting paid (under commitMu).
	commitTime   atomic.Int64
	lingerMisses int
	skipRounds   int
	// committedSeq is the seq after the last committed record; logCut the
	// seq retention last cut the log below (0 after a start: the first
	// pass cuts once more, harmlessly).
	committedSeq, logCut atomic.Uint64
	wg                   sync.WaitGroup

	subsByID map[uint32]*subscription // under mu
	mirrors  map[string]*mirror       // under mu

	// commitMu is held by whoever runs commit: the appender, or a lone
	// send committing itself (commitAlone). The fields below are theirs.
	commitMu sync.Mutex

	// appender-owned (under commitMu)
	diskFull   bool
	space      spaceReading // the last free-space reading (checkSpace)
	nextSeq    uint64
	lastMs     int64
	touched    []*queue
	dedup      map[dedupID]*DedupRecord
	dedupOrder []*DedupRecord // by StoredMs, oldest first
	dedupAdded []*DedupRecord // in the batch being built
	// counters is what the last committed batch stored.
	counters Counters
	// mirrorsTouched are the mirrors whose skip state the batch changes.
	mirrorsTouched []*mirror

	// ids names history, parked and dead records; it continues from the
	// stored counters (restoreCounters), so ids never repeat across restarts.
	ids         atomic.Uint64
	timers      *timerWake
	timerCursor atomic.Int64 // owned by the timer loop
	timerLow    atomic.Int64 // lowest due time committed since the last scan began; 0 = none

	tel *telemetry

	// ctx ends when Close begins: the checks in flight stop.
	ctx    context.Context
	cancel context.CancelFunc
	// txMu guards the open transactions (transaction.go).
	txMu    sync.Mutex
	txns    map[uint64]*txn
	txByMsg map[string]*txn
	// checkTokens numbers the checks started (under txMu).
	checkTokens uint64
	checkSlots  chan struct{}

	// leaseIDs counts the leases of this epoch from 1. epoch is raised and
	// made durable on every start, so a handle names the run that gave it.
	leaseIDs atomic.Uint64
	epoch    uint64
	group    uint32 // the replica group in handles; 0 on a single node
	receipts *receiptSealer
}

type topic struct {
	rec    *TopicRecord // replaced, never mutated, under Broker.mu
	queues []*queue     // grows only, under Broker.mu
	subs   map[string]*subscription
	rr     atomic.Uint32
	// deleted is set by the appender when a delete is applied; later
	// appends to the same *topic fail.
	deleted atomic.Bool
	// half counts the half messages of open transactions (transaction.go).
	half atomic.Int64
	// indexCut is the secondary index bucket retention last cut below.
	indexCut atomic.Uint32
	// metricAttrs labels the topic's send counters, made once: building
	// the attribute set on every send was a percent of a single send's CPU.
	// A slice, passed on as it is: an option given alone is put in a new
	// one by every call.
	metricAttrs []metric.AddOption
}

func newTopic(rec *TopicRecord) *topic {
	return &topic{rec: rec, subs: map[string]*subscription{},
		metricAttrs: []metric.AddOption{metric.WithAttributes(attribute.String("topic", rec.Name))}}
}

// queue is one ordered log of a topic.
type queue struct {
	topicID uint32
	id      uint32
	next    atomic.Uint64 // durable: the offset the next message gets; pulls read below it
	min     atomic.Uint64
	bytes   atomic.Int64

	// appender-owned: what the batch being built has assigned.
	pendingNext  uint64
	pendingBytes int64
	touched      bool
}

// New builds a broker over an opened store and starts its appender.
func New(store Store, opts Options) (*Broker, error) {
	opts.withDefaults()
	snap, err := store.Load()
	if err != nil {
		return nil, fmt.Errorf("core: load: %w", err)
	}
	b := &Broker{
		opts:       opts,
		store:      store,
		proposer:   opts.proposer(),
		log:        opts.Logger.With("component", "broker"),
		topics:     map[string]*topic{},
		topicsByID: map[uint32]*topic{},
		requests:   make(chan *request, 4096),
		subsByID:   map[uint32]*subscription{},
		mirrors:    map[string]*mirror{},
		timers:     newTimerWake(),
		dedup:      map[dedupID]*DedupRecord{},
		closing:    make(chan struct{}),
		polling:    make(chan struct{}),
		lastTopic:  snap.LastTopicID,
		lastSub:    snap.LastSubID,
		txns:       map[uint64]*txn{},
		txByMsg:    map[string]*txn{},
		checkSlots: make(chan struct{}, maxConcurrentChecks),
	}
	b.ctx, b.cancel = context.WithCancel(context.Background())
	b.arrivedFunc = b.arrived
	b.restoreCounters(snap)
	// A new epoch before anything is served: a receipt handle from before
	// this start can never match a lease made after it.
	b.epoch = snap.Epoch + 1
	for _, rec := range snap.Topics {
		b.topicsByID[rec.ID] = newTopic(rec)
	}
	putTxTimers, firstCheck := b.restoreTransactions(snap.Transactions)
	if err := commitEpoch(store, opts.epochProposer(), b.epoch, putTxTimers); err != nil {
		b.cancel()
		return nil, fmt.Errorf("core: epoch: %w", err)
	}
	b.receipts = newReceiptSealer(opts.ReceiptKey)
	firstTimer := snap.FirstTimerMs
	if firstCheck > 0 && (firstTimer == 0 || firstCheck < firstTimer) {
		firstTimer = firstCheck
	}
	b.timerCursor.Store(firstTimer)
	b.committedSeq.Store(b.nextSeq)
	for _, rec := range snap.Topics {
		t := b.topicsByID[rec.ID]
		ranges := snap.Queues[rec.ID]
		for i := range rec.Queues {
			q := &queue{topicID: rec.ID, id: uint32(i)}
			if i < len(ranges) {
				q.next.Store(ranges[i].Next)
				q.min.Store(ranges[i].Min)
				q.bytes.Store(ranges[i].Bytes)
			}
			q.pendingNext, q.pendingBytes = q.next.Load(), q.bytes.Load()
			t.queues = append(t.queues, q)
		}
		b.topics[rec.Name] = t
		b.topicsByID[rec.ID] = t
		b.lastTopic = max(b.lastTopic, rec.ID)
	}
	for _, rec := range snap.Subscriptions {
		t := b.topicsByID[rec.TopicID]
		if t == nil {
			b.log.Warn("subscription of a missing topic ignored", "group", rec.Group, "topic_id", rec.TopicID)
			continue
		}
		s, err := newSubscription(b, t, rec)
		if err != nil {
			return nil, fmt.Errorf("core: load subscription %s: %w", rec.Group, err)
		}
		if s.main != nil {
			s.main.restore(len(t.queues), snap.Acks[rec.ID])
		}
		s.nDead = snap.DeadCounts[rec.ID]
		t.subs[rec.Group] = s
		b.subsByID[rec.ID] = s
		b.lastSub = max(b.lastSub, rec.ID)
	}
	for _, m := range snap.Members {
		s := b.subsByID[m.SubID]
		if s == nil || s.rec.Mode != ModeBroadcast {
			continue
		}
		c := newCursor(m.CursorID, m.ConsumerID)
		c.restore(len(s.topic.queues), snap.Acks[m.CursorID])
		s.members[m.ConsumerID] = c
		s.byID[c.id] = c
		b.subsByID[c.id] = s
		b.lastSub = max(b.lastSub, c.id)
	}
	nowMs := b.now().UnixMilli()
	for _, p := range snap.Retries {
		s := b.subsByID[p.SubID]
		if s == nil || s.byID[p.SubID] == nil {
			continue
		}
		c := s.byID[p.SubID]
		// A retry already due was made ready before the restart, or is
		// about to be: either way it is ready now. A later one waits for
		// its timer, which is still in the index.
		d := &delivery{queue: RetryQueue, offset: p.ID, attempt: p.Attempt, dueMs: p.DueMs, heapIndex: -1,
			origQueue: p.Msg.QueueID, origOffset: p.Msg.Offset}
		if p.DueMs <= nowMs {
			d.ready = true
			c.released = append(c.released, d)
		}
		c.addRetry(d)
	}
	for id, recs := range snap.Attempts {
		if s := b.subsByID[id]; s != nil && s.byID[id] != nil {
			s.byID[id].restoreAttempts(recs)
		}
	}
	b.restoreDedup(snap.Dedup, nowMs)
	b.restoreMirrors(snap)
	if b.tel, err = newTelemetry(b, opts.TracerProvider, opts.MeterProvider); err != nil {
		return nil, fmt.Errorf("core: telemetry: %w", err)
	}
	b.wg.Go(b.appendLoop)
	b.wg.Go(b.timerLoop)
	b.wg.Go(b.alertLoop)
	return b, nil
}

func commitEpoch(store Store, p Proposer, epoch uint64, also func(Batch)) error {
	batch := store.NewBatch()
	defer batch.Close()
	batch.PutEpoch(epoch)
	also(batch)
	return p.Propose(batch, true)
}

// StopPolling answers every parked long poll at once (with what it has:
// nothing) and makes new pulls answer without waiting. Shutdown calls it
// before draining HTTP requests, so parked pulls do not hold the drain.
func (b *Broker) StopPolling() {
	b.stopPolling.Do(func() { close(b.polling) })
}

// Close stops accepting work, answers parked pulls at once, lets the
// appender finish what it has, and waits for it. It does not close the store,
// which belongs to the caller. Close is idempotent.
func (b *Broker) Close() error {
	b.closeMu.Lock()
	if b.closed.Swap(true) {
		b.closeMu.Unlock()
		return nil
	}
	b.StopPolling()
	b.cancel()
	close(b.closing)
	b.closeMu.Unlock()
	b.wg.Wait()
	b.stopWakeTimers()
	if b.tel.registered != nil {
		return b.tel.registered.Unregister()
	}
	return nil
}

func (b *Broker) now() time.Time { return b.opts.Now() }

func (b *Broker) topic(name string) (*topic, error) {
	b.mu.RLock()
	t := b.topics[name]
	b.mu.RUnlock()
	if t == nil {
		return nil, fmt.Errorf("%w: %s", ErrTopicNotFound, name)
	}
	return t, nil
}

// TopicConfig is what a client may set on a topic. Zero fields take defaults.
type TopicConfig struct {
	Queues         int
	RetentionHours int
	// TransactionCheckURL, when not nil, sets where half messages left
	// undecided are checked ("" clears it); nil leaves it as it is.
	TransactionCheckURL *string
	// TransactionMaxChecks, when not 0, sets how many checks a half
	// message gets before it is rolled back (default 15).
	TransactionMaxChecks int
	// TransactionAlertURL, when not nil, sets the webhook of the alert a
	// transaction rolled back after its last check fires.
	TransactionAlertURL *string
}

// TopicInfo describes a topic and its queues.
type TopicInfo struct {
	Name           string
	Queues         int
	RetentionHours int
	CreatedAt      time.Time
	Messages       int64
	Bytes          int64
	QueueStats     []QueueStat
	Subscriptions  []string
	// HalfMessages counts the topic's half messages (open transactions'),
	// which are in neither Messages nor Bytes.
	HalfMessages         int64
	TransactionCheckURL  string
	TransactionMaxChecks int
	TransactionAlertURL  string
}

// QueueStat is a queue's retained offsets [MinOffset, MaxOffset).
type QueueStat struct {
	QueueID   int
	MinOffset uint64
	MaxOffset uint64
}

// PutTopic creates a topic or updates an existing one. It reports whether
// the topic was created. Queues may grow, never shrink.
func (b *Broker) PutTopic(ctx context.Context, name string, cfg TopicConfig) (TopicInfo, bool, error) {
	if err := ValidateName("topic", name); err != nil {
		return TopicInfo{}, false, err
	}
	if cfg.Queues < 0 || cfg.Queues > MaxQueues {
		return TopicInfo{}, false, invalid("/queues", "must be between 1 and %d", MaxQueues)
	}
	if cfg.RetentionHours < 0 || cfg.RetentionHours > MaxRetentionHours {
		return TopicInfo{}, false, invalid("/retentionHours", "must be between 1 and %d", MaxRetentionHours)
	}
	if err := validateTransactionConfig(cfg); err != nil {
		return TopicInfo{}, false, err
	}
	b.adminMu.Lock()
	defer b.adminMu.Unlock()
	b.mu.RLock()
	t := b.topics[name]
	b.mu.RUnlock()
	if t == nil {
		t, err := b.createTopicLocked(ctx, name, cfg)
		if err != nil {
			return TopicInfo{}, false, err
		}
		return b.topicInfo(t), true, nil
	}
	rec := *t.rec
	if cfg.Queues != 0 && cfg.Queues < rec.Queues {
		return TopicInfo{}, false, fmt.Errorf("%w: topic %s has %d queues, asked for %d", ErrQueueCountDecrease, name, rec.Queues, cfg.Queues)
	}
	changed := false
	if cfg.Queues > rec.Queues {
		rec.Queues, changed = cfg.Queues, true
	}
	if cfg.RetentionHours != 0 && cfg.RetentionHours != rec.RetentionHours {
		rec.RetentionHours, changed = cfg.RetentionHours, true
	}
	if applyTransactionConfig(&rec, cfg) {
		changed = true
	}
	if changed {
		b.mu.RLock()
		subs := make([]*subscription, 0, len(t.subs))
		for _, s := range t.subs {
			subs = append(subs, s)
		}
		b.mu.RUnlock()
		req := &request{kind: reqAdmin, admin: func(batch Batch) { batch.PutTopic(&rec) }, after: func() {
			b.mu.Lock()
			for i := len(t.queues); i < rec.Queues; i++ {
				q := &queue{topicID: rec.ID, id: uint32(i)}
				t.queues = append(t.queues, q)
			}
			t.rec = &rec
			b.mu.Unlock()
		}}
		for _, s := range subs {
			req.effects = append(req.effects, subEffect{s, &effect{growTo: rec.Queues, wake: true}})
		}
		if err := b.submit(ctx, req); err != nil {
			return TopicInfo{}, false, err
		}
	}
	return b.topicInfo(t), false, nil
}

func (b *Broker) createTopicLocked(ctx context.Context, name string, cfg TopicConfig) (*topic, error) {
	if cfg.Queues == 0 {
		cfg.Queues = DefaultQueues
	}
	if cfg.RetentionHours == 0 {
		cfg.RetentionHours = DefaultRetentionHours
	}
	rec := &TopicRecord{
		ID: b.lastTopic + 1, Name: name, Queues: cfg.Queues,
		RetentionHours: cfg.RetentionHours, CreatedAtMs: b.now().UnixMilli(),
	}
	applyTransactionConfig(rec, cfg)
	lastSub := b.lastSub
	t := newTopic(rec)
	for i := range rec.Queues {
		t.queues = append(t.queues, &queue{topicID: rec.ID, id: uint32(i)})
	}
	err := b.submit(ctx, &request{kind: reqAdmin, admin: func(batch Batch) {
		batch.PutTopic(rec)
		batch.PutLastIDs(rec.ID, lastSub)
	}, after: func() {
		b.mu.Lock()
		b.lastTopic = rec.ID
		b.topics[name] = t
		b.topicsByID[rec.ID] = t
		b.mu.Unlock()
	}})
	if err != nil {
		return nil, err
	}
	b.log.Info("topic created", "topic", name, "queues", rec.Queues)
	return t, nil
}

// topicForSend returns the topic, creating it when auto-create is on.
func (b *Broker) topicForSend(ctx context.Context, name string) (*topic, error) {
	t, err := b.topic(name)
	if err == nil || !b.opts.AutoCreate {
		return t, err
	}
	if err := ValidateName("topic", name); err != nil {
		return nil, err
	}
	b.adminMu.Lock()
	defer b.adminMu.Unlock()
	if t, err := b.topic(name); err == nil {
		return t, nil
	}
	return b.createTopicLocked(ctx, name, TopicConfig{})
}

// GetTopic describes one topic.
func (b *Broker) GetTopic(name string) (TopicInfo, error) {
	if err := ValidateName("topic", name); err != nil {
		return TopicInfo{}, err
	}
	t, err := b.topic(name)
	if err != nil {
		return TopicInfo{}, err
	}
	return b.topicInfo(t), nil
}

// ListTopics describes every topic, sorted by name.
func (b *Broker) ListTopics() []TopicInfo {
	b.mu.RLock()
	ts := make([]*topic, 0, len(b.topics))
	for _, t := range b.topics {
		ts = append(ts, t)
	}
	b.mu.RUnlock()
	out := make([]TopicInfo, 0, len(ts))
	for _, t := range ts {
		out = append(out, b.topicInfo(t))
	}
	slices.SortFunc(out, func(a, b TopicInfo) int { return strings.Compare(a.Name, b.Name) })
	return out
}

func (b *Broker) topicInfo(t *topic) TopicInfo {
	b.mu.RLock()
	rec, queues := t.rec, t.queues
	subs := make([]string, 0, len(t.subs))
	for g := range t.subs {
		subs = append(subs, g)
	}
	b.mu.RUnlock()
	slices.Sort(subs)
	info := TopicInfo{
		Name: rec.Name, Queues: rec.Queues, RetentionHours: rec.RetentionHours,
		CreatedAt: time.UnixMilli(rec.CreatedAtMs).UTC(), Subscriptions: subs,
		QueueStats: make([]QueueStat, len(queues)), HalfMessages: t.half.Load(),
		TransactionCheckURL: rec.TransactionCheckURL, TransactionMaxChecks: rec.maxChecks(),
		TransactionAlertURL: rec.TransactionAlertURL,
	}
	for i, q := range queues {
		lo, hi := q.min.Load(), q.next.Load()
		info.QueueStats[i] = QueueStat{QueueID: i, MinOffset: lo, MaxOffset: hi}
		info.Messages += int64(hi - lo)
		info.Bytes += q.bytes.Load()
	}
	return info
}

// DeleteTopic removes a topic with its messages, indexes and subscriptions.
func (b *Broker) DeleteTopic(ctx context.Context, name string) error {
	if err := ValidateName("topic", name); err != nil {
		return err
	}
	b.adminMu.Lock()
	defer b.adminMu.Unlock()
	t, err := b.topic(name)
	if err != nil {
		return err
	}
	rec, subs := b.subsOf(t)
	type subWrites struct {
		retries   []*Parked
		cursorIDs []uint32
	}
	perSub := make([]subWrites, len(subs))
	for i, s := range subs {
		perSub[i].retries, perSub[i].cursorIDs = s.retriesOf()
	}
	var txRecs []*TransactionRecord
	req := &request{kind: reqAdmin, admin: func(batch Batch) {
		for i, s := range subs {
			deleteSubscriptionWrites(batch, s, perSub[i].retries, perSub[i].cursorIDs)
		}
		txRecs = b.dropTopicTransactions(batch, rec.ID)
		batch.DeleteTopic(rec)
	}, after: func() {
		b.forgetTransactions(txRecs)
		// Before the appender's next batch: a send queued behind the
		// delete finds the topic gone.
		t.deleted.Store(true)
		b.mu.Lock()
		delete(b.topics, name)
		delete(b.topicsByID, rec.ID)
		for i, s := range subs {
			delete(b.subsByID, s.id)
			for _, id := range perSub[i].cursorIDs {
				delete(b.subsByID, id)
			}
		}
		b.mu.Unlock()
	}}
	for _, s := range subs {
		req.effects = append(req.effects, subEffect{s, &effect{deleted: true, wake: true}})
	}
	if err := b.submit(ctx, req); err != nil {
		return err
	}
	b.log.Info("topic deleted", "topic", name)
	return nil
}

// Ready reports whether the broker accepts writes.
func (b *Broker) Ready() error {
	if b.closed.Load() {
		return ErrClosed
	}
	return nil
}

func (b *Broker) topicName(t *topic) string {
	b.mu.RLock()
	defer b.mu.RUnlock()
	return t.rec.Name
}
