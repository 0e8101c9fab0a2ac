package gateway

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/tidemq/tidemq/core"
)

// referencePullReply is a pull reply as encoding/json writes it without
// HTML escaping, U+2028 and U+2029 left as they are (jsontext escapes
// neither): the document pullReplyJSON must write byte for byte.
func referencePullReply(t *testing.T, got []core.Delivered) []byte {
	t.Helper()
	out := struct {
		Messages []messageJSON `json:"messages"`
	}{Messages: make([]messageJSON, len(got))}
	for i, d := range got {
		out.Messages[i] = pulledOut(d)
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(out); err != nil {
		t.Fatal(err)
	}
	return []byte(strings.NewReplacer(`\u2028`, "\u2028", `\u2029`, "\u2029").Replace(strings.TrimSuffix(b.String(), "\n")))
}

// randomDelivered is a delivered message with random contents: text
// bodies with quotes, backslashes, control characters and non-ASCII,
// binary bodies (invalid UTF-8, or sent as base64) of every length up to
// 2 KiB, empty bodies; tags, keys, properties, traceparents sometimes.
func randomDelivered(r *rand.Rand, i int) core.Delivered {
	text := func() string {
		pieces := []string{"a", "tidemq", "\"", "\\", "\n", "\t", "\x00", "\x01", "\x1f", "\x7f", "é", "日本", "\u2028", "\u2029", "😀", "<&>", "/", " "}
		var b strings.Builder
		for range r.IntN(16) {
			b.WriteString(pieces[r.IntN(len(pieces))])
		}
		return b.String()
	}
	m := &core.Message{ID: "id" + itoa(int64(i)), QueueID: uint32(r.IntN(8)), Offset: r.Uint64N(1 << 40),
		BornAtMs: 1_790_000_000_000 + r.Int64N(1e9), StoredAtMs: 1_790_000_000_000 + r.Int64N(1e9)}
	switch r.IntN(4) {
	case 0:
		m.Body = []byte(text())
	case 1:
		m.Body = make([]byte, r.IntN(2049))
		for j := range m.Body {
			m.Body[j] = byte(r.Uint32())
		}
		m.BodyBase64 = r.IntN(2) == 0
	case 2:
		m.Body = []byte(strings.Repeat("plain ASCII body 0123456789 ", r.IntN(80)))
	}
	if r.IntN(2) == 0 {
		m.Tag, m.ShardingKey, m.ProducerGroup = text(), text(), text()
		m.Keys = []string{text(), text()}
		m.Properties = map[string]string{"loadtest.run": text(), "k\"ey": text(), text(): text()}
	}
	d := core.Delivered{Topic: "orders", Message: m, Attempt: r.IntN(4), ReceiptHandle: "rh" + itoa(int64(i))}
	if r.IntN(3) == 0 {
		m.Traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	}
	if r.IntN(3) == 0 {
		d.Traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	}
	return d
}

// TestPullReplyMatchesEncodingJSON writes replies of random messages, in a
// reused buffer as pull does, and compares them byte for byte with
// encoding/json's.
func TestPullReplyMatchesEncodingJSON(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	buf := []byte("left over from the previous reply")
	for n := range 200 {
		got := make([]core.Delivered, n%40)
		for i := range got {
			got[i] = randomDelivered(r, i)
		}
		buf = pullReplyJSON(buf[:0], got)
		if want := referencePullReply(t, got); !bytes.Equal(buf, want) {
			i := 0
			for i < min(len(buf), len(want)) && buf[i] == want[i] {
				i++
			}
			t.Fatalf("reply %d differs at byte %d:\n got  …%q\n want …%q", n, i, buf[i:min(len(buf), i+80)], want[i:min(len(want), i+80)])
		}
	}
}
