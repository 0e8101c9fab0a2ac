package core

import (
	"hash/fnv"
	"time"
)

// TopicRecord is a topic's durable definition.
type TopicRecord struct {
	ID             uint32 `json:"id"`
	Name           string `json:"name"`
	Queues         int    `json:"queues"`
	RetentionHours int    `json:"retentionHours"`
	CreatedAtMs    int64  `json:"createdAtMs"`
	// TransactionCheckURL is where the broker asks a producer about a half
	// message left undecided (transaction.go); empty: nowhere, every check
	// fails. TransactionMaxChecks bounds the checks (0: the default).
	TransactionCheckURL  string `json:"transactionCheckUrl,omitempty"`
	TransactionMaxChecks int    `json:"transactionMaxChecks,omitempty"`
	// TransactionAlertURL receives the alert of a transaction rolled back
	// because its checks ran out.
	TransactionAlertURL string `json:"transactionAlertUrl,omitempty"`
}

// Subscription modes.
const (
	ModeClustering = "clustering"
	ModeBroadcast  = "broadcast"
)

// SubscriptionRecord is a subscription's durable definition.
type SubscriptionRecord struct {
	ID          uint32          `json:"id"`
	TopicID     uint32          `json:"topicId"`
	Group       string          `json:"group"`
	Mode        string          `json:"mode"`
	Orderly     bool            `json:"orderly"`
	Filter      string          `json:"filter"`
	MaxRetries  int             `json:"maxRetries"`
	StartFrom   string          `json:"startFrom"`
	RetryDelays []time.Duration `json:"retryDelays"`
	CreatedAtMs int64           `json:"createdAtMs"`
	Alerts      *AlertConfig    `json:"alerts,omitempty"`
	Push        *PushConfig     `json:"push,omitempty"`
}

// Message is one stored message. Times are Unix milliseconds.
type Message struct {
	ID            string
	TopicID       uint32
	QueueID       uint32
	Offset        uint64
	Seq           uint64
	Body          []byte
	BodyBase64    bool // the producer sent the body base64-encoded; serve it back so
	Half          bool // set (never stored) on a half message query found; beside BodyBase64 it costs the struct no room
	Tag           string
	Keys          []string
	Properties    map[string]string
	ShardingKey   string
	ProducerGroup string
	Traceparent   string
	BornAtMs      int64
	StoredAtMs    int64
	// DeliverAtMs, when in the future at send, holds the message back until
	// then (a delayed message); it gets its offset when it becomes due.
	DeliverAtMs int64
	// DedupKey makes a repeated send within DedupWindow store nothing.
	DedupKey string
}

// TagHash is the 32-bit FNV-1a of a tag, kept in the queue index so filters
// run before a body is read. Zero means "no tag".
func TagHash(tag string) uint32 {
	if tag == "" {
		return 0
	}
	h := fnv.New32a()
	h.Write([]byte(tag))
	if s := h.Sum32(); s != 0 {
		return s
	}
	return 1
}

// ShardingHash is the 32-bit FNV-1a of a sharding key, 0 for none: it picks
// the queue of a keyed message and keeps orderly delivery per key.
func ShardingHash(key string) uint32 {
	if key == "" {
		return 0
	}
	h := fnv.New32a()
	h.Write([]byte(key))
	if s := h.Sum32(); s != 0 {
		return s
	}
	return 1
}

// IndexHash is the 64-bit FNV-1a used by the secondary index.
func IndexHash(s string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(s))
	return h.Sum64()
}

// IDIndex is the id-index kind and digest of a message id. A NUID (the
// ids the broker makes: 12 random prefix characters, then a 10-digit
// base-62 sequence that grows with every id a process makes) indexes under
// IndexNUID by its sequence number, with 4 bits of its prefix's hash on
// top; other ids under IndexID by IndexHash. Ordered digests matter for
// speed: the ids of a send follow each other, so a store can keep them as
// one run (pebblestore does) and Pebble's memtable inserts after the last
// entry without searching. Equal digests are harmless: a lookup reads
// each candidate and compares ids.
func IDIndex(id string) (kind byte, digest uint64) {
	seq, ok := nuidSequence(id)
	if !ok {
		return IndexID, IndexHash(id)
	}
	return IndexNUID, IndexHash(id[:nuidPrefixLen])>>60<<60 | seq
}

const (
	nuidPrefixLen = 12
	nuidLen       = 22
	nuidDigits    = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
)

// nuidSequence is the sequence part of a NUID (below 62^10 < 2^60), and
// false for anything that is not a NUID.
func nuidSequence(id string) (uint64, bool) {
	if len(id) != nuidLen {
		return 0, false
	}
	var seq uint64
	for i := range nuidLen {
		d := nuidDigitValue[id[i]]
		if d < 0 {
			return 0, false
		}
		if i >= nuidPrefixLen {
			seq = seq*62 + uint64(d)
		}
	}
	return seq, true
}

// nuidDigitValue maps a byte to its base-62 digit value, -1 for bytes that
// are no digit: every sent message's id is decoded, so no string search.
var nuidDigitValue = func() (v [256]int8) {
	for i := range v {
		v[i] = -1
	}
	for d := range len(nuidDigits) {
		v[nuidDigits[d]] = int8(d)
	}
	return v
}()

// PushConfig makes the broker POST each message to an endpoint instead of
// waiting for pulls.
type PushConfig struct {
	Endpoint       string            `json:"endpoint"`
	MaxInFlight    int               `json:"maxInFlight"`
	TimeoutSeconds int               `json:"timeoutSeconds"`
	Headers        map[string]string `json:"headers,omitempty"`
	// Secret signs each POST (HMAC-SHA256); it is never shown back.
	Secret string `json:"secret,omitempty"`
}
