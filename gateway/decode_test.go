package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"
	"github.com/go-json-experiment/json/jsontext"

	"github.com/tidemq/tidemq/core"
	"github.com/tidemq/tidemq/internal/wire"
)

// The hot routes decode their bodies without kin-openapi (decode.go). These
// tests hold the one-pass decoders to what the spec accepts: the verdict of
// kin-openapi's body validation followed by an encoding/json decode (the
// pipeline they replaced), and the same decoded values.

// specSend is SendMessage as encoding/json decoded it before decode.go.
type specSend struct {
	Body         *string           `json:"body"`
	BodyEncoding string            `json:"bodyEncoding"`
	Tag          string            `json:"tag"`
	Keys         []string          `json:"keys"`
	Properties   map[string]string `json:"properties"`
	ShardingKey  string            `json:"shardingKey"`
	DelaySeconds *int64            `json:"delaySeconds"`
	DeliverAt    *time.Time        `json:"deliverAt"`
	DedupKey     string            `json:"dedupKey"`
	Transaction  *specTransaction  `json:"transaction"`
}

type specTransaction struct {
	CheckAfterSeconds int64 `json:"checkAfterSeconds"`
}

func transactionOf(checkAfter int64) *specTransaction {
	if checkAfter == 0 {
		return nil
	}
	return &specTransaction{checkAfter}
}

type hotRoute struct {
	name, path string
	// fast decodes with decode.go and returns a comparable value.
	fast func([]byte) (any, error)
	// slow decodes with encoding/json into the old types, after kin-openapi.
	slow func([]byte) (any, error)
}

func sendOf(r *sendRequest) specSend {
	out := specSend{BodyEncoding: r.BodyEncoding, Tag: r.Tag, Keys: r.Keys, Properties: r.Properties,
		ShardingKey: r.ShardingKey, DelaySeconds: r.DelaySeconds, DeliverAt: r.DeliverAt, DedupKey: r.DedupKey,
		Transaction: transactionOf(r.CheckAfterSeconds)}
	if r.HasBody {
		b := string(r.Body)
		out.Body = &b
	}
	return out
}

// slowJSON decodes with encoding/json, as the handlers did before
// decode.go, independently of decodeJSON.
func slowJSON[T any](body []byte) (any, error) {
	var v T
	if len(bytes.TrimSpace(body)) == 0 {
		return v, nil
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if dec.More() {
		return nil, fmt.Errorf("data after the JSON value")
	}
	return v, nil
}

var hotRoutes = []hotRoute{
	{"send", "/v1/topics/t/messages",
		func(b []byte) (any, error) {
			r, err := decodeSend(b)
			if err != nil {
				return nil, err
			}
			return sendOf(r), nil
		},
		slowJSON[specSend]},
	{"batch", "/v1/topics/t/messages:batch",
		func(b []byte) (any, error) {
			rs, checkAfter, err := decodeBatch(b)
			if err != nil {
				return nil, err
			}
			out := struct {
				Messages    []specSend       `json:"messages"`
				Transaction *specTransaction `json:"transaction"`
			}{Transaction: transactionOf(checkAfter)}
			for i := range rs {
				out.Messages = append(out.Messages, sendOf(&rs[i]))
			}
			return out, nil
		},
		slowJSON[struct {
			Messages    []specSend       `json:"messages"`
			Transaction *specTransaction `json:"transaction"`
		}]},
	{"pull", "/v1/topics/t/subscriptions/g/pull",
		func(b []byte) (any, error) { return decodePull(b) },
		slowJSON[pullRequest]},
	{"ack", "/v1/topics/t/subscriptions/g/ack",
		func(b []byte) (any, error) {
			r, err := decodeAck(b)
			if err != nil {
				return nil, err
			}
			return *r, nil
		},
		slowJSON[handlesRequest]},
}

type specChecker struct{ router routers.Router }

func newSpecChecker(t testing.TB) *specChecker {
	spec, err := LoadSpec()
	if err != nil {
		t.Fatal(err)
	}
	router, err := legacy.NewRouter(spec)
	if err != nil {
		t.Fatal(err)
	}
	return &specChecker{router: router}
}

// accepts says whether kin-openapi and encoding/json accept body on path,
// and what encoding/json decoded.
func (c *specChecker) accepts(hr hotRoute, body []byte) (any, error) {
	req, _ := http.NewRequest("POST", "http://127.0.0.1"+hr.path, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	route, params, err := c.router.FindRoute(req)
	if err != nil {
		panic(err)
	}
	if err := openapi3filter.ValidateRequest(context.Background(), &openapi3filter.RequestValidationInput{
		Request: req, PathParams: params, Route: route,
		Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc, SkipSettingDefaults: true},
	}); err != nil {
		return nil, err
	}
	return hr.slow(body)
}

// agree fails t unless the decoder and the spec pipeline give the same
// verdict and the same values on body. The decoder may refuse what the
// spec lets through only for duplicate member names and invalid UTF-8.
func (c *specChecker) agree(t *testing.T, hr hotRoute, body []byte) {
	t.Helper()
	fastV, fastErr := hr.fast(body)
	slowV, slowErr := c.accepts(hr, body)
	switch {
	case fastErr == nil && slowErr != nil:
		t.Fatalf("%s %q: decoder accepts what the spec refuses: %v", hr.name, body, slowErr)
	case fastErr != nil && slowErr == nil:
		if !jsontext.Value(body).IsValid() {
			return // duplicate names or invalid UTF-8: refused on purpose
		}
		t.Fatalf("%s %q: decoder refuses what the spec accepts: %v", hr.name, body, fastErr)
	case fastErr == nil && !reflect.DeepEqual(normalize(fastV), normalize(slowV)):
		t.Fatalf("%s %q: decoded differently:\n decoder %#v\n spec    %#v", hr.name, body, fastV, slowV)
	}
}

// normalize makes nil and empty slices and maps compare equal.
func normalize(v any) string {
	b, _ := json.Marshal(v)
	s := strings.ReplaceAll(string(b), `null`, `[]`)
	return strings.ReplaceAll(s, `{}`, `[]`)
}

var hotSeeds = map[string][]string{
	"send": {
		`{"body":"hello"}`,
		`{"body":"h\u00e9llo\n\"q\"","bodyEncoding":"utf8","tag":"TagA","keys":["k1","k2"],"properties":{"a":"1","b":""},"shardingKey":"s","dedupKey":"d"}`,
		`{"body":"aGVsbG8=","bodyEncoding":"base64"}`,
		`{"body":"x","delaySeconds":5}`, `{"body":"x","delaySeconds":5.0}`, `{"body":"x","delaySeconds":5e0}`,
		`{"body":"x","delaySeconds":5.5}`, `{"body":"x","delaySeconds":-1}`, `{"body":"x","delaySeconds":604800}`,
		`{"body":"x","delaySeconds":604801}`, `{"body":"x","delaySeconds":"5"}`, `{"body":"x","delaySeconds":null}`,
		`{"body":"x","deliverAt":"2030-01-02T03:04:05.678Z"}`, `{"body":"x","deliverAt":null}`,
		`{"body":"x","deliverAt":"2030-01-02T03:04:05+02:00"}`, `{"body":"x","deliverAt":"2030-01-02 03:04:05Z"}`,
		`{"body":"x","deliverAt":"2030-01-02T03:04:05"}`, `{"body":"x","deliverAt":"tomorrow"}`,
		`{"body":"x","tag":""}`, `{"body":"x","tag":"a b"}`, `{"body":"x","tag":"a|b"}`, `{"body":"x","tag":"a\tb"}`,
		`{"body":"x","tag":"` + strings.Repeat("é", 64) + `"}`, `{"body":"x","tag":"` + strings.Repeat("é", 65) + `"}`,
		`{"body":"x","tag":null}`, `{"body":"x","tag":7}`,
		`{"body":"x","keys":[]}`, `{"body":"x","keys":[""]}`, `{"body":"x","keys":null}`, `{"body":"x","keys":"k"}`,
		`{"body":"x","keys":[` + strings.Repeat(`"k",`, 32) + `"k"]}`, `{"body":"x","keys":[` + strings.Repeat(`"k",`, 31) + `"k"]}`,
		`{"body":"x","keys":["` + strings.Repeat("k", 129) + `"]}`, `{"body":"x","keys":[1]}`,
		`{"body":"x","properties":{"a":1}}`, `{"body":"x","properties":{"a":null}}`, `{"body":"x","properties":[]}`,
		`{"body":"x","properties":null}`, `{"body":"x","shardingKey":""}`, `{"body":"x","dedupKey":""}`,
		`{"body":"x","bodyEncoding":"hex"}`, `{"body":"x","bodyEncoding":""}`, `{"body":null}`, `{"body":5}`,
		`{}`, `[]`, `"x"`, `null`, ``, ` `, `{"body":"x"} {}`, `{"body":"x"}x`, `{"body":"x",}`, `{"body":"x"`,
		`{"Body":"x"}`, `{"body":"x","extra":1}`, `{"body":"x","body":"y"}`, "{\"body\":\"\xff\"}",
		`{"\u0062ody":"x"}`, `{"body":"x","keys":["a","a"]}`, ` {"body" : "x" } `,
		`{"body":"x","transaction":{"checkAfterSeconds":30}}`, `{"body":"x","transaction":{"checkAfterSeconds":0}}`,
		`{"body":"x","transaction":{"checkAfterSeconds":86400}}`, `{"body":"x","transaction":{"checkAfterSeconds":86401}}`,
		`{"body":"x","transaction":{}}`, `{"body":"x","transaction":null}`, `{"body":"x","transaction":{"checkAfterSeconds":1,"x":1}}`,
		`{"body":"x","transaction":{"checkAfterSeconds":"1"}}`, `{"body":"x","transaction":30}`,
	},
	"batch": {
		`{"messages":[{"body":"a"},{"body":"b","tag":"T"}]}`, `{"messages":[]}`, `{"messages":null}`, `{}`,
		`{"messages":[{"body":"a"},{"tag":"T"}]}`, `{"messages":[{"body":"a","nope":1}]}`, `{"messages":{}}`,
		`{"messages":[{"body":"a"}],"extra":1}`, `{"messages":[1]}`, `[{"body":"a"}]`,
		`{"messages":[` + strings.Repeat(`{"body":"a"},`, 999) + `{"body":"a"}]}`,
		`{"messages":[` + strings.Repeat(`{"body":"a"},`, 1000) + `{"body":"a"}]}`,
		`{"messages":[{"body":"a"}],"transaction":{"checkAfterSeconds":5}}`, `{"transaction":{"checkAfterSeconds":5},"messages":[{"body":"a"}]}`,
		`{"messages":[{"body":"a","transaction":{"checkAfterSeconds":5}}]}`, `{"messages":[{"body":"a"}],"transaction":{}}`,
		`{"messages":[{"body":"a"}],"transaction":{"checkAfterSeconds":0}}`, `{"transaction":{"checkAfterSeconds":5}}`,
	},
	"pull": {
		``, `{}`, `{"maxMessages":1}`, `{"maxMessages":0}`, `{"maxMessages":1000}`, `{"maxMessages":1001}`,
		`{"waitSeconds":0}`, `{"waitSeconds":30}`, `{"waitSeconds":31}`, `{"invisibleSeconds":0}`,
		`{"invisibleSeconds":43200}`, `{"invisibleSeconds":43201}`, `{"consumerId":""}`, `{"consumerId":"c1"}`,
		`{"maxMessages":2.0,"waitSeconds":1e0}`, `{"maxMessages":"2"}`, `{"maxMessages":null}`, `{"other":1}`,
		`[]`, `null`, `{"maxMessages":1,"maxMessages":2}`,
	},
	"ack": {
		`{"receiptHandles":["a","b"]}`, `{"receiptHandles":[]}`, `{"receiptHandles":[""]}`, `{"receiptHandles":null}`,
		`{"receiptHandles":[1]}`, `{}`, `{"receiptHandles":["a"],"x":1}`, `{"receiptHandles":"a"}`, ``,
		`{"receiptHandles":[` + strings.Repeat(`"h",`, 1000) + `"h"]}`,
	},
}

func TestHotBodiesAgreeWithSpec(t *testing.T) {
	c := newSpecChecker(t)
	for _, hr := range hotRoutes {
		for i, seed := range hotSeeds[hr.name] {
			t.Run(fmt.Sprintf("%s/%d", hr.name, i), func(t *testing.T) { c.agree(t, hr, []byte(seed)) })
		}
	}
}

func FuzzHotBodiesAgreeWithSpec(f *testing.F) {
	for i, hr := range hotRoutes {
		for _, seed := range hotSeeds[hr.name] {
			f.Add(uint8(i), []byte(seed))
		}
	}
	c := newSpecChecker(f)
	f.Fuzz(func(t *testing.T, route uint8, body []byte) {
		c.agree(t, hotRoutes[int(route)%len(hotRoutes)], body)
	})
}

// Refusals read the same as before: kin-openapi's words and pointer.
func TestHotBodyProblemsNameTheField(t *testing.T) {
	for _, tc := range []struct{ path, body, field string }{
		{"/v1/topics/t/messages", `{"body":"x","tag":"a b"}`, "/tag"},
		{"/v1/topics/t/messages", `{"body":"x","nope":1}`, "/nope"},
		{"/v1/topics/t/messages:batch", `{"messages":[{"body":"a"},{"body":"b","delaySeconds":-1}]}`, "/messages/1/delaySeconds"},
		{"/v1/topics/t/subscriptions/g/pull", `{"maxMessages":0}`, "/maxMessages"},
		{"/v1/topics/t/messages", `{"body":"x","body":"y"}`, "/body"},
	} {
		s := &Server{}
		spec, err := LoadSpec()
		if err != nil {
			t.Fatal(err)
		}
		if s.oaRouter, err = legacy.NewRouter(spec); err != nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequest("POST", "http://127.0.0.1"+tc.path, strings.NewReader(tc.body))
		req.Header.Set("Content-Type", "application/json")
		var derr error
		switch {
		case strings.HasSuffix(tc.path, ":batch"):
			_, _, derr = decodeBatch([]byte(tc.body))
		case strings.HasSuffix(tc.path, "/pull"):
			_, derr = decodePull([]byte(tc.body))
		default:
			_, derr = decodeSend([]byte(tc.body))
		}
		if derr == nil {
			t.Fatalf("%s: decoder accepted", tc.body)
		}
		err = s.explainBody(req, []byte(tc.body), derr)
		he, ok := err.(*httpError)
		if !ok || he.kind.status != 400 || he.pointer != tc.field {
			t.Errorf("%s: got %#v, want 400 at %q", tc.body, err, tc.field)
			continue
		}
		// In kin-openapi's words, as on every other route, unless only the
		// decoder refuses it (a repeated name).
		if kin := s.validate(req, []byte(tc.body), true); kin != nil && kin.Error() != he.detail {
			t.Errorf("%s: detail %q, want kin-openapi's %q", tc.body, he.detail, kin.Error())
		}
	}
}

// The hand-written send results read exactly as encoding/json wrote them.
func TestSendResultJSONMatchesEncodingJSON(t *testing.T) {
	type sendResult struct {
		MessageID string  `json:"messageId"`
		QueueID   int     `json:"queueId"`
		Offset    *uint64 `json:"offset"`
		StoredAt  Time    `json:"storedAt"`
		Duplicate bool    `json:"duplicate"`
	}
	at := time.Date(2026, 11, 29, 13, 4, 5, 678_900_000, time.FixedZone("x", 3600))
	var want, got []string
	var rs []core.SendResult
	for i, r := range []core.SendResult{
		{MessageID: "3Ydw9mRKEkN8HTkGnlMR4B", QueueID: 3, Offset: 1 << 40, StoredAt: at},
		{MessageID: "3Ydw9mRKEkN8HTkGnlMR4C", QueueID: 0, StoredAt: at, Delayed: true},
		{MessageID: "3Ydw9mRKEkN8HTkGnlMR4D", QueueID: 7, Offset: 0, StoredAt: at, Duplicate: true},
	} {
		rs = append(rs, r)
		sr := sendResult{MessageID: r.MessageID, QueueID: r.QueueID, StoredAt: Time(r.StoredAt), Duplicate: r.Duplicate}
		if !r.Delayed {
			sr.Offset = &rs[i].Offset
		}
		b, err := json.Marshal(sr)
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, string(b))
		got = append(got, string(sendResultJSON(r, "")))
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
	if b := batchResultJSON(rs, ""); string(b) != `{"results":[`+strings.Join(want, ",")+`]}` {
		t.Fatalf("batch: %s", b)
	}
}

// Pulled messages written by hand read exactly as encoding/json wrote them.
func TestPulledJSONMatchesEncodingJSON(t *testing.T) {
	for i, d := range []core.Delivered{
		{Topic: "t", Message: &core.Message{ID: "id1", QueueID: 2, Offset: 9, Body: []byte("hello <&> \"q\" \\ \n é \u2028"),
			BornAtMs: 1700000000123, StoredAtMs: 1700000000456}, Attempt: 1, ReceiptHandle: "rh"},
		{Topic: "t", Message: &core.Message{ID: "id2", Body: []byte{0xff, 0, 1}, Tag: "T", Keys: []string{"k1", "k<2>"},
			Properties: map[string]string{"z": "1", "a": "x\ty", "m\"": ""}, ShardingKey: "s", ProducerGroup: "pg",
			Traceparent: "00-stored-01"}, Attempt: 3, Traceparent: "00-delivery-01"},
		{Topic: "t", Message: &core.Message{ID: "id3", Body: []byte("aGk="), BodyBase64: true, Traceparent: "00-stored-01"}},
		{Topic: "t", Message: &core.Message{ID: "id4", Body: nil}},
		{Topic: "t", Message: &core.Message{ID: "id5", Body: []byte(`{"plain":"ascii <		{Topic: "t", Message: &core.Message{ID: "id4", Body: nil}},> 0123456789","n":[1,2]}`)}},
	} {
		want, err := json.Marshal(pulledOut(d))
		if err != nil {
			t.Fatal(err)
		}
		got := wire.AppendPulled(nil, d)
		var w, g any
		if err := json.Unmarshal(want, &w); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(got, &g); err != nil {
			t.Fatalf("%d: %s: %v", i, got, err)
		}
		if !reflect.DeepEqual(g, w) {
			t.Errorf("%d:\n got  %s\n want %s", i, got, want)
		}
		// Same fields in the same order.
		if !strings.HasPrefix(keysOf(want), "messageId,topic,queueId,offset,body,bodyEncoding") {
			t.Fatalf("keysOf: %q", keysOf(want))
		}
		if keysOf(got) != keysOf(want) {
			t.Errorf("%d: field order\n got  %s\n want %s", i, got, want)
		}
	}
}

func keysOf(doc []byte) string {
	dec := jsontext.NewDecoder(bytes.NewReader(doc))
	var names []string
	for {
		tok, err := dec.ReadToken()
		if err != nil {
			return strings.Join(names, ",")
		}
		if tok.Kind() == '"' && dec.StackDepth() == 1 {
			if _, n := dec.StackIndex(1); n%2 == 1 {
				names = append(names, tok.String())
			}
		}
	}
}

// Hot routes skip kin-openapi when their only parameters are path names,
// which core.ValidateName checks: it must be the Name schema's pattern.
func TestValidateNameIsTheNameSchema(t *testing.T) {
	spec, err := LoadSpec()
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(spec.Components.Schemas["Name"].Value.Pattern)
	names := []string{"", "a", "A9", "9a", ".a", "a.b_c-d", "-a", "_a", "a b", "a/b", "é", "a\x00", strings.Repeat("a", 127), strings.Repeat("a", 128)}
	rng := rand.New(rand.NewPCG(1, 2))
	const alphabet = "aZ09._-/ é%~"
	for range 20000 {
		b := []rune{}
		for range rng.IntN(6) {
			b = append(b, []rune(alphabet)[rng.IntN(len([]rune(alphabet)))])
		}
		names = append(names, string(b))
	}
	for _, n := range names {
		if got, want := core.ValidateName("topic", n) == nil, re.MatchString(n); got != want {
			t.Fatalf("%q: ValidateName accepts=%v, the Name pattern accepts=%v", n, got, want)
		}
	}
}

// pulledOut is how a pulled message was encoded before appendPulled: the
// reference it is compared with.
func pulledOut(d core.Delivered) messageJSON {
	m := messageOut(d.Topic, d.Message)
	m.DeliveryAttempt = d.Attempt
	m.ReceiptHandle = d.ReceiptHandle
	if d.Traceparent != "" {
		m.Traceparent = d.Traceparent
	}
	return m
}
