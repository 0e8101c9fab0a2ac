package loadtest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
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
