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
	// OffsetAtTime returns the first offset of the queue stored at or after
	// timeMs, or ok=false when every retained message is older.
	OffsetAtTime(topicID, queueID uint32, timeMs int64) (offset uint64, ok bool, err error)
	// Close flushes and closes the store. It is idempotent.
	Close() error
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
	// Len reports the encoded size so far, for batch size caps.
	Len() int
	// Commit makes the batch durable (sync) or merely applied (!sync).
	Commit(sync bool) error
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
}

// Snapshot is the durable state the broker rebuilds its memory from.
type Snapshot struct {
	NextSeq       uint64
	Topics        []*TopicRecord
	Subscriptions []*SubscriptionRecord
	// Queues holds the retained offset range and byte total of every queue of
	// every topic, keyed by topic id.
	Queues map[uint32][]QueueRange
	// Acks holds consumer state keyed by subscription id.
	Acks map[uint32][]QueueAcks
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
