// Package wire writes the JSON documents that more than one package sends:
// the pulled message (a pull reply's entries, and the body a push
// subscription POSTs) and the timestamps in it. It depends on core only, so
// webhook and gateway share it without depending on each other.
package wire

import (
	"cmp"
	"encoding/binary"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"

	"github.com/tidemq/tidemq/core"
)

// TimeLayout is the API's timestamp: RFC 3339 with milliseconds, in UTC
// (openapi.yaml's Timestamp schema).
const TimeLayout = "2006-01-02T15:04:05.000Z07:00"

// AppendTime appends t as AppendFormat(TimeLayout) does in UTC, without
// reading the layout: every pulled message carries two times and every
// send result one, and the layout's parse was ~2% of a pull's CPU. Years
// outside 0–9999 (which the layout writes in other widths) take the slow
// path.
func AppendTime(dst []byte, t time.Time) []byte {
	t = t.UTC()
	year, month, day := t.Date()
	if year < 0 || year > 9999 {
		return t.AppendFormat(dst, TimeLayout)
	}
	hour, minute, sec := t.Clock()
	ms := t.Nanosecond() / 1e6
	two := func(v int) { dst = append(dst, byte('0'+v/10), byte('0'+v%10)) }
	two(year / 100)
	two(year % 100)
	dst = append(dst, '-')
	two(int(month))
	dst = append(dst, '-')
	two(day)
	dst = append(dst, 'T')
	two(hour)
	dst = append(dst, ':')
	two(minute)
	dst = append(dst, ':')
	two(sec)
	dst = append(dst, '.', byte('0'+ms/100))
	two(ms % 100)
	return append(dst, 'Z')
}

// Plain reports whether b goes into a JSON string as it is: ASCII with no
// control character, quote or backslash. Most bodies are (JSON text,
// identifiers, base64 made by clients), and copying them beat
// jsontext.AppendQuote's byte-by-byte check and escape (~1 µs per 1 KiB
// body, a tenth of a pull's CPU). Eight bytes at a time: a word has such a
// byte iff it has a high bit set, a byte below 0x20, or a zero byte after
// XOR with '"' or '\\' repeated (the has-less and has-zero bit tricks are
// exact about whether any byte qualifies, not about which).
func Plain(b []byte) bool {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	hasZero := func(x uint64) uint64 { return (x - ones) & ^x & highs }
	bad := func(x uint64) uint64 {
		return x | ((x - ones*0x20) & ^x) | hasZero(x^(ones*'"')) | hasZero(x^(ones*'\\'))
	}
	// Four independent words per branch: the CPU overlaps their arithmetic.
	for len(b) >= 32 {
		if (bad(binary.LittleEndian.Uint64(b))|bad(binary.LittleEndian.Uint64(b[8:]))|
			bad(binary.LittleEndian.Uint64(b[16:]))|bad(binary.LittleEndian.Uint64(b[24:])))&highs != 0 {
			return false
		}
		b = b[32:]
	}
	for len(b) >= 8 {
		if bad(binary.LittleEndian.Uint64(b))&highs != 0 {
			return false
		}
		b = b[8:]
	}
	for _, c := range b {
		if c < 0x20 || c >= 0x80 || c == '"' || c == '\\' {
			return false
		}
	}
	return true
}

// PulledMessage is the JSON of one delivered message (openapi.yaml's
// PulledMessage), exactly as a pull returns it; push deliveries POST the
// same document. The slice is the caller's.
func PulledMessage(d core.Delivered) []byte {
	return AppendPulled(nil, d)
}

// AppendPulled appends a delivered message's JSON to dst: fields in the
// schema's order, empty optional ones left out, property names sorted (as
// encoding/json writes a map), without reflection or a string copy of the
// body: a pull of 256 1 KiB messages spent as much CPU in encoding/json as
// in reading them from Pebble. The gateway's
// TestPulledJSONMatchesEncodingJSON holds it to encoding/json's output.
func AppendPulled(dst []byte, d core.Delivered) []byte {
	m := d.Message
	str := func(name, v string) {
		dst = append(dst, name...)
		dst, _ = jsontext.AppendQuote(dst, v)
	}
	str(`{"messageId":`, m.ID)
	str(`,"topic":`, d.Topic)
	dst = append(dst, `,"queueId":`...)
	dst = strconv.AppendUint(dst, uint64(m.QueueID), 10)
	dst = append(dst, `,"offset":`...)
	dst = strconv.AppendUint(dst, m.Offset, 10)
	dst = appendBody(dst, m)
	if m.Tag != "" {
		str(`,"tag":`, m.Tag)
	}
	if len(m.Keys) > 0 {
		dst = append(dst, `,"keys":[`...)
		for i, k := range m.Keys {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst, _ = jsontext.AppendQuote(dst, k)
		}
		dst = append(dst, ']')
	}
	if len(m.Properties) > 0 {
		dst = appendProperties(dst, m.Properties)
	}
	if m.ShardingKey != "" {
		str(`,"shardingKey":`, m.ShardingKey)
	}
	dst = append(dst, `,"bornAt":"`...)
	dst = AppendTime(dst, time.UnixMilli(m.BornAtMs))
	dst = append(dst, `","storedAt":"`...)
	dst = AppendTime(dst, time.UnixMilli(m.StoredAtMs))
	dst = append(dst, '"')
	if m.ProducerGroup != "" {
		str(`,"producerGroup":`, m.ProducerGroup)
	}
	if d.Attempt != 0 {
		dst = append(dst, `,"deliveryAttempt":`...)
		dst = strconv.AppendInt(dst, int64(d.Attempt), 10)
	}
	if d.ReceiptHandle != "" {
		str(`,"receiptHandle":`, d.ReceiptHandle)
	}
	if tp := cmp.Or(d.Traceparent, m.Traceparent); tp != "" {
		str(`,"traceparent":`, tp)
	}
	return append(dst, '}')
}

// appendBody writes the body and bodyEncoding members: base64 when the
// body was sent so or is not valid UTF-8, else as text.
func appendBody(dst []byte, m *core.Message) []byte {
	dst = append(dst, `,"body":`...)
	switch {
	case !m.BodyBase64 && Plain(m.Body):
		dst = append(dst, '"')
		dst = append(dst, m.Body...)
		return append(dst, `","bodyEncoding":"utf8"`...)
	case m.BodyBase64 || !utf8.Valid(m.Body):
		dst = append(dst, '"')
		dst = AppendBase64(dst, m.Body)
		return append(dst, `","bodyEncoding":"base64"`...)
	default:
		dst, _ = jsontext.AppendQuote(dst, m.Body)
		return append(dst, `,"bodyEncoding":"utf8"`...)
	}
}

// appendProperties writes the properties member, names sorted.
func appendProperties(dst []byte, props map[string]string) []byte {
	dst = append(dst, `,"properties":{`...)
	// On the stack for a few names.
	var buf [8]string
	names := buf[:0]
	for k := range props {
		names = append(names, k)
	}
	slices.Sort(names)
	for i, k := range names {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst, _ = jsontext.AppendQuote(dst, k)
		dst = append(dst, ':')
		dst, _ = jsontext.AppendQuote(dst, props[k])
	}
	return append(dst, '}')
}
