package sdk_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/tidemq/tidemq/sdk"
)

// TestTransactionCheckHandler drives the check handler over real HTTP as the
// broker does: the check it decodes, the status it answers, and the problems
// for what is not a check or a check that failed.
func TestTransactionCheckHandler(t *testing.T) {
	var (
		mu  sync.Mutex
		got []sdk.TransactionCheck
	)
	answers := map[string]struct {
		status sdk.TransactionStatus
		err    error
	}{
		"tx-commit":   {sdk.TransactionCommit, nil},
		"tx-rollback": {sdk.TransactionRollback, nil},
		"tx-unknown":  {sdk.TransactionUnknown, nil},
		"tx-error":    {"", errors.New("database is locked")},
		"tx-bad":      {"maybe", nil},
	}
	srv := httptest.NewServer(sdk.TransactionCheckHandler(func(ctx context.Context, c sdk.TransactionCheck) (sdk.TransactionStatus, error) {
		mu.Lock()
		got = append(got, c)
		mu.Unlock()
		a := answers[c.TransactionID]
		return a.status, a.err
	}))
	defer srv.Close()
	post := func(t *testing.T, method, ctype, body string) (int, string, map[string]any) {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), method, srv.URL, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if ctype != "" {
			req.Header.Set("Content-Type", ctype)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		data, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		var out map[string]any
		if err := json.Unmarshal(data, &out); err != nil {
			t.Fatalf("%s: reply %q is not JSON: %v", method, data, err)
		}
		return resp.StatusCode, resp.Header.Get("Content-Type"), out
	}
	check := func(id string) string {
		b, _ := json.Marshal(map[string]any{"topic": "orders", "transactionId": id, "messageIds": []string{"m1", "m2"}, "producerGroup": "checkout", "check": 3})
		return string(b)
	}

	for _, c := range []struct {
		id, want string
	}{{"tx-commit", "commit"}, {"tx-rollback", "rollback"}, {"tx-unknown", "unknown"}} {
		status, ctype, out := post(t, "POST", "application/json", check(c.id))
		if status != 200 || ctype != "application/json" || out["status"] != c.want {
			t.Errorf("check %s: %d %s %v, want 200 {status:%s}", c.id, status, ctype, out, c.want)
		}
	}
	mu.Lock()
	first := got[0]
	mu.Unlock()
	want := sdk.TransactionCheck{Topic: "orders", TransactionID: "tx-commit", MessageIDs: []string{"m1", "m2"}, ProducerGroup: "checkout", Check: 3}
	if first.Topic != want.Topic || first.TransactionID != want.TransactionID || strings.Join(first.MessageIDs, ",") != "m1,m2" ||
		first.ProducerGroup != want.ProducerGroup || first.Check != want.Check {
		t.Errorf("decoded check %+v, want %+v", first, want)
	}

	for _, c := range []struct {
		name, method, ctype, body string
		status                    int
		code                      string
	}{
		{"check error", "POST", "application/json", check("tx-error"), 500, "internal"},
		{"bad status", "POST", "application/json", check("tx-bad"), 500, "internal"},
		{"not JSON", "POST", "application/json", "{", 400, "invalid_request"},
		{"no id", "POST", "application/json", `{"topic":"orders","check":1}`, 400, "invalid_request"},
		{"wrong type", "POST", "application/json", `{"transactionId":7}`, 400, "invalid_request"},
		{"text", "POST", "text/plain", check("tx-commit"), 415, "unsupported_media_type"},
		{"GET", "GET", "", "", 405, "method_not_allowed"},
	} {
		t.Run(c.name, func(t *testing.T) {
			status, ctype, out := post(t, c.method, c.ctype, c.body)
			if status != c.status || ctype != "application/problem+json" || out["code"] != c.code {
				t.Errorf("%d %s %v, want %d problem %s", status, ctype, out, c.status, c.code)
			}
			if c.code == "internal" && strings.Contains(out["detail"].(string), "locked") {
				t.Errorf("the problem shows the check's error: %v", out)
			}
		})
	}
}
