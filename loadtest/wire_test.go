package loadtest

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestSendBodyTransaction: the lean client's hand-written half-message
// bodies are the JSON the API takes, with the transaction where it goes.
func TestSendBodyTransaction(t *testing.T) {
	for _, c := range []struct {
		n         int
		batch, tx bool
	}{{1, false, false}, {1, false, true}, {3, true, false}, {3, true, true}} {
		raw := sendBody(c.n, c.batch, c.tx, "abc", "run1", 42)
		var v struct {
			Body        string
			Messages    []struct{ Body string }
			Transaction *struct{ CheckAfterSeconds int }
		}
		if err := json.Unmarshal(raw, &v); err != nil {
			t.Fatalf("%+v: %s: %v", c, raw, err)
		}
		if c.batch && len(v.Messages) != c.n || !c.batch && v.Body != "abc" {
			t.Errorf("%+v: %s", c, raw)
		}
		if got := v.Transaction != nil && v.Transaction.CheckAfterSeconds == txCheckAfterSeconds; got != c.tx {
			t.Errorf("%+v: transaction %+v in %s", c, v.Transaction, raw)
		}
	}
}

func TestDecodePull(t *testing.T) {
	const reply = `{"messages":[
		{"messageId":"m1","body":"aGVsbG8=","bodyEncoding":"base64","deliveryAttempt":2,"receiptHandle":"h1",
		 "properties":{"loadtest.run":"r1","loadtest.sentAt":"123","other":"x"},"keys":["a","b"]},
		{"messageId":"m2","body":"with \"quotes\" and \\ and \u00e9","deliveryAttempt":1,"receiptHandle":"h\u00322"}]}`
	var res pullResult
	if err := decodePull(strings.NewReader(reply), &res); err != nil {
		t.Fatal(err)
	}
	if len(res.Messages) != 2 {
		t.Fatalf("%d messages, want 2", len(res.Messages))
	}
	m := res.Messages[0]
	if m.DeliveryAttempt != 2 || m.ReceiptHandle != "h1" || m.Properties.Run != "r1" || m.Properties.SentAt != "123" {
		t.Errorf("first message %+v", m)
	}
	if m := res.Messages[1]; m.ReceiptHandle != "h22" || m.DeliveryAttempt != 1 || m.Properties.Run != "" {
		t.Errorf("second message %+v (escapes must be decoded)", m)
	}

	for _, bad := range []string{
		``, `{"messages":[{"deliveryAttempt":1,"receiptHandle":"h"}`, `{"messages":{}}`, `{}`,
		`{"messages":[{"deliveryAttempt":"1","receiptHandle":"h"}]}`, `{"messages":[{"deliveryAttempt":1}]}`,
		`{"messages":[{"deliveryAttempt":1,"receiptHandle":"unterminated}]}`,
	} {
		if err := decodePull(strings.NewReader(bad), &res); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}
