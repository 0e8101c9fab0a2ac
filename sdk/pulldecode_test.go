package sdk

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"
)

// decodeBoth decodes data with decodePullResult and with json.Unmarshal,
// and fails t unless the two agree (both results, and whether each
// failed).
func decodeBoth(t testing.TB, data []byte) {
	t.Helper()
	var got, want PullResult
	gotErr := decodePullResult(data, &got)
	wantErr := json.Unmarshal(data, &want)
	if (gotErr == nil) != (wantErr == nil) {
		t.Fatalf("%q: error %v, encoding/json's %v", data, gotErr, wantErr)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%q:\n got %+v\nwant %+v", data, got, want)
	}
}

// randomMessage is a pulled message with random contents: text with
// quotes, backslashes, control characters, non-ASCII and U+2028, or
// base64 bodies; some optional members left out.
func randomMessage(r *rand.Rand, i int) PulledMessage {
	text := func() string {
		pieces := []string{"a", "tidemq", "\"", "\\", "\n", "\x01", "\x1f", "é", "日本", "\u2028", "😀", "<&>", "/", " ", "\x7f"}
		var b strings.Builder
		for range r.IntN(12) {
			b.WriteString(pieces[r.IntN(len(pieces))])
		}
		return b.String()
	}
	body := make([]byte, r.IntN(2048))
	for j := range body {
		body[j] = byte(r.Uint32())
	}
	m := PulledMessage{
		MessageID: fmt.Sprintf("id%d", i), Topic: "orders", QueueID: r.IntN(8), Offset: r.Int64N(1 << 40),
		Body: base64.StdEncoding.EncodeToString(body), BodyEncoding: EncodingBase64,
		BornAt:   time.UnixMilli(1_790_000_000_000 + r.Int64N(1e9)).UTC(),
		StoredAt: time.UnixMilli(1_790_000_000_000 + r.Int64N(1e9)).UTC(), DeliveryAttempt: 1 + r.IntN(5),
		ReceiptHandle: fmt.Sprintf("rh-%d-%d", i, r.Uint64()),
	}
	if r.IntN(2) == 0 {
		m.Body, m.BodyEncoding = text(), EncodingUTF8
	}
	if r.IntN(3) == 0 {
		m.Body = "" // empty bodies
	}
	if r.IntN(2) == 0 {
		m.Tag, m.ShardingKey, m.ProducerGroup, m.Traceparent = text(), text(), text(), "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	}
	if r.IntN(2) == 0 {
		m.Keys = []string{text(), text()}
	}
	if r.IntN(2) == 0 {
		m.Properties = map[string]string{"loadtest.run": text(), "k\"ey": text(), text(): "v"}
	}
	return m
}

// TestPullResultDecodesAsEncodingJSON decodes replies of random messages,
// as encoding/json and as the broker write them (the broker's escapes
// fewer characters), and every variation of one reply the reader declines
// or must reject: each decodes as encoding/json decodes it.
func TestPullResultDecodesAsEncodingJSON(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for n := range 300 {
		msgs := make([]PulledMessage, n%20)
		for i := range msgs {
			msgs[i] = randomMessage(r, i)
		}
		data, err := json.Marshal(PullResult{Messages: msgs})
		if err != nil {
			t.Fatal(err)
		}
		decodeBoth(t, data)
		// The broker writes <, > and & as they are, and a newline after.
		unescaped := []byte(strings.NewReplacer(`\u003c`, "<", `\u003e`, ">", `\u0026`, "&").Replace(string(data)))
		decodeBoth(t, append(unescaped, '\n'))
	}

	const one = `{"messageId":"m1","topic":"t","queueId":3,"offset":42,"body":"aGk=","bodyEncoding":"base64","tag":"x",` +
		`"keys":["a","b"],"properties":{"p":"1","q":"2"},"shardingKey":"s","bornAt":"2026-12-02T01:01:22.123Z",` +
		`"storedAt":"2026-12-02T01:01:22.125Z","producerGroup":"g","deliveryAttempt":2,"receiptHandle":"rh","traceparent":"tp"}`
	reply := `{"messages":[` + one + `,` + one + `]}`
	decodeBoth(t, []byte(reply))
	// Every prefix: cut short replies fail.
	for i := range len(reply) {
		decodeBoth(t, []byte(reply[:i]))
	}
	for _, c := range []struct{ old, new string }{
		{`"queueId":3`, `"queueId":3.0`}, {`"queueId":3`, `"queueId":3e0`}, {`"queueId":3`, `"queueId":-3`},
		{`"queueId":3`, `"queueId":03`}, {`"queueId":3`, `"queueId":"3"`}, {`"queueId":3`, `"queueId":null`},
		{`"offset":42`, `"offset":12345678901234567890`}, {`"offset":42`, `"offset":-0`}, {`"offset":42`, `"offset":1234567890123456789`},
		{`"tag":"x"`, `"tag":null`}, {`"tag":"x"`, `"TAG":"y"`}, {`"tag":"x"`, `"unknown":{"a":[1]}`},
		{`"tag":"x"`, `"tag":"x","tag":"y"`}, {`"tag":"x"`, `"t\u0061g":"y"`}, {`"tag":"x"`, `"tag":"\ud83d\ude00\ud800x\u00e9\/"`},
		{`"tag":"x"`, "\"tag\":\"\xff\xfe\""}, {`"tag":"x"`, "\"tag\":\"a\x01\""}, {`"tag":"x"`, `"tag":"a\q"`},
		{`"keys":["a","b"]`, `"keys":[]`}, {`"keys":["a","b"]`, `"keys":null`}, {`"keys":["a","b"]`, `"keys":["a",null]`},
		{`"keys":["a","b"]`, `"keys":["a","b"],"keys":["c"]`}, {`"keys":["a","b"]`, `"keys":["a",]`},
		{`"properties":{"p":"1","q":"2"}`, `"properties":{}`}, {`"properties":{"p":"1","q":"2"}`, `"properties":{"p":"1"},"properties":{"q":"2"}`},
		{`"properties":{"p":"1","q":"2"}`, `"properties":{"p":"1","p":"2"}`}, {`"properties":{"p":"1","q":"2"}`, `"properties":{"p":1}`},
		{`"properties":{"p":"1","q":"2"}`, `"properties":{"\u00e9":"1"}`}, {`"properties":{"p":"1","q":"2"}`, `"properties":null`},
		{`"bornAt":"2026-12-02T01:01:22.123Z"`, `"bornAt":"2026-12-02T01:01:22+05:30"`},
		{`"bornAt":"2026-12-02T01:01:22.123Z"`, `"bornAt":"2026-02-30T01:01:22.123Z"`},
		{`"bornAt":"2026-12-02T01:01:22.123Z"`, `"bornAt":"2026-12-02T24:01:22.123Z"`},
		{`"bornAt":"2026-12-02T01:01:22.123Z"`, `"bornAt":"2024-02-29T23:59:59.999Z"`},
		{`"bornAt":"2026-12-02T01:01:22.123Z"`, `"bornAt":"2026-12-02T01:01:60.000Z"`},
		{`"bornAt":"2026-12-02T01:01:22.123Z"`, `"bornAt":"2026-1a-02T01:01:22.123Z"`},
		{`"bornAt":"2026-12-02T01:01:22.123Z"`, `"bornAt":null`}, {`"bornAt":"2026-12-02T01:01:22.123Z"`, `"bornAt":"yesterday"`},
		{`"bodyEncoding":"base64"`, `"bodyEncoding":"rot13"`}, {`"topic":"t"`, `"topic":"t\n"`},
		{`"messageId":"m1",`, ``}, {`:`, ` : `}, {`,`, " ,\n\t"},
	} {
		decodeBoth(t, []byte(strings.Replace(reply, c.old, c.new, 1)))
		decodeBoth(t, []byte(strings.ReplaceAll(reply, c.old, c.new)))
	}
	for _, s := range []string{``, `null`, `{}`, `[]`, `{"messages":null}`, `{"messages":[]}`, `{"messages":[{}]}`, `{"Messages":[]}`,
		`{"messages":[],"messages":[]}`, `{"messages":[]}x`, `{"messages":[]} `, ` {"messages":[ ]} `, `{"messages":[],"next":1}`,
		`{"messages":[` + one + `]`, `{"messages":[` + one + `,]}`, `{"messages":[1]}`} {
		decodeBoth(t, []byte(s))
	}
}

// TestPullResultReadsTheBrokersShape checks the hand-written reader, not
// encoding/json, takes a reply as the broker writes it: text and base64
// bodies, properties, escapes in a body.
func TestPullResultReadsTheBrokersShape(t *testing.T) {
	reply := `{"messages":[{"messageId":"3Cx9","topic":"orders","queueId":3,"offset":7,"body":"aGk=","bodyEncoding":"base64",` +
		`"properties":{"loadtest.run":"r1"},"bornAt":"2026-12-02T01:01:22.123Z","storedAt":"2026-12-02T01:01:22.125Z",` +
		`"deliveryAttempt":1,"receiptHandle":"AAEC"},{"messageId":"3Cxa","topic":"orders","queueId":3,"offset":8,` +
		`"body":"{\"a\":\"日本\"}\n","bodyEncoding":"utf8","keys":["k"],"bornAt":"2026-12-02T01:01:22.123Z",` +
		`"storedAt":"2026-12-02T01:01:22.125Z","deliveryAttempt":2,"receiptHandle":"AAED"}]}` + "\n"
	p := pullParser{d: []byte(reply)}
	msgs, ok := p.reply()
	if !ok || len(msgs) != 2 {
		t.Fatalf("the reader declined the broker's reply (%v, %d messages)", ok, len(msgs))
	}
	if msgs[1].Body != "{\"a\":\"日本\"}\n" || msgs[0].Properties["loadtest.run"] != "r1" || msgs[0].Topic != "orders" ||
		msgs[0].StoredAt != time.Date(2026, 12, 2, 1, 1, 22, 125e6, time.UTC) {
		t.Errorf("read %+v", msgs)
	}
	decodeBoth(t, []byte(reply))
}

// TestPrintable compares the word-at-a-time check with the byte rule for
// every byte value at every position of strings up to 24 bytes.
func TestPrintable(t *testing.T) {
	for n := 0; n <= 24; n++ {
		for pos := 0; pos < max(n, 1); pos++ {
			for c := 0; c < 256; c++ {
				b := bytes.Repeat([]byte{'a'}, n)
				if n > 0 {
					b[pos] = byte(c)
				}
				want := n == 0 || (c >= 0x20 && c < 0x80)
				if got := printable(b); got != want {
					t.Fatalf("printable(%q) = %v, want %v", b, got, want)
				}
			}
		}
	}
}

func FuzzPullResult(f *testing.F) {
	r := rand.New(rand.NewPCG(1, 2))
	for n := range 4 {
		msgs := make([]PulledMessage, n)
		for i := range msgs {
			msgs[i] = randomMessage(r, i)
		}
		data, _ := json.Marshal(PullResult{Messages: msgs})
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) { decodeBoth(t, data) })
}

func BenchmarkPullResult(b *testing.B) {
	r := rand.New(rand.NewPCG(3, 4))
	msgs := make([]PulledMessage, 256)
	// What the load tester's plain client pulls: 1 KiB binary bodies, two
	// properties.
	for i := range msgs {
		body := make([]byte, 1024)
		for j := range body {
			body[j] = byte(r.Uint32())
		}
		msgs[i] = PulledMessage{MessageID: fmt.Sprintf("3Cx9yZQ2kLmNpQrStUv%03d", i), Topic: "loadtest-pull-1234abcd", QueueID: i % 8, Offset: int64(i),
			Body: base64.StdEncoding.EncodeToString(body), BodyEncoding: EncodingBase64,
			Properties: map[string]string{"loadtest.run": "fill-1234abcd", "loadtest.sentAt": "1790000000123456789"},
			BornAt:     time.UnixMilli(1_790_000_000_000).UTC(), StoredAt: time.UnixMilli(1_790_000_000_002).UTC(),
			DeliveryAttempt: 1, ReceiptHandle: "AAAAAAAAAQIDBAUGBwgJCgsMDQ4PEBESExQVFhcYGRobHB0eHyA"}
	}
	data, _ := json.Marshal(PullResult{Messages: msgs})
	b.SetBytes(int64(len(data)))
	b.Run("decodePullResult", func(b *testing.B) {
		for b.Loop() {
			var res PullResult
			if err := decodePullResult(data, &res); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("json.Unmarshal", func(b *testing.B) {
		for b.Loop() {
			var res PullResult
			if err := json.Unmarshal(data, &res); err != nil {
				b.Fatal(err)
			}
		}
	})
}
