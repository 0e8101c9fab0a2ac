package core

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"syscall"
	"time"
)

type requestKind uint8

const (
	reqAppend requestKind = iota
	// reqAdmin writes topic or subscription definitions. It is applied in a
	// batch of its own so that it never shares a commit with appends it
	// might invalidate (a topic delete racing a send).
	reqAdmin
	// reqWrite applies writes decided elsewhere (acks, nacks, DLQ moves,
	// timers, retention) in the shared batch.
	reqWrite
)

// request is one command for the appender. Everything apply needs is in it:
// the times were stamped by whoever made it, so applying is deterministic.
type request struct {
	kind  requestKind
	topic *topic
	msgs  []*Message
	// prepare makes the send's messages half messages of this transaction.
	prepare *TransactionRecord
	admin   func(Batch)
	// writes are applied in order. Once the batch is durable, before the
	// requester is answered, the appender hands effects over to their
	// subscriptions (effects.go) and runs after: what the batch changes in
	// memory, and only then.
	writes  []func(Batch)
	effects []subEffect
	after   func()
	// mirror is a mirror's copies (their source offsets) or watermark
	// raises, recorded in the same batch (mirror.go).
	mirror  *mirrorWrite
	results []SendResult
	done    chan error
	queued  int64 // bytes counted in Broker.queuedBytes until applied
}

// submit hands r to the appender and waits until it is durable.
func (b *Broker) submit(ctx context.Context, r *request) error {
	r.done = make(chan error, 1)
	if r.kind != reqAdmin {
		// Admin requests commit alone: no group expects them.
		b.inFlight.Add(1)
		defer b.inFlight.Add(-1)
	}
	if b.commitAlone(r) {
		return <-r.done
	}
	if err := b.enqueue(ctx, r); err != nil {
		return err
	}
	// Once queued, the request is applied whatever the caller does; waiting
	// for it keeps the reply truthful.
	return <-r.done
}

// commitAlone commits a send on the caller's goroutine when nothing is
// queued and no commit is running: a lone send then skips the two
// goroutine handoffs to the appender and back (~40 µs of its p50 on a
// 2-core VM, where waking a parked goroutine is a futex and a reschedule).
// Under load the queue is rarely empty, so sends still share commits. It
// reports false, having done nothing, when r must go through the queue.
func (b *Broker) commitAlone(r *request) bool {
	if !r.isSend() || b.waitsForGroup() || len(b.requests) > 0 || b.lingering.Load() || !b.closeMu.TryRLock() {
		return false
	}
	defer b.closeMu.RUnlock()
	if b.closed.Load() || !b.commitMu.TryLock() {
		return false
	}
	defer b.commitMu.Unlock()
	if len(b.requests) > 0 {
		return false // others queued first: join them
	}
	b.commit([]*request{r}, true)
	return true
}

// isSend reports whether r stores messages (a send, or delayed messages
// coming due).
func (r *request) isSend() bool {
	return r.kind == reqAppend && len(r.msgs) > 0 && r.topic != nil
}

// enqueue hands r to the appender, or fails with ErrClosed once Close has
// begun. The appender keeps reading until Close holds closeMu, so a sender
// blocked on a full channel is always let through or refused.
func (b *Broker) enqueue(ctx context.Context, r *request) error {
	b.closeMu.RLock()
	defer b.closeMu.RUnlock()
	if b.closed.Load() {
		return ErrClosed
	}
	if r.isSend() {
		// Sends are refused rather than queued without bound: the producer
		// backs off (429 with Retry-After) instead of the broker's memory
		// growing. One request alone is always let through.
		size := int64(r.size())
		if q := b.queuedBytes.Add(size); q > size && q > b.opts.MaxQueuedBytes {
			b.queuedBytes.Add(-size)
			return fmt.Errorf("%w: %d bytes of sends are waiting to be stored", ErrTooManyRequests, q-size)
		}
		r.queued = size
		select {
		case b.requests <- r:
			return nil
		default:
			b.queuedBytes.Add(-size)
			return fmt.Errorf("%w: the append queue is full", ErrTooManyRequests)
		}
	}
	select {
	case b.requests <- r:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// appendLoop is the only writer: it drains waiting requests into one batch,
// commits it with one fsync, then makes the new offsets visible and answers.
// While a commit runs, new requests pile up and form the next batch (group
// commit); when fewer are queued than the group commit expects, the
// appender lingers for the rest (gather with a timer).
func (b *Broker) appendLoop() {
	var pending []*request
	var carry *request
	linger := time.NewTimer(time.Hour)
	linger.Stop()
	for {
		var first *request
		if carry != nil {
			first, carry = carry, nil
		} else {
			select {
			case first = <-b.requests:
			case <-b.closing:
				b.drainOnClose()
				return
			}
		}
		b.queuedBytes.Add(-first.queued)
		pending = append(pending[:0], first)
		size := first.size()
		missing, came := 0, 0
		if first.kind != reqAdmin {
			pending, size, carry = b.gather(pending, size, math.MaxInt, nil, 0)
			if want := int(b.expected.Load()); carry == nil && len(pending) < want && b.waitsForGroup() {
				had := len(pending)
				pending, _, carry = b.gather(pending, size, want, linger, b.lingerBound())
				missing, came = want-had, len(pending)-had
			}
		}
		b.commitMu.Lock()
		if missing > 0 {
			b.lingered(missing, came)
		}
		b.commit(pending, false)
		b.commitMu.Unlock()
		clear(pending)
	}
}

// The group commit decides from what it sees, not from a count tuned at
// one load. When a commit is durable, every request handed to submit and
// not yet answered is either in it or queued behind it: that number is how
// many the next round expects (a closed-loop producer answered now sends
// again within its round trip). The appender waits for that many, but never
// longer than a commit takes: waiting longer would cost more than
// committing what it has and starting the next. Whether waiting pays is
// seen too: open-loop senders (a rate, not a loop) do not come back when
// answered, so a wait that got less than half of what it waited for (and
// fewer than lingerPaid) is a miss, and after each miss in a row the appender skips twice as many
// rounds (up to maxSkippedRounds) before it waits again; and a round
// whose first request comes later than two commit times after the last
// commit does not wait (whoever was answered then is not coming). A lone
// producer, or a trickle, expects fewer than minExpected and never waits; a send then commits
// on its own goroutine (commitAlone). Admin requests are not counted: they
// commit alone.
const (
	lingerFloor      = 20 * time.Microsecond
	lingerMax        = time.Millisecond
	maxSkippedRounds = 64
	// minExpected: with two in flight, the other one is either in this
	// round already or being answered; two producers share commits
	// without waiting (each arrives while the other's commit runs).
	minExpected = 3
	// lingerPaid requests gathered by a wait pay for it even when fewer
	// than half of the missing came (many producers, slow to return when
	// the CPU is busy).
	lingerPaid = 4
)

// lingerBound is how long the appender waits for the rest of a round: the
// recent commit time, bounded.
func (b *Broker) lingerBound() time.Duration {
	return min(max(time.Duration(b.commitTime.Load()), lingerFloor), lingerMax)
}

// lingered records what a wait for missing requests got (under commitMu).
func (b *Broker) lingered(missing, came int) {
	if 2*came >= missing || came >= lingerPaid {
		b.lingerMisses = 0
		return
	}
	b.lingerMisses = min(b.lingerMisses+1, 16)
	// +1: the commit of the round that missed counts one down.
	b.skipRounds = min(1<<b.lingerMisses, maxSkippedRounds) + 1
}

// observeCommit records how long a proposal took (from proposed until it
// was durable) and, from the requests
// still unanswered, how many the next round expects and whether it waits
// for them.
func (b *Broker) observeCommit(proposed, durable time.Time) {
	ct := b.commitTime.Load()
	b.commitTime.Store(ct + (int64(durable.Sub(proposed))-ct)/8)
	expected := max(b.inFlight.Load(), b.arriving.Load())
	b.expected.Store(expected)
	if b.skipRounds > 0 {
		b.skipRounds--
	}
	if expected >= minExpected && b.skipRounds == 0 {
		// Closed-loop producers answered now are back within about a
		// commit's time; a request that comes later is not one of them.
		b.groupUntil.Store(durable.Add(2 * b.lingerBound()).UnixNano())
	} else {
		b.groupUntil.Store(0)
	}
}

// Arriving counts a request that will write from the moment it arrives at
// the API, before its body is read or decoded, until done is called. The
// group commit expects the larger of these and the requests in submit:
// under load, a request spends longer being read and decoded than a
// commit takes.
func (b *Broker) Arriving() (done func()) {
	b.arriving.Add(1)
	return b.arrivedFunc
}

func (b *Broker) arrived() { b.arriving.Add(-1) }

// waitsForGroup reports whether a request arriving now belongs to a round
// the appender waits to gather.
func (b *Broker) waitsForGroup() bool {
	until := b.groupUntil.Load()
	return until != 0 && time.Now().UnixNano() < until
}

// gather adds queued requests to pending until it holds want of them, the
// commit size cap is reached, or an admin request comes (returned, to go
// alone next). With linger nil it takes only what is queued already; with
// a timer it waits for more, until wait passes or Close begins.
func (b *Broker) gather(pending []*request, size, want int, linger *time.Timer, wait time.Duration) ([]*request, int, *request) {
	var expired <-chan time.Time
	if linger != nil {
		b.lingering.Store(true)
		defer b.lingering.Store(false)
		linger.Reset(wait)
		defer linger.Stop()
		expired = linger.C
	}
	for len(pending) < want && size < b.opts.MaxCommitBytes {
		var r *request
		if expired == nil {
			select {
			case r = <-b.requests:
			default:
				return pending, size, nil
			}
		} else {
			select {
			case r = <-b.requests:
			case <-expired:
				return pending, size, nil
			case <-b.closing:
				return pending, size, nil
			}
		}
		if r.kind == reqAdmin {
			return pending, size, r
		}
		b.queuedBytes.Add(-r.queued)
		pending = append(pending, r)
		size += r.size()
	}
	return pending, size, nil
}

// drainOnClose answers whatever is still queued: a request that made it
// into the channel before Close is applied, so its sender gets the truth.
func (b *Broker) drainOnClose() {
	for {
		var batch []*request
	drain:
		for {
			select {
			case r := <-b.requests:
				b.queuedBytes.Add(-r.queued)
				batch = append(batch, r)
			default:
				break drain
			}
		}
		if len(batch) == 0 {
			return
		}
		b.commitMu.Lock()
		for _, r := range batch {
			b.commit([]*request{r}, false)
		}
		b.commitMu.Unlock()
	}
}

func (r *request) size() int {
	n := 64
	for _, m := range r.msgs {
		n += len(m.Body) + 128
	}
	return n
}

// commit applies reqs in one batch and commits it; lone says the caller
// is a send committing alone (commitAlone), which the store is told
// (Batch.Commit's alone): nothing else is queued to want the CPU, so the
// store may spend some to return sooner.
func (b *Broker) commit(reqs []*request, lone bool) {
	batch := b.store.NewBatch()
	defer batch.Close()
	// One store time per batch, never going backwards, so the time index
	// and storedAt stay monotonic per queue even if the wall clock steps back.
	nowMs := max(b.now().UnixMilli(), b.lastMs)
	seqBefore := b.nextSeq
	b.expireDedup(batch, nowMs)
	errs := make([]error, len(reqs))
	spaceErr := b.checkSpace(reqs)
	var firstDelay int64
	for i, r := range reqs {
		switch r.kind {
		case reqAdmin:
			r.admin(batch)
		case reqWrite:
			for _, w := range r.writes {
				w(batch)
			}
		case reqAppend:
			if r.mirror != nil && b.mirror(r.mirror.m.name) != r.mirror.m {
				errs[i] = fmt.Errorf("%w: %s", ErrMirrorNotFound, r.mirror.m.name)
				continue
			}
			if r.mirror != nil && r.topic != nil && r.mirror.m.paused() {
				// Copies of a mirror paused since they were pulled: once a
				// pause is answered, nothing more is copied.
				errs[i] = fmt.Errorf("%w: %s", ErrMirrorPaused, r.mirror.m.name)
				continue
			}
			if r.topic == nil {
				if r.mirror != nil {
					b.applyMirror(batch, r)
				}
				continue
			}
			if r.topic.deleted.Load() {
				errs[i] = fmt.Errorf("%w: %s", ErrTopicNotFound, b.topicName(r.topic))
				continue
			}
			if spaceErr != nil && r.isSend() {
				errs[i] = spaceErr // delayed messages coming due wait too: the timer loop tries again
				continue
			}
			if d := b.applyAppend(batch, r, nowMs); d > 0 && (firstDelay == 0 || d < firstDelay) {
				firstDelay = d
			}
		}
	}
	for _, q := range b.touched {
		batch.PutQueueMeta(q.topicID, q.id, q.pendingNext, q.pendingBytes)
	}
	// Read after every request is applied: an id in this batch was taken
	// before its request was queued (settle) or while applying it (a
	// delayed send), so the stored high-water covers it.
	counters := Counters{NextSeq: b.nextSeq, LastStoredMs: nowMs, IDs: b.ids.Load()}
	if counters != b.counters {
		batch.PutCounters(counters)
	}
	proposed := time.Now()
	err := b.proposer.Propose(batch, lone)
	b.observeCommit(proposed, time.Now())
	if err != nil {
		b.log.Error("commit failed", "err", err, "requests", len(reqs))
		b.nextSeq = seqBefore
		for _, q := range b.touched {
			q.pendingNext, q.pendingBytes = q.next.Load(), q.bytes.Load()
			q.touched = false
		}
		b.touched = b.touched[:0]
		b.rollbackDedup()
		b.mirrorsCommitted(false)
		for _, r := range reqs {
			for _, se := range r.effects {
				se.s.handOver(se.e, true)
			}
			r.done <- classifyStoreError(err)
		}
		return
	}
	b.lastMs = nowMs
	b.counters = counters
	b.dedupOrder = append(b.dedupOrder, b.dedupAdded...)
	b.dedupAdded = b.dedupAdded[:0]
	b.mirrorsCommitted(true)
	for _, q := range b.touched {
		q.next.Store(q.pendingNext)
		q.bytes.Store(q.pendingBytes)
		q.touched = false
	}
	b.touched = b.touched[:0]
	// After the queues: whoever reads committedSeq then finds every queue
	// holding a seq below it visible (EnforceRetention relies on it).
	b.committedSeq.Store(b.nextSeq)
	if firstDelay > 0 {
		b.timerCommitted(firstDelay)
	}
	var woken []*topic
	for i, r := range reqs {
		if errs[i] == nil {
			for _, se := range r.effects {
				se.s.handOver(se.e, false)
			}
			if r.after != nil {
				r.after()
			}
		}
		if r.kind == reqAppend && r.topic != nil && errs[i] == nil && !slices.Contains(woken, r.topic) {
			woken = append(woken, r.topic)
			b.wakeSubscriptions(r.topic)
		}
		r.done <- errs[i]
	}
}

// restoreCounters continues the counters from the store's last counters
// record, never from a clock: a restart, or a later leader reading the same
// writes, gives no seq, id or store time below one given before. The log's
// last seq still counts, should a record outlive its counters.
func (b *Broker) restoreCounters(snap *Snapshot) {
	c := Counters{NextSeq: snap.NextSeq}
	switch {
	case snap.Counters != nil:
		c = *snap.Counters
		c.NextSeq = max(c.NextSeq, snap.NextSeq)
		b.counters = c
	case snap.LastTopicID > 0 || snap.NextSeq > 0:
		// A store written before counters were stored holds ids taken from
		// the clock (nanoseconds): only the clock is above them. The first
		// commit stores the counters, and later runs continue from those.
		c.IDs = uint64(time.Now().UnixNano())
	}
	b.nextSeq, b.lastMs = c.NextSeq, c.LastStoredMs
	b.ids.Store(c.IDs)
}

// touch records that q's meta must be written with this batch.
func (b *Broker) touch(q *queue) {
	if !q.touched {
		q.touched = true
		b.touched = append(b.touched, q)
	}
}

// applyAppend stores a send's messages: appended to their queues, or
// parked until due when delayed, or answered from the dedup memory when a
// dedup key repeats. It returns the earliest delay it parked, 0 if none.
func (b *Broker) applyAppend(batch Batch, r *request, nowMs int64) int64 {
	// PutTopic replaces t.rec when a topic grows: read it under b.mu.
	b.mu.RLock()
	queues, topicID := r.topic.queues, r.topic.rec.ID
	b.mu.RUnlock()
	if r.prepare != nil {
		return b.applyPrepare(batch, r, nowMs)
	}
	r.results = make([]SendResult, len(r.msgs))
	var firstDelay int64
	for i, m := range r.msgs {
		if r.mirror != nil && !b.mirrorMark(r, i) {
			// A copy whose source offset is stored here already.
			r.results[i] = SendResult{MessageID: m.ID, QueueID: int(m.QueueID), Duplicate: true}
			continue
		}
		if m.DedupKey != "" {
			if rec := b.dedup[dedupID{topicID, m.DedupKey}]; rec != nil {
				res := rec.Result
				res.Duplicate = true
				r.results[i] = res
				continue
			}
		}
		if r.mirror != nil {
			b.mirrorCopied(r, i, nowMs)
		}
		if m.DeliverAtMs > nowMs {
			m.StoredAtMs = nowMs // as its reply says; it gets a new one when due
			p := &Parked{ID: b.ids.Add(1), Kind: ParkedDelayed, TopicID: topicID, DueMs: m.DeliverAtMs, Msg: m}
			batch.PutParked(p)
			batch.PutTimer(p.DueMs, p.ID, ParkedDelayed)
			r.results[i] = SendResult{MessageID: m.ID, QueueID: int(m.QueueID), StoredAt: time.UnixMilli(nowMs).UTC(), Delayed: true}
			if firstDelay == 0 || p.DueMs < firstDelay {
				firstDelay = p.DueMs
			}
		} else {
			q := queues[m.QueueID]
			m.Offset = q.pendingNext
			m.Seq = b.nextSeq
			m.StoredAtMs = nowMs
			q.pendingNext++
			q.pendingBytes += int64(len(m.Body))
			b.nextSeq++
			batch.Append(m)
			b.touch(q)
			r.results[i] = SendResult{MessageID: m.ID, QueueID: int(m.QueueID), Offset: m.Offset, StoredAt: time.UnixMilli(nowMs).UTC()}
		}
		if m.DedupKey != "" {
			rec := &DedupRecord{TopicID: topicID, Key: m.DedupKey, Result: r.results[i], StoredMs: nowMs}
			b.dedup[dedupID{topicID, m.DedupKey}] = rec
			b.dedupAdded = append(b.dedupAdded, rec)
			batch.PutDedup(rec)
		}
	}
	for _, w := range r.writes {
		w(batch)
	}
	if r.mirror != nil {
		b.applyMirror(batch, r)
	}
	return firstDelay
}

// classifyStoreError turns a full disk into ErrInsufficientStorage, which
// clients see as 507 and may retry once space returns.
func classifyStoreError(err error) error {
	if errors.Is(err, syscall.ENOSPC) {
		return fmt.Errorf("%w: %v", ErrInsufficientStorage, err)
	}
	return err
}

// Free space is read from the filesystem (statfs) at most every
// spaceReadInterval while it is plentiful: a reading per commit was ~10 µs
// of a lone send's critical path (profiled), and RocketMQ looks every 10 s.
// Between readings every byte appended is assumed to cost
// spaceAmplification bytes of disk (the WAL, then the flush's sstable and
// blob file before the WAL is recycled); once that estimate could reach the
// reserve, or while sends are refused, every commit reads again.
const (
	spaceReadInterval  = 100 * time.Millisecond
	spaceAmplification = 4
)

// spaceReading is checkSpace's last statfs: the free bytes, when, and the
// bytes appended since.
type spaceReading struct {
	free     int64
	at       time.Time
	appended int64
}

// checkSpace refuses this batch's sends when the disk is nearly full.
func (b *Broker) checkSpace(reqs []*request) error {
	sr, ok := b.store.(SpaceReporter)
	if !ok {
		return nil
	}
	var incoming int64
	for _, r := range reqs {
		if r.kind == reqAppend {
			incoming += int64(r.size())
		}
	}
	if incoming == 0 {
		return nil
	}
	r := &b.space
	r.appended += incoming
	if !b.diskFull && !r.at.IsZero() && time.Since(r.at) < spaceReadInterval &&
		r.free-spaceAmplification*r.appended >= b.opts.MinFreeBytes {
		return nil
	}
	free, err := sr.FreeBytes()
	if err != nil {
		b.log.Warn("checking free disk space", "err", err)
		return nil
	}
	*r = spaceReading{free: free, at: time.Now(), appended: incoming} // this batch is not in free yet
	if free-incoming < b.opts.MinFreeBytes {
		if !b.diskFull {
			b.diskFull = true
			b.log.Error("disk nearly full: refusing sends until space returns", "free_bytes", free, "min_free_bytes", b.opts.MinFreeBytes)
		}
		return fmt.Errorf("%w: %d bytes free on the store's disk, %d kept in reserve", ErrInsufficientStorage, free, b.opts.MinFreeBytes)
	}
	if b.diskFull {
		b.diskFull = false
		b.log.Info("disk space back: accepting sends", "free_bytes", free)
	}
	return nil
}
