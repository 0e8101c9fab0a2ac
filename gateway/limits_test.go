package gateway

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
)

// The decoders' limits are the spec's: each case changes one bound in a
// copy of openapi.yaml to a value no literal in decode.go could have, and
// the decoders built from that copy must accept the body at the new bound
// and refuse the one past it.
func TestBodyLimitsFollowTheSpec(t *testing.T) {
	u := func(v uint64) *uint64 { return &v }
	f := func(v float64) *float64 { return &v }
	prop := func(doc *openapi3.T, schema, name string) *openapi3.Schema {
		return doc.Components.Schemas[schema].Value.Properties[name].Value
	}
	send := func(l *bodyLimits, b string) error { _, err := l.decodeSend([]byte(b)); return err }
	batch := func(l *bodyLimits, b string) error { _, _, err := l.decodeBatch([]byte(b)); return err }
	pull := func(l *bodyLimits, b string) error { _, err := l.decodePull([]byte(b)); return err }
	ack := func(l *bodyLimits, b string) error { _, err := l.decodeAck([]byte(b)); return err }
	for _, tc := range []struct {
		name           string
		change         func(doc *openapi3.T)
		decode         func(*bodyLimits, string) error
		accept, refuse []string
	}{
		{"keys maxItems", func(d *openapi3.T) { prop(d, "SendMessage", "keys").MaxItems = u(2) }, send,
			[]string{`{"body":"","keys":["a","b"]}`}, []string{`{"body":"","keys":["a","b","c"]}`}},
		{"key length", func(d *openapi3.T) {
			k := prop(d, "SendMessage", "keys").Items.Value
			k.MinLength, k.MaxLength = 2, u(3)
		}, send,
			[]string{`{"body":"","keys":["ab","abc"]}`}, []string{`{"body":"","keys":["a"]}`, `{"body":"","keys":["abcd"]}`}},
		{"shardingKey maxLength", func(d *openapi3.T) { prop(d, "SendMessage", "shardingKey").MaxLength = u(3) }, send,
			[]string{`{"body":"","shardingKey":"abc"}`}, []string{`{"body":"","shardingKey":"abcd"}`}},
		{"dedupKey maxLength", func(d *openapi3.T) { prop(d, "SendMessage", "dedupKey").MaxLength = u(3) }, send,
			[]string{`{"body":"","dedupKey":"abc"}`}, []string{`{"body":"","dedupKey":"abcd"}`}},
		{"tag pattern", func(d *openapi3.T) { d.Components.Schemas["Tag"].Value.Pattern = `^[^|\s]{2,3}$` }, send,
			[]string{`{"body":"","tag":"ab"}`, `{"body":"","tag":"abc"}`}, []string{`{"body":"","tag":"a"}`, `{"body":"","tag":"abcd"}`}},
		{"delaySeconds range", func(d *openapi3.T) { p := prop(d, "SendMessage", "delaySeconds"); p.Min, p.Max = f(2), f(5) }, send,
			[]string{`{"body":"","delaySeconds":2}`, `{"body":"","delaySeconds":5}`}, []string{`{"body":"","delaySeconds":1}`, `{"body":"","delaySeconds":6}`}},
		{"bodyEncoding enum", func(d *openapi3.T) { prop(d, "SendMessage", "bodyEncoding").Enum = []any{"utf8"} }, send,
			[]string{`{"body":"","bodyEncoding":"utf8"}`}, []string{`{"body":"","bodyEncoding":"base64"}`}},
		{"batch items", func(d *openapi3.T) { p := prop(d, "SendBatch", "messages"); p.MinItems, p.MaxItems = 2, u(3) }, batch,
			[]string{`{"messages":[{"body":""},{"body":""}]}`, `{"messages":[{"body":""},{"body":""},{"body":""}]}`},
			[]string{`{"messages":[{"body":""}]}`, `{"messages":[{"body":""},{"body":""},{"body":""},{"body":""}]}`}},
		{"maxMessages maximum", func(d *openapi3.T) { prop(d, "PullRequest", "maxMessages").Max = f(5) }, pull,
			[]string{`{"maxMessages":5}`}, []string{`{"maxMessages":6}`}},
		{"waitSeconds maximum", func(d *openapi3.T) { prop(d, "PullRequest", "waitSeconds").Max = f(2) }, pull,
			[]string{`{"waitSeconds":2}`}, []string{`{"waitSeconds":3}`}},
		{"invisibleSeconds minimum", func(d *openapi3.T) { prop(d, "PullRequest", "invisibleSeconds").Min = f(10) }, pull,
			[]string{`{"invisibleSeconds":10}`}, []string{`{"invisibleSeconds":9}`}},
		{"consumerId maxLength", func(d *openapi3.T) { prop(d, "PullRequest", "consumerId").MaxLength = u(3) }, pull,
			[]string{`{"consumerId":"abc"}`}, []string{`{"consumerId":"abcd"}`}},
		{"receiptHandles maxItems", func(d *openapi3.T) { d.Components.Schemas["ReceiptHandles"].Value.MaxItems = u(2) }, ack,
			[]string{`{"receiptHandles":["a","b"]}`}, []string{`{"receiptHandles":["a","b","c"]}`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			doc, err := LoadSpec()
			if err != nil {
				t.Fatal(err)
			}
			tc.change(doc)
			changed, err := json.Marshal(doc)
			if err != nil {
				t.Fatal(err)
			}
			l, err := readBodyLimits(changed)
			if err != nil {
				t.Fatal(err)
			}
			for _, b := range tc.accept {
				if err := tc.decode(l, b); err != nil {
					t.Errorf("%s: refused (%v); the changed spec allows it", b, err)
				}
			}
			for _, b := range tc.refuse {
				if err := tc.decode(l, b); err == nil {
					t.Errorf("%s: accepted; the changed spec refuses it", b)
				}
			}
		})
	}
}

// The embedded spec's limits, as the decoders read them, are the numbers
// openapi.yaml writes.
func TestSpecLimitsAreOpenAPIYAMLs(t *testing.T) {
	l, err := specLimits()
	if err != nil {
		t.Fatal(err)
	}
	doc, err := LoadSpec()
	if err != nil {
		t.Fatal(err)
	}
	schema := func(name string) *openapi3.Schema { return doc.Components.Schemas[name].Value }
	prop := func(s, name string) *openapi3.Schema { return schema(s).Properties[name].Value }
	keys := prop("SendMessage", "keys")
	for _, c := range []struct {
		what      string
		got, want any
	}{
		{"keys", l.keys, itemCount{int(keys.MinItems), int(*keys.MaxItems)}},
		{"key", l.key, textLength{int(keys.Items.Value.MinLength), int(*keys.Items.Value.MaxLength)}},
		{"shardingKey", l.shardingKey.max, int(*prop("SendMessage", "shardingKey").MaxLength)},
		{"dedupKey", l.dedupKey.max, int(*prop("SendMessage", "dedupKey").MaxLength)},
		{"tag", fmt.Sprintf(`^[^|\s]{%d,%d}$`, l.tag.min, l.tag.max), schema("Tag").Pattern},
		{"delaySeconds", l.delaySeconds, intRange{int64(*prop("SendMessage", "delaySeconds").Min), int64(*prop("SendMessage", "delaySeconds").Max)}},
		{"bodyEncoding", fmt.Sprint(l.bodyEncodings), fmt.Sprint(prop("SendMessage", "bodyEncoding").Enum)},
		{"batch", l.batch.max, int(*prop("SendBatch", "messages").MaxItems)},
		{"maxMessages", l.maxMessages.hi, int64(*prop("PullRequest", "maxMessages").Max)},
		{"waitSeconds", l.waitSeconds.hi, int64(*prop("PullRequest", "waitSeconds").Max)},
		{"invisibleSeconds", l.invisible, intRange{int64(*prop("PullRequest", "invisibleSeconds").Min), int64(*prop("PullRequest", "invisibleSeconds").Max)}},
		{"consumerId", l.consumerID.max, int(*prop("PullRequest", "consumerId").MaxLength)},
		{"receiptHandles", l.handles, itemCount{int(schema("ReceiptHandles").MinItems), int(*schema("ReceiptHandles").MaxItems)}},
	} {
		if c.got != c.want {
			t.Errorf("%s: decoder %v, openapi.yaml %v", c.what, c.got, c.want)
		}
	}
}

// A spec without a bound the decoders need is refused, not read as "no
// limit".
func TestBodyLimitsNeedEveryBound(t *testing.T) {
	doc, err := LoadSpec()
	if err != nil {
		t.Fatal(err)
	}
	doc.Components.Schemas["SendBatch"].Value.Properties["messages"].Value.MaxItems = nil
	changed, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := readBodyLimits(changed); err == nil || !strings.Contains(err.Error(), "SendBatch.messages has no maxItems") {
		t.Fatalf("readBodyLimits without SendBatch.messages.maxItems: %v", err)
	}
}
