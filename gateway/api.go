package gateway

import (
	"encoding/base64"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/tidemq/tidemq/core"
	"github.com/tidemq/tidemq/internal/wire"
)

// Wire types: the JSON of openapi.yaml, kept apart from core's types.

// Time formats as RFC 3339 with milliseconds in UTC, as SPEC requires.
type Time time.Time

func (t Time) MarshalJSON() ([]byte, error) {
	b := make([]byte, 0, 26)
	b = append(b, '"')
	b = wire.AppendTime(b, time.Time(t))
	return append(b, '"'), nil
}

func msTime(ms int64) Time { return Time(time.UnixMilli(ms)) }

type topicRequest struct {
	Queues               int     `json:"queues"`
	RetentionHours       int     `json:"retentionHours"`
	TransactionCheckURL  *string `json:"transactionCheckUrl"`
	TransactionMaxChecks int     `json:"transactionMaxChecks"`
	TransactionAlertURL  *string `json:"transactionAlertUrl"`
}

type queueStat struct {
	QueueID   int    `json:"queueId"`
	MinOffset uint64 `json:"minOffset"`
	MaxOffset uint64 `json:"maxOffset"`
}

type topicJSON struct {
	Topic          string      `json:"topic"`
	Queues         int         `json:"queues"`
	RetentionHours int         `json:"retentionHours"`
	CreatedAt      Time        `json:"createdAt"`
	Messages       int64       `json:"messages"`
	Bytes          int64       `json:"bytes"`
	QueueStats     []queueStat `json:"queueStats"`
	Subscriptions  []string    `json:"subscriptions"`
	HalfMessages   int64       `json:"halfMessages"`
	// Transaction settings (SPEC §9).
	TransactionCheckURL  string `json:"transactionCheckUrl,omitempty"`
	TransactionMaxChecks int    `json:"transactionMaxChecks"`
	TransactionAlertURL  string `json:"transactionAlertUrl,omitempty"`
}

func topicOut(t core.TopicInfo) topicJSON {
	out := topicJSON{
		Topic: t.Name, Queues: t.Queues, RetentionHours: t.RetentionHours,
		CreatedAt: Time(t.CreatedAt), Messages: t.Messages, Bytes: t.Bytes,
		QueueStats: make([]queueStat, len(t.QueueStats)), Subscriptions: t.Subscriptions,
		HalfMessages: t.HalfMessages, TransactionCheckURL: t.TransactionCheckURL,
		TransactionMaxChecks: t.TransactionMaxChecks, TransactionAlertURL: t.TransactionAlertURL,
	}
	for i, q := range t.QueueStats {
		out.QueueStats[i] = queueStat(q)
	}
	return out
}

// sendRequest is one SendMessage, as decodeSend and decodeBatch read it.
type sendRequest struct {
	Body         []byte // unescaped, still base64 when BodyEncoding says so
	HasBody      bool
	BodyEncoding string
	Tag          string
	Keys         []string
	Properties   map[string]string
	ShardingKey  string
	DelaySeconds *int64
	DeliverAt    *time.Time
	DedupKey     string
	// CheckAfterSeconds > 0: the send's "transaction" (a half message).
	CheckAfterSeconds int64
}

// appendSendResult writes one SendResult. By hand: a batch reply holds up
// to 1,000 of them, and encoding/json's reflection was a tenth of a batch
// send's CPU. Message ids are NUIDs (base62), which need no escaping.
// txID is a half message's transaction, "" for any other.
func appendSendResult(dst []byte, r core.SendResult, txID string) []byte {
	dst = append(dst, `{"messageId":"`...)
	dst = append(dst, r.MessageID...)
	dst = append(dst, `","queueId":`...)
	dst = strconv.AppendInt(dst, int64(r.QueueID), 10)
	dst = append(dst, `,"offset":`...)
	if r.Delayed {
		dst = append(dst, "null"...)
	} else {
		dst = strconv.AppendUint(dst, r.Offset, 10)
	}
	dst = append(dst, `,"storedAt":"`...)
	dst = wire.AppendTime(dst, r.StoredAt)
	dst = append(dst, `","duplicate":`...)
	dst = strconv.AppendBool(dst, r.Duplicate)
	if txID != "" {
		// A NUID and digits: no escaping either.
		dst = append(dst, `,"transactionId":"`...)
		dst = append(dst, txID...)
		dst = append(dst, '"')
	}
	return append(dst, '}')
}

func sendResultJSON(r core.SendResult, txID string) []byte {
	return appendSendResult(make([]byte, 0, 128), r, txID)
}

func batchResultJSON(results []core.SendResult, txID string) []byte {
	out := make([]byte, 0, 16+len(results)*110)
	out = append(out, `{"results":[`...)
	for i, r := range results {
		if i > 0 {
			out = append(out, ',')
		}
		out = appendSendResult(out, r, txID)
	}
	out = append(out, ']')
	if txID != "" {
		out = append(out, `,"transactionId":"`...)
		out = append(out, txID...)
		out = append(out, '"')
	}
	return append(out, '}')
}

// messageJSON is a stored message as clients see it; pulled messages add
// deliveryAttempt and receiptHandle.
type messageJSON struct {
	MessageID       string            `json:"messageId"`
	Topic           string            `json:"topic"`
	QueueID         uint32            `json:"queueId"`
	Offset          *uint64           `json:"offset"` // null while a delayed message is not yet due
	Body            string            `json:"body"`
	BodyEncoding    string            `json:"bodyEncoding"`
	Tag             string            `json:"tag,omitempty"`
	Keys            []string          `json:"keys,omitempty"`
	Properties      map[string]string `json:"properties,omitempty"`
	ShardingKey     string            `json:"shardingKey,omitempty"`
	BornAt          Time              `json:"bornAt"`
	StoredAt        Time              `json:"storedAt"`
	DeliverAt       *Time             `json:"deliverAt,omitempty"`
	ProducerGroup   string            `json:"producerGroup,omitempty"`
	DeliveryAttempt int               `json:"deliveryAttempt,omitempty"`
	ReceiptHandle   string            `json:"receiptHandle,omitempty"`
	Traceparent     string            `json:"traceparent,omitempty"`
	// State is "half" for a half message found by query.
	State string `json:"state,omitempty"`
}

// messageOut renders a body as sent: base64 when it was sent so or is not
// valid UTF-8, else as text.
func messageOut(topic string, m *core.Message) messageJSON {
	out := messageJSON{
		MessageID: m.ID, Topic: topic, QueueID: m.QueueID, Offset: &m.Offset,
		Tag: m.Tag, Keys: m.Keys, Properties: m.Properties, ShardingKey: m.ShardingKey,
		BornAt: msTime(m.BornAtMs), StoredAt: msTime(m.StoredAtMs),
		ProducerGroup: m.ProducerGroup, Traceparent: m.Traceparent,
	}
	if m.DeliverAtMs > 0 {
		// Only a delayed message not yet due has one (core.Broker.GetMessage).
		at := msTime(m.DeliverAtMs)
		out.Offset, out.DeliverAt = nil, &at
	}
	if m.Half {
		out.Offset, out.State = nil, core.StateHalf
	}
	if m.BodyBase64 || !utf8.Valid(m.Body) {
		out.Body, out.BodyEncoding = base64.StdEncoding.EncodeToString(m.Body), "base64"
	} else {
		out.Body, out.BodyEncoding = string(m.Body), "utf8"
	}
	return out
}

type subscriptionRequest struct {
	Mode        string      `json:"mode"`
	Orderly     bool        `json:"orderly"`
	Filter      string      `json:"filter"`
	MaxRetries  *int        `json:"maxRetries"`
	StartFrom   string      `json:"startFrom"`
	RetryDelays []string    `json:"retryDelays"`
	Alerts      *alertsJSON `json:"alerts"`
	Push        *pushJSON   `json:"push"`
}

type pushJSON struct {
	Endpoint       string            `json:"endpoint"`
	MaxInFlight    int               `json:"maxInFlight,omitempty"`
	TimeoutSeconds int               `json:"timeoutSeconds,omitempty"`
	Headers        map[string]string `json:"headers,omitempty"`
	Secret         string            `json:"secret,omitempty"`
	Signed         bool              `json:"signed,omitempty"`
	State          string            `json:"state,omitempty"`
}

type alertsJSON struct {
	MaxLag     *int64  `json:"maxLag"`
	MaxDlq     *int64  `json:"maxDlq"`
	WebhookURL *string `json:"webhookUrl"`
}

type subQueueJSON struct {
	QueueID     int    `json:"queueId"`
	MaxOffset   uint64 `json:"maxOffset"`
	AckedOffset uint64 `json:"ackedOffset"`
	Inflight    int64  `json:"inflight"`
	Lag         int64  `json:"lag"`
}

type consumerJSON struct {
	ConsumerID string `json:"consumerId"`
	LastSeen   Time   `json:"lastSeen"`
	Queues     []int  `json:"queues"`
}

type subscriptionJSON struct {
	Topic       string         `json:"topic"`
	Group       string         `json:"group"`
	Mode        string         `json:"mode"`
	Orderly     bool           `json:"orderly"`
	Filter      string         `json:"filter"`
	MaxRetries  int            `json:"maxRetries"`
	StartFrom   string         `json:"startFrom"`
	RetryDelays []string       `json:"retryDelays"`
	CreatedAt   Time           `json:"createdAt"`
	Queues      []subQueueJSON `json:"queues"`
	Lag         int64          `json:"lag"`
	Inflight    int64          `json:"inflight"`
	Retrying    int64          `json:"retrying"`
	DLQ         int64          `json:"dlq"`
	Consumers   []consumerJSON `json:"consumers"`
	Alerts      *alertsJSON    `json:"alerts,omitempty"`
	Push        *pushJSON      `json:"push,omitempty"`
}

func subscriptionOut(s core.SubscriptionInfo) subscriptionJSON {
	out := subscriptionJSON{
		Topic: s.Topic, Group: s.Group, Mode: s.Config.Mode, Orderly: s.Config.Orderly,
		Filter: s.Config.Filter, MaxRetries: s.Config.MaxRetries, StartFrom: s.Config.StartFrom,
		CreatedAt: Time(s.CreatedAt), Lag: s.Lag, Inflight: s.Inflight, Retrying: s.Retrying, DLQ: s.DLQ,
		Queues: make([]subQueueJSON, len(s.Queues)), Consumers: make([]consumerJSON, len(s.Consumers)),
	}
	if p := s.Config.Push; p != nil {
		out.Push = &pushJSON{Endpoint: p.Endpoint, MaxInFlight: p.MaxInFlight, TimeoutSeconds: p.TimeoutSeconds,
			Headers: p.Headers, Signed: p.Secret != "", State: s.PushState}
	}
	if a := s.Config.Alerts; a != nil {
		out.Alerts = &alertsJSON{MaxLag: a.MaxLag, MaxDlq: a.MaxDLQ}
		if a.WebhookURL != "" {
			out.Alerts.WebhookURL = &a.WebhookURL
		}
	}
	for _, d := range s.Config.RetryDelays {
		out.RetryDelays = append(out.RetryDelays, formatDelay(d))
	}
	for i, q := range s.Queues {
		out.Queues[i] = subQueueJSON(q)
	}
	for i, c := range s.Consumers {
		out.Consumers[i] = consumerJSON{ConsumerID: c.ConsumerID, LastSeen: Time(c.LastSeen), Queues: c.Queues}
	}
	return out
}

// formatDelay writes a duration in the largest whole unit, as the
// retryDelays pattern ^[0-9]+(ms|s|m|h)$ reads it.
func formatDelay(d time.Duration) string {
	switch {
	case d%time.Hour == 0 && d > 0:
		return itoa(int64(d/time.Hour)) + "h"
	case d%time.Minute == 0 && d > 0:
		return itoa(int64(d/time.Minute)) + "m"
	case d%time.Second == 0:
		return itoa(int64(d/time.Second)) + "s"
	}
	return itoa(int64(d/time.Millisecond)) + "ms"
}

type pullRequest struct {
	MaxMessages      int    `json:"maxMessages"`
	WaitSeconds      int    `json:"waitSeconds"`
	InvisibleSeconds int    `json:"invisibleSeconds"`
	ConsumerID       string `json:"consumerId"`
}

type handlesRequest struct {
	ReceiptHandles   []string `json:"receiptHandles"`
	DelaySeconds     *int64   `json:"delaySeconds"`
	Reason           string   `json:"reason"`
	InvisibleSeconds int      `json:"invisibleSeconds"`
}

type failedHandle struct {
	ReceiptHandle string `json:"receiptHandle"`
	Code          string `json:"code"`
}

// pullReplyJSON appends the reply to a pull to dst, growing it once, to
// the size the reply can take.
func pullReplyJSON(dst []byte, got []core.Delivered) []byte {
	size := 17 // with the newline writeBody adds
	for _, d := range got {
		size += 400 + len(d.Message.Body)*4/3
	}
	out := append(slices.Grow(dst, size), `{"messages":[`...)
	for i, d := range got {
		if i > 0 {
			out = append(out, ',')
		}
		out = wire.AppendPulled(out, d)
	}
	return append(out, "]}"...)
}
