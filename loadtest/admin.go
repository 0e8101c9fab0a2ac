package loadtest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"time"
)

// Admin does the few set-up and inspection requests a suite needs around
// its runs (topics, subscriptions, a subscription's lag), with the same
// client code and error codes as Run.
type Admin struct {
	URL   string // the broker's base URL
	Token string // bearer token, when not empty (needs admin)
	// Client does the requests; nil is http.DefaultClient.
	Client *http.Client
}

func (a Admin) do(ctx context.Context, method, path string, body any, out any) error {
	var raw []byte
	if body != nil {
		var err error
		if raw, err = json.Marshal(body); err != nil {
			return err
		}
	}
	c := a.Client
	if c == nil {
		c = http.DefaultClient
	}
	return doJSON(ctx, c, a.URL, a.Token, method, path, raw, out)
}

// PutTopic creates topic (or updates it) with queues (0: the broker's
// default) and retentionHours (0: the broker's default).
func (a Admin) PutTopic(ctx context.Context, topic string, queues, retentionHours int) error {
	cfg := map[string]int{}
	if queues > 0 {
		cfg["queues"] = queues
	}
	if retentionHours > 0 {
		cfg["retentionHours"] = retentionHours
	}
	if err := a.do(ctx, "PUT", "/v1/topics/"+url.PathEscape(topic), cfg, nil); err != nil {
		return fmt.Errorf("loadtest: creating topic %s: %w", topic, err)
	}
	return nil
}

// DeleteTopic deletes topic with its messages and subscriptions.
func (a Admin) DeleteTopic(ctx context.Context, topic string) error {
	if err := a.do(ctx, "DELETE", "/v1/topics/"+url.PathEscape(topic), nil, nil); err != nil {
		return fmt.Errorf("loadtest: deleting topic %s: %w", topic, err)
	}
	return nil
}

// PutSubscription creates the clustering subscription group on topic,
// starting from startFrom ("earliest" or "latest").
func (a Admin) PutSubscription(ctx context.Context, topic, group, startFrom string) error {
	path := "/v1/topics/" + url.PathEscape(topic) + "/subscriptions/" + url.PathEscape(group)
	if err := a.do(ctx, "PUT", path, map[string]string{"startFrom": startFrom}, nil); err != nil {
		return fmt.Errorf("loadtest: creating subscription %s/%s: %w", topic, group, err)
	}
	return nil
}

// SubscriptionStats is the part of a subscription's GET the suites read.
type SubscriptionStats struct {
	// Lag is messages stored but not yet acked.
	Lag      int64 `json:"lag"`
	Inflight int64 `json:"inflight"`
}

// Subscription reads the stats of subscription group on topic.
func (a Admin) Subscription(ctx context.Context, topic, group string) (SubscriptionStats, error) {
	var st SubscriptionStats
	path := "/v1/topics/" + url.PathEscape(topic) + "/subscriptions/" + url.PathEscape(group)
	if err := a.do(ctx, "GET", path, nil, &st); err != nil {
		return st, fmt.Errorf("loadtest: reading subscription %s/%s: %w", topic, group, err)
	}
	return st, nil
}

// TopicStats is the part of a topic's GET the suites read.
type TopicStats struct {
	Queues   int   `json:"queues"`
	Messages int64 `json:"messages"`
	Bytes    int64 `json:"bytes"`
}

// Topic reads the stats of topic.
func (a Admin) Topic(ctx context.Context, topic string) (TopicStats, error) {
	var st TopicStats
	if err := a.do(ctx, "GET", "/v1/topics/"+url.PathEscape(topic), nil, &st); err != nil {
		return st, fmt.Errorf("loadtest: reading topic %s: %w", topic, err)
	}
	return st, nil
}

// MirrorSource is where a mirror copies from (SPEC §8): the source
// broker's base URL, its topic, and a token there (may be empty).
type MirrorSource struct {
	URL   string `json:"url"`
	Topic string `json:"topic"`
	Token string `json:"token,omitempty"`
}

// PutMirror creates (or updates) mirror name on this broker, copying every
// message of src's topic from startFrom ("earliest" or "latest") into the
// local topic.
func (a Admin) PutMirror(ctx context.Context, name string, src MirrorSource, topic, startFrom string) error {
	body := map[string]any{"source": src, "topic": topic, "filter": "*", "startFrom": startFrom}
	if err := a.do(ctx, "PUT", "/v1/mirrors/"+url.PathEscape(name), body, nil); err != nil {
		return fmt.Errorf("loadtest: creating mirror %s: %w", name, err)
	}
	return nil
}

// DeleteMirror deletes mirror name.
func (a Admin) DeleteMirror(ctx context.Context, name string) error {
	if err := a.do(ctx, "DELETE", "/v1/mirrors/"+url.PathEscape(name), nil, nil); err != nil {
		return fmt.Errorf("loadtest: deleting mirror %s: %w", name, err)
	}
	return nil
}

// MirrorStats is GET /v1/mirrors/{name}.
type MirrorStats struct {
	State        string `json:"state"`
	Lag          int64  `json:"lag"`
	Copied       int64  `json:"copied"`
	LastCopiedAt string `json:"lastCopiedAt,omitempty"`
	LastError    string `json:"lastError,omitempty"`
}

// Mirror reads the status of mirror name.
func (a Admin) Mirror(ctx context.Context, name string) (MirrorStats, error) {
	var st MirrorStats
	if err := a.do(ctx, "GET", "/v1/mirrors/"+url.PathEscape(name), nil, &st); err != nil {
		return st, fmt.Errorf("loadtest: reading mirror %s: %w", name, err)
	}
	return st, nil
}

// StoredMessage is what [Admin.StoredMessages] reads of a message: its id,
// when it was stored, and, for a mirror's copy, the source message's id.
type StoredMessage struct {
	ID       string    `json:"messageId"`
	StoredAt time.Time `json:"storedAt"`
	SourceID string    `json:"-"`
}

// StoredMessages reads every message of topic through the query API
// (GET …/messages?queueId=&offset=), queue by queue in offset order, and
// calls f with each page. It reads bodies too (the API has no other
// way), so it costs a pull of the whole topic.
func (a Admin) StoredMessages(ctx context.Context, topic string, f func([]StoredMessage)) error {
	var ti struct {
		QueueStats []struct {
			QueueID   int    `json:"queueId"`
			MinOffset uint64 `json:"minOffset"`
			MaxOffset uint64 `json:"maxOffset"`
		} `json:"queueStats"`
	}
	base := "/v1/topics/" + url.PathEscape(topic)
	if err := a.do(ctx, "GET", base, nil, &ti); err != nil {
		return fmt.Errorf("loadtest: reading topic %s: %w", topic, err)
	}
	for _, q := range ti.QueueStats {
		for off := q.MinOffset; off < q.MaxOffset; {
			var page struct {
				Messages []struct {
					ID         string            `json:"messageId"`
					Offset     *uint64           `json:"offset"`
					StoredAt   time.Time         `json:"storedAt"`
					Properties map[string]string `json:"properties"`
				} `json:"messages"`
			}
			path := fmt.Sprintf("%s/messages?queueId=%d&offset=%d&limit=1000", base, q.QueueID, off)
			if err := a.do(ctx, "GET", path, nil, &page); err != nil {
				return fmt.Errorf("loadtest: reading %s queue %d from %d: %w", topic, q.QueueID, off, err)
			}
			if len(page.Messages) == 0 {
				return fmt.Errorf("loadtest: %s queue %d: nothing from offset %d, below its maxOffset %d", topic, q.QueueID, off, q.MaxOffset)
			}
			ms := make([]StoredMessage, 0, len(page.Messages))
			for _, m := range page.Messages {
				if m.Offset == nil || *m.Offset < off {
					return fmt.Errorf("loadtest: %s queue %d from offset %d: %s at offset %v", topic, q.QueueID, off, m.ID, m.Offset)
				}
				off = *m.Offset + 1
				ms = append(ms, StoredMessage{ID: m.ID, StoredAt: m.StoredAt, SourceID: m.Properties["mirror.sourceMessageId"]})
			}
			f(ms)
		}
	}
	return nil
}
