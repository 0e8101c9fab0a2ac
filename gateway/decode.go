package gateway

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"
)

// The hot routes (send, batch send, pull, ack) read their JSON bodies here,
// in one pass that checks each field against its openapi.yaml schema as it
// decodes it. kin-openapi's body validation decodes the whole body into
// map[string]any with encoding/json and walks the schema over it; together
// with the typed decode that followed, that was about half of a batch
// send's CPU (docs/LOADTEST.md). kin-openapi still validates these routes'
// paths, queries and headers, and explains a body this decoder refuses (see
// Server.explainBody), so a client reads the same problem either way.
// FuzzHotBodiesAgreeWithSpec holds the two to the same verdicts.
//
// Stricter than a map decode on purpose: a member name given twice and
// invalid UTF-8 are refused (RFC 8259 leaves duplicates undefined; which
// one wins would be a guess), as is a body with anything after its value.

var bodyReaders = sync.Pool{New: func() any { return &bodyReader{dec: new(jsontext.Decoder)} }}

// bodyReader reads one request body. Strings it returns may alias body:
// readBody allocates a fresh buffer for every request and nothing writes to
// it afterwards. Readers are pooled with their decoder and buffer, so a
// request's decode allocates neither.
type bodyReader struct {
	lim *bodyLimits
	dec *jsontext.Decoder
	buf bytes.Buffer // over the body: a bytes.Buffer is parsed in place, without a copy
}

func newBodyReader(body []byte, lim *bodyLimits) *bodyReader {
	br := bodyReaders.Get().(*bodyReader)
	br.lim = lim
	br.buf = *bytes.NewBuffer(body)
	br.dec.Reset(&br.buf)
	return br
}

// release returns br to the pool, holding on to no body.
func (br *bodyReader) release() {
	br.buf = bytes.Buffer{}
	br.dec.Reset(&br.buf)
	br.lim = nil
	bodyReaders.Put(br)
}

// fieldError is a body that breaks its schema, at the JSON pointer where.
type fieldError struct {
	where  string
	reason string
}

func (e *fieldError) Error() string { return e.where + ": " + e.reason }

func (br *bodyReader) fail(format string, args ...any) error {
	return &fieldError{where: string(br.dec.StackPointer()), reason: fmt.Sprintf(format, args...)}
}

// wrap turns a syntax error from jsontext into a fieldError (nil stays nil).
func (br *bodyReader) wrap(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := errors.AsType[*fieldError](err); ok {
		return err
	}
	return &fieldError{where: string(br.dec.StackPointer()), reason: "malformed JSON: " + err.Error()}
}

// object reads a JSON object, calling member for each name; member must
// read the value.
func (br *bodyReader) object(member func(name []byte) error) error {
	if err := br.open('{', "an object"); err != nil {
		return err
	}
	for br.dec.PeekKind() != '}' {
		name, err := br.str()
		if err != nil {
			return err
		}
		if err := member(name); err != nil {
			return err
		}
	}
	_, err := br.dec.ReadToken()
	return br.wrap(err)
}

// open reads the '{' or '[' that must come next.
func (br *bodyReader) open(delim jsontext.Kind, what string) error {
	if br.dec.PeekKind() != delim {
		if err := br.dec.SkipValue(); err != nil {
			return br.wrap(err)
		}
		return br.fail("must be %s", what)
	}
	_, err := br.dec.ReadToken()
	return br.wrap(err)
}

// array reads a JSON array of n.min to n.max items, calling item for each.
func (br *bodyReader) array(n itemCount, item func(i int) error) error {
	minItems, maxItems := n.min, n.max
	if err := br.open('[', "an array"); err != nil {
		return err
	}
	i := 0
	for ; br.dec.PeekKind() != ']'; i++ {
		if i == maxItems {
			return br.fail("must have at most %d items", maxItems)
		}
		if err := item(i); err != nil {
			return err
		}
	}
	if _, err := br.dec.ReadToken(); err != nil {
		return br.wrap(err)
	}
	if i < minItems {
		return br.fail("must have at least %d items", minItems)
	}
	return nil
}

// str reads a JSON string, unescaped; without escapes it is a slice of the
// body itself.
func (br *bodyReader) str() ([]byte, error) {
	if br.dec.PeekKind() != '"' {
		if err := br.dec.SkipValue(); err != nil {
			return nil, br.wrap(err)
		}
		return nil, br.fail("must be a string")
	}
	v, err := br.dec.ReadValue()
	if err != nil {
		return nil, br.wrap(err)
	}
	inner := v[1 : len(v)-1]
	if bytes.IndexByte(inner, '\\') < 0 {
		return inner, nil
	}
	out, err := jsontext.AppendUnquote(make([]byte, 0, len(inner)), v)
	if err != nil {
		return nil, br.wrap(err)
	}
	return out, nil
}

// text reads a string of l.min to l.max characters (max 0: no limit).
func (br *bodyReader) text(l textLength) (string, error) {
	minLen, maxLen := l.min, l.max
	b, err := br.str()
	if err != nil {
		return "", err
	}
	if n := utf8.RuneCount(b); n < minLen || maxLen > 0 && n > maxLen {
		if maxLen > 0 {
			return "", br.fail("must be %d to %d characters long", minLen, maxLen)
		}
		return "", br.fail("must be at least %d characters long", minLen)
	}
	return string(b), nil
}

// integer reads a whole number in [r.lo, r.hi], written as one (5, not 5.0
// or 5e0, as encoding/json has always required here).
func (br *bodyReader) integer(r intRange) (int64, error) {
	lo, hi := r.lo, r.hi
	if br.dec.PeekKind() != '0' {
		if err := br.dec.SkipValue(); err != nil {
			return 0, br.wrap(err)
		}
		return 0, br.fail("must be an integer")
	}
	v, err := br.dec.ReadValue()
	if err != nil {
		return 0, br.wrap(err)
	}
	if bytes.ContainsAny(v, ".eE") {
		return 0, br.fail("must be an integer")
	}
	n, err := strconv.ParseInt(string(v), 10, 64)
	if err != nil || n < lo || n > hi {
		return 0, br.fail("must be between %d and %d", lo, hi)
	}
	return n, nil
}

// isNull consumes a null if one is next.
func (br *bodyReader) isNull() (bool, error) {
	if br.dec.PeekKind() != 'n' {
		return false, nil
	}
	_, err := br.dec.ReadToken()
	return true, br.wrap(err)
}

// end checks that nothing follows the value.
func (br *bodyReader) end() error {
	if _, err := br.dec.ReadToken(); err == nil {
		return br.fail("data after the JSON value")
	} else if !errors.Is(err, io.EOF) {
		return br.wrap(err)
	}
	return nil
}

// sendMessage reads one SendMessage object.
func (br *bodyReader) sendMessage(req *sendRequest) error {
	lim := br.lim
	return br.object(func(name []byte) error {
		var err error
		switch string(name) {
		case "body":
			req.Body, err = br.str()
			req.HasBody = err == nil
		case "bodyEncoding":
			var enc []byte
			if enc, err = br.str(); err == nil {
				if req.BodyEncoding = string(enc); !slices.Contains(lim.bodyEncodings, req.BodyEncoding) {
					err = br.fail("must be %s", oneOf(lim.bodyEncodings))
				}
			}
		case "tag":
			req.Tag, err = br.tag()
		case "keys":
			err = br.array(lim.keys, func(int) error {
				k, err := br.text(lim.key)
				req.Keys = append(req.Keys, k)
				return err
			})
		case "properties":
			req.Properties = map[string]string{}
			err = br.object(func(name []byte) error {
				v, err := br.text(textLength{})
				req.Properties[string(name)] = v
				return err
			})
		case "shardingKey":
			req.ShardingKey, err = br.text(lim.shardingKey)
		case "delaySeconds":
			var n int64
			n, err = br.integer(lim.delaySeconds)
			req.DelaySeconds = &n
		case "deliverAt":
			var null bool
			if null, err = br.isNull(); err != nil || null {
				return err
			}
			var s []byte
			if s, err = br.str(); err == nil {
				var t time.Time
				if t.UnmarshalText(s) != nil {
					return br.fail("must be an RFC 3339 date-time")
				}
				req.DeliverAt = &t
			}
		case "dedupKey":
			req.DedupKey, err = br.text(lim.dedupKey)
		case "transaction":
			if br.dec.StackDepth() > 1 {
				// A batch's entries share one transaction, given beside them.
				return br.fail("property %q is unsupported in a batch entry: give it once, beside messages", name)
			}
			req.CheckAfterSeconds, err = br.transaction()
		default:
			return br.fail("property %q is unsupported", name)
		}
		return err
	})
}

// transaction reads a Transaction object: its checkAfterSeconds.
func (br *bodyReader) transaction() (int64, error) {
	var n int64
	err := br.object(func(name []byte) error {
		if string(name) != "checkAfterSeconds" {
			return br.fail("property %q is unsupported", name)
		}
		var err error
		n, err = br.integer(br.lim.checkAfter)
		return err
	})
	if err == nil && n == 0 {
		return 0, &fieldError{where: "/transaction/checkAfterSeconds", reason: "is required"}
	}
	return n, err
}

// tag reads a Tag: no '|' and no white space, of the length the schema's
// pattern ^[^|\s]{1,64}$ allows (\s is ASCII white space; core then refuses
// Unicode white space too).
func (br *bodyReader) tag() (string, error) {
	b, err := br.str()
	if err != nil {
		return "", err
	}
	if n := utf8.RuneCount(b); n < br.lim.tag.min || n > br.lim.tag.max || bytes.ContainsAny(b, "|\t\n\f\r ") {
		return "", br.fail("must be %d-%d characters without '|' or white space", br.lim.tag.min, br.lim.tag.max)
	}
	return string(b), nil
}

// decodeSend, decodeBatch, decodePull and decodeAck decode with the
// embedded openapi.yaml's limits.
func decodeSend(body []byte) (*sendRequest, error) {
	l, err := specLimits()
	if err != nil {
		return nil, err
	}
	return l.decodeSend(body)
}

func decodeBatch(body []byte) ([]sendRequest, int64, error) {
	l, err := specLimits()
	if err != nil {
		return nil, 0, err
	}
	return l.decodeBatch(body)
}

func decodePull(body []byte) (pullRequest, error) {
	l, err := specLimits()
	if err != nil {
		return pullRequest{}, err
	}
	return l.decodePull(body)
}

func decodeAck(body []byte) (*handlesRequest, error) {
	l, err := specLimits()
	if err != nil {
		return nil, err
	}
	return l.decodeAck(body)
}

func (l *bodyLimits) decodeSend(body []byte) (*sendRequest, error) {
	br := newBodyReader(body, l)
	defer br.release()
	req := new(sendRequest)
	if err := br.sendMessage(req); err != nil {
		return nil, err
	}
	if !req.HasBody {
		return nil, &fieldError{where: "/body", reason: "is required"}
	}
	return req, br.end()
}

func (l *bodyLimits) decodeBatch(body []byte) ([]sendRequest, int64, error) {
	br := newBodyReader(body, l)
	defer br.release()
	var msgs []sendRequest
	var checkAfter int64
	seen := false
	err := br.object(func(name []byte) error {
		if string(name) == "transaction" {
			var err error
			checkAfter, err = br.transaction()
			return err
		}
		if string(name) != "messages" {
			return br.fail("property %q is unsupported", name)
		}
		seen = true
		return br.array(l.batch, func(i int) error {
			if i == 0 {
				// Sized from the body: a 1 KiB message is about 1 KiB of JSON.
				msgs = make([]sendRequest, 0, min(l.batch.max, 1+len(body)/512))
			}
			msgs = append(msgs, sendRequest{})
			if err := br.sendMessage(&msgs[i]); err != nil {
				return err
			}
			if !msgs[i].HasBody {
				return &fieldError{where: fmt.Sprintf("/messages/%d/body", i), reason: "is required"}
			}
			return nil
		})
	})
	if err != nil {
		return nil, 0, err
	}
	if !seen {
		return nil, 0, &fieldError{where: "/messages", reason: "is required"}
	}
	return msgs, checkAfter, br.end()
}

func (l *bodyLimits) decodePull(body []byte) (pullRequest, error) {
	var req pullRequest
	if len(body) == 0 { // every field is optional, and so is the body
		return req, nil
	}
	br := newBodyReader(body, l)
	defer br.release()
	err := br.object(func(name []byte) error {
		var n int64
		var err error
		switch string(name) {
		case "maxMessages":
			n, err = br.integer(l.maxMessages)
			req.MaxMessages = int(n)
		case "waitSeconds":
			n, err = br.integer(l.waitSeconds)
			req.WaitSeconds = int(n)
		case "invisibleSeconds":
			n, err = br.integer(l.invisible)
			req.InvisibleSeconds = int(n)
		case "consumerId":
			req.ConsumerID, err = br.text(l.consumerID)
		default:
			return br.fail("property %q is unsupported", name)
		}
		return err
	})
	if err != nil {
		return req, err
	}
	return req, br.end()
}

func (l *bodyLimits) decodeAck(body []byte) (*handlesRequest, error) {
	br := newBodyReader(body, l)
	defer br.release()
	req := new(handlesRequest)
	seen := false
	err := br.object(func(name []byte) error {
		if string(name) != "receiptHandles" {
			return br.fail("property %q is unsupported", name)
		}
		seen = true
		return br.array(l.handles, func(int) error {
			h, err := br.str()
			req.ReceiptHandles = append(req.ReceiptHandles, string(h))
			return err
		})
	})
	if err != nil {
		return nil, err
	}
	if !seen {
		return nil, &fieldError{where: "/receiptHandles", reason: "is required"}
	}
	return req, br.end()
}

// explainBody answers a body one of the decoders above refused: with
// kin-openapi's own problem when the spec refuses it too (the words every
// other route uses), else with the decoder's.
func (s *Server) explainBody(r *http.Request, body []byte, err error) error {
	if verr := s.validate(r, body, true); verr != nil {
		return verr
	}
	fe, ok := errors.AsType[*fieldError](err)
	if !ok {
		return err
	}
	where := fe.where
	if where == "" {
		where = "the body"
	}
	return badRequest(fe.where, "%s: %s", where, fe.reason)
}
