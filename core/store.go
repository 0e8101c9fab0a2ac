package core

// Store is what the broker needs from durable storage. pebblestore implements
// it; the key layout is that package's business (see pebblestore/doc.go).
//
// Reads may run concurrently with each other and with one Batch being built
// and committed; the broker commits batches from a single goroutine.
type Store interface {
	// Load returns everything needed to rebuild the broker's memory at open.
	Load() (*Snapshot, error)
	// NewBatch starts an atomic group of writes.
	NewBatch() Batch
	// ScanQueue calls fn for index entries of one queue with offsets in
	// [from, to), in offset order, until fn returns false.
	ScanQueue(topicID, queueID uint32, from, to uint64, fn func(IndexEntry) bool) error
	// ReadMessage returns the message stored under seq; ErrMessageNotFound when
	// retention removed it. The returned message is owned by the caller.
	ReadMessage(seq uint64) (*Message, error)
	// ReadMessages reads the messages stored under seqs (ascending) into
	// out (len(out) == len(seqs)); a seq retention removed leaves nil. One
	// pass over the log instead of a lookup per message.
	ReadMessages(seqs []uint64, out []*Message) error
	// OffsetAtTime returns the first offset of the queue stored at or after
	// timeMs, or ok=false when every retained message is older.
	OffsetAtTime(topicID, queueID uint32, timeMs int64) (offset uint64, ok bool, err error)
	// ReadParked returns a parked message of a kind, or ErrMessageNotFound.
	ReadParked(kind byte, id uint64) (*Parked, error)
	// ReadTransaction returns a transaction record, open or settled, or
	// ErrTransactionNotFound.
	ReadTransaction(id uint64) (*TransactionRecord, error)
	// ScanTimers calls fn for timers due in [fromMs, toMs] in due order.
	ScanTimers(fromMs, toMs int64, fn func(dueMs int64, id uint64, kind byte) bool) error
	// ScanDead calls fn for a subscription's dead messages with deadAt in
	// [fromMs, toMs], oldest first, starting after the entry named by after
	// (0,0 for the beginning).
	ScanDead(subID uint32, fromMs, toMs int64, afterMs int64, afterID uint64, fn func(*Dead) bool) error
	// ScanIndex calls fn for the seqs indexed under (kind, hash) on a topic,
	// bucket by bucket in [fromBucket, toBucket], then by seq, starting
	// after (afterBucket, afterSeq). Hashes collide: callers check the message.
	ScanIndex(topicID uint32, kind byte, hash uint64, fromBucket, toBucket uint32, afterBucket uint32, afterSeq uint64, fn func(bucket uint32, seq uint64) bool) error
	// ScanHistory calls fn for the delivery history of one message.
	ScanHistory(topicID, queueID uint32, offset uint64, fn func(*HistoryRecord) bool) error
	// ApplyBatch applies a batch encoded by Batch.Repr, durably when sync
	// is set. It reads nothing and decides nothing: a replica applying the
	// leader's batches in commit order holds the leader's keys and values.
	ApplyBatch(repr []byte, sync bool) error
	// Close flushes and closes the store. It is idempotent.
	Close() error
}

// Secondary index kinds.
const (
	IndexID   byte = 'i' // message ids that are not NUIDs, by IndexHash
	IndexNUID byte = 'n' // message ids that are NUIDs, by their sequence (IDIndex); the store may keep them in runs
	IndexKey  byte = 'k'
	IndexTag  byte = 't'
	// IndexDelayed finds delayed messages not yet due: by IndexHash of
	// their id, in the bucket of their due time (so retention does not cut
	// it before they are), with the parked record's id where other kinds
	// have a seq. The store keeps it with the parked record (PutParked,
	// DeleteParked).
	IndexDelayed byte = 'd'
)

// IndexBucketMs is the width of a secondary index time bucket: retention
// drops whole buckets with one range tombstone.
const IndexBucketMs = 3600 * 1000

// IndexBucket is the bucket of a store time.
func IndexBucket(storedAtMs int64) uint32 { return uint32(max(storedAtMs, 0) / IndexBucketMs) }

// Delivery outcomes kept in history.
const (
	OutcomeAck          byte = 'a'
	OutcomeNack         byte = 'n'
	OutcomeLeaseExpired byte = 'e'
	OutcomeDeadLetter   byte = 'd'
)

// HistoryRecord is one settled delivery of a message to a subscription.
type HistoryRecord struct {
	// ID orders a message's records (ids grow with time) and keeps a
	// redriven message's new attempts from overwriting its old ones.
	ID            uint64
	TopicID       uint32
	QueueID       uint32
	Offset        uint64
	StateID       uint32
	Attempt       int
	ConsumerID    string
	DeliveredAtMs int64
	Outcome       byte
	Reason        string
	SettledAtMs   int64
}

// Batch is an atomic group of writes; nothing of it is visible before Commit.
type Batch interface {
	PutTopic(t *TopicRecord)
	// DeleteTopic removes the topic, its queues' messages and indexes.
	DeleteTopic(t *TopicRecord)
	PutSubscription(s *SubscriptionRecord)
	// DeleteSubscription removes the subscription and its consumer state.
	DeleteSubscription(s *SubscriptionRecord)
	// Append stores m under m.Seq and indexes it at (TopicID, QueueID, Offset).
	Append(m *Message)
	// PutQueueMeta records a queue's next offset and running byte total.
	PutQueueMeta(topicID, queueID uint32, next uint64, bytes int64)
	// PutAckWatermark records that every offset below acked is done.
	PutAckWatermark(subID, queueID uint32, acked uint64)
	// PutAck records an ack above the watermark; DeleteAck drops it once the
	// watermark has passed it.
	PutAck(subID, queueID uint32, offset uint64)
	DeleteAck(subID, queueID uint32, offset uint64)
	// PutLastIDs records the highest topic and subscription/cursor ids ever
	// given, so a deleted one's id is never given again after a restart.
	PutLastIDs(lastTopic, lastSub uint32)
	// PutEpoch records the broker's epoch, raised on every start (receipt
	// handles carry it).
	PutEpoch(epoch uint64)
	// PutCounters records the broker's counters as of this batch; the
	// appender writes it in every batch that advanced them, so a restart
	// (or a later leader reading the same writes) continues them.
	PutCounters(c Counters)
	// PutMember records a broadcast consumer's cursor id.
	PutMember(subID uint32, consumerID string, cursorID uint32)
	// DeleteCursor removes a cursor's watermarks, acks and attempts.
	DeleteCursor(cursorID uint32)
	// DeleteCursorQueue removes a cursor's acks and attempts in one queue
	// (seek).
	DeleteCursorQueue(cursorID, queueID uint32)
	// PutAttempt records a delivery's failed attempts and suspension;
	// DeleteAttempt drops it once the delivery is done.
	PutAttempt(r AttemptRecord)
	DeleteAttempt(cursorID, queueID uint32, offset uint64)
	PutParked(p *Parked)
	DeleteParked(p *Parked)
	// PutTimer indexes a parked message under its due time.
	PutTimer(dueMs int64, id uint64, kind byte)
	// DeleteTimersBefore drops timers due before dueMs (already processed).
	DeleteTimersBefore(dueMs int64)
	// PutTransaction records a transaction; a settled one replaces its open
	// record (Load returns only open ones). DeleteTransaction drops either.
	PutTransaction(r *TransactionRecord)
	DeleteTransaction(r *TransactionRecord)
	PutDead(d *Dead)
	DeleteDead(d *Dead)
	PutDedup(r *DedupRecord)
	DeleteDedup(topicID uint32, key string)
	// CutQueue removes a queue's index entries below offset and its time
	// index entries before timeMs (retention).
	CutQueue(topicID, queueID uint32, offset uint64, timeMs int64)
	// CutIndex removes a topic's secondary index buckets below bucket.
	CutIndex(topicID uint32, bucket uint32)
	PutHistory(h *HistoryRecord)
	// CutLog removes log records below seq (retention, across topics).
	CutLog(seq uint64)
	// Len reports the encoded size so far, for batch size caps.
	Len() int
	// Repr returns the batch encoded, for Store.ApplyBatch on a replica. It
	// is valid until Commit or Close; whoever keeps it longer copies it.
	Repr() []byte
	// Commit makes the batch durable (sync) or merely applied (!sync).
	// alone says the commit answers one caller, committing on its own
	// goroutine with nothing queued behind it: a hint the store may use to
	// return sooner by spending CPU nobody else is waiting for. The batch
	// is as durable either way.
	Commit(sync, alone bool) error
	// Close releases the batch; it is a no-op after Commit failed or succeeded.
	Close()
}

// IndexEntry is one message's row in the queue index: enough to filter by tag
// and to find the body without reading it.
type IndexEntry struct {
	Offset     uint64
	Seq        uint64
	StoredAtMs int64
	TagHash    uint32
	Size       uint32
	// KeyHash is the sharding key's hash (0: none), so orderly delivery
	// knows a message's key without reading it.
	KeyHash uint32
}

// Counters are the broker's counters that must never go backwards, kept
// in the store (Batch.PutCounters) rather than seeded from a clock.
type Counters struct {
	// NextSeq is the log seq the next message gets: above every seq ever
	// given, even once retention has cut the whole log.
	NextSeq uint64
	// LastStoredMs is the latest store time given, which later store times
	// never go below (so storedAt and the time index stay monotonic even
	// when the wall clock steps back).
	LastStoredMs int64
	// IDs is the highest id given to history, parked and dead records.
	IDs uint64
}

// Snapshot is the durable state the broker rebuilds its memory from.
type Snapshot struct {
	// NextSeq is one past the last seq in the log (0 when it is empty).
	NextSeq uint64
	// Counters is the last counters record, nil when the store has none.
	Counters *Counters
	// LastTopicID and LastSubID are the highest ids ever given.
	LastTopicID, LastSubID uint32
	// Epoch is the last epoch a broker started in, 0 for a new store.
	Epoch         uint64
	Topics        []*TopicRecord
	Subscriptions []*SubscriptionRecord
	// Queues holds the retained offset range and byte total of every queue of
	// every topic, keyed by topic id.
	Queues map[uint32][]QueueRange
	// Acks holds consumer state keyed by subscription id.
	Acks map[uint32][]QueueAcks
	// Members holds the broadcast consumers of every subscription.
	Members []MemberRecord
	// Retries holds every ParkedRetry record, without bodies.
	Retries []*Parked
	// FirstTimerMs is the due time of the earliest timer, 0 if none.
	FirstTimerMs int64
	// DeadCounts is the DLQ size per subscription id.
	DeadCounts map[uint32]int64
	// Dedup holds the remembered sends, oldest first.
	Dedup []*DedupRecord
	// Transactions holds the open transactions.
	Transactions []*TransactionRecord
	// Attempts holds every AttemptRecord keyed by cursor id, in (queue,
	// offset) order.
	Attempts map[uint32][]AttemptRecord
}

// RetryQueue is the queue id of a parked retry's delivery: its offset is
// the parked record's id.
const RetryQueue = ^uint32(0)

// AttemptRecord is a delivery's durable progress: the failed attempts of a
// message not yet done (lease expiries, orderly nacks) and, for an orderly
// key, when its suspension ends.
type AttemptRecord struct {
	CursorID uint32
	// QueueID is RetryQueue for a parked retry, whose Offset is the parked
	// record's id.
	QueueID uint32
	Offset  uint64
	Attempt int
	DueMs   int64 // end of an orderly suspension; 0: none
}

// MemberRecord names the cursor of one consumer of a broadcast subscription.
type MemberRecord struct {
	SubID      uint32
	ConsumerID string
	CursorID   uint32
}

// QueueRange is a queue's retained offsets [Min, Next).
type QueueRange struct {
	Min, Next uint64
	Bytes     int64
}

// QueueAcks is a subscription's durable position in one queue.
type QueueAcks struct {
	QueueID   uint32
	Watermark uint64
	Acked     []uint64 // acks above the watermark, ascending
}

// Parked kinds.
const (
	// ParkedRetry is a message a subscription will get again after a delay.
	ParkedRetry byte = 'r'
	// ParkedDelayed is a delayed send, appended to its queue when due.
	ParkedDelayed byte = 'd'
	// ParkedHalf is a half message (transaction.go): appended to its queue
	// when its transaction commits, dropped when it rolls back. It has no
	// timer of its own (its transaction has); DueMs holds its delay in ms,
	// counted from the commit.
	ParkedHalf byte = 'h'
	// TimerTransaction is the timer kind of a transaction record: its next
	// check while open, the end of its retention once settled.
	TimerTransaction byte = 'x'
)

// Parked is a message waiting for a timer, kept apart from the queues so
// that retention never removes it. Its body is a copy of the message.
type Parked struct {
	ID      uint64
	Kind    byte
	SubID   uint32 // ParkedRetry: the cursor id
	TopicID uint32
	DueMs   int64
	// Attempt is how many deliveries failed so far (ParkedRetry).
	Attempt int
	Reason  string
	Msg     *Message
}

// Dead is a message in a subscription's dead-letter queue.
type Dead struct {
	ID    uint64
	SubID uint32
	// CursorID is the cursor the message failed on; a redrive returns it there.
	CursorID uint32
	DeadAtMs int64
	Attempt  int
	Reason   string
	Msg      *Message
}

// DedupRecord remembers a send's reply for DedupWindow.
type DedupRecord struct {
	TopicID  uint32
	Key      string
	Result   SendResult
	StoredMs int64
}
