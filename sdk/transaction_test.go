package sdk_test

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/tidemq/tidemq/sdk"
)

// The transactional producer against the real server: half messages reach
// nobody until committed, a failed local transaction rolls them back, the
// verbs are idempotent and answer as SPEC §9 says.

func TestSendInTransactionCommit(t *testing.T) {
	srv := startServer(t)
	c := newClient(t, srv.URL)
	ctx := t.Context()
	topic := topicName("tx-commit")
	if _, _, err := c.PutTopic(ctx, topic, sdk.TopicConfig{Queues: 2}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.PutSubscription(ctx, topic, "g", sdk.SubscriptionConfig{}); err != nil {
		t.Fatal(err)
	}
	p, err := sdk.NewProducer(c, topic, sdk.ProducerOptions{Group: "checkout", TransactionCheckAfter: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	for _, n := range []int{1, 3} {
		t.Run(fmt.Sprintf("%d messages", n), func(t *testing.T) {
			msgs := make([]sdk.SendMessage, n)
			for i := range msgs {
				msgs[i] = sdk.SendMessage{Body: fmt.Sprintf("order %d/%d", i, n), Keys: []string{fmt.Sprintf("k%d", i)}}
			}
			var inside sdk.TransactionResult
			res, err := p.SendInTransaction(ctx, msgs, func(ctx context.Context) error {
				tx, ok := sdk.TransactionFromContext(ctx)
				if !ok {
					return errors.New("no transaction in the local transaction's ctx")
				}
				inside = tx
				// While it runs: stored, counted apart, delivered to nobody.
				top, err := c.GetTopic(ctx, topic)
				if err != nil {
					return err
				}
				if top.HalfMessages != int64(n) {
					return fmt.Errorf("halfMessages %d during the local transaction, want %d", top.HalfMessages, n)
				}
				st, err := c.GetMessage(ctx, topic, tx.Results[0].MessageID)
				if err != nil {
					return err
				}
				if len(st.Subscriptions) != 1 || st.Subscriptions[0].State != sdk.StateHalf ||
					st.Message.State != sdk.StateHalf || st.Message.Offset != nil {
					return fmt.Errorf("message status %+v, want state half", st)
				}
				open, err := c.ListTransactions(ctx, topic)
				if err != nil || len(open) != 1 || open[0].TransactionID != tx.TransactionID || len(open[0].MessageIDs) != n ||
					open[0].State != sdk.TransactionOpen || open[0].ProducerGroup != "checkout" {
					return fmt.Errorf("open transactions %+v (%v), want %s with %d messages", open, err, tx.TransactionID, n)
				}
				got, err := c.Pull(ctx, topic, "g", sdk.PullRequest{MaxMessages: 100})
				if err != nil || len(got) != 0 {
					return fmt.Errorf("a pull during the local transaction got %d messages (%v)", len(got), err)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if res.Status != sdk.TransactionCommit || res.TransactionID == "" || res.TransactionID != inside.TransactionID || len(res.Results) != n {
				t.Fatalf("result %+v (inside: %+v)", res, inside)
			}
			delivered := pullAll(t, c, topic, "g", n)
			for _, id := range res.MessageIDs() {
				if _, ok := delivered[id]; !ok {
					t.Errorf("committed message %s not delivered (got %d)", id, len(delivered))
				}
			}
			if len(delivered) != n {
				t.Errorf("%d delivered, want %d", len(delivered), n)
			}
			// The verbs: commit again is fine, rollback now is settled.
			if info, err := c.CommitTransaction(ctx, topic, res.TransactionID); err != nil || info.State != sdk.TransactionCommitted ||
				info.ProducerGroup != "checkout" || len(info.MessageIDs) != n {
				t.Errorf("second commit: %+v, %v", info, err)
			}
			if _, err := c.RollbackTransaction(ctx, topic, res.TransactionID); !errors.Is(err, sdk.ErrTransactionSettled) || !errors.Is(err, sdk.ErrRejected) {
				t.Errorf("rollback after commit: %v, want transaction_settled", err)
			}
		})
	}
	if top, err := c.GetTopic(ctx, topic); err != nil || top.HalfMessages != 0 || top.Messages != 4 {
		t.Errorf("topic after the commits: %+v, %v: want 4 messages, no half ones", top, err)
	}
	if _, err := c.CommitTransaction(ctx, topic, "NoSuchTransaction0"); !errors.Is(err, sdk.ErrTransactionNotFound) {
		t.Errorf("commit of an unknown id: %v, want transaction_not_found", err)
	}
}

func TestSendInTransactionRollback(t *testing.T) {
	srv := startServer(t)
	c := newClient(t, srv.URL)
	ctx := t.Context()
	topic := topicName("tx-rollback")
	if _, _, err := c.PutSubscription(ctx, topic, "g", sdk.SubscriptionConfig{}); err != nil {
		t.Fatal(err)
	}
	p, err := sdk.NewProducer(c, topic, sdk.ProducerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	errPayment := errors.New("payment refused")
	res, err := p.SendInTransaction(ctx, []sdk.SendMessage{sdk.NewMessage("a"), sdk.NewMessage("b")}, func(context.Context) error {
		return errPayment
	}, sdk.CheckAfter(time.Minute))
	if !errors.Is(err, errPayment) || errors.Is(err, sdk.ErrTransactionUnsettled) {
		t.Fatalf("err %v, want the local transaction's", err)
	}
	if res.Status != sdk.TransactionRollback || res.TransactionID == "" {
		t.Fatalf("result %+v", res)
	}
	// A send after it is delivered; the rolled-back ones never are.
	if _, err := p.Send(ctx, sdk.NewMessage("after")); err != nil {
		t.Fatal(err)
	}
	got := pullAll(t, c, topic, "g", 1)
	for _, m := range got {
		if m.Body != "after" {
			t.Errorf("delivered %q: a rolled-back message", m.Body)
		}
	}
	if _, err := c.RollbackTransaction(ctx, topic, res.TransactionID); err != nil {
		t.Errorf("second rollback: %v", err)
	}
	if _, err := c.CommitTransaction(ctx, topic, res.TransactionID); !errors.Is(err, sdk.ErrTransactionSettled) {
		t.Errorf("commit after rollback: %v, want transaction_settled", err)
	}
	if top, err := c.GetTopic(ctx, topic); err != nil || top.HalfMessages != 0 || top.Messages != 1 {
		t.Errorf("topic: %+v, %v: want 1 message, no half ones", top, err)
	}
	// The SDK refuses an empty transaction without a request.
	if _, err := p.SendInTransaction(ctx, nil, func(context.Context) error { return nil }); err == nil {
		t.Error("an empty transaction: no error")
	}
}

// TestSendInTransactionLostReplies: the half send's reply is lost and the
// producer sends it again; half messages carry no dedup key, so the retry
// opens a second transaction, which the producer commits. The first stays
// open, committed by nobody, for its check to roll back (done by hand
// here): each message is delivered once.
func TestSendInTransactionLostReplies(t *testing.T) {
	srv := startServer(t)
	proxy := startProxy(t, srv.URL, 2) // every second send's reply is lost
	c := newClient(t, proxy.URL())
	ctx := t.Context()
	topic := topicName("tx-lost")
	if _, _, err := c.PutSubscription(ctx, topic, "g", sdk.SubscriptionConfig{}); err != nil {
		t.Fatal(err)
	}
	p, err := sdk.NewProducer(c, topic, sdk.ProducerOptions{MinBackoff: 5 * time.Millisecond, NoBreaker: true, TransactionCheckAfter: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	const txs = 6
	var ids []string
	for i := range txs {
		res, err := p.SendInTransaction(ctx, []sdk.SendMessage{sdk.NewMessage(fmt.Sprintf("m%d", i))}, func(context.Context) error { return nil })
		if err != nil {
			t.Fatalf("transaction %d: %v", i, err)
		}
		ids = append(ids, res.MessageIDs()...)
	}
	lost := proxy.droppedSingle.Load()
	if lost == 0 {
		t.Fatal("no reply was lost: the test tested nothing")
	}
	open, err := c.ListTransactions(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(open)) != lost {
		t.Fatalf("%d open transactions after %d lost replies: %+v", len(open), lost, open)
	}
	for _, tx := range open {
		if tx.State != sdk.TransactionOpen || len(tx.MessageIDs) != 1 {
			t.Errorf("open transaction %+v", tx)
		}
		info, err := c.RollbackTransaction(ctx, topic, tx.TransactionID) // what its check would decide
		if err != nil || info.State != sdk.TransactionRolledBack || info.DecidedBy != sdk.DecidedByRequest {
			t.Errorf("rollback of %s: %+v, %v", tx.TransactionID, info, err)
		}
	}
	got := pullAll(t, c, topic, "g", txs)
	if len(got) != txs {
		t.Errorf("%d delivered, want %d", len(got), txs)
	}
	for _, id := range ids {
		if _, ok := got[id]; !ok {
			t.Errorf("message %s not delivered", id)
		}
	}
	if top, err := c.GetTopic(ctx, topic); err != nil || top.Messages != txs || top.HalfMessages != 0 {
		t.Errorf("topic: %+v, %v: want %d messages, no half ones", top, err, txs)
	}
}

// TestSendInTransactionCheckBack: the commit or rollback of
// SendInTransaction does not reach the broker (it is cut off during the
// local transaction); the call says so (ErrTransactionUnsettled), and the
// broker's check-back, answered by TransactionCheckHandler, settles the
// transaction: commit → delivered, rollback → never; "unknown" is asked
// again.
func TestSendInTransactionCheckBack(t *testing.T) {
	srv := startServer(t)
	proxy := startProxy(t, srv.URL, 0)
	c := newClient(t, proxy.URL())
	admin := newClient(t, srv.URL)
	ctx := t.Context()

	var (
		mu      sync.Mutex
		answers = map[string][]sdk.TransactionStatus{} // transaction → answers, one per check, the last repeating
		checks  = map[string][]int{}                   // transaction → check numbers seen
	)
	checkSrv := httptest.NewServer(sdk.TransactionCheckHandler(func(_ context.Context, tc sdk.TransactionCheck) (sdk.TransactionStatus, error) {
		mu.Lock()
		defer mu.Unlock()
		checks[tc.TransactionID] = append(checks[tc.TransactionID], tc.Check)
		a := answers[tc.TransactionID]
		if len(a) == 0 {
			return sdk.TransactionUnknown, nil
		}
		st := a[0]
		if len(a) > 1 {
			answers[tc.TransactionID] = a[1:]
		}
		return st, nil
	}))
	defer checkSrv.Close()
	topic := topicName("tx-check")
	if _, _, err := admin.PutTopic(ctx, topic, sdk.TopicConfig{TransactionCheckURL: checkSrv.URL}); err != nil {
		t.Fatal(err)
	}
	if top, err := admin.GetTopic(ctx, topic); err != nil || top.TransactionCheckURL != checkSrv.URL {
		t.Fatalf("topic %+v, %v: want the check URL", top, err)
	}
	if _, _, err := admin.PutSubscription(ctx, topic, "g", sdk.SubscriptionConfig{}); err != nil {
		t.Fatal(err)
	}
	p, err := sdk.NewProducer(c, topic, sdk.ProducerOptions{Group: "g1", RetryTimeout: 200 * time.Millisecond, NoBreaker: true,
		TransactionCheckAfter: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	// The broker is cut off while the local transaction runs; the answers
	// are set before the check can come (it comes after a second).
	place := func(body string, localErr error, answer ...sdk.TransactionStatus) sdk.TransactionResult {
		t.Helper()
		proxy.setDown(false)
		res, err := p.SendInTransaction(ctx, []sdk.SendMessage{sdk.NewMessage(body)}, func(ctx context.Context) error {
			tx, _ := sdk.TransactionFromContext(ctx)
			mu.Lock()
			answers[tx.TransactionID] = answer
			mu.Unlock()
			proxy.setDown(true)
			return localErr
		})
		proxy.setDown(false)
		if !errors.Is(err, sdk.ErrTransactionUnsettled) || !errors.Is(err, sdk.ErrUnavailable) || res.Status != sdk.TransactionUnknown {
			t.Fatalf("%s: %+v, %v: want the transaction left to the check-back", body, res, err)
		}
		if localErr != nil && !errors.Is(err, localErr) {
			t.Fatalf("%s: %v does not carry the local error", body, err)
		}
		return res
	}
	committed := place("committed by its check", nil, sdk.TransactionCommit)
	errLocal := errors.New("local failure")
	rolledBack := place("rolled back by its check", errLocal, sdk.TransactionRollback)
	later := place("unknown, then committed", nil, sdk.TransactionUnknown, sdk.TransactionCommit)

	got := pullAll(t, admin, topic, "g", 2)
	want := map[string]bool{committed.Results[0].MessageID: true, later.Results[0].MessageID: true}
	for id, m := range got {
		if !want[id] {
			t.Errorf("delivered %q (%s)", m.Body, id)
		}
	}
	if len(got) != 2 {
		t.Errorf("%d delivered, want 2", len(got))
	}
	waitFor(t, 20*time.Second, "no open transactions", func() (bool, error) {
		open, err := admin.ListTransactions(ctx, topic)
		return err == nil && len(open) == 0, err
	})
	for _, c := range []struct {
		res    sdk.TransactionResult
		state  string
		checks []int
	}{
		{committed, sdk.TransactionCommitted, []int{1}},
		{rolledBack, sdk.TransactionRolledBack, []int{1}},
		{later, sdk.TransactionCommitted, []int{1, 2}},
	} {
		// The verb the check decided answers 200 again; the other is 409.
		other := admin.RollbackTransaction
		same := admin.CommitTransaction
		if c.state == sdk.TransactionRolledBack {
			other, same = same, other
		}
		info, err := same(ctx, topic, c.res.TransactionID)
		if err != nil || info.State != c.state || info.DecidedBy != sdk.DecidedByCheck {
			t.Errorf("%s: %+v, %v: want %s decided by check", c.res.TransactionID, info, err, c.state)
		}
		if _, err := other(ctx, topic, c.res.TransactionID); !errors.Is(err, sdk.ErrTransactionSettled) {
			t.Errorf("%s: the other verb: %v", c.res.TransactionID, err)
		}
		mu.Lock()
		seen := checks[c.res.TransactionID]
		mu.Unlock()
		if fmt.Sprint(seen) != fmt.Sprint(c.checks) {
			t.Errorf("%s: checks %v, want %v", c.res.TransactionID, seen, c.checks)
		}
	}
}
