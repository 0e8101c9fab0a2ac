// Command transactions is an order service that keeps a SQLite table of
// orders and a tidemq topic of "order created" messages in step with
// transactional messages (half messages, SPEC §9): an order is placed with
// its message or not at all, even when the service is killed between the
// two. See README.md.
//
//	go run ./examples/transactions                 # a demo: 10 orders, then exit
//	go run ./examples/transactions -demo 0         # serve POST /orders until Ctrl-C
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/tidemq/tidemq/sdk"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "transactions:", err)
		os.Exit(1)
	}
}

func run() error {
	brokerURL := os.Getenv("TIDEMQ_URL")
	if brokerURL == "" {
		brokerURL = "http://127.0.0.1:8080"
	}
	var (
		broker     = flag.String("broker", brokerURL, "the tidemq broker's URL (TIDEMQ_URL)")
		addr       = flag.String("addr", "127.0.0.1:8090", "where to serve POST /orders and the broker's POST /tx-check")
		advertise  = flag.String("advertise", "", "the base URL the broker reaches this service at (default http://<addr>)")
		dbPath     = flag.String("db", "orders.db", "the SQLite database file")
		topic      = flag.String("topic", "orders", "the topic of order messages")
		checkAfter = flag.Duration("check-after", 5*time.Second, "how long the broker waits for a commit before it asks /tx-check")
		maxChecks  = flag.Int("max-checks", 0, "the topic's transactionMaxChecks (0: the broker's default, 15)")
		settle     = flag.Duration("settle-delay", 0, "wait this long between an order's local commit and its message's commit (a slow link to the broker: widens the window a crash falls into)")
		demo       = flag.Int("demo", 10, "place this many orders (a third fail their local transaction), print what happened and exit; 0 serves until SIGINT/SIGTERM")
	)
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	db, err := openDB(ctx, *dbPath)
	if err != nil {
		return err
	}
	defer db.Close()

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	base := *advertise
	if base == "" {
		base = "http://" + ln.Addr().String()
	}

	client, err := sdk.NewClient(*broker, sdk.ClientOptions{Logger: log})
	if err != nil {
		return errors.Join(err, ln.Close())
	}
	defer client.Close()
	// The topic's check URL is this service (set again on every start, in
	// case the address changed).
	if _, _, err := client.PutTopic(ctx, *topic, sdk.TopicConfig{TransactionCheckURL: base + "/tx-check", TransactionMaxChecks: *maxChecks}); err != nil {
		return errors.Join(fmt.Errorf("topic %s: %w", *topic, err), ln.Close())
	}
	producer, err := sdk.NewProducer(client, *topic, sdk.ProducerOptions{Group: "order-service", TransactionCheckAfter: *checkAfter})
	if err != nil {
		return errors.Join(err, ln.Close())
	}
	defer producer.Close()

	s := &service{db: db, producer: producer, log: log, settleDelay: *settle, running: map[string]bool{}}
	srv := &http.Server{Handler: s.handler(), ReadHeaderTimeout: 5 * time.Second, IdleTimeout: time.Minute, MaxHeaderBytes: 1 << 16}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	log.Info("orders service listening", "addr", ln.Addr().String(), "broker", *broker, "topic", *topic, "check_url", base+"/tx-check")

	var runErr error
	if *demo > 0 {
		runErr = runDemo(ctx, s, client, *topic, *demo, *checkAfter)
	} else {
		select {
		case <-ctx.Done():
		case runErr = <-served:
		}
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return errors.Join(runErr, srv.Shutdown(sctx))
}

// runDemo places n orders, a third of them failing their local
// transaction, prints each outcome, waits (bounded) until the topic holds
// no half message and prints its counts.
func runDemo(ctx context.Context, s *service, client *sdk.Client, topic string, n int, checkAfter time.Duration) error {
	run := fmt.Sprintf("%04x", rand.Uint32()&0xffff)
	for i := range n {
		o := order{ID: fmt.Sprintf("demo-%s-%03d", run, i), Item: "book", SimulateFailure: rand.IntN(3) == 0}
		p, err := s.place(ctx, o)
		switch {
		case err == nil:
			fmt.Printf("order %s placed, message %s (transaction %s)\n", o.ID, p.Message, p.TransactionID)
		case errors.Is(err, errLocalFailure):
			fmt.Printf("order %s failed, its message rolled back (transaction %s)\n", o.ID, p.TransactionID)
		default:
			return fmt.Errorf("order %s: %w", o.ID, err)
		}
	}
	deadline := time.Now().Add(2*checkAfter + 10*time.Second)
	for {
		t, err := client.GetTopic(ctx, topic)
		if err != nil {
			return err
		}
		if t.HalfMessages == 0 || time.Now().After(deadline) {
			fmt.Printf("topic %s: %d messages, %d half messages (open transactions)\n", topic, t.Messages, t.HalfMessages)
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}
