package gateway_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/tidemq/tidemq/core"
	"github.com/tidemq/tidemq/gateway"
	"github.com/tidemq/tidemq/webhook"
)

type halfReply struct {
	MessageID     string
	Offset        *uint64
	TransactionID string
}

type batchHalfReply struct {
	Results       []halfReply
	TransactionID string
}

type transactionReply struct {
	TransactionID string
	Topic         string
	State         string
	DecidedBy     string
	MessageIDs    []string
	Checks        int
}

func txPath(topic, id, verb string) string {
	return topicPath(topic) + "/transactions/" + id + ":" + verb
}

func TestE2ETransactions(t *testing.T) {
	ts := startServer(t, serverConfig{})
	c := ts.client(t)
	r := c.do(http.MethodPut, topicPath("orders"), map[string]any{"queues": 1, "transactionCheckUrl": "http://127.0.0.1:1/check", "transactionMaxChecks": 4})
	wantStatus(t, r, http.StatusCreated)
	subscribe(c, "orders", "g")

	r = c.do(http.MethodPost, sendPath("orders"), map[string]any{"body": "one", "transaction": map[string]any{"checkAfterSeconds": 60}})
	wantStatus(t, r, http.StatusCreated)
	one := decode[halfReply](t, r)
	if one.TransactionID == "" || one.Offset != nil {
		t.Fatalf("half message reply %s: want a transactionId and a null offset", r)
	}
	r = c.do(http.MethodPost, batchPath("orders"), map[string]any{"transaction": map[string]any{"checkAfterSeconds": 60},
		"messages": []any{jsonMsg("b1"), jsonMsg("b2")}})
	wantStatus(t, r, http.StatusCreated)
	batch := decode[batchHalfReply](t, r)
	if batch.TransactionID == "" || len(batch.Results) != 2 || batch.Results[1].TransactionID != batch.TransactionID {
		t.Fatalf("batch of half messages %s", r)
	}
	r = c.do(http.MethodPost, sendPath("orders"), "raw", hdr{"Content-Type": "application/octet-stream", "X-Tidemq-Transaction-Check-After": "60"})
	wantStatus(t, r, http.StatusCreated)
	raw := decode[halfReply](t, r)
	if raw.TransactionID == "" {
		t.Fatalf("raw half message %s", r)
	}

	var topic struct {
		HalfMessages         int64
		Messages             int64
		TransactionCheckURL  string
		TransactionMaxChecks int
	}
	r = c.do(http.MethodGet, topicPath("orders"), nil)
	wantStatus(t, r, http.StatusOK)
	if topic = decode[struct {
		HalfMessages         int64
		Messages             int64
		TransactionCheckURL  string
		TransactionMaxChecks int
	}](t, r); topic.HalfMessages != 4 || topic.Messages != 0 || topic.TransactionMaxChecks != 4 || topic.TransactionCheckURL != "http://127.0.0.1:1/check" {
		t.Fatalf("topic %s", r)
	}
	r = c.do(http.MethodGet, topicPath("orders")+"/transactions", nil)
	wantStatus(t, r, http.StatusOK)
	if list := decode[struct{ Transactions []transactionReply }](t, r); len(list.Transactions) != 3 || list.Transactions[1].TransactionID != batch.TransactionID ||
		list.Transactions[1].State != core.TxOpen || len(list.Transactions[1].MessageIDs) != 2 {
		t.Fatalf("open transactions %s", r)
	}
	r = c.do(http.MethodGet, topicPath("orders")+"/messages/"+one.MessageID, nil)
	wantStatus(t, r, http.StatusOK)
	type queried struct {
		Message struct {
			State  string
			Offset *uint64
		}
		Subscriptions []struct{ Group, State string }
	}
	if q := decode[queried](t, r); q.Message.State != "half" || q.Message.Offset != nil ||
		len(q.Subscriptions) != 1 || q.Subscriptions[0].State != "half" {
		t.Fatalf("query of a half message %s", r)
	}
	if got := c.pull("orders", "g", map[string]any{"maxMessages": 10}); len(got) != 0 {
		t.Fatalf("pulled %d half messages", len(got))
	}

	r = c.do(http.MethodPost, txPath("orders", one.TransactionID, "commit"), nil)
	wantStatus(t, r, http.StatusOK)
	if tx := decode[transactionReply](t, r); tx.State != core.TxCommitted || tx.DecidedBy != "request" {
		t.Fatalf("commit %s", r)
	}
	wantStatus(t, c.do(http.MethodPost, txPath("orders", one.TransactionID, "commit"), nil), http.StatusOK)
	wantProblem(t, c.do(http.MethodPost, txPath("orders", one.TransactionID, "rollback"), nil), http.StatusConflict, "transaction_settled")
	wantStatus(t, c.do(http.MethodPost, txPath("orders", batch.TransactionID, "rollback"), nil), http.StatusOK)
	wantStatus(t, c.do(http.MethodPost, txPath("orders", batch.TransactionID, "rollback"), nil), http.StatusOK)
	wantProblem(t, c.do(http.MethodPost, txPath("orders", batch.TransactionID, "commit"), nil), http.StatusConflict, "transaction_settled")
	wantStatus(t, c.do(http.MethodPost, txPath("orders", raw.TransactionID, "commit"), nil), http.StatusOK)
	got := c.pull("orders", "g", map[string]any{"maxMessages": 10})
	var bodies []string
	for _, m := range got {
		bodies = append(bodies, m.Body)
	}
	if slices.Sort(bodies); !slices.Equal(bodies, []string{"one", "raw"}) {
		t.Fatalf("after commits pulled %v, want the two committed ones", bodies)
	}

	wantProblem(t, c.do(http.MethodPost, txPath("orders", "NoSuchTransaction12345678", "commit"), nil), http.StatusNotFound, "transaction_not_found")
	wantProblem(t, c.do(http.MethodPost, txPath("orders", "x", "rollback"), nil), http.StatusNotFound, "transaction_not_found")
	wantProblem(t, c.do(http.MethodPost, txPath("nosuch", one.TransactionID, "commit"), nil), http.StatusNotFound, "topic_not_found")
	for name, tc := range map[string]struct {
		path string
		body any
		h    hdr
	}{
		"no checkAfterSeconds": {sendPath("orders"), map[string]any{"body": "x", "transaction": map[string]any{}}, nil},
		"checkAfterSeconds 0":  {sendPath("orders"), map[string]any{"body": "x", "transaction": map[string]any{"checkAfterSeconds": 0}}, nil},
		"too long":             {sendPath("orders"), map[string]any{"body": "x", "transaction": map[string]any{"checkAfterSeconds": 86401}}, nil},
		"unknown member":       {sendPath("orders"), map[string]any{"body": "x", "transaction": map[string]any{"checkAfterSeconds": 1, "x": 1}}, nil},
		"with a dedupKey":      {sendPath("orders"), map[string]any{"body": "x", "dedupKey": "d", "transaction": map[string]any{"checkAfterSeconds": 1}}, nil},
		"in a batch entry": {batchPath("orders"), map[string]any{"messages": []any{
			map[string]any{"body": "x", "transaction": map[string]any{"checkAfterSeconds": 1}}}}, nil},
		"bad raw header": {sendPath("orders"), "raw", hdr{"Content-Type": "application/octet-stream", "X-Tidemq-Transaction-Check-After": "soon"}},
		"bad check url":  {topicPath("orders"), map[string]any{"transactionCheckUrl": "not a url"}, nil},
	} {
		t.Run(name, func(t *testing.T) {
			method := http.MethodPost
			if tc.path == topicPath("orders") {
				method = http.MethodPut
			}
			wantProblem(t, c.on(t).do(method, tc.path, tc.body, tc.h), http.StatusBadRequest, "invalid_request")
		})
	}
}

// The check-back over real HTTP: the broker POSTs the check to the topic's
// transactionCheckUrl (webhook.Checker) and commits on "commit".
func TestE2ETransactionCheckBack(t *testing.T) {
	var mu sync.Mutex
	var asked []map[string]any
	producer := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		asked = append(asked, body)
		n := len(asked)
		mu.Unlock()
		status := "unknown"
		if n >= 2 {
			status = "commit"
		}
		fmt.Fprintf(w, `{"status":%q}`, status)
	}))
	t.Cleanup(producer.Close)
	ts := startServer(t, serverConfig{core: core.Options{TransactionChecker: webhook.NewChecker(webhook.CheckerOptions{})}})
	c := ts.client(t)
	wantStatus(t, c.do(http.MethodPut, topicPath("orders"), map[string]any{"queues": 1, "transactionCheckUrl": producer.URL}), http.StatusCreated)
	subscribe(c, "orders", "g")
	r := c.do(http.MethodPost, sendPath("orders"), map[string]any{"body": "checked", "transaction": map[string]any{"checkAfterSeconds": 1}},
		hdr{"X-Producer-Group": "pg"})
	wantStatus(t, r, http.StatusCreated)
	half := decode[halfReply](t, r)
	var got []pulledMessage
	// Checks at 1 s (unknown) and 2 s later (commit), within the timer
	// loop's 1 s scans.
	eventually(t, 10*time.Second, func() error {
		if got = c.pull("orders", "g", map[string]any{}); len(got) == 0 {
			return fmt.Errorf("not delivered yet")
		}
		return nil
	})
	if got[0].MessageID != half.MessageID || got[0].Body != "checked" {
		t.Fatalf("delivered %+v", got[0])
	}
	mu.Lock()
	defer mu.Unlock()
	if len(asked) != 2 || asked[0]["transactionId"] != half.TransactionID || asked[0]["topic"] != "orders" ||
		asked[0]["producerGroup"] != "pg" || asked[1]["check"] != float64(2) ||
		fmt.Sprint(asked[0]["messageIds"]) != fmt.Sprint([]any{half.MessageID}) {
		t.Fatalf("checks asked %v", asked)
	}
}

// SendOne (a single send's body) is SendMessage (a batch entry) plus
// transaction: the two must not drift apart.
func TestSendOneIsSendMessageWithTransaction(t *testing.T) {
	doc, err := gateway.LoadSpec()
	if err != nil {
		t.Fatal(err)
	}
	one, msg := doc.Components.Schemas["SendOne"].Value, doc.Components.Schemas["SendMessage"].Value
	if _, ok := one.Properties["transaction"]; !ok {
		t.Fatal("SendOne has no transaction")
	}
	if len(one.Properties) != len(msg.Properties)+1 || fmt.Sprint(one.Required) != fmt.Sprint(msg.Required) {
		t.Fatalf("SendOne has %d properties (required %v), SendMessage %d (required %v)", len(one.Properties), one.Required, len(msg.Properties), msg.Required)
	}
	for name, p := range msg.Properties {
		a, _ := json.Marshal(p)
		b, _ := json.Marshal(one.Properties[name])
		if string(a) != string(b) {
			t.Errorf("property %s: SendMessage %s, SendOne %s", name, a, b)
		}
	}
}

// The producer's check endpoint is down: every check fails (connection
// refused) until transactionMaxChecks, then the transaction is rolled back
// and the alert is POSTed to the topic's transactionAlertUrl.
func TestE2ETransactionCheckEndpointDown(t *testing.T) {
	down := httptest.NewServer(http.NotFoundHandler())
	downURL := down.URL
	down.Close() // nothing listens there any more
	alerts := make(chan map[string]any, 4)
	alertSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var a map[string]any
		_ = json.NewDecoder(r.Body).Decode(&a)
		alerts <- a
	}))
	t.Cleanup(alertSrv.Close)
	notifier := webhook.New(webhook.Options{})
	t.Cleanup(func() { _ = notifier.Close() })
	ts := startServer(t, serverConfig{core: core.Options{Notifier: notifier,
		TransactionChecker: webhook.NewChecker(webhook.CheckerOptions{Timeout: 2 * time.Second})}})
	c := ts.client(t)
	wantStatus(t, c.do(http.MethodPut, topicPath("orders"), map[string]any{"queues": 1, "transactionCheckUrl": downURL,
		"transactionMaxChecks": 2, "transactionAlertUrl": alertSrv.URL}), http.StatusCreated)
	subscribe(c, "orders", "g")
	r := c.do(http.MethodPost, sendPath("orders"), map[string]any{"body": "orphan", "transaction": map[string]any{"checkAfterSeconds": 1}},
		hdr{"X-Producer-Group": "pg"})
	wantStatus(t, r, http.StatusCreated)
	half := decode[halfReply](t, r)
	// Checks at 1 s and 2 s later, each failing; then the rollback.
	var a map[string]any
	select {
	case a = <-alerts:
	case <-time.After(15 * time.Second):
		t.Fatal("no alert within 15 s")
	}
	if a["alert"] != "transaction_check_limit" || a["status"] != "firing" || a["topic"] != "orders" || a["group"] != "pg" ||
		a["transactionId"] != half.TransactionID || a["value"] != float64(2) || a["max"] != float64(2) {
		t.Fatalf("alert %v", a)
	}
	r = c.do(http.MethodPost, txPath("orders", half.TransactionID, "rollback"), nil)
	wantStatus(t, r, http.StatusOK)
	if tx := decode[transactionReply](t, r); tx.State != core.TxRolledBack || tx.DecidedBy != "check_limit" || tx.Checks != 2 {
		t.Fatalf("after the last check %s", r)
	}
	wantProblem(t, c.do(http.MethodPost, txPath("orders", half.TransactionID, "commit"), nil), http.StatusConflict, "transaction_settled")
	if got := c.pull("orders", "g", map[string]any{}); len(got) != 0 {
		t.Fatalf("the rolled back message was delivered: %+v", got)
	}
}
