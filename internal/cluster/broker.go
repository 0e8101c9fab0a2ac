package cluster

import (
	"context"
	"time"

	"github.com/tidemq/tidemq/core"
	"github.com/tidemq/tidemq/gateway"
)

// LeaderBroker is the gateway's broker on a cluster node: the broker this
// node serves while it leads, and core.ErrNoLeader for every call while it
// does not (the forwarder sends such requests to the leader first; this is
// for a request that raced with a change of leader).
type LeaderBroker struct{ c *Cluster }

var _ gateway.Broker = LeaderBroker{}

// Gateway returns the broker the node's gateway serves.
func (c *Cluster) Gateway() LeaderBroker { return LeaderBroker{c} }

func (l LeaderBroker) get() (*core.Broker, error) {
	if b := l.c.Broker(); b != nil {
		return b, nil
	}
	return nil, core.ErrNoLeader
}

// Ready reports whether the node can serve: it leads, or knows a leader to
// forward to.
func (l LeaderBroker) Ready() error {
	if b := l.c.Broker(); b != nil {
		return b.Ready()
	}
	if _, id := l.c.raft.LeaderWithID(); id == "" {
		return core.ErrNoLeader
	}
	return nil
}

func (l LeaderBroker) ListTopics() []core.TopicInfo {
	if b := l.c.Broker(); b != nil {
		return b.ListTopics()
	}
	return nil
}

func (l LeaderBroker) PutTopic(ctx context.Context, name string, cfg core.TopicConfig) (core.TopicInfo, bool, error) {
	b, err := l.get()
	if err != nil {
		return core.TopicInfo{}, false, err
	}
	return b.PutTopic(ctx, name, cfg)
}

func (l LeaderBroker) GetTopic(name string) (core.TopicInfo, error) {
	b, err := l.get()
	if err != nil {
		return core.TopicInfo{}, err
	}
	return b.GetTopic(name)
}

func (l LeaderBroker) DeleteTopic(ctx context.Context, name string) error {
	b, err := l.get()
	if err != nil {
		return err
	}
	return b.DeleteTopic(ctx, name)
}

func (l LeaderBroker) Send(ctx context.Context, topic string, msgs []*core.Message) ([]core.SendResult, error) {
	b, err := l.get()
	if err != nil {
		return nil, err
	}
	return b.Send(ctx, topic, msgs)
}

func (l LeaderBroker) Arriving() (done func()) {
	if b := l.c.Broker(); b != nil {
		return b.Arriving()
	}
	return func() {}
}

func (l LeaderBroker) PutSubscription(ctx context.Context, topic, group string, cfg core.SubscriptionConfig) (core.SubscriptionInfo, bool, error) {
	b, err := l.get()
	if err != nil {
		return core.SubscriptionInfo{}, false, err
	}
	return b.PutSubscription(ctx, topic, group, cfg)
}

func (l LeaderBroker) GetSubscription(topic, group string) (core.SubscriptionInfo, error) {
	b, err := l.get()
	if err != nil {
		return core.SubscriptionInfo{}, err
	}
	return b.GetSubscription(topic, group)
}

func (l LeaderBroker) ListSubscriptions(topic string) ([]core.SubscriptionInfo, error) {
	b, err := l.get()
	if err != nil {
		return nil, err
	}
	return b.ListSubscriptions(topic)
}

func (l LeaderBroker) DeleteSubscription(ctx context.Context, topic, group string) error {
	b, err := l.get()
	if err != nil {
		return err
	}
	return b.DeleteSubscription(ctx, topic, group)
}

func (l LeaderBroker) Pull(ctx context.Context, topic, group string, req core.PullRequest) ([]core.Delivered, error) {
	b, err := l.get()
	if err != nil {
		return nil, err
	}
	return b.Pull(ctx, topic, group, req)
}

func (l LeaderBroker) Release(topic, group string, handles []string) {
	if b := l.c.Broker(); b != nil {
		b.Release(topic, group, handles)
	}
}

func (l LeaderBroker) Ack(ctx context.Context, topic, group string, handles []string) (int, []core.HandleResult, error) {
	b, err := l.get()
	if err != nil {
		return 0, nil, err
	}
	return b.Ack(ctx, topic, group, handles)
}

func (l LeaderBroker) Nack(ctx context.Context, topic, group string, handles []string, delay time.Duration, reason string) (int, []core.HandleResult, error) {
	b, err := l.get()
	if err != nil {
		return 0, nil, err
	}
	return b.Nack(ctx, topic, group, handles, delay, reason)
}

func (l LeaderBroker) Extend(ctx context.Context, topic, group string, handles []string, invisible time.Duration) (int, []core.HandleResult, error) {
	b, err := l.get()
	if err != nil {
		return 0, nil, err
	}
	return b.Extend(ctx, topic, group, handles, invisible)
}

func (l LeaderBroker) DeadLetter(ctx context.Context, topic, group string, handles []string, reason string) (int, []core.HandleResult, error) {
	b, err := l.get()
	if err != nil {
		return 0, nil, err
	}
	return b.DeadLetter(ctx, topic, group, handles, reason)
}

func (l LeaderBroker) ListDead(topic, group string, limit int, after core.DLQCursor) ([]core.DeadMessage, *core.DLQCursor, error) {
	b, err := l.get()
	if err != nil {
		return nil, nil, err
	}
	return b.ListDead(topic, group, limit, after)
}

func (l LeaderBroker) Redrive(ctx context.Context, topic, group string, f core.RedriveFilter) (int, error) {
	b, err := l.get()
	if err != nil {
		return 0, err
	}
	return b.Redrive(ctx, topic, group, f)
}

func (l LeaderBroker) Seek(ctx context.Context, topic, group, to, consumerID string, dryRun bool) (core.SeekResult, error) {
	b, err := l.get()
	if err != nil {
		return core.SeekResult{}, err
	}
	return b.Seek(ctx, topic, group, to, consumerID, dryRun)
}

func (l LeaderBroker) GetMessage(topic, id string) (*core.Message, []core.MessageState, error) {
	b, err := l.get()
	if err != nil {
		return nil, nil, err
	}
	return b.GetMessage(topic, id)
}

func (l LeaderBroker) QueryMessages(ctx context.Context, topic string, q core.Query) ([]*core.Message, *core.QueryCursor, error) {
	b, err := l.get()
	if err != nil {
		return nil, nil, err
	}
	return b.QueryMessages(ctx, topic, q)
}

func (l LeaderBroker) SendTransaction(ctx context.Context, topic string, msgs []*core.Message, checkAfter time.Duration) ([]core.SendResult, string, error) {
	b, err := l.get()
	if err != nil {
		return nil, "", err
	}
	return b.SendTransaction(ctx, topic, msgs, checkAfter)
}

func (l LeaderBroker) CommitTransaction(ctx context.Context, topic, txID string) (core.TransactionInfo, error) {
	b, err := l.get()
	if err != nil {
		return core.TransactionInfo{}, err
	}
	return b.CommitTransaction(ctx, topic, txID)
}

func (l LeaderBroker) RollbackTransaction(ctx context.Context, topic, txID string) (core.TransactionInfo, error) {
	b, err := l.get()
	if err != nil {
		return core.TransactionInfo{}, err
	}
	return b.RollbackTransaction(ctx, topic, txID)
}

func (l LeaderBroker) ListTransactions(topic string) ([]core.TransactionInfo, error) {
	b, err := l.get()
	if err != nil {
		return nil, err
	}
	return b.ListTransactions(topic)
}
