package sdk

import (
	"encoding/base64"
	"fmt"
	"time"
)

// The wire types below are written by hand to match the schemas of
// openapi.yaml field for field (same JSON names, same optionality). Integer
// fields with format int32 are int, those with format int64 are int64;
// nullable fields are pointers; timestamps are time.Time.

// Body encodings (bodyEncoding).
const (
	EncodingUTF8   = "utf8"
	EncodingBase64 = "base64"
)

// Subscription modes (SubscriptionConfig.Mode).
const (
	ModeClustering = "clustering"
	ModeBroadcast  = "broadcast"
)

// Seek positions and startFrom values besides an RFC 3339 time.
const (
	PositionEarliest = "earliest"
	PositionLatest   = "latest"
)

// ---------------------------------------------------------------- topics

// TopicConfig is the body of PUT /v1/topics/{topic}. Zero fields take the
// server's defaults (8 queues, 24 hours).
type TopicConfig struct {
	Queues         int `json:"queues,omitempty"`
	RetentionHours int `json:"retentionHours,omitempty"`
	// TransactionCheckURL is where the broker POSTs a TransactionCheck
	// for a half message left without commit or rollback past its
	// checkAfterSeconds (SPEC §9); TransactionCheckHandler answers it.
	TransactionCheckURL string `json:"transactionCheckUrl,omitempty"`
	// TransactionMaxChecks is how many checks a half message gets before
	// the broker rolls it back (server default 15).
	TransactionMaxChecks int `json:"transactionMaxChecks,omitempty"`
	// TransactionAlertURL is the webhook of the alert fired when a
	// transaction is rolled back after its last check.
	TransactionAlertURL string `json:"transactionAlertUrl,omitempty"`
}

// QueueStats describes one queue of a topic. MaxOffset is exclusive.
type QueueStats struct {
	QueueID   int   `json:"queueId"`
	MinOffset int64 `json:"minOffset"`
	MaxOffset int64 `json:"maxOffset"`
}

// Topic is a topic with its statistics.
type Topic struct {
	Topic          string       `json:"topic"`
	Queues         int          `json:"queues"`
	RetentionHours int          `json:"retentionHours"`
	CreatedAt      time.Time    `json:"createdAt"`
	Messages       int64        `json:"messages,omitempty"`
	Bytes          int64        `json:"bytes,omitempty"`
	QueueStats     []QueueStats `json:"queueStats,omitempty"`
	Subscriptions  []string     `json:"subscriptions,omitempty"`
	// TransactionCheckURL and TransactionMaxChecks are as in TopicConfig.
	TransactionCheckURL  string `json:"transactionCheckUrl,omitempty"`
	TransactionMaxChecks int    `json:"transactionMaxChecks,omitempty"`
	TransactionAlertURL  string `json:"transactionAlertUrl,omitempty"`
	// HalfMessages counts the messages of open transactions: stored,
	// delivered to nobody until committed; not in Messages.
	HalfMessages int64 `json:"halfMessages,omitempty"`
}

// TopicList is the reply of GET /v1/topics.
type TopicList struct {
	Topics []Topic `json:"topics"`
}

// -------------------------------------------------------------- messages

// SendMessage is one message to send (schema SendMessage). Body is text
// when BodyEncoding is "" or "utf8", and base64 of the bytes when it is
// "base64"; use NewMessage or NewBinaryMessage to get it right.
type SendMessage struct {
	Body         string            `json:"body"`
	BodyEncoding string            `json:"bodyEncoding,omitempty"`
	Tag          string            `json:"tag,omitempty"`
	Keys         []string          `json:"keys,omitempty"`
	Properties   map[string]string `json:"properties,omitempty"`
	ShardingKey  string            `json:"shardingKey,omitempty"`
	// DelaySeconds (0–604800) keeps the message invisible that long; not
	// together with DeliverAt.
	DelaySeconds int        `json:"delaySeconds,omitempty"`
	DeliverAt    *time.Time `json:"deliverAt,omitempty"`
	// DedupKey makes a repeated send within 5 minutes store nothing. A
	// Producer fills it in when it is empty (see ProducerOptions.NoAutoDedup),
	// except on half messages, which may not have one (400).
	DedupKey string `json:"dedupKey,omitempty"`
	// Transaction makes a single send a half message (SPEC §9); in a
	// batch it goes on SendBatch instead. Producer.SendInTransaction
	// sets it.
	Transaction *Transaction `json:"transaction,omitempty"`
}

// Transaction asks for a half message: stored, delivered to nobody until
// committed (schema Transaction).
type Transaction struct {
	// CheckAfterSeconds is how long the broker waits for a commit or
	// rollback before it asks the topic's TransactionCheckURL.
	CheckAfterSeconds int `json:"checkAfterSeconds"`
}

// NewMessage is a message with a text body.
func NewMessage(body string) SendMessage { return SendMessage{Body: body} }

// NewBinaryMessage is a message with a binary body, sent base64-encoded.
func NewBinaryMessage(body []byte) SendMessage {
	return SendMessage{Body: base64.StdEncoding.EncodeToString(body), BodyEncoding: EncodingBase64}
}

// SendResult is the reply to one sent message. Offset is nil for a delayed
// message (it gets one when it becomes due). Duplicate is true when an
// earlier send with the same DedupKey stored the message — for a Producer
// that may be its own earlier attempt whose reply was lost.
type SendResult struct {
	MessageID string    `json:"messageId"`
	QueueID   int       `json:"queueId"`
	Offset    *int64    `json:"offset"`
	StoredAt  time.Time `json:"storedAt,omitzero"`
	Duplicate bool      `json:"duplicate,omitempty"`
	// TransactionID is set on the reply to a half message.
	TransactionID string `json:"transactionId,omitempty"`
}

// SendBatch is the body of POST /v1/topics/{topic}/messages:batch.
type SendBatch struct {
	Messages []SendMessage `json:"messages"`
	// Transaction makes the whole batch one transaction's half messages.
	Transaction *Transaction `json:"transaction,omitempty"`
}

// BatchResult is the reply of a batch send, one result per message in
// request order.
type BatchResult struct {
	Results []SendResult `json:"results"`
	// TransactionID is set on the reply to a batch of half messages.
	TransactionID string `json:"transactionId,omitempty"`
}

// --------------------------------------------------------- subscriptions

// PushConfig makes the broker POST each message to Endpoint.
type PushConfig struct {
	Endpoint       string            `json:"endpoint"`
	MaxInFlight    int               `json:"maxInFlight,omitempty"`
	TimeoutSeconds int               `json:"timeoutSeconds,omitempty"`
	Headers        map[string]string `json:"headers,omitempty"`
}

// AlertsConfig holds a subscription's alert thresholds.
type AlertsConfig struct {
	MaxLag     *int64  `json:"maxLag,omitempty"`
	MaxDlq     *int64  `json:"maxDlq,omitempty"`
	WebhookURL *string `json:"webhookUrl,omitempty"`
}

// SubscriptionConfig is the body of PUT …/subscriptions/{group}. Every
// field is optional; the server's defaults are clustering, not orderly,
// filter "*", 5 retries, earliest, and RocketMQ's retry schedule. A PUT sets
// the whole configuration: fields left out go back to their defaults.
type SubscriptionConfig struct {
	Mode    string `json:"mode,omitempty"`
	Orderly bool   `json:"orderly,omitempty"`
	Filter  string `json:"filter,omitempty"`
	// MaxRetries (0–32); nil means the default, 5.
	MaxRetries *int `json:"maxRetries,omitempty"`
	// StartFrom is "earliest", "latest" or an RFC 3339 time.
	StartFrom string `json:"startFrom,omitempty"`
	// RetryDelays are durations like "10s", "1m", "500ms".
	RetryDelays []string      `json:"retryDelays,omitempty"`
	Push        *PushConfig   `json:"push,omitempty"`
	Alerts      *AlertsConfig `json:"alerts,omitempty"`
}

// SubscriptionQueue is a subscription's position in one queue.
type SubscriptionQueue struct {
	QueueID     int   `json:"queueId"`
	MaxOffset   int64 `json:"maxOffset,omitempty"`
	AckedOffset int64 `json:"ackedOffset,omitempty"`
	Inflight    int64 `json:"inflight,omitempty"`
	Lag         int64 `json:"lag,omitempty"`
}

// SubscriptionConsumer is a consumer seen recently by a subscription
// (schema Consumer).
type SubscriptionConsumer struct {
	ConsumerID string    `json:"consumerId"`
	LastSeen   time.Time `json:"lastSeen,omitzero"`
	Queues     []int     `json:"queues,omitempty"`
}

// Subscription is a subscription's configuration and statistics.
type Subscription struct {
	Topic       string                 `json:"topic"`
	Group       string                 `json:"group"`
	CreatedAt   time.Time              `json:"createdAt"`
	Mode        string                 `json:"mode"`
	Orderly     bool                   `json:"orderly"`
	Filter      string                 `json:"filter"`
	MaxRetries  int                    `json:"maxRetries"`
	StartFrom   string                 `json:"startFrom,omitempty"`
	RetryDelays []string               `json:"retryDelays,omitempty"`
	Push        *PushConfig            `json:"push,omitempty"`
	Alerts      *AlertsConfig          `json:"alerts,omitempty"`
	Queues      []SubscriptionQueue    `json:"queues,omitempty"`
	Lag         int64                  `json:"lag,omitempty"`
	Inflight    int64                  `json:"inflight,omitempty"`
	Retrying    int64                  `json:"retrying,omitempty"`
	Dlq         int64                  `json:"dlq,omitempty"`
	Consumers   []SubscriptionConsumer `json:"consumers,omitempty"`
}

// SubscriptionList is the reply of GET …/subscriptions.
type SubscriptionList struct {
	Subscriptions []Subscription `json:"subscriptions"`
}

// ----------------------------------------------------------- consumption

// PullRequest is the body of POST …/pull. Zero fields take the server's
// defaults (32 messages, no wait, 30 s lease).
type PullRequest struct {
	MaxMessages      int    `json:"maxMessages,omitempty"`
	WaitSeconds      int    `json:"waitSeconds,omitempty"`
	InvisibleSeconds int    `json:"invisibleSeconds,omitempty"`
	ConsumerID       string `json:"consumerId,omitempty"`
}

// PulledMessage is a leased message.
type PulledMessage struct {
	MessageID       string            `json:"messageId"`
	Topic           string            `json:"topic"`
	QueueID         int               `json:"queueId"`
	Offset          int64             `json:"offset"`
	Body            string            `json:"body"`
	BodyEncoding    string            `json:"bodyEncoding"`
	Tag             string            `json:"tag,omitempty"`
	Keys            []string          `json:"keys,omitempty"`
	Properties      map[string]string `json:"properties,omitempty"`
	ShardingKey     string            `json:"shardingKey,omitempty"`
	BornAt          time.Time         `json:"bornAt,omitzero"`
	StoredAt        time.Time         `json:"storedAt"`
	ProducerGroup   string            `json:"producerGroup,omitempty"`
	DeliveryAttempt int               `json:"deliveryAttempt"`
	ReceiptHandle   string            `json:"receiptHandle"`
	Traceparent     string            `json:"traceparent,omitempty"`
}

// Bytes returns the body as sent, decoding base64.
func (m *PulledMessage) Bytes() ([]byte, error) { return decodeBody(m.Body, m.BodyEncoding) }

// PullResult is the reply of a pull.
type PullResult struct {
	Messages []PulledMessage `json:"messages"`
}

// AckRequest is the body of POST …/ack.
type AckRequest struct {
	ReceiptHandles []string `json:"receiptHandles"`
}

// NackRequest is the body of POST …/nack. A nil DelaySeconds uses the
// subscription's next retry delay.
type NackRequest struct {
	ReceiptHandles []string `json:"receiptHandles"`
	DelaySeconds   *int     `json:"delaySeconds,omitempty"`
	Reason         string   `json:"reason,omitempty"`
}

// ExtendRequest is the body of POST …/extend.
type ExtendRequest struct {
	ReceiptHandles   []string `json:"receiptHandles"`
	InvisibleSeconds int      `json:"invisibleSeconds"`
}

// DeadLetterRequest is the body of POST …/deadletter.
type DeadLetterRequest struct {
	ReceiptHandles []string `json:"receiptHandles"`
	Reason         string   `json:"reason,omitempty"`
}

// Receipt failure codes (HandleFailure.Code); errors.Is(f.Err(), …) works
// with ErrReceiptExpired and ErrReceiptInvalid too.
const (
	CodeReceiptExpired = "receipt_expired"
	CodeReceiptInvalid = "receipt_invalid"
)

// HandleFailure is one receipt handle that could not be settled.
type HandleFailure struct {
	ReceiptHandle string `json:"receiptHandle"`
	Code          string `json:"code"`
}

// Err is the failure as an error value: ErrReceiptExpired or
// ErrReceiptInvalid (or an error naming an unknown code).
func (f HandleFailure) Err() error {
	switch f.Code {
	case CodeReceiptExpired:
		return ErrReceiptExpired
	case CodeReceiptInvalid:
		return ErrReceiptInvalid
	}
	return fmt.Errorf("tidemq: receipt handle failed: %s", f.Code)
}

// AckResult is the per-handle outcome of an ack.
type AckResult struct {
	Acked  int             `json:"acked"`
	Failed []HandleFailure `json:"failed"`
}

// NackResult is the per-handle outcome of a nack.
type NackResult struct {
	Nacked int             `json:"nacked"`
	Failed []HandleFailure `json:"failed"`
}

// ExtendResult is the per-handle outcome of an extend.
type ExtendResult struct {
	Extended int             `json:"extended"`
	Failed   []HandleFailure `json:"failed"`
}

// DeadLetterResult is the per-handle outcome of a dead-letter request.
type DeadLetterResult struct {
	DeadLettered int             `json:"deadLettered"`
	Failed       []HandleFailure `json:"failed"`
}

// SeekRequest is the body of POST …/seek. To is "earliest", "latest" or an
// RFC 3339 time (see SeekTime).
type SeekRequest struct {
	To         string `json:"to"`
	DryRun     bool   `json:"dryRun,omitempty"`
	ConsumerID string `json:"consumerId,omitempty"`
}

// SeekTime formats t as a seek position or startFrom value.
func SeekTime(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z07:00") }

// SeekQueue is how many messages of one queue a seek delivers again (or
// skips).
type SeekQueue struct {
	QueueID int   `json:"queueId"`
	Count   int64 `json:"count"`
}

// SeekResult is the reply of a seek.
type SeekResult struct {
	DryRun bool        `json:"dryRun"`
	Queues []SeekQueue `json:"queues"`
	Total  int64       `json:"total"`
}

// ------------------------------------------------------------------- dlq

// DeadMessage is a message in a subscription's DLQ.
type DeadMessage struct {
	MessageID       string            `json:"messageId"`
	Topic           string            `json:"topic"`
	QueueID         int               `json:"queueId"`
	Offset          int64             `json:"offset"`
	Body            string            `json:"body"`
	BodyEncoding    string            `json:"bodyEncoding"`
	Tag             string            `json:"tag,omitempty"`
	Keys            []string          `json:"keys,omitempty"`
	Properties      map[string]string `json:"properties,omitempty"`
	ShardingKey     string            `json:"shardingKey,omitempty"`
	BornAt          time.Time         `json:"bornAt,omitzero"`
	StoredAt        time.Time         `json:"storedAt"`
	ProducerGroup   string            `json:"producerGroup,omitempty"`
	Traceparent     string            `json:"traceparent,omitempty"`
	Reason          *string           `json:"reason,omitempty"`
	DeliveryAttempt int               `json:"deliveryAttempt"`
	DeadAt          time.Time         `json:"deadAt"`
}

// Bytes returns the body as sent, decoding base64.
func (m *DeadMessage) Bytes() ([]byte, error) { return decodeBody(m.Body, m.BodyEncoding) }

// DeadMessagePage is one page of a DLQ listing; Next is nil on the last.
type DeadMessagePage struct {
	Messages []DeadMessage `json:"messages"`
	Next     *string       `json:"next"`
}

// RedriveRequest chooses dead messages to re-drive: by MessageIDs, or by
// Tag and From/To on deadAt; the zero value means all.
type RedriveRequest struct {
	MessageIDs []string   `json:"messageIds,omitempty"`
	Tag        string     `json:"tag,omitempty"`
	From       *time.Time `json:"from,omitempty"`
	To         *time.Time `json:"to,omitempty"`
	DryRun     bool       `json:"dryRun,omitempty"`
}

// RedriveResult is how many messages were (or, with DryRun, would be)
// re-driven.
type RedriveResult struct {
	Redriven int64 `json:"redriven"`
	DryRun   bool  `json:"dryRun"`
}

// ----------------------------------------------------------------- query

// StoredMessage is a message as stored. Offset is nil while a delayed
// message is not yet due.
type StoredMessage struct {
	MessageID     string            `json:"messageId"`
	Topic         string            `json:"topic"`
	QueueID       int               `json:"queueId"`
	Offset        *int64            `json:"offset"`
	Body          string            `json:"body"`
	BodyEncoding  string            `json:"bodyEncoding"`
	Tag           string            `json:"tag,omitempty"`
	Keys          []string          `json:"keys,omitempty"`
	Properties    map[string]string `json:"properties,omitempty"`
	ShardingKey   string            `json:"shardingKey,omitempty"`
	BornAt        time.Time         `json:"bornAt,omitzero"`
	StoredAt      time.Time         `json:"storedAt"`
	DeliverAt     *time.Time        `json:"deliverAt,omitempty"`
	ProducerGroup string            `json:"producerGroup,omitempty"`
	Traceparent   string            `json:"traceparent,omitempty"`
	// State is StateHalf for a half message of an open transaction (its
	// Offset is nil; ListTransactions has the transaction with its message
	// ids).
	State string `json:"state,omitempty"`
}

// Bytes returns the body as sent, decoding base64.
func (m *StoredMessage) Bytes() ([]byte, error) { return decodeBody(m.Body, m.BodyEncoding) }

// Delivery outcomes (DeliveryRecord.Outcome).
const (
	OutcomeAck          = "ack"
	OutcomeNack         = "nack"
	OutcomeLeaseExpired = "lease_expired"
	OutcomeDeadLetter   = "deadletter"
	OutcomePending      = "pending"
)

// DeliveryRecord is one delivery of a message to a group.
type DeliveryRecord struct {
	Attempt     int        `json:"attempt"`
	ConsumerID  string     `json:"consumerId,omitempty"`
	DeliveredAt time.Time  `json:"deliveredAt,omitzero"`
	Outcome     string     `json:"outcome"`
	Reason      *string    `json:"reason,omitempty"`
	SettledAt   *time.Time `json:"settledAt,omitempty"`
}

// Message states per group (GroupState.State).
const (
	StatePending  = "pending"
	StateInflight = "inflight"
	StateAcked    = "acked"
	StateRetrying = "retrying"
	StateDead     = "dead"
	StateFiltered = "filtered"
	// StateHalf: the message belongs to an open transaction and is
	// delivered to nobody yet.
	StateHalf = "half"
)

// GroupState is where a message is for one group, with its deliveries.
type GroupState struct {
	Group           string           `json:"group"`
	State           string           `json:"state"`
	DeliveryAttempt int              `json:"deliveryAttempt,omitempty"`
	LastReason      *string          `json:"lastReason,omitempty"`
	History         []DeliveryRecord `json:"history,omitempty"`
}

// MessageStatus is the reply of GET …/messages/{messageId}.
type MessageStatus struct {
	Message       StoredMessage `json:"message"`
	Subscriptions []GroupState  `json:"subscriptions"`
}

// MessagePage is one page of a message query; Next is nil on the last.
type MessagePage struct {
	Messages []StoredMessage `json:"messages"`
	Next     *string         `json:"next"`
}

func decodeBody(body, encoding string) ([]byte, error) {
	if encoding == EncodingBase64 {
		b, err := base64.StdEncoding.DecodeString(body)
		if err != nil {
			return nil, fmt.Errorf("tidemq: message body: %w", err)
		}
		return b, nil
	}
	return []byte(body), nil
}

// --------------------------------------------------------------- mirrors

// Mirror states (Mirror.State, MirrorConfig.State).
const (
	MirrorRunning = "running"
	MirrorPaused  = "paused"
	MirrorFailing = "failing"
)

// MirrorSource is the broker and topic a mirror copies from. Token is sent,
// never shown back.
type MirrorSource struct {
	URL   string `json:"url"`
	Topic string `json:"topic"`
	Token string `json:"token,omitempty"`
}

// MirrorAlerts holds a mirror's alert threshold on its lag.
type MirrorAlerts struct {
	MaxLag     *int64  `json:"maxLag,omitempty"`
	WebhookURL *string `json:"webhookUrl,omitempty"`
}

// MirrorConfig is the body of PUT /v1/mirrors/{name}: copy Source's topic
// into the local Topic. Filter defaults to "*", StartFrom to "earliest",
// State to "running".
type MirrorConfig struct {
	Source    MirrorSource  `json:"source"`
	Topic     string        `json:"topic"`
	Filter    string        `json:"filter,omitempty"`
	StartFrom string        `json:"startFrom,omitempty"`
	State     string        `json:"state,omitempty"`
	Alerts    *MirrorAlerts `json:"alerts,omitempty"`
}

// Mirror is a mirror's configuration and state. Lag is the source
// subscription's lag; Copied counts the messages stored here.
type Mirror struct {
	Name         string        `json:"name"`
	Source       MirrorSource  `json:"source"`
	Topic        string        `json:"topic"`
	Filter       string        `json:"filter"`
	StartFrom    string        `json:"startFrom"`
	Alerts       *MirrorAlerts `json:"alerts,omitempty"`
	CreatedAt    time.Time     `json:"createdAt"`
	State        string        `json:"state"`
	Lag          int64         `json:"lag"`
	Copied       int64         `json:"copied"`
	LastCopiedAt *time.Time    `json:"lastCopiedAt"`
	LastError    *string       `json:"lastError"`
}

// MirrorList is the reply of GET /v1/mirrors.
type MirrorList struct {
	Mirrors []Mirror `json:"mirrors"`
}

// Health is the reply of GET /healthz.
type Health struct {
	Status string `json:"status"`
	Region string `json:"region,omitempty"`
}
