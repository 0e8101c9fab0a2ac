package sdk

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"time"
	"unicode/utf8"
)

// A pull reply is mostly bodies: 256 messages of 1 KiB are ~450 KB, which
// json.Unmarshal scans once to validate, again to decode, and decodes by
// reflection, at more CPU than the broker took to read and write them.
// The Client reads the reply's usual shape by hand instead, in one strict
// pass; anything else goes to json.Unmarshal, which then decides, so that
// the result and the errors are its own. (As a json.Unmarshaler it would
// save encoding/json's users nothing: encoding/json scans the whole value
// before handing it over.)

// decodePullResult reads a pull reply into r as json.Unmarshal does.
func decodePullResult(data []byte, r *PullResult) error {
	if r.Messages == nil {
		// Into existing messages encoding/json decodes field by field,
		// keeping what the reply leaves out: left to it.
		p := pullParser{d: data}
		if msgs, ok := p.reply(); ok {
			r.Messages = msgs
			return nil
		}
	}
	return json.Unmarshal(data, r)
}

// pullParser reads one pull reply from d. Each method returns false for
// anything outside the shape the broker writes (and then the whole reply
// goes to encoding/json); what it accepts is valid JSON, decoded as
// encoding/json decodes it.
type pullParser struct {
	d     []byte
	i     int
	topic string    // the previous message's: one string for all
	names [8]string // property names seen, likewise
}

func (p *pullParser) ws() {
	for p.i < len(p.d) {
		switch p.d[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

// byte consumes c after any whitespace.
func (p *pullParser) byte(c byte) bool {
	p.ws()
	if p.i < len(p.d) && p.d[p.i] == c {
		p.i++
		return true
	}
	return false
}

// peek is the next byte after whitespace, or 0 at the end.
func (p *pullParser) peek() byte {
	p.ws()
	if p.i < len(p.d) {
		return p.d[p.i]
	}
	return 0
}

func (p *pullParser) reply() ([]PulledMessage, bool) {
	if !p.byte('{') {
		return nil, false
	}
	key, ok := p.raw()
	if !ok || string(key) != "messages" || !p.byte(':') || !p.byte('[') {
		return nil, false
	}
	msgs := []PulledMessage{}
	if p.peek() != ']' {
		for {
			msgs = append(msgs, PulledMessage{})
			if !p.message(&msgs[len(msgs)-1]) {
				return nil, false
			}
			if !p.byte(',') {
				break
			}
		}
	}
	// The one member: a second "messages" would decode into the first's
	// messages, which encoding/json does its way.
	if !p.byte(']') || !p.byte('}') {
		return nil, false
	}
	p.ws()
	return msgs, p.i == len(p.d)
}

// message reads one PulledMessage object. A member given twice is taken
// the second time, as encoding/json does (properties merging).
func (p *pullParser) message(m *PulledMessage) bool {
	if !p.byte('{') {
		return false
	}
	if p.peek() == '}' {
		p.i++
		return true
	}
	for {
		key, ok := p.raw()
		if !ok || !p.byte(':') {
			return false
		}
		p.ws()
		switch string(key) {
		case "messageId":
			ok = p.str(&m.MessageID)
		case "topic":
			var b []byte
			if b, ok = p.raw(); ok {
				if string(b) != p.topic {
					p.topic = string(b)
				}
				m.Topic = p.topic
			}
		case "queueId":
			ok = p.intField(&m.QueueID)
		case "offset":
			m.Offset, ok = p.int()
		case "body":
			ok = p.str(&m.Body)
		case "bodyEncoding":
			var b []byte
			if b, ok = p.raw(); ok {
				switch string(b) {
				case EncodingBase64:
					m.BodyEncoding = EncodingBase64
				case EncodingUTF8:
					m.BodyEncoding = EncodingUTF8
				default:
					m.BodyEncoding = string(b)
				}
			}
		case "tag":
			ok = p.str(&m.Tag)
		case "keys":
			ok = p.keys(m)
		case "properties":
			ok = p.properties(m)
		case "shardingKey":
			ok = p.str(&m.ShardingKey)
		case "bornAt":
			ok = p.time(&m.BornAt)
		case "storedAt":
			ok = p.time(&m.StoredAt)
		case "producerGroup":
			ok = p.str(&m.ProducerGroup)
		case "deliveryAttempt":
			ok = p.intField(&m.DeliveryAttempt)
		case "receiptHandle":
			ok = p.str(&m.ReceiptHandle)
		case "traceparent":
			ok = p.str(&m.Traceparent)
		default:
			// Unknown members (and names in other cases, which
			// encoding/json matches too) are its business.
			return false
		}
		if !ok {
			return false
		}
		if !p.byte(',') {
			return p.byte('}')
		}
	}
}

func (p *pullParser) keys(m *PulledMessage) bool {
	if !p.byte('[') {
		return false // null among them
	}
	keys := []string{}
	if p.peek() != ']' {
		for {
			var k string
			p.ws()
			if !p.str(&k) {
				return false
			}
			keys = append(keys, k)
			if !p.byte(',') {
				break
			}
		}
	}
	m.Keys = keys
	return p.byte(']')
}

func (p *pullParser) properties(m *PulledMessage) bool {
	if !p.byte('{') {
		return false
	}
	if m.Properties == nil {
		m.Properties = make(map[string]string, 2)
	}
	if p.peek() == '}' {
		p.i++
		return true
	}
	for {
		p.ws()
		name, ok := p.raw()
		if !ok || !p.byte(':') {
			return false
		}
		var v string
		p.ws()
		if !p.str(&v) {
			return false
		}
		m.Properties[p.name(name)] = v
		if !p.byte(',') {
			return p.byte('}')
		}
	}
}

// name is b as a string, the one of an earlier message when it had it.
func (p *pullParser) name(b []byte) string {
	for i, n := range p.names {
		if n == "" {
			p.names[i] = string(b)
			return p.names[i]
		}
		if n == string(b) {
			return n
		}
	}
	return string(b)
}

// raw reads a string with nothing to unescape and returns its bytes (in
// d): printable ASCII, or valid UTF-8 without control characters.
func (p *pullParser) raw() ([]byte, bool) {
	p.ws()
	if p.i >= len(p.d) || p.d[p.i] != '"' {
		return nil, false
	}
	rest := p.d[p.i+1:]
	n := bytes.IndexByte(rest, '"')
	if n < 0 {
		return nil, false
	}
	s := rest[:n]
	if bytes.IndexByte(s, '\\') >= 0 || !printable(s) && (hasControl(s) || !utf8.Valid(s)) {
		return nil, false
	}
	p.i += n + 2
	return s, true
}

// str reads a string into dst: escapes and invalid UTF-8 (which
// encoding/json turns into U+FFFD) through encoding/json, on the string
// alone.
func (p *pullParser) str(dst *string) bool {
	if s, ok := p.raw(); ok {
		*dst = string(s)
		return true
	}
	if p.i >= len(p.d) || p.d[p.i] != '"' {
		return false
	}
	end := p.i + 1
	for end < len(p.d) && p.d[end] != '"' {
		if p.d[end] == '\\' {
			end++
		}
		end++
	}
	if end >= len(p.d) {
		return false
	}
	lit := p.d[p.i : end+1]
	if json.Unmarshal(lit, dst) != nil {
		return false
	}
	p.i = end + 1
	return true
}

// int reads an integer without fraction or exponent, of up to 18 digits
// (no overflow).
func (p *pullParser) int() (int64, bool) {
	d, i := p.d, p.i
	neg := i < len(d) && d[i] == '-'
	if neg {
		i++
	}
	start := i
	var n int64
	for i < len(d) && d[i] >= '0' && d[i] <= '9' {
		n = n*10 + int64(d[i]-'0')
		i++
	}
	digits := i - start
	if digits == 0 || digits > 18 || (digits > 1 && d[start] == '0') {
		return 0, false
	}
	if i < len(d) && (d[i] == '.' || d[i] == 'e' || d[i] == 'E') {
		return 0, false
	}
	p.i = i
	if neg {
		n = -n
	}
	return n, true
}

// intField reads an integer that fits an int.
func (p *pullParser) intField(dst *int) bool {
	n, ok := p.int()
	if !ok || int64(int(n)) != n {
		return false
	}
	*dst = int(n)
	return true
}

// time reads a timestamp. The API's own (2006-01-02T15:04:05.000Z) is read
// by hand; any other goes to time.Time's UnmarshalJSON.
func (p *pullParser) time(dst *time.Time) bool {
	d := p.d[p.i:]
	const n = len(`"2006-01-02T15:04:05.000Z"`)
	if len(d) >= n && d[0] == '"' && d[n-1] == '"' && d[n-2] == 'Z' &&
		d[5] == '-' && d[8] == '-' && d[11] == 'T' && d[14] == ':' && d[17] == ':' && d[20] == '.' {
		ok := true
		num := func(b []byte) int {
			v := 0
			for _, c := range b {
				if c < '0' || c > '9' {
					ok = false
				}
				v = v*10 + int(c-'0')
			}
			return v
		}
		year, month, day := num(d[1:5]), num(d[6:8]), num(d[9:11])
		hour, minute, sec, ms := num(d[12:14]), num(d[15:17]), num(d[18:20]), num(d[21:24])
		if ok && month >= 1 && month <= 12 && day >= 1 && hour < 24 && minute < 60 && sec < 60 {
			t := time.Date(year, time.Month(month), day, hour, minute, sec, ms*1e6, time.UTC)
			if t.Day() == day { // not the 31st of a shorter month
				*dst = t
				p.i += n
				return true
			}
		}
	}
	if len(d) == 0 || d[0] != '"' {
		return false // null among them
	}
	end := bytes.IndexByte(d[1:], '"')
	if end < 0 || bytes.IndexByte(d[1:end+1], '\\') >= 0 {
		return false
	}
	if dst.UnmarshalJSON(d[:end+2]) != nil {
		return false
	}
	p.i += end + 2
	return true
}

// printable reports whether s is all printable ASCII, eight bytes at a
// time: a word has a byte below 0x20 or above 0x7f iff the has-less trick
// or the high bits say so.
func printable(s []byte) bool {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	for len(s) >= 8 {
		x := binary.LittleEndian.Uint64(s)
		if (x|((x-ones*0x20)&^x))&highs != 0 {
			return false
		}
		s = s[8:]
	}
	for _, c := range s {
		if c < 0x20 || c >= 0x80 {
			return false
		}
	}
	return true
}

// hasControl reports whether s has a byte JSON does not allow in a string
// as it is.
func hasControl(s []byte) bool {
	for _, c := range s {
		if c < 0x20 {
			return true
		}
	}
	return false
}
