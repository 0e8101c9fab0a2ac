package core

import (
	"context"
	"errors"
	"fmt"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/nats-io/nuid"
)

// Limits of SPEC §2.
const (
	MaxTagLen       = 64
	MaxKeys         = 32
	MaxKeyLen       = 128
	MaxShardingLen  = 128
	MaxDelaySeconds = 7 * 24 * 3600
)

// SendResult is what a producer is told about one stored message.
type SendResult struct {
	MessageID string
	QueueID   int
	Offset    uint64
	StoredAt  time.Time
	// Delayed messages have no offset yet.
	Delayed bool
	// Duplicate: a send with the same dedup key was stored before; this is
	// that first send's result and nothing new was stored.
	Duplicate bool
}

// ValidateMessage checks one message against SPEC §2's limits. Field
// pointers are relative to the message ("/tag").
func ValidateMessage(m *Message, maxBytes int) error {
	if len(m.Body) > maxBytes {
		return fmt.Errorf("%w: body is %d bytes, the limit is %d", ErrMessageTooLarge, len(m.Body), maxBytes)
	}
	if m.Tag != "" && !ValidTag(m.Tag) {
		return invalid("/tag", "must be 1-64 characters without '|' or white space")
	}
	if len(m.Keys) > MaxKeys {
		return invalid("/keys", "at most %d keys", MaxKeys)
	}
	// Every string is valid UTF-8: it is served back in JSON, and a key
	// that JSON turned into U+FFFD could never be queried again.
	for i, k := range m.Keys {
		if n := utf8.RuneCountInString(k); n == 0 || n > MaxKeyLen || !utf8.ValidString(k) {
			return invalid(fmt.Sprintf("/keys/%d", i), "must be 1-%d characters of valid UTF-8", MaxKeyLen)
		}
	}
	if !utf8.ValidString(m.ShardingKey) {
		return invalid("/shardingKey", "must be valid UTF-8")
	}
	if !utf8.ValidString(m.DedupKey) {
		return invalid("/dedupKey", "must be valid UTF-8")
	}
	for k, v := range m.Properties {
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			return invalid("/properties", "names and values must be valid UTF-8")
		}
	}
	if utf8.RuneCountInString(m.DedupKey) > MaxDedupKeyLen {
		return invalid("/dedupKey", "at most %d characters", MaxDedupKeyLen)
	}
	if utf8.RuneCountInString(m.ShardingKey) > MaxShardingLen {
		return invalid("/shardingKey", "at most %d characters", MaxShardingLen)
	}
	return nil
}

// Send stores messages on a topic atomically and answers once they are
// durable. Each message's ID, queue, offset and store time are filled in.
// A *ValidationError names the bad message in Entry (its index in msgs);
// its Field is relative to that message.
func (b *Broker) Send(ctx context.Context, topicName string, msgs []*Message) ([]SendResult, error) {
	if err := ValidateName("topic", topicName); err != nil {
		return nil, err
	}
	if len(msgs) == 0 || len(msgs) > MaxBatchMessages {
		return nil, invalid("/messages", "must hold 1-%d messages", MaxBatchMessages)
	}
	for i, m := range msgs {
		if err := ValidateMessage(m, b.opts.MaxMessageBytes); err != nil {
			if ve, ok := errors.AsType[*ValidationError](err); ok {
				return nil, &ValidationError{Field: ve.Field, Reason: ve.Reason, Entry: i}
			}
			return nil, &EntryError{Entry: i, Err: err}
		}
	}
	t, err := b.topicForSend(ctx, topicName)
	if err != nil {
		return nil, err
	}
	b.place(t, msgs)
	spans := b.tel.beginSends(ctx, msgs, b.now())
	req := &request{kind: reqAppend, topic: t, msgs: msgs}
	err = b.submit(ctx, req)
	spans.end(topicName, msgs, req.results, err)
	if err != nil {
		return nil, err
	}
	var bytes int64
	for _, m := range msgs {
		bytes += int64(len(m.Body))
	}
	b.tel.msgsIn.Add(ctx, int64(len(msgs)), t.metricAttrs...)
	b.tel.bytesIn.Add(ctx, bytes, t.metricAttrs...)
	return req.results, nil
}

// place names each message and gives it its topic and queue: the sharding
// key's queue, else the next one round-robin. It returns the topic's id.
func (b *Broker) place(t *topic, msgs []*Message) uint32 {
	b.mu.RLock()
	nq := uint32(len(t.queues))
	topicID := t.rec.ID
	b.mu.RUnlock()
	for _, m := range msgs {
		m.ID = nuid.Next()
		m.TopicID = topicID
		if m.ShardingKey != "" {
			m.QueueID = ShardingHash(m.ShardingKey) % nq
		} else {
			m.QueueID = t.rr.Add(1) % nq
		}
	}
	return topicID
}

// ValidTag is the one rule for tags, on messages and in filters: 1-64
// characters of valid UTF-8, no '|' and no white space (Unicode's).
func ValidTag(tag string) bool {
	if tag == "" || !utf8.ValidString(tag) || utf8.RuneCountInString(tag) > MaxTagLen {
		return false
	}
	for _, r := range tag {
		if r == '|' || unicode.IsSpace(r) {
			return false
		}
	}
	return true
}
