package loadtest

import (
	"strings"
	"testing"
)

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
