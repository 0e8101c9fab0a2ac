package gateway_test

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/klauspost/compress/zstd"
	"golang.org/x/net/http/httpguts"

	"github.com/tidemq/tidemq/core"
	"github.com/tidemq/tidemq/gateway"
	"github.com/tidemq/tidemq/pebblestore"
)

// FuzzRequests drives the real wiring (Pebble on vfs.NewMem, core, gateway)
// through ServeHTTP, without a network, with requests made of a method and
// a path from the real routes, a body, a Content-Type, a Content-Encoding
// and one header, all fuzzed. SPEC §4: whatever the request, no panic, no
// 5xx other than 503 and 507, and every error is application/problem+json
// with a code.

var fzMethods = []string{"POST", "PUT", "GET", "DELETE", "PATCH", "HEAD", "OPTIONS"}

// fzPaths are the routes; "$ID" is replaced by the last message id a reply
// carried. Topic fz has orderly subscription o, broadcast b and plain g.
var fzPaths = []string{
	"/v1/topics/fz/messages",                     // 0 send, raw send
	"/v1/topics/fz/messages:batch",               // 1
	"/v1/topics/fz/subscriptions/g/pull",         // 2
	"/v1/topics/fz/subscriptions/g/ack",          // 3
	"/v1/topics/fz/subscriptions/g/nack",         // 4
	"/v1/topics/fz/subscriptions/g/extend",       // 5
	"/v1/topics/fz/subscriptions/g/deadletter",   // 6
	"/v1/topics/fz/subscriptions/g/seek",         // 7
	"/v1/topics/fz/subscriptions/g/dlq:redrive",  // 8
	"/v1/topics/fz/subscriptions/g",              // 9 put subscription
	"/v1/topics/fz",                              // 10 put topic
	"/v1/topics/fz/messages?key=k1&limit=5",      // 11 query
	"/v1/topics/fz/messages/$ID",                 // 12
	"/v1/topics/fz/subscriptions/g/dlq?limit=10", // 13
	"/v1/topics/fz/subscriptions/o/pull",         // 14 orderly
	"/v1/topics/fz/subscriptions/b/pull",         // 15 broadcast: consumerId required
	"/v1/topics/fz/subscriptions/o/ack",          // 16
	"/v1/topics/auto/messages",                   // 17 auto-created
	"/v1/topics/bad%20name/messages",             // 18
	"/v1/topics/fz/subscriptions",                // 19
	"/v1/topics",                                 // 20
	"/v1/topics/fz/messages",                     // 21 query, its parameters from the fuzzed header value
	"/readyz",                                    // 22
	"/metrics",                                   // 23
}

const fzQueryPath = 21

var fzContentTypes = []string{"application/json", "application/octet-stream", "", "text/plain",
	"application/json; charset=utf-8", "application/problem+json", "multipart/form-data; boundary=x"}

// Content-Encodings: the body compressed as said, or the header lying.
var fzEncodings = []string{"", "gzip", "zstd", "gzip (not compressed)", "zstd (not compressed)", "identity", "br"}

// fzHeaders take the fuzzed header value; past the list it goes to the
// Content-Type (len), the Content-Encoding (len+1) or the query string of
// the query route (always, when that route is chosen).
var fzHeaders = []string{"X-Tidemq-Tag", "X-Tidemq-Keys", "X-Tidemq-Sharding-Key", "X-Tidemq-Delay-Seconds",
	"X-Tidemq-Deliver-At", "Idempotency-Key", "X-Tidemq-Property-Region", "X-Producer-Group", "traceparent",
	"Accept-Encoding", "X-Request-Id", "Authorization"}

type fzCase struct {
	name                 string
	method, path, ct, ce uint8
	header               uint8
	value                string
	body                 string
}

var fzCases = []fzCase{
	{"send", 0, 0, 0, 0, 0, "TagA", `{"body":"hello","tag":"TagA","keys":["k1"],"shardingKey":"s1","properties":{"region":"hz"}}`},
	{"send base64 delayed", 0, 0, 4, 0, 5, "idem-1", `{"body":"AAEC/w==","bodyEncoding":"base64","delaySeconds":1,"dedupKey":"d1"}`},
	{"send gzip", 0, 0, 0, 1, 9, "gzip", `{"body":"zipped","tag":"TagB"}`},
	{"send zstd", 0, 0, 0, 2, 9, "zstd, gzip", `{"body":"zstd","keys":["k1","k2"]}`},
	{"send raw", 0, 0, 1, 0, 1, " k1, ,k2 ", "raw bytes \x00\xff"},
	{"send raw deliver at", 0, 0, 1, 0, 4, "2999-01-01T00:00:00Z", "later"},
	{"send raw bad delay", 0, 0, 1, 0, 3, "1e3", "x"},
	{"send raw tag with space", 0, 0, 1, 0, 0, "Tag A", "x"},
	{"send gzip lies", 0, 0, 0, 3, 10, "req-1", `{"body":"x"}`},
	{"send truncated json", 0, 0, 0, 0, 8, "00-zz", `{"body":`},
	{"send trailing data", 0, 0, 0, 0, 7, "pg", `{"body":"x"} {}`},
	{"send too large", 0, 0, 0, 0, 0, "T", `{"body":"` + strings.Repeat("x", 2000) + `"}`},
	{"send text/plain", 0, 0, 3, 0, 0, "", `{"body":"x"}`},
	{"batch", 0, 1, 0, 0, 2, "s", `{"messages":[{"body":"a","shardingKey":"s"},{"body":"b","dedupKey":"d2","tag":"TagA"}]}`},
	{"batch bad entry", 0, 1, 0, 0, 0, "", `{"messages":[{"body":"a"},{"body":"b","tag":"a|b"}]}`},
	{"batch empty", 0, 1, 0, 0, 0, "", `{"messages":[]}`},
	{"pull", 0, 2, 0, 0, 9, "gzip", `{"maxMessages":10,"waitSeconds":1,"invisibleSeconds":1,"consumerId":"c1"}`},
	{"pull huge number", 0, 2, 0, 0, 0, "", `{"maxMessages":1e999}`},
	{"pull orderly", 0, 14, 0, 0, 0, "", `{"maxMessages":3}`},
	{"pull broadcast without consumer", 0, 15, 0, 0, 0, "", `{}`},
	{"pull broadcast", 0, 15, 0, 0, 0, "", `{"consumerId":"b1","maxMessages":1000}`},
	{"ack the last handle", 0, 3, 0, 0, 0, "", `{"receiptHandles":["$H","nope"]}`},
	{"ack garbage", 0, 16, 0, 0, 0, "", `{"receiptHandles":["","AAAA",null]}`},
	{"nack", 0, 4, 0, 0, 0, "", `{"receiptHandles":["$H"],"delaySeconds":0,"reason":"retry"}`},
	{"extend", 0, 5, 0, 0, 0, "", `{"receiptHandles":["$H"],"invisibleSeconds":60}`},
	{"dead-letter", 0, 6, 0, 0, 0, "", `{"receiptHandles":["$H"],"reason":"poison"}`},
	{"seek dry run", 0, 7, 0, 0, 0, "", `{"to":"earliest","dryRun":true}`},
	{"seek to a time", 0, 7, 0, 0, 0, "", `{"to":"2025-01-01T00:00:00+02:00"}`},
	{"redrive all", 0, 8, 0, 0, 0, "", `{}`},
	{"redrive by filter", 0, 8, 0, 0, 0, "", `{"tag":"TagA","from":"2025-01-01T00:00:00Z","to":"2999-01-01T00:00:00Z","dryRun":true}`},
	{"put subscription", 1, 9, 0, 0, 0, "", `{"mode":"clustering","filter":"TagA || TagB","maxRetries":1,"retryDelays":["1ms"],"alerts":{"maxLag":1,"maxDlq":0}}`},
	{"put subscription bad filter", 1, 9, 0, 0, 0, "", `{"filter":"TagA ||"}`},
	{"put subscription mode change", 1, 9, 0, 0, 0, "", `{"mode":"broadcast"}`},
	{"put topic", 1, 10, 0, 0, 0, "", `{"queues":3,"retentionHours":1}`},
	{"shrink topic", 1, 10, 0, 0, 0, "", `{"queues":1}`},
	{"query by key", 2, 11, 2, 0, 0, "", ""},
	{"query by parameters", 2, fzQueryPath, 2, 0, 0, "queueId=0&offset=0&limit=1000&from=2025-01-01T00:00:00Z", ""},
	{"query bad cursor", 2, fzQueryPath, 2, 0, 0, "cursor=!!!&limit=-1", ""},
	{"get message", 2, 12, 2, 0, 0, "", ""},
	{"list dlq", 2, 13, 2, 0, 0, "", ""},
	{"wrong method", 3, 2, 0, 0, 0, "", `{}`},
	{"bad name", 0, 18, 0, 0, 0, "", `{"body":"x"}`},
	{"auto-create", 0, 17, 0, 0, 10, "req-2", `{"body":"x"}`},
	{"content-type in the header value", 0, 0, 0, 0, uint8(len(fzHeaders)), "application/json; charset=\"", `{"body":"x"}`},
	{"content-encoding in the header value", 0, 0, 0, 0, uint8(len(fzHeaders) + 1), "deflate", `{"body":"x"}`},
	{"metrics", 2, 23, 2, 0, 11, "Bearer nope", ""},
}

type fzGateway struct {
	gw                 http.Handler
	lastHandle, lastID string
}

func newFzGateway(f *testing.F) *fzGateway {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	store, err := pebblestore.Open("db", pebblestore.Options{FS: vfs.NewMem(), Logger: log, CacheBytes: 1 << 20, MemTableBytes: 1 << 20})
	if err != nil {
		f.Fatal(err)
	}
	b, err := core.New(store, core.Options{Logger: log, AutoCreate: true, NoSync: true, MaxMessageBytes: 1024,
		MaxLeasesPerQueue: 64, MaxQueuedBytes: 1 << 20, MaxParkedPulls: 4})
	if err != nil {
		f.Fatal(err)
	}
	// Pulls answer at once instead of waiting up to 30 s.
	b.StopPolling()
	gw, err := gateway.New(b, gateway.Options{Logger: log, MaxMessageBytes: 1024, MaxRequestBytes: 64 << 10})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() {
		if err := b.Close(); err != nil {
			f.Error(err)
		}
		if err := store.Close(); err != nil {
			f.Error(err)
		}
	})
	g := &fzGateway{gw: gw}
	for _, setup := range []struct{ path, body string }{
		{"/v1/topics/fz", `{"queues":2}`},
		{"/v1/topics/fz/subscriptions/g", `{"maxRetries":1,"retryDelays":["1ms"]}`},
		{"/v1/topics/fz/subscriptions/o", `{"orderly":true}`},
		{"/v1/topics/fz/subscriptions/b", `{"mode":"broadcast"}`},
	} {
		req := httptest.NewRequest("PUT", setup.path, strings.NewReader(setup.body))
		req.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		gw.ServeHTTP(w, req)
		if w.Code != http.StatusCreated {
			f.Fatalf("PUT %s: %d %s", setup.path, w.Code, w.Body)
		}
	}
	return g
}

func fzEncode(ce string, body []byte) []byte {
	var buf bytes.Buffer
	switch ce {
	case "gzip":
		zw := gzip.NewWriter(&buf)
		_, _ = zw.Write(body)
		_ = zw.Close()
	case "zstd":
		zw, _ := zstd.NewWriter(&buf)
		_, _ = zw.Write(body)
		_ = zw.Close()
	default:
		return body
	}
	return buf.Bytes()
}

// fzHeaderValue keeps what a server would let through of v: no control
// bytes but tab, no leading or trailing white space.
func fzHeaderValue(v string) string {
	if !httpguts.ValidHeaderFieldValue(v) {
		v = strings.Map(func(r rune) rune {
			if r < ' ' && r != '\t' || r == 0x7f {
				return -1
			}
			return r
		}, v)
	}
	return strings.Trim(v, " \t")
}

// request builds the request of one fuzz input.
func (g *fzGateway) request(ctx context.Context, method, path, ct, ce uint8, header uint8, value string, body []byte) *http.Request {
	p := fzPaths[int(path)%len(fzPaths)]
	id := g.lastID
	if id == "" {
		id = "nosuchmessage"
	}
	p = strings.ReplaceAll(p, "$ID", id)
	if g.lastHandle != "" {
		body = bytes.ReplaceAll(body, []byte("$H"), []byte(g.lastHandle))
	}
	encoding := fzEncodings[int(ce)%len(fzEncodings)]
	body = fzEncode(encoding, body)
	req := httptest.NewRequestWithContext(ctx, fzMethods[int(method)%len(fzMethods)], p, bytes.NewReader(body))
	if ctype := fzContentTypes[int(ct)%len(fzContentTypes)]; ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	if encoding != "" {
		req.Header.Set("Content-Encoding", strings.TrimSuffix(encoding, " (not compressed)"))
	}
	v := fzHeaderValue(value)
	switch h := int(header) % (len(fzHeaders) + 2); {
	case int(path)%len(fzPaths) == fzQueryPath:
		req.URL.RawQuery = strings.NewReplacer(" ", "%20", "\t", "%09", "#", "%23").Replace(v)
	case h < len(fzHeaders):
		req.Header.Set(fzHeaders[h], v)
	case h == len(fzHeaders):
		req.Header.Set("Content-Type", v)
	default:
		req.Header.Set("Content-Encoding", v)
	}
	return req
}

// serve runs one request and returns what is wrong with the reply.
func (g *fzGateway) serve(req *http.Request) (int, []string) {
	w := httptest.NewRecorder()
	g.gw.ServeHTTP(w, req)
	resp := w.Result()
	body := w.Body.Bytes()
	var problems []string
	switch enc := resp.Header.Get("Content-Encoding"); enc {
	case "":
	case "gzip", "deflate":
		var zr io.Reader
		if enc == "gzip" {
			r, err := gzip.NewReader(bytes.NewReader(body))
			if err != nil {
				return resp.StatusCode, []string{fmt.Sprintf("gzip reply does not gunzip: %v", err)}
			}
			zr = r
		} else {
			zr = flate.NewReader(bytes.NewReader(body))
		}
		plain, err := io.ReadAll(zr)
		if err != nil {
			return resp.StatusCode, []string{fmt.Sprintf("%s reply does not decompress: %v", enc, err)}
		}
		body = plain
	default:
		problems = append(problems, fmt.Sprintf("reply in Content-Encoding %q", enc))
	}
	status := resp.StatusCode
	if status >= 500 && status != http.StatusServiceUnavailable && status != http.StatusInsufficientStorage {
		problems = append(problems, fmt.Sprintf("status %d; no request may get a 5xx other than 503 and 507", status))
	}
	if status >= 400 {
		var p gateway.Problem
		if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt != "application/problem+json" {
			problems = append(problems, fmt.Sprintf("error reply with Content-Type %q", resp.Header.Get("Content-Type")))
		} else if err := json.Unmarshal(body, &p); err != nil {
			problems = append(problems, fmt.Sprintf("problem is not JSON: %v", err))
		} else if p.Code == "" || p.Status != status {
			problems = append(problems, fmt.Sprintf("problem without code, or with status %d", p.Status))
		}
	}
	if status == http.StatusOK || status == http.StatusCreated {
		var seen struct {
			MessageID string
			Messages  []struct{ MessageID, ReceiptHandle string }
		}
		if json.Unmarshal(body, &seen) == nil {
			if seen.MessageID != "" {
				g.lastID = seen.MessageID
			}
			for _, m := range seen.Messages {
				g.lastID, g.lastHandle = m.MessageID, m.ReceiptHandle
			}
		}
	}
	if len(problems) > 0 {
		problems = append(problems, fmt.Sprintf("reply: %d %s %.600s", status, resp.Header.Get("Content-Type"), body))
	}
	return status, problems
}

func FuzzRequests(f *testing.F) {
	for _, tc := range fzCases {
		f.Add(tc.method, tc.path, tc.ct, tc.ce, tc.header, tc.value, []byte(tc.body))
	}
	g := newFzGateway(f) // one broker for the whole run
	f.Fuzz(func(t *testing.T, method, path, ct, ce, header uint8, value string, body []byte) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		req := g.request(ctx, method, path, ct, ce, header, value, body)
		if _, problems := g.serve(req); len(problems) > 0 {
			t.Fatalf("%s %s (Content-Type %q, Content-Encoding %q, header #%d %q, body %q):\n%s",
				req.Method, req.URL.RequestURI(), req.Header.Get("Content-Type"), req.Header.Get("Content-Encoding"),
				header, fzHeaderValue(value), truncate(body, 300), strings.Join(problems, "\n"))
		}
	})
}

// TestFuzzRequestsCatchesViolations keeps FuzzRequests' checks honest: each
// of these made-up replies breaks SPEC §4 and must be reported, and these
// others must not.
func TestFuzzRequestsCatchesViolations(t *testing.T) {
	problem := func(status int, code string) []byte {
		return fmt.Appendf(nil, `{"type":"about:blank","title":"t","status":%d,"code":%q}`, status, code)
	}
	gz := func(b []byte) []byte { return fzEncode("gzip", b) }
	for _, tc := range []struct {
		name        string
		status      int
		ctype, cenc string
		body        []byte
		ok          bool
	}{
		{"created", 201, "application/json", "", []byte(`{"messageId":"m"}`), true},
		{"problem", 404, "application/problem+json", "", problem(404, "topic_not_found"), true},
		{"gzipped problem", 400, "application/problem+json", "gzip", gz(problem(400, "invalid_request")), true},
		{"503", 503, "application/problem+json", "", problem(503, "not_ready"), true},
		{"507", 507, "application/problem+json", "", problem(507, "insufficient_storage"), true},
		{"500", 500, "application/problem+json", "", problem(500, "internal"), false},
		{"502", 502, "application/problem+json", "", problem(502, "bad_gateway"), false},
		{"plain-text error", 404, "text/plain", "", []byte("404 page not found"), false},
		{"problem without code", 400, "application/problem+json", "", []byte(`{"type":"x","title":"t","status":400}`), false},
		{"problem with another status", 400, "application/problem+json", "", problem(409, "x"), false},
		{"problem not JSON", 400, "application/problem+json", "", []byte("{"), false},
		{"gzip that is not", 400, "application/problem+json", "gzip", problem(400, "x"), false},
		{"unasked encoding", 200, "application/json", "br", []byte("{}"), false},
	} {
		g := &fzGateway{gw: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", tc.ctype)
			if tc.cenc != "" {
				w.Header().Set("Content-Encoding", tc.cenc)
			}
			w.WriteHeader(tc.status)
			_, _ = w.Write(tc.body)
		})}
		_, problems := g.serve(httptest.NewRequest("GET", "/v1/topics", nil))
		if tc.ok && len(problems) > 0 {
			t.Errorf("%s: reported %q", tc.name, problems)
		}
		if !tc.ok && len(problems) == 0 {
			t.Errorf("%s: not reported", tc.name)
		}
	}
}

// A raw send takes its keys from a header, whose bytes need not be UTF-8.
// The broker stores such a key as it came (ValidateMessage checks UTF-8 for
// tags only), every JSON reply then shows it with U+FFFD in place of the
// bad bytes, and a query by the key as the API shows it finds nothing: the
// message's own key does not find it. Either the send is refused (400), or
// the key the API shows finds the message. (Sharding keys, dedup keys and
// properties from headers go the same way.)
func TestRegressionInvalidUTF8KeyCannotBeQueried(t *testing.T) {
	gw := startServer(t, serverConfig{}).gw
	req := httptest.NewRequest("POST", "/v1/topics/utf8/messages", strings.NewReader("x"))
	req.Header.Set("Content-Type", "application/octet-stream")
	req.Header.Set("X-Tidemq-Keys", "k\xff1")
	w := httptest.NewRecorder()
	gw.ServeHTTP(w, req)
	if w.Code == http.StatusBadRequest {
		return // refused: fine
	}
	if w.Code != http.StatusCreated {
		t.Fatalf("raw send with key \"k\\xff1\": %d %s", w.Code, w.Body)
	}
	var sent struct{ MessageID string }
	if err := json.Unmarshal(w.Body.Bytes(), &sent); err != nil {
		t.Fatal(err)
	}
	w = httptest.NewRecorder()
	gw.ServeHTTP(w, httptest.NewRequest("GET", "/v1/topics/utf8/messages/"+sent.MessageID, nil))
	var got struct{ Message struct{ Keys []string } }
	if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil || w.Code != http.StatusOK || len(got.Message.Keys) != 1 {
		t.Fatalf("GET the message: %d %s", w.Code, w.Body)
	}
	shown := got.Message.Keys[0]
	w = httptest.NewRecorder()
	gw.ServeHTTP(w, httptest.NewRequest("GET", "/v1/topics/utf8/messages?key="+url.QueryEscape(shown), nil))
	var found struct{ Messages []struct{ MessageID string } }
	if err := json.Unmarshal(w.Body.Bytes(), &found); err != nil || w.Code != http.StatusOK {
		t.Fatalf("query by key: %d %s", w.Code, w.Body)
	}
	if len(found.Messages) != 1 || found.Messages[0].MessageID != sent.MessageID {
		t.Errorf("the message was stored with key \"k\\xff1\" (201), the API shows its key as %q, and ?key=%s finds %d messages, not it",
			shown, url.QueryEscape(shown), len(found.Messages))
	}
}
