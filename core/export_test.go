package core

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// WakeTimerOf returns a probe of a subscription's wake-up timer: whether it
// is armed, and whether it was still pending (the probe stops it, so call
// it last). The probe keeps working after the subscription is deleted.
func WakeTimerOf(b *Broker, topic, group string) func() (armed, pending bool) {
	s, err := b.subscription(topic, group)
	if err != nil {
		panic(err)
	}
	return func() (bool, bool) {
		s.lock()
		defer s.mu.Unlock()
		return s.wakeAtMs != 0, s.wakeTimer != nil && s.wakeTimer.Stop()
	}
}

// Flush waits until every write queued before it is durable: the appender
// takes requests in order, so an empty write behind them commits after
// them. A pull's side writes (expiries, skipped watermarks) are queued
// without anyone waiting for them.
func Flush(b *Broker) error {
	// Applying the effects handed over may queue writes of its own (a
	// watermark the applied settlements moved): commit, apply, and again
	// until no effect waits.
	for range 10 {
		if err := b.submit(context.Background(), &request{kind: reqWrite}); err != nil {
			return err
		}
		subs := b.subscriptions()
		pending := false
		for _, s := range subs {
			if s.nEffects.Load() > 0 {
				pending = true
				s.lock()
				s.mu.Unlock()
			}
		}
		if !pending {
			return nil
		}
	}
	return errors.New("effects keep coming")
}

// SettleDue does at the clock's now what the broker does lazily or on its
// own loops: it ends every lease and suspension that ran out (a pull would
// on its next look) and fires every due timer (the timer loop would on its
// next scan). Their writes are queued; Flush makes them durable.
func SettleDue(b *Broker) {
	now := b.now()
	subs := b.subscriptions()
	for _, s := range subs {
		s.lock()
		for _, c := range s.cursors() {
			w := &leaseWork{
				nowMs: now.UnixMilli(), now: now, orderly: s.rec.Orderly, filter: s.filter,
				maxRetry: s.rec.MaxRetries, delays: s.rec.RetryDelays, maxLeases: b.opts.MaxLeasesPerQueue,
			}
			s.expireLocked(c, w)
			s.noteLocked(c)
		}
		s.mu.Unlock()
	}
	for range 100 {
		if !b.fireDue(now.UnixMilli()) {
			break
		}
	}
	// Transaction checks run on goroutines of their own: wait for the
	// ones fired to be recorded.
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		b.txMu.Lock()
		busy := false
		for _, tx := range b.txns {
			busy = busy || tx.checking != 0
		}
		b.txMu.Unlock()
		if !busy {
			return
		}
	}
}

// State is a broker's logical state: what a broker rebuilt from its store
// must hold for consumers to see the same thing. Serving state (leases,
// long-poll waiters, loops, consumer liveness) is left out.
type State struct {
	Counters StateCounters
	Topics   []TopicState   // by name
	Subs     []SubState     // by topic, group
	Dedup    []DedupState   // by topic id, key
	Delayed  []DelayedState // by id
	// Transactions are the open ones, by id.
	Transactions []TransactionRecord
}

// StateCounters are the broker's counters.
type StateCounters struct {
	NextSeq   uint64
	LastMs    int64
	IDs       uint64
	LastTopic uint32
	LastSub   uint32
}

// TopicState is a topic's record and queues.
type TopicState struct {
	Rec    TopicRecord
	Queues []QueueState
	Half   int64
}

// QueueState is one queue's durable range.
type QueueState struct {
	Next, Min uint64
	Bytes     int64
}

// SubState is a subscription's definition and consumer state.
type SubState struct {
	Topic, Group string
	Rec          SubRecState
	NDead        int64
	// Lag is the subscription's reported lag, in all and per queue
	// (SubscriptionInfo): a figure of the stored state, leases aside.
	Lag      int64
	QueueLag []int64
	Members  []MemberState // by consumer id
	Cursors  []CursorState // by id
}

// SubRecState is a SubscriptionRecord with its pointers and slices
// spelled out, so two records compare by value.
type SubRecState struct {
	ID, TopicID uint32
	Mode        string
	Orderly     bool
	Filter      string
	MaxRetries  int
	StartFrom   string
	RetryDelays string
	CreatedAtMs int64
	Alerts      string
	Push        string
}

// MemberState names a broadcast consumer's cursor.
type MemberState struct {
	ConsumerID string
	CursorID   uint32
}

// CursorState is one cursor's position and parked retries.
type CursorState struct {
	ID         uint32
	ConsumerID string
	Queues     []SubQueueState
	Retries    []RetryState // by id
}

// SubQueueState is a cursor's watermark in a queue and the offsets above
// it that are still to be delivered.
type SubQueueState struct {
	Queue     uint32
	Watermark uint64
	Pending   []PendingState // by offset
}

// PendingState is an offset still to be delivered: its settled attempts
// (a lease in progress is not one) and, for an orderly key waiting out a
// retry delay, the end of that wait (0: none).
type PendingState struct {
	Offset         uint64
	Attempts       int
	SuspendedUntil int64
}

// RetryState is a parked retry. DueMs is 0 once due: a retry already due
// is ready, whether its timer fired or a restart made it ready. Armed says
// a timer in the store will make a waiting retry ready.
type RetryState struct {
	ID         uint64
	OrigQueue  uint32
	OrigOffset uint64
	Attempts   int
	DueMs      int64
	Armed      bool
}

// DedupState is a remembered send still inside the dedup window.
type DedupState struct {
	TopicID    uint32
	Key        string
	MessageID  string
	QueueID    int
	Offset     uint64
	StoredAtMs int64
	Delayed    bool
	StoredMs   int64
}

// DelayedState is a delayed message not yet appended, and whether the
// timer loop's scan will still reach its timer.
type DelayedState struct {
	ID       uint64
	TopicID  uint32
	DueMs    int64
	WillFire bool
}

// unscannedProgress is what a cursor knows of an offset it has not read
// since it was restored: the attempts already settled and, for an orderly
// key, when its retry delay ends. Restored cursors know nothing of either.
func unscannedProgress(sq *subQueue, o uint64) (attempts int, dueMs int64) {
	r := sq.attempts[o]
	return r.Attempt, r.DueMs
}

// LogicalState reads a broker's logical state at nowMs. The caller keeps
// the broker quiet (SettleDue, Flush, a frozen clock) while it reads.
func LogicalState(b *Broker, nowMs int64) (State, error) {
	var st State
	b.commitMu.Lock()
	b.mu.RLock()
	st.Counters = StateCounters{NextSeq: b.nextSeq, LastMs: b.lastMs, IDs: b.ids.Load(), LastTopic: b.lastTopic, LastSub: b.lastSub}
	b.mu.RUnlock()
	for _, r := range b.dedup {
		if r.StoredMs+DedupWindow.Milliseconds() <= nowMs {
			continue
		}
		st.Dedup = append(st.Dedup, DedupState{
			TopicID: r.TopicID, Key: r.Key, MessageID: r.Result.MessageID, QueueID: r.Result.QueueID,
			Offset: r.Result.Offset, StoredAtMs: r.Result.StoredAt.UnixMilli(), Delayed: r.Result.Delayed, StoredMs: r.StoredMs,
		})
	}
	b.commitMu.Unlock()
	slices.SortFunc(st.Dedup, func(x, y DedupState) int {
		return cmp.Or(cmp.Compare(x.TopicID, y.TopicID), strings.Compare(x.Key, y.Key))
	})

	type subRef struct {
		topic string
		s     *subscription
	}
	var subs []subRef
	b.mu.RLock()
	for name, t := range b.topics {
		ts := TopicState{Rec: *t.rec, Half: t.half.Load()}
		for _, q := range t.queues {
			ts.Queues = append(ts.Queues, QueueState{Next: q.next.Load(), Min: q.min.Load(), Bytes: q.bytes.Load()})
		}
		st.Topics = append(st.Topics, ts)
		for _, s := range t.subs {
			subs = append(subs, subRef{name, s})
		}
	}
	topicQueues := map[uint32][]*queue{}
	for _, t := range b.topics {
		topicQueues[t.rec.ID] = t.queues
	}
	b.mu.RUnlock()
	slices.SortFunc(st.Topics, func(x, y TopicState) int { return strings.Compare(x.Rec.Name, y.Rec.Name) })

	timerFrom := b.timerCursor.Load()
	if low := b.timerLow.Load(); low > 0 && low < timerFrom {
		timerFrom = low
	}
	armed := func(due int64, id uint64) (bool, error) {
		found := false
		err := b.store.ScanTimers(due, due, func(_ int64, tid uint64, kind byte) bool {
			found = found || (tid == id && kind == ParkedRetry)
			return !found
		})
		return found && due >= timerFrom, err
	}

	for _, ref := range subs {
		s := ref.s
		info := s.info() // takes s.mu itself
		s.lock()
		ss, err := subState(b, ref.topic, s, topicQueues[s.rec.TopicID], nowMs, armed)
		s.mu.Unlock()
		if err != nil {
			return State{}, err
		}
		ss.Lag = info.Lag
		for _, q := range info.Queues {
			ss.QueueLag = append(ss.QueueLag, q.Lag)
		}
		st.Subs = append(st.Subs, ss)
	}
	slices.SortFunc(st.Subs, func(x, y SubState) int {
		return cmp.Or(strings.Compare(x.Topic, y.Topic), strings.Compare(x.Group, y.Group))
	})

	err := b.store.ScanTimers(0, maxTimeMs, func(due int64, id uint64, kind byte) bool {
		if kind != ParkedDelayed {
			return true
		}
		p, rerr := b.store.ReadParked(ParkedDelayed, id)
		if rerr != nil || p.DueMs != due {
			return true // appended already, or its timer is stale
		}
		st.Delayed = append(st.Delayed, DelayedState{ID: id, TopicID: p.TopicID, DueMs: due, WillFire: due >= timerFrom})
		return true
	})
	if err != nil {
		return State{}, err
	}
	slices.SortFunc(st.Delayed, func(x, y DelayedState) int { return cmp.Compare(x.ID, y.ID) })
	b.txMu.Lock()
	for _, tx := range b.txns {
		st.Transactions = append(st.Transactions, *tx.rec)
	}
	b.txMu.Unlock()
	slices.SortFunc(st.Transactions, func(x, y TransactionRecord) int { return cmp.Compare(x.ID, y.ID) })
	return st, nil
}

// subState reads one subscription. Caller holds s.mu.
func subState(b *Broker, topic string, s *subscription, queues []*queue, nowMs int64, armed func(int64, uint64) (bool, error)) (SubState, error) {
	r := s.rec
	ss := SubState{
		Topic: topic, Group: s.group, NDead: s.nDead,
		Rec: SubRecState{
			ID: r.ID, TopicID: r.TopicID, Mode: r.Mode, Orderly: r.Orderly, Filter: r.Filter,
			MaxRetries: r.MaxRetries, StartFrom: r.StartFrom, RetryDelays: fmt.Sprint(r.RetryDelays),
			CreatedAtMs: r.CreatedAtMs, Alerts: alertsString(r.Alerts), Push: pushString(r.Push),
		},
	}
	for id, c := range s.members {
		ss.Members = append(ss.Members, MemberState{ConsumerID: id, CursorID: c.id})
	}
	slices.SortFunc(ss.Members, func(x, y MemberState) int { return strings.Compare(x.ConsumerID, y.ConsumerID) })
	for _, c := range s.byID {
		cs, err := cursorState(b, s, c, queues, nowMs, armed)
		if err != nil {
			return SubState{}, err
		}
		ss.Cursors = append(ss.Cursors, cs)
	}
	slices.SortFunc(ss.Cursors, func(x, y CursorState) int { return cmp.Compare(x.ID, y.ID) })
	return ss, nil
}

// settledAttempts is a delivery's attempts without a lease in progress.
func settledAttempts(d *delivery) int {
	if d.leased {
		return d.attempt - 1
	}
	return d.attempt
}

func cursorState(b *Broker, s *subscription, c *cursor, queues []*queue, nowMs int64, armed func(int64, uint64) (bool, error)) (CursorState, error) {
	cs := CursorState{ID: c.id, ConsumerID: c.consumerID}
	for i, sq := range c.queues {
		qs := SubQueueState{Queue: sq.id, Watermark: sq.acked}
		if i < len(queues) {
			q := queues[i]
			err := b.store.ScanQueue(q.topicID, q.id, sq.acked, q.next.Load(), func(e IndexEntry) bool {
				o := e.Offset
				switch {
				case sq.out.has(o) && !s.filter.mayMatch(e.TagHash):
					// Outstanding from before the filter changed: its next
					// delivery drops it unseen (readDeliveries), so it is
					// no longer to be delivered.
				case sq.out.has(o):
					p := PendingState{Offset: o}
					if d := c.deliveries[dkey{sq.id, o}]; d != nil {
						p.Attempts = settledAttempts(d)
						if d.suspended && d.deadline > nowMs {
							p.SuspendedUntil = d.deadline
						}
					}
					qs.Pending = append(qs.Pending, p)
				case o >= sq.next && !sq.preAcked[o] && !sq.durableAcks[o] && s.filter.mayMatch(e.TagHash):
					attempts, due := unscannedProgress(sq, o)
					p := PendingState{Offset: o, Attempts: attempts}
					if s.rec.Orderly && due > nowMs {
						p.SuspendedUntil = due
					}
					qs.Pending = append(qs.Pending, p)
				}
				return true
			})
			if err != nil {
				return CursorState{}, err
			}
		}
		cs.Queues = append(cs.Queues, qs)
	}
	for k, d := range c.deliveries {
		if !d.isRetry() {
			continue
		}
		rs := RetryState{ID: k.offset, OrigQueue: d.origQueue, OrigOffset: d.origOffset, Attempts: settledAttempts(d)}
		if d.dueMs > nowMs {
			rs.DueMs = d.dueMs
			ok, err := armed(d.dueMs, k.offset)
			if err != nil {
				return CursorState{}, err
			}
			rs.Armed = ok
		}
		cs.Retries = append(cs.Retries, rs)
	}
	slices.SortFunc(cs.Retries, func(x, y RetryState) int { return cmp.Compare(x.ID, y.ID) })
	return cs, nil
}

func alertsString(a *AlertConfig) string {
	if a == nil {
		return "none"
	}
	lag, dlq := "-", "-"
	if a.MaxLag != nil {
		lag = fmt.Sprint(*a.MaxLag)
	}
	if a.MaxDLQ != nil {
		dlq = fmt.Sprint(*a.MaxDLQ)
	}
	return fmt.Sprintf("maxLag=%s maxDlq=%s webhook=%s", lag, dlq, a.WebhookURL)
}

func pushString(p *PushConfig) string {
	if p == nil {
		return "none"
	}
	return fmt.Sprintf("%+v", *p)
}

// DiffStates names every difference between two states as a path and the
// two values ("topic orders/queue 3/next: 17 vs 16"); "-" marks a piece
// one side does not have.
func DiffStates(a, b State) []string {
	fa, pa := flattenState(a)
	fb, pb := flattenState(b)
	var out []string
	for k, va := range fa {
		vb, ok := fb[k]
		if !ok {
			if missingPiece(fb, pa[k]) {
				continue // the whole piece is missing: named once, by its own path
			}
			vb = "-"
		}
		if va != vb {
			out = append(out, fmt.Sprintf("%s: %s vs %s", k, va, vb))
		}
	}
	for k, vb := range fb {
		if _, ok := fa[k]; !ok {
			if missingPiece(fa, pb[k]) {
				continue
			}
			out = append(out, fmt.Sprintf("%s: - vs %s", k, vb))
		}
	}
	slices.Sort(out)
	return out
}

// missingPiece reports whether a leaf's piece (its parent path, up the
// chain) is missing from leaves.
func missingPiece(leaves map[string]string, parent string) bool {
	_, has := leaves[parent]
	return parent != "" && !has
}

// flattenState maps each leaf of a state to its path, and each field of a
// keyed piece (a topic, a subscription, a pending offset, a retry) to the
// path of the piece, so that a piece one side lacks is named once.
func flattenState(st State) (leaves, parents map[string]string) {
	leaves, parents = map[string]string{}, map[string]string{}
	// put records a leaf; a leaf of a keyed piece names the piece's own
	// leaf as its parent.
	put := func(parent string, v any, format string, args ...any) string {
		k := fmt.Sprintf(format, args...)
		leaves[k] = fmt.Sprint(v)
		if parent != "" {
			parents[k] = parent
		}
		return k
	}
	c := st.Counters
	put("", c.NextSeq, "counters/nextSeq")
	put("", c.LastMs, "counters/lastMs")
	put("", c.IDs, "counters/ids")
	put("", c.LastTopic, "counters/lastTopic")
	put("", c.LastSub, "counters/lastSub")
	for _, t := range st.Topics {
		n := t.Rec.Name
		tp := put("", t.Rec.ID, "topic %s", n)
		put(tp, t.Rec.Queues, "topic %s/queues", n)
		put(tp, t.Rec.RetentionHours, "topic %s/retentionHours", n)
		put(tp, t.Rec.CreatedAtMs, "topic %s/createdAtMs", n)
		put(tp, t.Half, "topic %s/half messages", n)
		put(tp, len(t.Queues), "topic %s/queue count", n)
		for i, q := range t.Queues {
			put(tp, q.Next, "topic %s/queue %d/next", n, i)
			put(tp, q.Min, "topic %s/queue %d/min", n, i)
			put(tp, q.Bytes, "topic %s/queue %d/bytes", n, i)
		}
	}
	for _, s := range st.Subs {
		p := "sub " + s.Topic + "/" + s.Group
		sp := put("", fmt.Sprintf("%+v", s.Rec), "%s", p)
		put(sp, s.NDead, "%s/dlq", p)
		put(sp, s.Lag, "%s/lag", p)
		for i, l := range s.QueueLag {
			put(sp, l, "%s/queue %d lag", p, i)
		}
		for _, mb := range s.Members {
			put(sp, mb.CursorID, "%s/member %s", p, mb.ConsumerID)
		}
		for _, cs := range s.Cursors {
			cp := fmt.Sprintf("%s/cursor %d", p, cs.ID)
			put(sp, cs.ConsumerID, "%s/consumer", cp)
			put(sp, len(cs.Queues), "%s/queue count", cp)
			for _, q := range cs.Queues {
				qp := fmt.Sprintf("%s/queue %d", cp, q.Queue)
				put(sp, q.Watermark, "%s/watermark", qp)
				for _, pd := range q.Pending {
					pp := put(sp, "pending", "%s/pending offset %d", qp, pd.Offset)
					put(pp, pd.Attempts, "%s attempts", pp)
					put(pp, pd.SuspendedUntil, "%s suspended until", pp)
				}
			}
			for _, r := range cs.Retries {
				rp := put(sp, fmt.Sprintf("of %d@%d", r.OrigQueue, r.OrigOffset), "%s/retry %d", cp, r.ID)
				put(rp, r.Attempts, "%s/attempts", rp)
				put(rp, r.DueMs, "%s/due", rp)
				put(rp, r.Armed, "%s/armed", rp)
			}
		}
	}
	for _, d := range st.Dedup {
		dp := put("", fmt.Sprintf("msg %s queue %d offset %d storedAt %d delayed %t", d.MessageID, d.QueueID, d.Offset, d.StoredAtMs, d.Delayed),
			"dedup %d/%s", d.TopicID, d.Key)
		put(dp, d.StoredMs, "%s/storedMs", dp)
	}
	for _, d := range st.Delayed {
		dp := put("", fmt.Sprintf("topic %d due %d", d.TopicID, d.DueMs), "delayed %d", d.ID)
		put(dp, d.WillFire, "%s/will fire", dp)
	}
	for _, r := range st.Transactions {
		tp := put("", fmt.Sprintf("%s topic %d", r.TxID, r.TopicID), "transaction %d", r.ID)
		put(tp, fmt.Sprintf("%+v", r), "%s/record", tp)
	}
	return leaves, parents
}

// RaceEnabled reports whether the race detector is on, for tests that
// bound their work by it.
const RaceEnabled = raceEnabled

// ChecksRunning is how many transaction checks hold a slot: a check holds
// one until what it decided is committed.
func ChecksRunning(b *Broker) int { return len(b.checkSlots) }
