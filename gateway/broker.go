package gateway

import (
	"context"
	"time"

	"github.com/tidemq/tidemq/core"
)

// Broker is what the gateway serves: the operations of *core.Broker its
// handlers call, and no others. A cluster's routing broker, which forwards
// each call to the node that owns the topic, implements it too. The
// methods mean what core.Broker's do; their errors are core's, which the
// problem table maps to statuses.
type Broker interface {
	// Ready reports whether the broker accepts writes (GET /readyz).
	Ready() error

	ListTopics() []core.TopicInfo
	// PutTopic creates or updates a topic and reports whether it created it.
	PutTopic(ctx context.Context, name string, cfg core.TopicConfig) (core.TopicInfo, bool, error)
	GetTopic(name string) (core.TopicInfo, error)
	DeleteTopic(ctx context.Context, name string) error

	// Send stores msgs on a topic atomically, answering once they are
	// durable; it fills in each message's ID, queue, offset and store time.
	Send(ctx context.Context, topic string, msgs []*core.Message) ([]core.SendResult, error)
	// SendTransaction stores msgs as the half messages of one new
	// transaction, checked back after checkAfter (SPEC §9).
	// It returns the results and the transaction's id.
	SendTransaction(ctx context.Context, topic string, msgs []*core.Message, checkAfter time.Duration) ([]core.SendResult, string, error)
	// CommitTransaction and RollbackTransaction settle a transaction;
	// each is idempotent, and the other verb after one is
	// core.ErrTransactionSettled.
	CommitTransaction(ctx context.Context, topic, txID string) (core.TransactionInfo, error)
	RollbackTransaction(ctx context.Context, topic, txID string) (core.TransactionInfo, error)
	// ListTransactions describes a topic's open transactions.
	ListTransactions(topic string) ([]core.TransactionInfo, error)
	// Arriving counts a request that will write (a send, an ack) from the
	// moment it arrives, before its body is read, until done is called:
	// the group commit expects it.
	Arriving() (done func())

	// PutSubscription creates or updates a subscription and reports whether
	// it created it.
	PutSubscription(ctx context.Context, topic, group string, cfg core.SubscriptionConfig) (core.SubscriptionInfo, bool, error)
	GetSubscription(topic, group string) (core.SubscriptionInfo, error)
	ListSubscriptions(topic string) ([]core.SubscriptionInfo, error)
	DeleteSubscription(ctx context.Context, topic, group string) error

	// Pull leases ready messages, parking up to req.Wait for the first one.
	Pull(ctx context.Context, topic, group string, req core.PullRequest) ([]core.Delivered, error)
	// Release gives back leases a client never received, without counting
	// an attempt.
	Release(topic, group string, handles []string)
	Ack(ctx context.Context, topic, group string, handles []string) (int, []core.HandleResult, error)
	// Nack hands messages back for delivery after delay (the subscription's
	// retry delay when delay < 0).
	Nack(ctx context.Context, topic, group string, handles []string, delay time.Duration, reason string) (int, []core.HandleResult, error)
	// Extend keeps leased messages invisible for another invisible from now.
	Extend(ctx context.Context, topic, group string, handles []string, invisible time.Duration) (int, []core.HandleResult, error)
	// DeadLetter moves leased messages to the DLQ at once.
	DeadLetter(ctx context.Context, topic, group string, handles []string, reason string) (int, []core.HandleResult, error)
	// ListDead pages through a subscription's DLQ, oldest first.
	ListDead(topic, group string, limit int, after core.DLQCursor) ([]core.DeadMessage, *core.DLQCursor, error)
	// Redrive puts dead messages back for delivery (only counts them with
	// f.DryRun).
	Redrive(ctx context.Context, topic, group string, f core.RedriveFilter) (int, error)

	// Seek moves a subscription's (or one broadcast consumer's) cursors to
	// "earliest", "latest" or an RFC 3339 time.
	Seek(ctx context.Context, topic, group, to, consumerID string, dryRun bool) (core.SeekResult, error)
	// GetMessage finds a message by id and its state in every subscription.
	GetMessage(topic, id string) (*core.Message, []core.MessageState, error)
	// QueryMessages answers one page of q.
	QueryMessages(ctx context.Context, topic string, q core.Query) ([]*core.Message, *core.QueryCursor, error)
}
