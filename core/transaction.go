package core

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nuid"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Transactional messages (SPEC §9). A half message is a ParkedHalf record,
// delivered to nobody, and its transaction a TransactionRecord; both are
// written in the batch of the send that prepares them. Commit appends the
// half messages to their queues as a send at that moment would (new store
// time, offsets, delays counted from the commit) and deletes them in the
// same batch, so none is appended twice; rollback deletes them. The
// record's next check is a timer (TimerTransaction): when it fires on the
// broker that serves the topic (a cluster's leader: only its broker runs),
// the broker asks the producer through Options.TransactionChecker, outside
// the appender, and records the answer through a batch. A settled record
// stays for the topic's retention, so commit and rollback stay idempotent,
// then its timer deletes it.

// Limits and defaults of transactions.
const (
	MinCheckAfterSeconds        = 1
	MaxCheckAfterSeconds        = 86400
	DefaultTransactionMaxChecks = 15
	MaxTransactionMaxChecks     = 100
	// maxCheckDelay caps the doubling delay between checks (a
	// checkAfterSeconds above it stays as it is).
	maxCheckDelay = 5 * time.Minute
	// maxConcurrentChecks bounds the checks in flight at once.
	maxConcurrentChecks = 16
)

// Transaction states.
const (
	TxOpen       = "open"
	TxCommitted  = "committed"
	TxRolledBack = "rolled_back"
)

// Why a transaction was settled.
const (
	DecidedByRequest    = "request"     // commit or rollback from the producer
	DecidedByCheck      = "check"       // the check's answer
	DecidedByCheckLimit = "check_limit" // transactionMaxChecks checks without an answer
	DecidedByTopicGone  = "topic_deleted"
)

// TransactionRecord is a transaction's durable state.
type TransactionRecord struct {
	// ID names the record in its timers; TxID (which ends with it) is
	// what the producer holds.
	ID            uint64   `json:"id"`
	TxID          string   `json:"txId"`
	TopicID       uint32   `json:"topicId"`
	ProducerGroup string   `json:"producerGroup,omitempty"`
	Parked        []uint64 `json:"parked"`
	MessageIDs    []string `json:"messageIds"`
	// Traceparents are the messages' (for the settle spans without reading
	// the messages).
	Traceparents []string `json:"traceparents,omitempty"`
	CheckAfterMs int64    `json:"checkAfterMs"`
	// Checks counts the checks that got no decision.
	Checks      int    `json:"checks"`
	NextCheckMs int64  `json:"nextCheckMs,omitempty"`
	State       string `json:"state"`
	DecidedBy   string `json:"decidedBy,omitempty"`
	CreatedAtMs int64  `json:"createdAtMs"`
	SettledAtMs int64  `json:"settledAtMs,omitempty"`
	// ExpireMs is when a settled record is dropped.
	ExpireMs int64 `json:"expireMs,omitempty"`
}

// TransactionCheck is what a check asks the producer (SPEC §9's body).
type TransactionCheck struct {
	Topic         string
	TransactionID string
	MessageIDs    []string
	ProducerGroup string
	// Check is the check's number, from 1.
	Check int
}

// Check answers.
const (
	CheckCommit   = "commit"
	CheckRollback = "rollback"
	CheckUnknown  = "unknown"
)

// TransactionChecker asks a producer about an undecided transaction
// (webhook.Checker POSTs to the topic's transactionCheckUrl). It returns
// CheckCommit, CheckRollback or CheckUnknown; an error counts as unknown.
type TransactionChecker interface {
	CheckTransaction(ctx context.Context, url string, c TransactionCheck) (string, error)
}

// TransactionInfo describes a transaction.
type TransactionInfo struct {
	TransactionID string
	Topic         string
	State         string
	DecidedBy     string
	MessageIDs    []string
	ProducerGroup string
	Checks        int
	CreatedAt     time.Time
	NextCheckAt   time.Time // zero once settled
	SettledAt     time.Time // zero while open
}

// txn is an open transaction in memory. mu serializes what settles it or
// records a check (requests and the check), so the decision read under it
// is the one committed.
type txn struct {
	mu       sync.Mutex
	rec      *TransactionRecord // replaced, never mutated, under Broker.txMu
	final    *TransactionRecord // set once settled
	checking uint64             // the running check's token, 0 for none (under Broker.txMu)
}

func (r *TopicRecord) maxChecks() int {
	if r.TransactionMaxChecks > 0 {
		return r.TransactionMaxChecks
	}
	return DefaultTransactionMaxChecks
}

func validateTransactionConfig(cfg TopicConfig) error {
	if cfg.TransactionMaxChecks < 0 || cfg.TransactionMaxChecks > MaxTransactionMaxChecks {
		return invalid("/transactionMaxChecks", "must be between 1 and %d", MaxTransactionMaxChecks)
	}
	for field, u := range map[string]*string{"/transactionCheckUrl": cfg.TransactionCheckURL, "/transactionAlertUrl": cfg.TransactionAlertURL} {
		if u == nil || *u == "" {
			continue
		}
		p, err := url.Parse(*u)
		if err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
			return invalid(field, "must be an absolute http or https URL")
		}
	}
	return nil
}

// applyTransactionConfig sets cfg's transaction fields on rec and reports
// whether anything changed.
func applyTransactionConfig(rec *TopicRecord, cfg TopicConfig) bool {
	changed := false
	if cfg.TransactionCheckURL != nil && *cfg.TransactionCheckURL != rec.TransactionCheckURL {
		rec.TransactionCheckURL, changed = *cfg.TransactionCheckURL, true
	}
	if cfg.TransactionAlertURL != nil && *cfg.TransactionAlertURL != rec.TransactionAlertURL {
		rec.TransactionAlertURL, changed = *cfg.TransactionAlertURL, true
	}
	if cfg.TransactionMaxChecks != 0 && cfg.TransactionMaxChecks != rec.TransactionMaxChecks {
		rec.TransactionMaxChecks, changed = cfg.TransactionMaxChecks, true
	}
	return changed
}

// checkDelay is the wait before the check after checks unanswered ones:
// checkAfter, doubling each time up to 5 minutes (or checkAfter, if longer).
func checkDelay(checkAfterMs int64, checks int) int64 {
	ceiling := max(maxCheckDelay.Milliseconds(), checkAfterMs)
	d := checkAfterMs
	for range checks {
		if d >= ceiling {
			break
		}
		d *= 2
	}
	return min(d, ceiling)
}

// txIDOf makes a transaction id: a NUID (unguessable enough, and only
// letters and digits, so valid in a path) then the record id, which names
// the record in the store.
func txIDOf(id uint64) string { return nuid.Next() + strconv.FormatUint(id, 10) }

// parseTxID returns the record id a transaction id ends with.
func parseTxID(txID string) (uint64, bool) {
	if len(txID) <= nuidLen || len(txID) > nuidLen+20 {
		return 0, false
	}
	id, err := strconv.ParseUint(txID[nuidLen:], 10, 64)
	return id, err == nil && id > 0
}

// SendTransaction stores msgs as half messages of one new transaction: held
// back from every subscription until CommitTransaction (or a check) commits
// them. checkAfter is how long the broker waits for a decision before it
// asks the producer. It returns the messages' results (Delayed: no offset
// yet) and the transaction's id. A dedup key is refused: the transaction
// id is a half message's handle.
func (b *Broker) SendTransaction(ctx context.Context, topicName string, msgs []*Message, checkAfter time.Duration) ([]SendResult, string, error) {
	if err := ValidateName("topic", topicName); err != nil {
		return nil, "", err
	}
	if checkAfter < MinCheckAfterSeconds*time.Second || checkAfter > MaxCheckAfterSeconds*time.Second {
		return nil, "", invalid("/transaction/checkAfterSeconds", "must be between %d and %d", MinCheckAfterSeconds, MaxCheckAfterSeconds)
	}
	if len(msgs) == 0 || len(msgs) > MaxBatchMessages {
		return nil, "", invalid("/messages", "must hold 1-%d messages", MaxBatchMessages)
	}
	for i, m := range msgs {
		if err := ValidateMessage(m, b.opts.MaxMessageBytes); err != nil {
			if ve, ok := errors.AsType[*ValidationError](err); ok {
				return nil, "", &ValidationError{Field: ve.Field, Reason: ve.Reason, Entry: i}
			}
			return nil, "", &EntryError{Entry: i, Err: err}
		}
		if m.DedupKey != "" {
			return nil, "", &ValidationError{Field: "/dedupKey", Reason: "is not allowed on a half message: its transaction id is its handle", Entry: i}
		}
	}
	t, err := b.topicForSend(ctx, topicName)
	if err != nil {
		return nil, "", err
	}
	topicID := b.place(t, msgs)
	now := b.now()
	rec := &TransactionRecord{ID: b.ids.Add(1), TopicID: topicID, CheckAfterMs: checkAfter.Milliseconds(), State: TxOpen,
		Parked: make([]uint64, len(msgs)), MessageIDs: make([]string, len(msgs))}
	rec.TxID = txIDOf(rec.ID)
	for i, m := range msgs {
		rec.Parked[i] = b.ids.Add(1)
		rec.MessageIDs[i] = m.ID
		if rec.ProducerGroup == "" {
			rec.ProducerGroup = m.ProducerGroup
		}
	}
	spans := b.tel.beginSends(ctx, msgs, now)
	for _, m := range msgs {
		rec.Traceparents = append(rec.Traceparents, m.Traceparent)
	}
	tx := &txn{rec: rec}
	req := &request{kind: reqAppend, topic: t, msgs: msgs, prepare: rec, after: func() {
		b.txMu.Lock()
		b.txns[rec.ID] = tx
		for _, id := range rec.MessageIDs {
			b.txByMsg[id] = tx
		}
		b.txMu.Unlock()
		t.half.Add(int64(len(msgs)))
		b.timerCommitted(rec.NextCheckMs)
	}}
	err = b.submit(ctx, req)
	spans.end(topicName, msgs, req.results, err)
	if err != nil {
		return nil, "", err
	}
	at := b.now()
	for _, m := range msgs {
		b.tel.event(parseTraceparent(m.Traceparent), SpanTxPrepare, at, append(messageAttrs(topicName, m), attribute.String("tidemq.transaction.id", rec.TxID))...)
	}
	b.tel.transactions.Add(ctx, 1, metric.WithAttributes(attribute.String("topic", topicName), attribute.String("outcome", "prepared")))
	return req.results, rec.TxID, nil
}

// applyPrepare parks a transaction's half messages and records it, with
// the timer of its first check (under commitMu, in the batch being built).
func (b *Broker) applyPrepare(batch Batch, r *request, nowMs int64) int64 {
	rec := r.prepare
	r.results = make([]SendResult, len(r.msgs))
	for i, m := range r.msgs {
		var delayMs int64
		if m.DeliverAtMs > 0 {
			delayMs = max(m.DeliverAtMs-nowMs, 0)
		}
		m.StoredAtMs, m.DeliverAtMs = nowMs, 0
		batch.PutParked(&Parked{ID: rec.Parked[i], Kind: ParkedHalf, TopicID: rec.TopicID, DueMs: delayMs, Msg: m})
		r.results[i] = SendResult{MessageID: m.ID, QueueID: int(m.QueueID), StoredAt: time.UnixMilli(nowMs).UTC(),
			Delayed: true}
	}
	rec.CreatedAtMs = nowMs
	rec.NextCheckMs = nowMs + rec.CheckAfterMs
	batch.PutTransaction(rec)
	batch.PutTimer(rec.NextCheckMs, rec.ID, TimerTransaction)
	return rec.NextCheckMs
}

// CommitTransaction delivers a transaction's half messages as if sent now.
// It is idempotent; after a rollback it is ErrTransactionSettled.
func (b *Broker) CommitTransaction(ctx context.Context, topicName, txID string) (TransactionInfo, error) {
	return b.settleRequest(ctx, topicName, txID, TxCommitted)
}

// RollbackTransaction drops a transaction's half messages. It is
// idempotent; after a commit it is ErrTransactionSettled.
func (b *Broker) RollbackTransaction(ctx context.Context, topicName, txID string) (TransactionInfo, error) {
	return b.settleRequest(ctx, topicName, txID, TxRolledBack)
}

func (b *Broker) settleRequest(ctx context.Context, topicName, txID, state string) (TransactionInfo, error) {
	if err := ValidateName("topic", topicName); err != nil {
		return TransactionInfo{}, err
	}
	t, err := b.topic(topicName)
	if err != nil {
		return TransactionInfo{}, err
	}
	tx, rec, err := b.findTxn(t, txID)
	if err != nil {
		return TransactionInfo{}, err
	}
	if tx != nil {
		tx.mu.Lock()
		defer tx.mu.Unlock()
		if tx.final == nil {
			final, err := b.settleTxn(ctx, t, tx, state, DecidedByRequest)
			if err != nil {
				return TransactionInfo{}, err
			}
			rec = final
		} else {
			rec = tx.final
		}
	}
	if rec.State != state {
		return TransactionInfo{}, fmt.Errorf("%w: transaction %s was %s", ErrTransactionSettled, txID, strings.ReplaceAll(rec.State, "_", " "))
	}
	return b.txInfo(topicName, rec), nil
}

// findTxn finds a transaction of t: open (tx) or settled (rec only).
func (b *Broker) findTxn(t *topic, txID string) (*txn, *TransactionRecord, error) {
	notFound := fmt.Errorf("%w: %s", ErrTransactionNotFound, txID)
	id, ok := parseTxID(txID)
	if !ok {
		return nil, nil, notFound
	}
	b.mu.RLock()
	topicID := t.rec.ID
	b.mu.RUnlock()
	b.txMu.Lock()
	tx := b.txns[id]
	var rec *TransactionRecord
	if tx != nil {
		rec = tx.rec
	}
	b.txMu.Unlock()
	if tx != nil {
		if rec.TxID != txID || rec.TopicID != topicID {
			return nil, nil, notFound
		}
		return tx, rec, nil
	}
	rec, err := b.store.ReadTransaction(id)
	if errors.Is(err, ErrTransactionNotFound) || err == nil && (rec.TxID != txID || rec.TopicID != topicID) {
		return nil, nil, notFound
	}
	if err != nil {
		return nil, nil, err
	}
	if rec.State == TxOpen {
		// Open in the store, not in memory: prepared on another leader and
		// not yet loaded, which cannot be (New loads every open one).
		return nil, nil, fmt.Errorf("core: transaction %s open in the store but not in memory", txID)
	}
	return nil, rec, nil
}

// settleTxn commits or rolls back an open transaction (under tx.mu) and
// returns its settled record.
func (b *Broker) settleTxn(ctx context.Context, t *topic, tx *txn, state, by string) (*TransactionRecord, error) {
	b.txMu.Lock()
	open := tx.rec
	b.txMu.Unlock()
	now := b.now()
	b.mu.RLock()
	topicRec := t.rec
	nq := uint32(len(t.queues))
	b.mu.RUnlock()
	final := *open
	final.State, final.DecidedBy = state, by
	if by == DecidedByCheckLimit {
		final.Checks++ // the last check, which got no decision either
	}
	final.NextCheckMs = 0
	final.SettledAtMs = now.UnixMilli()
	final.ExpireMs = final.SettledAtMs + int64(topicRec.RetentionHours)*3600*1000
	parked := make([]*Parked, len(open.Parked))
	for i, id := range open.Parked {
		parked[i] = &Parked{ID: id, Kind: ParkedHalf, TopicID: open.TopicID}
	}
	writes := func(batch Batch) {
		for _, p := range parked {
			batch.DeleteParked(p)
		}
		batch.PutTransaction(&final)
		batch.PutTimer(final.ExpireMs, final.ID, TimerTransaction)
	}
	after := func() {
		b.txMu.Lock()
		delete(b.txns, open.ID)
		for _, id := range open.MessageIDs {
			delete(b.txByMsg, id)
		}
		b.txMu.Unlock()
		tx.final = &final
		t.half.Add(-int64(len(open.Parked)))
		b.timerCommitted(final.ExpireMs)
	}
	req := &request{kind: reqWrite, writes: []func(Batch){writes}, after: after}
	if state == TxCommitted {
		msgs := make([]*Message, len(open.Parked))
		for i, id := range open.Parked {
			p, err := b.store.ReadParked(ParkedHalf, id)
			if err != nil {
				return nil, fmt.Errorf("core: reading half message %d of %s: %w", id, open.TxID, err)
			}
			m := p.Msg
			m.TopicID = open.TopicID
			if m.QueueID >= nq {
				m.QueueID %= nq
			}
			m.DeliverAtMs = 0
			if p.DueMs > 0 {
				m.DeliverAtMs = now.UnixMilli() + p.DueMs
			}
			m.DedupKey = ""
			msgs[i] = m
		}
		req = &request{kind: reqAppend, topic: t, msgs: msgs, writes: req.writes, after: after}
	}
	if err := b.submit(ctx, req); err != nil {
		return nil, err
	}
	name := topicRec.Name
	span := SpanTxRollback
	if state == TxCommitted {
		span = SpanTxCommit
	}
	if b.tel.tracing {
		for i, tp := range open.Traceparents {
			attrs := []attribute.KeyValue{attribute.String("messaging.system", "tidemq"),
				attribute.String("messaging.destination.name", name), attribute.String("tidemq.transaction.id", open.TxID),
				attribute.String("tidemq.transaction.decided_by", by)}
			if i < len(open.MessageIDs) {
				attrs = append(attrs, attribute.String("messaging.message.id", open.MessageIDs[i]))
			}
			if state == TxCommitted && i < len(req.results) && !req.results[i].Delayed {
				attrs = append(attrs, attribute.Int("messaging.destination.partition.id", req.results[i].QueueID),
					attribute.Int64("messaging.message.offset", int64(req.results[i].Offset)))
			}
			b.tel.event(parseTraceparent(tp), span, now, attrs...)
		}
	}
	b.tel.transactions.Add(ctx, 1, metric.WithAttributes(attribute.String("topic", name),
		attribute.String("outcome", state), attribute.String("decided_by", by)))
	if state == TxCommitted {
		var bytes int64
		for _, m := range req.msgs {
			bytes += int64(len(m.Body))
		}
		b.tel.msgsIn.Add(ctx, int64(len(req.msgs)), t.metricAttrs...)
		b.tel.bytesIn.Add(ctx, bytes, t.metricAttrs...)
	}
	return &final, nil
}

func (b *Broker) txInfo(topicName string, rec *TransactionRecord) TransactionInfo {
	info := TransactionInfo{TransactionID: rec.TxID, Topic: topicName, State: rec.State, DecidedBy: rec.DecidedBy,
		MessageIDs: rec.MessageIDs, ProducerGroup: rec.ProducerGroup, Checks: rec.Checks,
		CreatedAt: time.UnixMilli(rec.CreatedAtMs).UTC()}
	if rec.State == TxOpen {
		info.NextCheckAt = time.UnixMilli(rec.NextCheckMs).UTC()
	} else {
		info.SettledAt = time.UnixMilli(rec.SettledAtMs).UTC()
	}
	return info
}

// ListTransactions describes a topic's open transactions, oldest first.
func (b *Broker) ListTransactions(topicName string) ([]TransactionInfo, error) {
	if err := ValidateName("topic", topicName); err != nil {
		return nil, err
	}
	t, err := b.topic(topicName)
	if err != nil {
		return nil, err
	}
	b.mu.RLock()
	topicID := t.rec.ID
	b.mu.RUnlock()
	var recs []*TransactionRecord
	b.txMu.Lock()
	for _, tx := range b.txns {
		if tx.rec.TopicID == topicID {
			recs = append(recs, tx.rec)
		}
	}
	b.txMu.Unlock()
	slices.SortFunc(recs, func(x, y *TransactionRecord) int { return compareUint64(x.ID, y.ID) })
	out := make([]TransactionInfo, len(recs))
	for i, r := range recs {
		out[i] = b.txInfo(topicName, r)
	}
	return out, nil
}

func compareUint64(x, y uint64) int {
	switch {
	case x < y:
		return -1
	case x > y:
		return 1
	}
	return 0
}

// findHalf returns a half message of an open transaction of the topic by
// id; nil when id is no half message.
func (b *Broker) findHalf(topicID uint32, id string) (*Message, error) {
	b.txMu.Lock()
	tx := b.txByMsg[id]
	var rec *TransactionRecord
	if tx != nil {
		rec = tx.rec
	}
	b.txMu.Unlock()
	if rec == nil || rec.TopicID != topicID {
		return nil, nil
	}
	i := slices.Index(rec.MessageIDs, id)
	if i < 0 {
		return nil, nil
	}
	p, err := b.store.ReadParked(ParkedHalf, rec.Parked[i])
	if errors.Is(err, ErrMessageNotFound) {
		return nil, nil // settled meanwhile
	}
	if err != nil {
		return nil, err
	}
	p.Msg.TopicID, p.Msg.Half = topicID, true
	return p.Msg, nil
}

// fireTransaction handles a transaction's timer: the next check of an open
// one, the end of a settled one's retention.
func (b *Broker) fireTransaction(id uint64, due int64) {
	b.txMu.Lock()
	tx := b.txns[id]
	start := tx != nil && tx.rec.NextCheckMs == due && tx.checking == 0
	var token uint64
	if start {
		b.checkTokens++
		token = b.checkTokens
		tx.checking = token
	}
	b.txMu.Unlock()
	if start {
		b.wg.Go(func() { b.check(tx, token) })
		return
	}
	if tx != nil {
		return // a timer of an earlier check, or one running
	}
	rec, err := b.store.ReadTransaction(id)
	if err != nil {
		if !errors.Is(err, ErrTransactionNotFound) {
			b.log.Error("reading a transaction", "err", err, "id", id)
		}
		return
	}
	if rec.State == TxOpen || rec.ExpireMs != due {
		return
	}
	req := &request{kind: reqWrite, writes: []func(Batch){func(batch Batch) { batch.DeleteTransaction(rec) }}}
	if err := b.submit(b.ctx, req); err != nil && !errors.Is(err, ErrClosed) && b.ctx.Err() == nil {
		b.log.Error("dropping a settled transaction", "err", err, "id", id)
	}
}

// check asks the producer about tx and records the answer. Stopped by
// Close (the context): nothing is recorded then, and the next broker
// checks again (New puts the timer of every open transaction back).
func (b *Broker) check(tx *txn, token uint64) {
	done := func() {
		if tx.checking == token {
			tx.checking = 0
		}
	}
	defer func() {
		b.txMu.Lock()
		done()
		b.txMu.Unlock()
	}()
	select {
	case b.checkSlots <- struct{}{}:
		defer func() { <-b.checkSlots }()
	case <-b.ctx.Done():
		return
	}
	b.txMu.Lock()
	rec := tx.rec
	b.txMu.Unlock()
	b.mu.RLock()
	t := b.topicsByID[rec.TopicID]
	var topicRec *TopicRecord
	if t != nil {
		topicRec = t.rec
	}
	b.mu.RUnlock()
	if t == nil {
		return // deleted: DeleteTopic drops its transactions
	}
	n := rec.Checks + 1
	status, err := CheckUnknown, error(nil)
	start := b.now()
	switch {
	case b.opts.TransactionChecker == nil:
		err = errors.New("no transaction checker")
	case topicRec.TransactionCheckURL == "":
		err = errors.New("the topic has no transactionCheckUrl")
	default:
		status, err = b.opts.TransactionChecker.CheckTransaction(b.ctx, topicRec.TransactionCheckURL, TransactionCheck{
			Topic: topicRec.Name, TransactionID: rec.TxID, MessageIDs: rec.MessageIDs, ProducerGroup: rec.ProducerGroup, Check: n})
	}
	if b.ctx.Err() != nil {
		return
	}
	if err != nil {
		status = CheckUnknown
	}
	answer := status
	if err != nil {
		answer = "failed"
	}
	b.tel.checks.Add(b.ctx, 1, metric.WithAttributes(attribute.String("topic", topicRec.Name), attribute.String("status", answer)))
	if b.tel.tracing {
		for i, tp := range rec.Traceparents {
			attrs := []attribute.KeyValue{attribute.String("messaging.system", "tidemq"),
				attribute.String("messaging.destination.name", topicRec.Name), attribute.String("tidemq.transaction.id", rec.TxID),
				attribute.Int("tidemq.transaction.check", n), attribute.String("tidemq.transaction.check_status", answer)}
			if i < len(rec.MessageIDs) {
				attrs = append(attrs, attribute.String("messaging.message.id", rec.MessageIDs[i]))
			}
			if err != nil {
				attrs = append(attrs, attribute.String("error.message", err.Error()))
			}
			b.tel.event(parseTraceparent(tp), SpanTxCheck, start, attrs...)
		}
	}
	log := b.log.With("topic", topicRec.Name, "transaction", rec.TxID, "check", n)
	if err != nil {
		log.Warn("transaction check failed", "err", err)
	}
	tx.mu.Lock()
	defer tx.mu.Unlock()
	if tx.final != nil {
		return // settled while the check ran
	}
	var serr error
	switch {
	case status == CheckCommit:
		_, serr = b.settleTxn(b.ctx, t, tx, TxCommitted, DecidedByCheck)
	case status == CheckRollback:
		_, serr = b.settleTxn(b.ctx, t, tx, TxRolledBack, DecidedByCheck)
	case n >= topicRec.maxChecks():
		log.Warn("transaction rolled back: no decision after its last check", "max_checks", topicRec.maxChecks())
		if _, serr = b.settleTxn(b.ctx, t, tx, TxRolledBack, DecidedByCheckLimit); serr == nil {
			b.transactionAlert(topicRec, rec, n)
		}
	default:
		next := *rec
		next.Checks = n
		next.NextCheckMs = b.now().UnixMilli() + checkDelay(rec.CheckAfterMs, n)
		serr = b.submit(b.ctx, &request{kind: reqWrite, writes: []func(Batch){func(batch Batch) {
			// A topic delete committed since the check began dropped the
			// transaction: writing it again would leave an open record
			// without its topic (admin requests commit alone, so the
			// delete's forgetting is done by the time this runs).
			b.txMu.Lock()
			live := b.txns[next.ID] == tx
			b.txMu.Unlock()
			if !live {
				return
			}
			batch.PutTransaction(&next)
			batch.PutTimer(next.NextCheckMs, next.ID, TimerTransaction)
		}}, after: func() {
			b.txMu.Lock()
			tx.rec = &next
			// Before the timer can fire: a scan that found the check
			// still running would skip it.
			done()
			b.txMu.Unlock()
			b.timerCommitted(next.NextCheckMs)
		}})
	}
	if serr != nil && !errors.Is(serr, ErrClosed) && b.ctx.Err() == nil {
		log.Error("recording a transaction check", "err", serr)
	}
}

// transactionAlert reports a transaction rolled back after its last check
// (SPEC §9): logged, counted, and POSTed to the topic's transactionAlertUrl.
func (b *Broker) transactionAlert(topicRec *TopicRecord, rec *TransactionRecord, checks int) {
	const kind = "transaction_check_limit"
	b.tel.alerts.Add(context.Background(), 1, metric.WithAttributes(
		attribute.String("alert", kind), attribute.String("status", "firing"),
		attribute.String("topic", topicRec.Name), attribute.String("group", rec.ProducerGroup)))
	if b.opts.Notifier != nil && topicRec.TransactionAlertURL != "" {
		b.opts.Notifier.Notify(Alert{Status: "firing", Alert: kind, Topic: topicRec.Name, Group: rec.ProducerGroup,
			Value: int64(checks), Max: int64(topicRec.maxChecks()), At: b.now().UTC(), WebhookURL: topicRec.TransactionAlertURL,
			TransactionID: rec.TxID})
	}
}

// restoreTransactions rebuilds the open transactions at New and puts
// their check timers back into the epoch's batch (a check that was running
// when the last broker stopped may have had its timer cleaned up).
func (b *Broker) restoreTransactions(recs []*TransactionRecord) (putTimers func(Batch), first int64) {
	for _, rec := range recs {
		tx := &txn{rec: rec}
		b.txns[rec.ID] = tx
		for _, id := range rec.MessageIDs {
			b.txByMsg[id] = tx
		}
		if t := b.topicsByID[rec.TopicID]; t != nil {
			t.half.Add(int64(len(rec.Parked)))
		}
		if first == 0 || rec.NextCheckMs < first {
			first = rec.NextCheckMs
		}
	}
	return func(batch Batch) {
		for _, rec := range recs {
			batch.PutTimer(rec.NextCheckMs, rec.ID, TimerTransaction)
		}
	}, first
}

// dropTopicTransactions writes the deletion of a topic's open transactions
// and returns them. It runs in the topic delete's batch, in the appender:
// a transaction prepared in a batch before it is open by then, so none is
// left behind in the store without its topic.
func (b *Broker) dropTopicTransactions(batch Batch, topicID uint32) []*TransactionRecord {
	var recs []*TransactionRecord
	b.txMu.Lock()
	for _, tx := range b.txns {
		if tx.rec.TopicID == topicID {
			recs = append(recs, tx.rec)
		}
	}
	b.txMu.Unlock()
	for _, rec := range recs {
		for _, id := range rec.Parked {
			batch.DeleteParked(&Parked{ID: id, Kind: ParkedHalf, TopicID: topicID})
		}
		batch.DeleteTransaction(rec)
	}
	return recs
}

// forgetTransactions drops deleted transactions from memory.
func (b *Broker) forgetTransactions(recs []*TransactionRecord) {
	b.txMu.Lock()
	defer b.txMu.Unlock()
	for _, rec := range recs {
		delete(b.txns, rec.ID)
		for _, id := range rec.MessageIDs {
			delete(b.txByMsg, id)
		}
	}
}
