package core_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/tidemq/tidemq/core"
)

// scriptedChecker answers checks from a script (the producer's side of
// the check, in process; the HTTP one is webhook.Checker's test).
type scriptedChecker struct {
	mu      sync.Mutex
	answers []string // "" is a failure; the last answer repeats
	asked   []core.TransactionCheck
}

func (c *scriptedChecker) CheckTransaction(_ context.Context, url string, tc core.TransactionCheck) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.asked = append(c.asked, tc)
	a := c.answers[min(len(c.asked), len(c.answers))-1]
	if a == "" {
		return "", errors.New("producer down")
	}
	return a, nil
}

func (c *scriptedChecker) checks() []core.TransactionCheck {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.asked)
}

// alertSink collects alerts the broker notifies.
type alertSink struct {
	mu     sync.Mutex
	alerts []core.Alert
}

func (s *alertSink) Notify(a core.Alert) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.alerts = append(s.alerts, a)
}

func (s *alertSink) all() []core.Alert {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.alerts)
}

func (e *env) txTopic(name string, maxChecks int) {
	e.t.Helper()
	url, alert := "http://producer.invalid/check", "http://ops.invalid/alert"
	if _, _, err := e.b.PutTopic(e.t.Context(), name, core.TopicConfig{Queues: 1, TransactionCheckURL: &url,
		TransactionMaxChecks: maxChecks, TransactionAlertURL: &alert}); err != nil {
		e.t.Fatal(err)
	}
}

// halfResult is a half message's result with its transaction's id.
type halfResult struct {
	core.SendResult
	TransactionID string
}

func (e *env) prepare(topic string, checkAfter time.Duration, msgs ...*core.Message) []halfResult {
	e.t.Helper()
	res, txID, err := e.b.SendTransaction(e.t.Context(), topic, msgs, checkAfter)
	if err != nil {
		e.t.Fatalf("SendTransaction: %v", err)
	}
	if txID == "" || len(res) != len(msgs) {
		e.t.Fatalf("SendTransaction: %d results for %d messages, transaction %q", len(res), len(msgs), txID)
	}
	out := make([]halfResult, len(res))
	for i, r := range res {
		if !r.Delayed {
			e.t.Fatalf("half message results %+v: want no offsets", res)
		}
		out[i] = halfResult{r, txID}
	}
	return out
}

// waitSettled waits for the check goroutine to settle the topic's only
// open transaction.
func (e *env) waitSettled(topic string) {
	e.t.Helper()
	within(e.t, 5*time.Second, func() error {
		txs, err := e.b.ListTransactions(topic)
		if err != nil || len(txs) != 0 {
			return fmt.Errorf("open transactions %v, %v", txs, err)
		}
		return nil
	})
}

func TestTransactionCommitDeliversAsSentAtCommit(t *testing.T) {
	clk := newClock()
	e := newEnv(t, core.Options{Now: clk.Now})
	e.txTopic("orders", 0)
	e.subscribe("orders", "g", core.SubscriptionConfig{Filter: "TagA"})
	e.sendBatch("orders", &core.Message{Body: []byte("plain"), Tag: "TagA"})
	half := e.prepare("orders", time.Minute,
		&core.Message{Body: []byte("h1"), Tag: "TagA", Keys: []string{"k1"}},
		&core.Message{Body: []byte("h2"), Tag: "TagB"})
	txID := half[0].TransactionID

	info := e.topicInfo("orders")
	if info.HalfMessages != 2 || info.Messages != 1 {
		t.Fatalf("topic: %d half, %d messages; want 2 half apart from 1 message", info.HalfMessages, info.Messages)
	}
	m, states, err := e.b.GetMessage("orders", half[0].MessageID)
	if err != nil || !m.Half || len(states) != 1 || states[0].State != core.StateHalf {
		t.Fatalf("query of a half message: %+v %+v %v; want state half", m, states, err)
	}
	got := e.drain("orders", "g", core.PullRequest{MaxMessages: 10})
	if len(got) != 1 || string(got[0].Message.Body) != "plain" {
		t.Fatalf("before the commit pulled %v, want only the plain message", bodies(got))
	}
	e.ackAll("orders", "g", got)

	clk.Advance(10 * time.Second)
	commitAt := clk.Now()
	tx, err := e.b.CommitTransaction(t.Context(), "orders", txID)
	if err != nil || tx.State != core.TxCommitted || tx.DecidedBy != core.DecidedByRequest {
		t.Fatalf("commit: %+v, %v", tx, err)
	}
	got = e.drain("orders", "g", core.PullRequest{MaxMessages: 10})
	if len(got) != 1 || string(got[0].Message.Body) != "h1" || got[0].Message.Offset != 1 ||
		got[0].Message.StoredAtMs != commitAt.UnixMilli() || got[0].Message.ID != half[0].MessageID {
		t.Fatalf("after the commit pulled %v (%+v); want h1 at offset 1, stored at the commit, TagB filtered", bodies(got), got)
	}
	if info := e.topicInfo("orders"); info.HalfMessages != 0 || info.Messages != 3 {
		t.Fatalf("after the commit: %d half, %d messages", info.HalfMessages, info.Messages)
	}
	if _, err := e.b.CommitTransaction(t.Context(), "orders", txID); err != nil {
		t.Fatalf("second commit: %v, want the same answer", err)
	}
	_, err = e.b.RollbackTransaction(t.Context(), "orders", txID)
	wantErr(t, err, core.ErrTransactionSettled)
	if msgs, _, err := e.b.QueryMessages(t.Context(), "orders", core.Query{Key: "k1"}); err != nil || len(msgs) != 1 {
		t.Fatalf("query by key after the commit: %d, %v", len(msgs), err)
	}
	e.ackAll("orders", "g", got)
	e.pullNone("orders", "g", core.PullRequest{}, "a second commit appends nothing")
}

func TestTransactionRollbackDropsHalfMessages(t *testing.T) {
	e := newEnv(t, core.Options{})
	e.txTopic("orders", 0)
	e.txTopic("other", 0)
	e.subscribe("orders", "g", core.SubscriptionConfig{})
	half := e.prepare("orders", time.Minute, &core.Message{Body: []byte("h")})
	txID := half[0].TransactionID
	_, err := e.b.RollbackTransaction(t.Context(), "other", txID)
	wantErr(t, err, core.ErrTransactionNotFound)
	for _, bad := range []string{"nope", txID + "1", txID[:22] + "99999"} {
		_, err = e.b.CommitTransaction(t.Context(), "orders", bad)
		wantErr(t, err, core.ErrTransactionNotFound)
	}
	tx, err := e.b.RollbackTransaction(t.Context(), "orders", txID)
	if err != nil || tx.State != core.TxRolledBack {
		t.Fatalf("rollback: %+v, %v", tx, err)
	}
	if _, err := e.b.RollbackTransaction(t.Context(), "orders", txID); err != nil {
		t.Fatalf("second rollback: %v", err)
	}
	_, err = e.b.CommitTransaction(t.Context(), "orders", txID)
	wantErr(t, err, core.ErrTransactionSettled)
	e.pullNone("orders", "g", core.PullRequest{}, "a rolled back half message")
	if info := e.topicInfo("orders"); info.HalfMessages != 0 || info.Messages != 0 {
		t.Fatalf("after the rollback: %d half, %d messages", info.HalfMessages, info.Messages)
	}
	_, _, err = e.b.GetMessage("orders", half[0].MessageID)
	wantErr(t, err, core.ErrMessageNotFound)
	// The settled record survives a restart: the verbs answer the same.
	e.restart()
	if _, err := e.b.RollbackTransaction(t.Context(), "orders", txID); err != nil {
		t.Fatalf("rollback after a restart: %v", err)
	}
	_, err = e.b.CommitTransaction(t.Context(), "orders", txID)
	wantErr(t, err, core.ErrTransactionSettled)
}

func TestTransactionRefusesBadInput(t *testing.T) {
	e := newEnv(t, core.Options{})
	e.txTopic("orders", 0)
	_, _, err := e.b.SendTransaction(t.Context(), "orders", []*core.Message{{Body: []byte("x")}}, 0)
	wantValidation(t, err, "/transaction/checkAfterSeconds", -1)
	_, _, err = e.b.SendTransaction(t.Context(), "orders", []*core.Message{{Body: []byte("x"), DedupKey: "d"}}, time.Second)
	wantValidation(t, err, "/dedupKey", 0)
	bad := "ftp://x"
	_, _, err = e.b.PutTopic(t.Context(), "orders", core.TopicConfig{TransactionCheckURL: &bad})
	wantValidation(t, err, "/transactionCheckUrl", -1)
	_, _, err = e.b.PutTopic(t.Context(), "orders", core.TopicConfig{TransactionMaxChecks: 101})
	wantValidation(t, err, "/transactionMaxChecks", -1)
}

func TestTransactionCheckSettles(t *testing.T) {
	for _, tc := range []struct {
		name    string
		answers []string
		checks  int // checks asked until settled
		state   string
	}{
		{"commit", []string{core.CheckCommit}, 1, core.TxCommitted},
		{"rollback", []string{core.CheckRollback}, 1, core.TxRolledBack},
		{"unknown then commit", []string{core.CheckUnknown, "", core.CheckCommit}, 3, core.TxCommitted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := newClock()
			checker := &scriptedChecker{answers: tc.answers}
			e := newEnv(t, core.Options{Now: clk.Now, TransactionChecker: checker})
			e.txTopic("orders", 0)
			e.subscribe("orders", "g", core.SubscriptionConfig{})
			half := e.prepare("orders", 10*time.Second, &core.Message{Body: []byte("h"), ProducerGroup: "pg"})
			e.advanceTimers(clk, 9*time.Second)
			if n := len(checker.checks()); n != 0 {
				t.Fatalf("%d checks before checkAfter", n)
			}
			// Checks at 10 s, then 20 s and 40 s later (the delay doubles).
			for i, wait := range []time.Duration{time.Second, 20 * time.Second, 40 * time.Second}[:tc.checks] {
				e.advanceTimers(clk, wait)
				within(t, 5*time.Second, func() error {
					if n := len(checker.checks()); n != i+1 {
						return fmt.Errorf("%d checks asked, want %d", n, i+1)
					}
					if i+1 == tc.checks {
						return nil
					}
					// Undecided: recorded, with the next check due later.
					txs, _ := e.b.ListTransactions("orders")
					if len(txs) != 1 || txs[0].Checks != i+1 {
						return fmt.Errorf("open transactions %+v, want one with %d checks", txs, i+1)
					}
					return nil
				})
				if i+1 < tc.checks {
					e.pullNone("orders", "g", core.PullRequest{}, "undecided after a check")
				}
			}
			e.waitSettled("orders")
			c := checker.checks()
			if len(c) != tc.checks || c[0].TransactionID != half[0].TransactionID || c[0].ProducerGroup != "pg" ||
				c[0].Topic != "orders" || !slices.Equal(c[0].MessageIDs, []string{half[0].MessageID}) || c[len(c)-1].Check != tc.checks {
				t.Fatalf("checks asked: %+v", c)
			}
			if tc.state == core.TxCommitted {
				if got := e.pullSoon("orders", "g", core.PullRequest{}); len(got) != 1 || got[0].Message.ID != half[0].MessageID {
					t.Fatalf("after a check committed pulled %v", bodies(got))
				}
			} else {
				e.pullNone("orders", "g", core.PullRequest{}, "after a check rolled back")
			}
			tx, err := e.b.CommitTransaction(t.Context(), "orders", half[0].TransactionID)
			if tc.state == core.TxCommitted && (err != nil || tx.DecidedBy != core.DecidedByCheck) {
				t.Fatalf("commit after the check committed: %+v, %v", tx, err)
			}
			if tc.state == core.TxRolledBack {
				wantErr(t, err, core.ErrTransactionSettled)
			}
		})
	}
}

func TestTransactionRolledBackAfterMaxChecksWithAlert(t *testing.T) {
	clk := newClock()
	checker := &scriptedChecker{answers: []string{""}} // the producer is down
	alerts := &alertSink{}
	reader := sdkmetric.NewManualReader()
	e := newEnv(t, core.Options{Now: clk.Now, TransactionChecker: checker, Notifier: alerts,
		MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))})
	e.txTopic("orders", 3)
	e.subscribe("orders", "g", core.SubscriptionConfig{})
	half := e.prepare("orders", 5*time.Minute, &core.Message{Body: []byte("h"), ProducerGroup: "pg"})
	// checkAfter above the 5-minute cap: every wait is checkAfter.
	for i := range 3 {
		e.advanceTimers(clk, 5*time.Minute)
		within(t, 5*time.Second, func() error {
			if n := len(checker.checks()); n != i+1 {
				return fmt.Errorf("%d checks", n)
			}
			return nil
		})
	}
	e.waitSettled("orders")
	_, err := e.b.CommitTransaction(t.Context(), "orders", half[0].TransactionID)
	wantErr(t, err, core.ErrTransactionSettled)
	tx, err := e.b.RollbackTransaction(t.Context(), "orders", half[0].TransactionID)
	if err != nil || tx.DecidedBy != core.DecidedByCheckLimit || tx.Checks != 3 {
		t.Fatalf("rolled back after the limit: %+v, %v", tx, err)
	}
	a := alerts.all()
	if len(a) != 1 || a[0].Alert != "transaction_check_limit" || a[0].Status != "firing" || a[0].Topic != "orders" ||
		a[0].Group != "pg" || a[0].TransactionID != half[0].TransactionID || a[0].Value != 3 || a[0].Max != 3 ||
		a[0].WebhookURL != "http://ops.invalid/alert" {
		t.Fatalf("alerts %+v", a)
	}
	e.pullNone("orders", "g", core.PullRequest{}, "rolled back after the last check")
	counts := counterValues(t, reader)
	if counts["tidemq.transactions outcome=rolled_back decided_by=check_limit"] != 1 ||
		counts["tidemq.alerts alert=transaction_check_limit status=firing"] != 1 ||
		counts["tidemq.transaction.checks status=failed"] != 3 {
		t.Fatalf("metrics %v", counts)
	}
}

// counterValues sums the broker's counters by name and the attributes
// that tell outcomes apart.
func counterValues(t *testing.T, reader *sdkmetric.ManualReader) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	counts := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			sum, ok := m.Data.(metricdata.Sum[int64])
			if !ok {
				continue
			}
			for _, p := range sum.DataPoints {
				key := m.Name
				for _, k := range []attribute.Key{"outcome", "decided_by", "alert", "status"} {
					if v, ok := p.Attributes.Value(k); ok {
						key += " " + string(k) + "=" + v.AsString()
					}
				}
				counts[key] += p.Value
			}
		}
	}
	return counts
}

// Open transactions survive a restart: nothing is delivered early, and
// the check-back still comes (its timer is put back at start).
func TestTransactionsSurviveRestart(t *testing.T) {
	clk := newClock()
	checker := &scriptedChecker{answers: []string{core.CheckCommit}}
	e := newEnv(t, core.Options{Now: clk.Now, TransactionChecker: checker})
	e.txTopic("orders", 0)
	e.subscribe("orders", "g", core.SubscriptionConfig{})
	committed := e.prepare("orders", time.Hour, &core.Message{Body: []byte("by request"), DeliverAtMs: clk.Now().Add(30 * time.Second).UnixMilli()})
	checked := e.prepare("orders", 2*time.Minute, &core.Message{Body: []byte("by check")})
	e.restart()
	if info := e.topicInfo("orders"); info.HalfMessages != 2 || info.Messages != 0 {
		t.Fatalf("after a restart: %d half, %d messages", info.HalfMessages, info.Messages)
	}
	e.pullNone("orders", "g", core.PullRequest{}, "half messages after a restart")
	if txs, err := e.b.ListTransactions("orders"); err != nil || len(txs) != 2 {
		t.Fatalf("open transactions after a restart: %+v, %v", txs, err)
	}
	clk.Advance(time.Minute)
	// The delay counts from the commit: due 30 s after it, not after the send.
	if _, err := e.b.CommitTransaction(t.Context(), "orders", committed[0].TransactionID); err != nil {
		t.Fatal(err)
	}
	e.pullNone("orders", "g", core.PullRequest{}, "a committed half message with a delay, before its delay")
	e.advanceTimers(clk, 31*time.Second)
	got := e.pullSoon("orders", "g", core.PullRequest{})
	if len(got) != 1 || got[0].Message.ID != committed[0].MessageID {
		t.Fatalf("pulled %v, want the committed message after its delay", bodies(got))
	}
	e.ackAll("orders", "g", got)
	e.advanceTimers(clk, time.Minute)
	e.waitSettled("orders")
	got = e.pullSoon("orders", "g", core.PullRequest{})
	if len(got) != 1 || got[0].Message.ID != checked[0].MessageID {
		t.Fatalf("pulled %v, want the message the check committed", bodies(got))
	}
	if n := len(checker.checks()); n != 1 {
		t.Fatalf("%d checks, want 1", n)
	}
}

// A settled record is dropped after the topic's retention: its id is then
// unknown.
func TestSettledTransactionExpiresWithRetention(t *testing.T) {
	clk := newClock()
	e := newEnv(t, core.Options{Now: clk.Now})
	url := "http://producer.invalid/check"
	if _, _, err := e.b.PutTopic(t.Context(), "orders", core.TopicConfig{Queues: 1, RetentionHours: 1, TransactionCheckURL: &url}); err != nil {
		t.Fatal(err)
	}
	half := e.prepare("orders", time.Hour, &core.Message{Body: []byte("h")})
	if _, err := e.b.RollbackTransaction(t.Context(), "orders", half[0].TransactionID); err != nil {
		t.Fatal(err)
	}
	e.advanceTimers(clk, 59*time.Minute)
	if _, err := e.b.RollbackTransaction(t.Context(), "orders", half[0].TransactionID); err != nil {
		t.Fatalf("within retention: %v", err)
	}
	e.advanceTimers(clk, 2*time.Minute)
	within(t, 5*time.Second, func() error {
		_, err := e.b.RollbackTransaction(t.Context(), "orders", half[0].TransactionID)
		if !errors.Is(err, core.ErrTransactionNotFound) {
			return fmt.Errorf("after retention: %v", err)
		}
		return nil
	})
}

// Deleting a topic drops its open transactions with it.
func TestDeleteTopicDropsOpenTransactions(t *testing.T) {
	e := newEnv(t, core.Options{})
	e.txTopic("orders", 0)
	half := e.prepare("orders", time.Minute, &core.Message{Body: []byte("h")})
	if err := e.b.DeleteTopic(t.Context(), "orders"); err != nil {
		t.Fatal(err)
	}
	e.txTopic("orders", 0)
	_, err := e.b.CommitTransaction(t.Context(), "orders", half[0].TransactionID)
	wantErr(t, err, core.ErrTransactionNotFound)
	e.restart()
	if txs, _ := e.b.ListTransactions("orders"); len(txs) != 0 {
		t.Fatalf("open transactions after the topic's delete and a restart: %+v", txs)
	}
}

// gatedChecker fails every check, each only once the test lets it go.
type gatedChecker struct {
	asked   chan struct{}
	release chan struct{}
}

func (c *gatedChecker) CheckTransaction(ctx context.Context, _ string, _ core.TransactionCheck) (string, error) {
	c.asked <- struct{}{}
	select {
	case <-c.release:
	case <-ctx.Done():
	}
	return "", errors.New("producer down")
}

// A topic deleted while a check of its transaction runs stays without
// it: the check's record of another attempt does not write the
// transaction back (a rebuilt broker would load an open transaction of a
// topic that is gone).
func TestTopicDeletedDuringACheckStaysDeleted(t *testing.T) {
	clk := newClock()
	checker := &gatedChecker{asked: make(chan struct{}, 1), release: make(chan struct{})}
	e := newEnv(t, core.Options{Now: clk.Now, TransactionChecker: checker})
	e.txTopic("orders", 5)
	e.prepare("orders", time.Minute, &core.Message{Body: []byte("h")})
	e.advanceTimers(clk, time.Minute)
	select {
	case <-checker.asked:
	case <-time.After(5 * time.Second):
		t.Fatal("no check within 5 s of its due time")
	}
	if err := e.b.DeleteTopic(t.Context(), "orders"); err != nil {
		t.Fatal(err)
	}
	close(checker.release)
	within(t, 5*time.Second, func() error {
		if n := core.ChecksRunning(e.b); n != 0 {
			return fmt.Errorf("%d checks running", n)
		}
		return nil
	})
	e.restart()
	st, err := core.LogicalState(e.b, clk.Now().UnixMilli())
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Transactions) != 0 {
		t.Fatalf("open transactions after the topic's delete, a check and a restart: %+v", st.Transactions)
	}
}

// Commits and rollbacks racing on one transaction settle it once: every
// caller of the winning verb gets it, every other ErrTransactionSettled,
// and a commit delivers the message once.
func TestConcurrentVerbsSettleOnce(t *testing.T) {
	e := newEnv(t, core.Options{})
	e.txTopic("orders", 0)
	e.subscribe("orders", "g", core.SubscriptionConfig{})
	for round := range 20 {
		half := e.prepare("orders", time.Minute, &core.Message{Body: fmt.Appendf(nil, "h%d", round)})
		var wg sync.WaitGroup
		results := make([]error, 8)
		for i := range results {
			wg.Go(func() {
				if i%2 == 0 {
					_, results[i] = e.b.CommitTransaction(t.Context(), "orders", half[0].TransactionID)
				} else {
					_, results[i] = e.b.RollbackTransaction(t.Context(), "orders", half[0].TransactionID)
				}
			})
		}
		wg.Wait()
		commits, rollbacks := 0, 0
		for i, err := range results {
			switch {
			case err == nil && i%2 == 0:
				commits++
			case err == nil:
				rollbacks++
			case !errors.Is(err, core.ErrTransactionSettled):
				t.Fatalf("round %d: %v", round, err)
			}
		}
		if (commits == 0) == (rollbacks == 0) || commits+rollbacks != 4 {
			t.Fatalf("round %d: %d commits and %d rollbacks succeeded, want one verb's 4", round, commits, rollbacks)
		}
		got := e.drain("orders", "g", core.PullRequest{MaxMessages: 10})
		if want := min(commits, 1); len(got) != want {
			t.Fatalf("round %d: delivered %d, want %d", round, len(got), want)
		}
		e.ackAll("orders", "g", got)
	}
}

// A committed half message takes its place in its sharding key's order at
// the commit, as a send then would: an orderly subscription gets the key's
// messages in store order, the half message after those sent before its
// commit (even those sent after its prepare).
func TestCommittedHalfMessageIsOrderedAtTheCommit(t *testing.T) {
	e := newEnv(t, core.Options{})
	e.txTopic("orders", 0)
	if _, _, err := e.b.PutTopic(t.Context(), "orders", core.TopicConfig{Queues: 4}); err != nil {
		t.Fatal(err)
	}
	e.subscribe("orders", "seq", core.SubscriptionConfig{Orderly: true})
	e.sendBatch("orders", &core.Message{Body: []byte("a"), ShardingKey: "acct-1"})
	half := e.prepare("orders", time.Minute, &core.Message{Body: []byte("half"), ShardingKey: "acct-1"})
	e.sendBatch("orders", &core.Message{Body: []byte("b"), ShardingKey: "acct-1"})
	if _, err := e.b.CommitTransaction(t.Context(), "orders", half[0].TransactionID); err != nil {
		t.Fatal(err)
	}
	e.sendBatch("orders", &core.Message{Body: []byte("c"), ShardingKey: "acct-1"})
	var got []string
	for range 10 {
		ds := e.pull("orders", "seq", core.PullRequest{MaxMessages: 1})
		if len(ds) == 0 {
			break
		}
		got = append(got, bodies(ds)...)
		e.ackAll("orders", "seq", ds)
	}
	if want := []string{"a", "b", "half", "c"}; !slices.Equal(got, want) {
		t.Fatalf("orderly delivery %v, want %v", got, want)
	}
}
