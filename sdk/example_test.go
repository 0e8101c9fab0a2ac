package sdk_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/tidemq/tidemq/core"
	"github.com/tidemq/tidemq/gateway"
	"github.com/tidemq/tidemq/pebblestore"
	"github.com/tidemq/tidemq/sdk"
	"github.com/tidemq/tidemq/webhook"
)

// The examples run against a real server started in-process (see
// exampleServer); against your own, use its URL, "http://127.0.0.1:8080"
// by default.

func Example() {
	ctx := context.Background()
	client, err := sdk.NewClient(exampleServer(), sdk.ClientOptions{})
	if err != nil {
		log.Fatal(err)
	}
	if _, _, err := client.PutTopic(ctx, "orders", sdk.TopicConfig{Queues: 4}); err != nil {
		log.Fatal(err)
	}
	if _, _, err := client.PutSubscription(ctx, "orders", "billing", sdk.SubscriptionConfig{}); err != nil {
		log.Fatal(err)
	}

	// Produce: retried with a dedup key, so stored exactly once.
	producer, err := sdk.NewProducer(client, "orders", sdk.ProducerOptions{Group: "checkout"})
	if err != nil {
		log.Fatal(err)
	}
	defer producer.Close()
	res, err := producer.Send(ctx, sdk.SendMessage{Body: "order 1001 created", Tag: "created", Keys: []string{"order-1001"}})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("stored with an offset:", res.Offset != nil)

	// Consume: long polls, 4 handlers, ack on nil, nack on error.
	consumer, err := sdk.NewConsumer(client, "orders", "billing", sdk.ConsumerOptions{Concurrency: 4})
	if err != nil {
		log.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	err = consumer.Run(runCtx, func(ctx context.Context, m *sdk.PulledMessage) error {
		fmt.Printf("got %q (tag %s, attempt %d)\n", m.Body, m.Tag, m.DeliveryAttempt)
		stop() // one is enough for the example: Run finishes this one and returns
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	// Output:
	// stored with an offset: true
	// got "order 1001 created" (tag created, attempt 1)
}

func ExampleProducer_SendAsync() {
	ctx := context.Background()
	client, _ := sdk.NewClient(exampleServer(), sdk.ClientOptions{})
	producer, err := sdk.NewProducer(client, "clicks", sdk.ProducerOptions{Linger: 10 * time.Millisecond})
	if err != nil {
		log.Fatal(err)
	}
	// Many messages, few requests: they go in batches (messages:batch).
	var futures []*sdk.Future
	for i := range 100 {
		futures = append(futures, producer.SendAsync(ctx, sdk.NewMessage(fmt.Sprintf("click %d", i))))
	}
	stored := 0
	for _, f := range futures {
		if _, err := f.Wait(ctx); err != nil {
			log.Print(err)
			continue
		}
		stored++
	}
	// Close sends whatever is still queued and stops the batcher.
	if err := producer.Close(); err != nil {
		log.Fatal(err)
	}
	fmt.Println("stored", stored)
	// Output: stored 100
}

func ExampleConsumer_Run() {
	ctx := context.Background()
	client, _ := sdk.NewClient(exampleServer(), sdk.ClientOptions{})
	producer, _ := sdk.NewProducer(client, "payments", sdk.ProducerOptions{})
	defer producer.Close()
	for _, body := range []string{"ok", "flaky", "poison"} {
		if _, err := producer.Send(ctx, sdk.NewMessage(body)); err != nil {
			log.Fatal(err)
		}
	}

	consumer, _ := sdk.NewConsumer(client, "payments", "ledger", sdk.ConsumerOptions{WaitSeconds: 1})
	runCtx, stop := context.WithCancel(ctx)
	var mu sync.Mutex
	var seen []string
	errDownstream := errors.New("ledger busy")
	err := consumer.Run(runCtx, func(ctx context.Context, m *sdk.PulledMessage) error {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, fmt.Sprintf("%s#%d", m.Body, m.DeliveryAttempt))
		if len(seen) == 4 {
			defer stop()
		}
		switch {
		case m.Body == "flaky" && m.DeliveryAttempt == 1:
			return sdk.RetryAfter(time.Second, errDownstream) // nack: again in 1 s
		case m.Body == "poison":
			return sdk.DeadLetter(errors.New("cannot parse")) // to the DLQ at once
		}
		return nil // ack
	})
	if err != nil {
		log.Fatal(err)
	}
	sort.Strings(seen)
	fmt.Println(seen)
	for m, err := range client.DeadLetters(ctx, "payments", "ledger", sdk.PageOptions{}) {
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("dead: %s (%s)\n", m.Body, *m.Reason)
	}
	// Output:
	// [flaky#1 flaky#2 ok#1 poison#1]
	// dead: poison (cannot parse)
}

func ExampleAPIError() {
	client, _ := sdk.NewClient(exampleServer(), sdk.ClientOptions{})
	_, err := client.GetTopic(context.Background(), "no-such-topic")
	switch {
	case errors.Is(err, sdk.ErrTopicNotFound):
		fmt.Println("no such topic")
	case err != nil:
		log.Fatal(err)
	}
	var apiErr *sdk.APIError
	if errors.As(err, &apiErr) {
		fmt.Println(apiErr.Status, apiErr.Code)
	}
	// Output:
	// no such topic
	// 404 topic_not_found
}

func ExampleClient_Messages() {
	ctx := context.Background()
	client, _ := sdk.NewClient(exampleServer(), sdk.ClientOptions{})
	_, err := client.SendBatch(ctx, "invoices", "", []sdk.SendMessage{
		{Body: "invoice 1", Keys: []string{"customer-7"}},
		{Body: "invoice 2", Keys: []string{"customer-8"}},
		{Body: "invoice 3", Keys: []string{"customer-7"}},
		{Body: "invoice 4", Keys: []string{"customer-7"}},
	})
	if err != nil {
		log.Fatal(err)
	}
	// Every message with a key, page by page.
	var bodies []string
	for m, err := range client.Messages(ctx, "invoices", sdk.MessageQuery{Key: "customer-7", Limit: 2}) {
		if err != nil {
			log.Fatal(err)
		}
		bodies = append(bodies, m.Body)
	}
	sort.Strings(bodies)
	fmt.Println(bodies)
	// Output: [invoice 1 invoice 3 invoice 4]
}

func ExampleProducer_SendInTransaction() {
	ctx := context.Background()
	client, _ := sdk.NewClient(exampleServer(), sdk.ClientOptions{})
	if _, _, err := client.PutSubscription(ctx, "shipments", "warehouse", sdk.SubscriptionConfig{}); err != nil {
		log.Fatal(err)
	}
	producer, _ := sdk.NewProducer(client, "shipments", sdk.ProducerOptions{TransactionCheckAfter: 30 * time.Second})
	defer producer.Close()

	// The local change: a row in your database, with the transaction id
	// so that a check-back can find it (here a map stands for the table).
	orders := map[string]string{} // order → transaction id
	errOutOfStock := errors.New("out of stock")
	place := func(order string, stock int) error {
		_, err := producer.SendInTransaction(ctx, []sdk.SendMessage{{Body: "ship " + order, Keys: []string{order}}},
			func(ctx context.Context) error {
				if stock == 0 {
					return errOutOfStock // rolls the message back
				}
				tx, _ := sdk.TransactionFromContext(ctx)
				orders[order] = tx.TransactionID
				return nil // commits it
			})
		return err
	}
	fmt.Println("order-1:", place("order-1", 3))
	err := place("order-2", 0)
	fmt.Println("order-2 out of stock:", errors.Is(err, errOutOfStock))

	// Only the committed message is delivered.
	msgs, err := client.Pull(ctx, "shipments", "warehouse", sdk.PullRequest{WaitSeconds: 1})
	if err != nil {
		log.Fatal(err)
	}
	for _, m := range msgs {
		fmt.Println("delivered:", m.Body)
	}
	// Output:
	// order-1: <nil>
	// order-2 out of stock: true
	// delivered: ship order-1
}

func ExampleTransactionCheckHandler() {
	ctx := context.Background()
	client, _ := sdk.NewClient(exampleServer(), sdk.ClientOptions{})

	// The producer's check endpoint answers from its own records: here a
	// set of committed local transactions stands for the database.
	committed := map[string]bool{}
	var mu sync.Mutex
	check := sdk.TransactionCheckHandler(func(ctx context.Context, c sdk.TransactionCheck) (sdk.TransactionStatus, error) {
		mu.Lock()
		defer mu.Unlock()
		if committed[c.TransactionID] {
			return sdk.TransactionCommit, nil
		}
		return sdk.TransactionRollback, nil
	})
	mux := http.NewServeMux()
	mux.Handle("POST /tx-check", check)
	endpoint := httptest.NewServer(mux)
	defer endpoint.Close()
	if _, _, err := client.PutTopic(ctx, "payments", sdk.TopicConfig{TransactionCheckURL: endpoint.URL + "/tx-check"}); err != nil {
		log.Fatal(err)
	}
	if _, _, err := client.PutSubscription(ctx, "payments", "ledger", sdk.SubscriptionConfig{}); err != nil {
		log.Fatal(err)
	}

	// A producer sends a half message, commits its local transaction and
	// dies before it commits the message.
	res, err := client.PrepareTransaction(ctx, "payments", "", sdk.Transaction{CheckAfterSeconds: 1}, []sdk.SendMessage{sdk.NewMessage("payment 7")})
	if err != nil {
		log.Fatal(err)
	}
	mu.Lock()
	committed[res.TransactionID] = true
	mu.Unlock()

	// A second later the broker asks, and delivers it.
	msgs, err := client.Pull(ctx, "payments", "ledger", sdk.PullRequest{WaitSeconds: 10})
	if err != nil {
		log.Fatal(err)
	}
	for _, m := range msgs {
		fmt.Println("delivered:", m.Body)
	}
	// Output: delivered: payment 7
}

// ------------------------------------------------------------- plumbing

var examples struct {
	mu       sync.Mutex
	cleanups []func()
}

// exampleServer starts a real tidemq server in-process, with its data in a
// temporary directory, and returns its URL; TestMain stops it.
func exampleServer() string {
	dir, err := os.MkdirTemp("", "tidemq-example-")
	if err != nil {
		log.Fatal(err)
	}
	quiet := slog.New(slog.DiscardHandler)
	store, err := pebblestore.Open(dir, pebblestore.Options{Logger: quiet, CacheBytes: 8 << 20, MemTableBytes: 8 << 20})
	if err != nil {
		log.Fatal(err)
	}
	b, err := core.New(store, core.Options{AutoCreate: true, Logger: quiet, TransactionChecker: webhook.NewChecker(webhook.CheckerOptions{Logger: quiet})})
	if err != nil {
		log.Fatal(err)
	}
	gw, err := gateway.New(b, gateway.Options{Logger: quiet})
	if err != nil {
		log.Fatal(err)
	}
	srv := httptest.NewServer(gw)
	examples.mu.Lock()
	defer examples.mu.Unlock()
	examples.cleanups = append(examples.cleanups, func() {
		b.StopPolling()
		srv.Close()
		if err := errors.Join(b.Close(), store.Close(), os.RemoveAll(dir)); err != nil {
			log.Print(err)
		}
	})
	return srv.URL
}

func TestMain(m *testing.M) {
	code := m.Run()
	examples.mu.Lock()
	for _, f := range examples.cleanups {
		f()
	}
	examples.mu.Unlock()
	os.Exit(code)
}
