package gateway_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"
	"github.com/klauspost/compress/zstd"

	"github.com/tidemq/tidemq"
	"github.com/tidemq/tidemq/core"
	"github.com/tidemq/tidemq/gateway"
	"github.com/tidemq/tidemq/pebblestore"
)

// End-to-end tests: the real wiring (Pebble in t.TempDir(), core, gateway)
// behind a real HTTP server on 127.0.0.1:0, driven through plain HTTP. Every
// reply is checked against openapi.yaml, every error reply is a problem, and
// no reply is a 5xx other than 503 and 507.

// ---------------------------------------------------------------- server

type serverConfig struct {
	core    core.Options
	gateway gateway.Options
}

type testServer struct {
	URL   string
	Addr  string // host:port
	b     *core.Broker
	gw    *gateway.Server
	store *pebblestore.Store
	srv   *httptest.Server
	logs  *syncBuffer
}

// startServer wires pebblestore → core → gateway as cmd/tidemq does and
// serves it on 127.0.0.1:0. Cleanup answers parked pulls, closes the
// server, then the broker, then the store, and checks their errors.
func startServer(t *testing.T, cfg serverConfig) *testServer {
	t.Helper()
	logs := &syncBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	store, err := pebblestore.Open(t.TempDir(), pebblestore.Options{Logger: log, CacheBytes: 8 << 20, MemTableBytes: 8 << 20})
	if err != nil {
		t.Fatalf("pebblestore.Open: %v", err)
	}
	cfg.core.Logger = log
	cfg.core.AutoCreate = true
	b, err := core.New(store, cfg.core)
	if err != nil {
		_ = store.Close()
		t.Fatalf("core.New: %v", err)
	}
	cfg.gateway.Logger = log
	gw, err := gateway.New(b, cfg.gateway)
	if err != nil {
		_ = b.Close()
		_ = store.Close()
		t.Fatalf("gateway.New: %v", err)
	}
	srv := httptest.NewServer(gw)
	ts := &testServer{URL: srv.URL, Addr: srv.Listener.Addr().String(), b: b, gw: gw, store: store, srv: srv, logs: logs}
	t.Cleanup(func() {
		b.StopPolling() // parked long polls answer now, so Close does not wait for them
		srv.Close()
		if err := b.Close(); err != nil {
			t.Errorf("broker Close: %v", err)
		}
		if err := store.Close(); err != nil {
			t.Errorf("store Close: %v", err)
		}
		if t.Failed() {
			log := logs.String()
			if len(log) > 16<<10 {
				log = "…" + log[len(log)-16<<10:]
			}
			t.Logf("server log (end):\n%s", log)
		}
	})
	return ts
}

// newGateway is the wired gateway, for tests that only look at its router.
func newGateway(t *testing.T, cfg serverConfig) *gateway.Server {
	return startServer(t, cfg).gw
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// ---------------------------------------------------------------- client

// client does HTTP requests and checks every reply against openapi.yaml.
// A subtest takes its own with on(t).
type client struct {
	t      *testing.T
	base   string
	hc     *http.Client
	router routers.Router
}

func (ts *testServer) client(t *testing.T) *client {
	t.Helper()
	doc, err := gateway.LoadSpec()
	if err != nil {
		t.Fatalf("LoadSpec: %v", err)
	}
	router, err := legacy.NewRouter(doc)
	if err != nil {
		t.Fatalf("legacy.NewRouter: %v", err)
	}
	transport := http.DefaultTransport
	if ts.srv != nil {
		transport = ts.srv.Client().Transport
	}
	return &client{t: t, base: ts.URL, router: router, hc: &http.Client{Transport: transport, Timeout: 60 * time.Second}}
}

// on is the client reporting to t (a subtest).
func (c *client) on(t *testing.T) *client {
	cc := *c
	cc.t = t
	return &cc
}

type reply struct {
	status int
	header http.Header
	raw    []byte // as received
	body   []byte // decompressed
}

func (r *reply) String() string {
	return fmt.Sprintf("%d %s %s", r.status, r.header.Get("Content-Type"), truncate(r.body, 600))
}

func truncate(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "…"
	}
	return string(b)
}

type hdr map[string]string

// request builds a request; body is nil (none), []byte or string (sent as
// is) or anything else (JSON-encoded). Content-Type is application/json
// when there is a body, unless h says otherwise.
func (c *client) request(ctx context.Context, method, path string, body any, h hdr) *http.Request {
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		rd = bytes.NewReader(b)
	case string:
		rd = strings.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			panic(fmt.Sprintf("test body %T: %v", body, err))
		}
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		panic(fmt.Sprintf("test request %s %s: %v", method, path, err))
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range h {
		if v == "" {
			req.Header.Del(k)
		} else {
			req.Header.Set(k, v)
		}
	}
	return req
}

// do sends a request from the test goroutine; a transport error fails the test.
func (c *client) do(method, path string, body any, h ...hdr) *reply {
	c.t.Helper()
	var hh hdr
	if len(h) > 0 {
		hh = h[0]
	}
	r, err := c.roundTrip(c.request(c.t.Context(), method, path, body, hh))
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, path, err)
	}
	return r
}

// roundTrip sends req and checks the reply (problems reported with
// t.Errorf, so it may run on any goroutine).
func (c *client) roundTrip(req *http.Request) (*reply, error) {
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("%s %s: reading the reply: %w", req.Method, req.URL.Path, err)
	}
	r := &reply{status: resp.StatusCode, header: resp.Header, raw: raw, body: raw}
	switch enc := resp.Header.Get("Content-Encoding"); enc {
	case "":
	case "gzip":
		zr, err := gzip.NewReader(bytes.NewReader(raw))
		if err == nil {
			r.body, err = io.ReadAll(zr)
		}
		if err != nil {
			return nil, fmt.Errorf("%s %s: gunzip the reply: %w", req.Method, req.URL.Path, err)
		}
	default:
		return nil, fmt.Errorf("%s %s: reply in Content-Encoding %q, which the client did not ask for", req.Method, req.URL.Path, enc)
	}
	c.check(req, r)
	return r, nil
}

// check holds every reply to the contract and fails the test (without
// stopping it) for each violation.
func (c *client) check(req *http.Request, r *reply) {
	c.t.Helper()
	for _, v := range c.violations(req, r) {
		c.t.Error(v)
	}
}

// violations lists how a reply breaks the contract: its status and body are
// not those openapi.yaml describes for the operation, an error is not a
// problem, or it is a 5xx other than 503 and 507 (SPEC §4).
func (c *client) violations(req *http.Request, r *reply) []string {
	var out []string
	what := req.Method + " " + req.URL.RequestURI()
	if r.status >= 500 && r.status != http.StatusServiceUnavailable && r.status != http.StatusInsufficientStorage {
		out = append(out, fmt.Sprintf("%s: got %s; no request may get a 5xx other than 503 and 507", what, r))
	}
	if r.status >= 400 {
		out = append(out, problemViolations(what, r)...)
	}
	if r.status == http.StatusNotFound || r.status == http.StatusMethodNotAllowed {
		if p, _ := decodeProblem(r.body); p.Code == "not_found" || p.Code == "method_not_allowed" {
			// The router's own answer to a path or method it does not
			// serve: no operation's reply.
			return out
		}
	}
	// Route on the path as sent: the spec router decodes it, which would
	// turn a name like a%2Fb into two segments.
	sent := req.Clone(req.Context())
	sent.URL.Path, sent.URL.RawPath = req.URL.EscapedPath(), ""
	route, params, err := c.router.FindRoute(sent)
	if err != nil {
		return append(out, fmt.Sprintf("%s is not an operation of openapi.yaml (%v) but got %s", what, err, r))
	}
	in := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route},
		Status:                 r.status,
		Header:                 r.header,
		Options: &openapi3filter.Options{
			AuthenticationFunc:    openapi3filter.NoopAuthenticationFunc,
			IncludeResponseStatus: true,
		},
	}
	in.SetBodyBytes(r.body)
	if err := openapi3filter.ValidateResponse(context.Background(), in); err != nil {
		out = append(out, fmt.Sprintf("%s: the reply does not match openapi.yaml: %v\nreply: %s", what, err, r))
	}
	return out
}

// problemViolations: an error reply is application/problem+json with type,
// title, status (equal to the HTTP status) and code.
func problemViolations(what string, r *reply) []string {
	if mt, _, _ := mime.ParseMediaType(r.header.Get("Content-Type")); mt != "application/problem+json" {
		return []string{fmt.Sprintf("%s: error reply has Content-Type %q, want application/problem+json: %s", what, r.header.Get("Content-Type"), r)}
	}
	var p map[string]any
	if err := json.Unmarshal(r.body, &p); err != nil {
		return []string{fmt.Sprintf("%s: problem is not JSON: %v: %s", what, err, r)}
	}
	var out []string
	for _, f := range []string{"type", "title", "code"} {
		if s, _ := p[f].(string); s == "" {
			out = append(out, fmt.Sprintf("%s: problem lacks %q: %s", what, f, r))
		}
	}
	if st, _ := p["status"].(float64); int(st) != r.status {
		out = append(out, fmt.Sprintf("%s: problem status %v, HTTP status %d", what, p["status"], r.status))
	}
	return out
}

// TestClientCatchesContractViolations keeps the reply checks honest: each
// of these made-up replies breaks the contract and must be reported.
func TestClientCatchesContractViolations(t *testing.T) {
	t.Parallel()
	c := (&testServer{URL: "http://127.0.0.1:1"}).client(t)
	jsonH := http.Header{"Content-Type": {"application/json"}}
	problemH := http.Header{"Content-Type": {"application/problem+json"}}
	problem := func(status int, code string) []byte {
		return fmt.Appendf(nil, `{"type":"about:blank","title":"t","status":%d,"code":%q}`, status, code)
	}
	for _, tc := range []struct {
		name         string
		method, path string
		r            reply
		ok           bool
	}{
		{"valid list", "GET", "/v1/topics", reply{status: 200, header: jsonH, body: []byte(`{"topics":[]}`)}, true},
		{"valid problem", "GET", "/v1/topics/x", reply{status: 404, header: problemH, body: problem(404, "topic_not_found")}, true},
		{"router 404", "GET", "/nowhere", reply{status: 404, header: problemH, body: problem(404, "not_found")}, true},
		{"body off schema", "GET", "/v1/topics", reply{status: 200, header: jsonH, body: []byte(`{"topics":"none"}`)}, false},
		{"required field missing", "POST", "/v1/topics/x/messages", reply{status: 201, header: jsonH, body: []byte(`{"queueId":0,"offset":0}`)}, false},
		{"status not in spec", "GET", "/v1/topics", reply{status: 418, header: problemH, body: problem(418, "internal")}, false},
		{"500", "POST", "/v1/topics/x/messages", reply{status: 500, header: problemH, body: problem(500, "internal")}, false},
		{"error not a problem", "GET", "/v1/topics/x", reply{status: 404, header: jsonH, body: []byte(`{"error":"nope"}`)}, false},
		{"problem without code", "GET", "/v1/topics/x", reply{status: 404, header: problemH, body: []byte(`{"type":"x","title":"t","status":404}`)}, false},
		{"problem status differs", "GET", "/v1/topics/x", reply{status: 404, header: problemH, body: problem(400, "topic_not_found")}, false},
		{"unknown code", "GET", "/v1/topics/x", reply{status: 404, header: problemH, body: problem(404, "gone")}, false},
		{"path not in spec", "GET", "/v2/other", reply{status: 200, header: jsonH, body: []byte(`{}`)}, false},
	} {
		req := c.request(context.Background(), tc.method, tc.path, nil, nil)
		r := tc.r
		got := c.violations(req, &r)
		if tc.ok && len(got) > 0 {
			t.Errorf("%s: reported %q", tc.name, got)
		}
		if !tc.ok && len(got) == 0 {
			t.Errorf("%s: %s %s → %s was not reported", tc.name, tc.method, tc.path, &r)
		}
	}
}

func decodeProblem(body []byte) (gateway.Problem, error) {
	var p gateway.Problem
	err := json.Unmarshal(body, &p)
	return p, err
}

func decode[T any](t *testing.T, r *reply) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(r.body, &v); err != nil {
		t.Fatalf("decoding %T from %s: %v", v, r, err)
	}
	return v
}

func wantStatus(t *testing.T, r *reply, status int) {
	t.Helper()
	if r.status != status {
		t.Fatalf("got %s, want status %d", r, status)
	}
}

func wantProblem(t *testing.T, r *reply, status int, code string) gateway.Problem {
	t.Helper()
	p := decode[gateway.Problem](t, r)
	if r.status != status || p.Code != code {
		t.Fatalf("got %s, want %d %s", r, status, code)
	}
	return p
}

// eventually polls cond until it returns nil, failing after timeout with
// its last error.
func eventually(t *testing.T, timeout time.Duration, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	wait := time.Millisecond
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("still not true after %v: %v", timeout, err)
		}
		time.Sleep(wait)
		wait = min(2*wait, 50*time.Millisecond)
	}
}

// ------------------------------------------------------------ wire types

type topicReply struct {
	Topic          string
	Queues         int
	RetentionHours int
	CreatedAt      string
	Messages       int64
	Bytes          int64
	QueueStats     []struct {
		QueueID              int
		MinOffset, MaxOffset uint64
	}
	Subscriptions []string
}

type sendReply struct {
	MessageID string
	QueueID   int
	Offset    *uint64
	StoredAt  string
	Duplicate bool
}

type pulledMessage struct {
	MessageID       string
	Topic           string
	QueueID         int
	Offset          uint64
	Body            string
	BodyEncoding    string
	Tag             string
	Keys            []string
	Properties      map[string]string
	ShardingKey     string
	BornAt          string
	StoredAt        string
	ProducerGroup   string
	DeliveryAttempt int
	ReceiptHandle   string
	Traceparent     string
}

type subscriptionReply struct {
	Topic       string
	Group       string
	Mode        string
	Orderly     bool
	Filter      string
	MaxRetries  int
	StartFrom   string
	RetryDelays []string
	Queues      []struct {
		QueueID                int
		MaxOffset, AckedOffset uint64
		Inflight, Lag          int64
	}
	Lag, Inflight int64
	Consumers     []struct {
		ConsumerID string
		Queues     []int
	}
}

type ackReply struct {
	Acked  int
	Failed []struct{ ReceiptHandle, Code string }
}

// ------------------------------------------------------ client shortcuts

func topicPath(topic string) string        { return "/v1/topics/" + topic }
func subPath(topic, group string) string   { return topicPath(topic) + "/subscriptions/" + group }
func pullPath(topic, group string) string  { return subPath(topic, group) + "/pull" }
func ackPath(topic, group string) string   { return subPath(topic, group) + "/ack" }
func sendPath(topic string) string         { return topicPath(topic) + "/messages" }
func batchPath(topic string) string        { return topicPath(topic) + "/messages:batch" }
func b64(b []byte) string                  { return base64.StdEncoding.EncodeToString(b) }
func jsonMsg(body string) map[string]any   { return map[string]any{"body": body} }
func subscribe(c *client, topic, g string) { c.putSubscription(topic, g, nil, http.StatusCreated) }

func (c *client) createTopic(topic string, queues int) topicReply {
	c.t.Helper()
	r := c.do("PUT", topicPath(topic), map[string]any{"queues": queues})
	wantStatus(c.t, r, http.StatusCreated)
	return decode[topicReply](c.t, r)
}

func (c *client) getTopic(topic string) topicReply {
	c.t.Helper()
	r := c.do("GET", topicPath(topic), nil)
	wantStatus(c.t, r, http.StatusOK)
	return decode[topicReply](c.t, r)
}

func (c *client) putSubscription(topic, group string, cfg map[string]any, status int) subscriptionReply {
	c.t.Helper()
	var body any
	if cfg != nil {
		body = cfg
	}
	r := c.do("PUT", subPath(topic, group), body)
	wantStatus(c.t, r, status)
	return decode[subscriptionReply](c.t, r)
}

func (c *client) getSubscription(topic, group string) subscriptionReply {
	c.t.Helper()
	r := c.do("GET", subPath(topic, group), nil)
	wantStatus(c.t, r, http.StatusOK)
	return decode[subscriptionReply](c.t, r)
}

func (c *client) send(topic string, msg any, h ...hdr) sendReply {
	c.t.Helper()
	r := c.do("POST", sendPath(topic), msg, h...)
	wantStatus(c.t, r, http.StatusCreated)
	return decode[sendReply](c.t, r)
}

func (c *client) pull(topic, group string, req map[string]any) []pulledMessage {
	c.t.Helper()
	var body any // nil: no body at all (a JSON null body is a 400)
	if req != nil {
		body = req
	}
	r := c.do("POST", pullPath(topic, group), body)
	wantStatus(c.t, r, http.StatusOK)
	return decode[struct{ Messages []pulledMessage }](c.t, r).Messages
}

func (c *client) ack(topic, group string, handles ...string) ackReply {
	c.t.Helper()
	r := c.do("POST", ackPath(topic, group), map[string]any{"receiptHandles": handles})
	wantStatus(c.t, r, http.StatusOK)
	return decode[ackReply](c.t, r)
}

func handles(msgs []pulledMessage) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = m.ReceiptHandle
	}
	return out
}

// waitParked waits until a pull of consumer has looked for messages (the
// subscription lists the consumer): a long poll that found none is then
// parked.
func (c *client) waitParked(topic, group, consumer string) {
	c.t.Helper()
	eventually(c.t, 10*time.Second, func() error {
		for _, cs := range c.getSubscription(topic, group).Consumers {
			if cs.ConsumerID == consumer {
				return nil
			}
		}
		return fmt.Errorf("consumer %s has not pulled from %s/%s", consumer, topic, group)
	})
}

// ================================================================ tests

func TestE2ETopicLifecycle(t *testing.T) {
	t.Parallel()
	c := startServer(t, serverConfig{}).client(t)

	r := c.do("PUT", topicPath("orders"), map[string]any{"queues": 4, "retentionHours": 48})
	wantStatus(t, r, http.StatusCreated)
	tp := decode[topicReply](t, r)
	if tp.Topic != "orders" || tp.Queues != 4 || tp.RetentionHours != 48 || len(tp.QueueStats) != 4 || tp.Messages != 0 {
		t.Fatalf("created topic = %+v", tp)
	}
	if _, err := time.Parse(time.RFC3339, tp.CreatedAt); err != nil {
		t.Errorf("createdAt %q: %v", tp.CreatedAt, err)
	}

	// Again: 200 with the topic as it is.
	r = c.do("PUT", topicPath("orders"), map[string]any{"queues": 4})
	wantStatus(t, r, http.StatusOK)
	if tp := decode[topicReply](t, r); tp.Queues != 4 || tp.RetentionHours != 48 {
		t.Errorf("PUT of an existing topic changed it: %+v", tp)
	}
	r = c.do("PUT", topicPath("orders"), nil) // the body is optional
	wantStatus(t, r, http.StatusOK)
	if tp := decode[topicReply](t, r); tp.Queues != 4 {
		t.Errorf("PUT without a body changed the queues: %+v", tp)
	}

	// Queues grow, never shrink.
	r = c.do("PUT", topicPath("orders"), map[string]any{"queues": 6})
	wantStatus(t, r, http.StatusOK)
	if tp := decode[topicReply](t, r); tp.Queues != 6 || len(tp.QueueStats) != 6 {
		t.Errorf("grown topic = %+v, want 6 queues", tp)
	}
	wantProblem(t, c.do("PUT", topicPath("orders"), map[string]any{"queues": 2}), http.StatusConflict, "queue_count_decrease")
	if tp := c.getTopic("orders"); tp.Queues != 6 {
		t.Errorf("after a refused shrink the topic has %d queues, want 6", tp.Queues)
	}

	c.createTopic("billing", 1)
	list := decode[struct{ Topics []topicReply }](t, c.do("GET", "/v1/topics", nil)).Topics
	var names []string
	for _, tp := range list {
		names = append(names, tp.Topic)
	}
	if strings.Join(names, ",") != "billing,orders" {
		t.Errorf("topics = %v, want [billing orders]", names)
	}

	// DELETE takes the subscriptions with it.
	subscribe(c, "orders", "g1")
	if tp := c.getTopic("orders"); strings.Join(tp.Subscriptions, ",") != "g1" {
		t.Errorf("subscriptions of orders = %v, want [g1]", tp.Subscriptions)
	}
	c.send("orders", jsonMsg("x"))
	wantStatus(t, c.do("DELETE", topicPath("orders"), nil), http.StatusNoContent)
	wantProblem(t, c.do("GET", topicPath("orders"), nil), http.StatusNotFound, "topic_not_found")
	wantProblem(t, c.do("DELETE", topicPath("orders"), nil), http.StatusNotFound, "topic_not_found")
	wantProblem(t, c.do("GET", subPath("orders", "g1"), nil), http.StatusNotFound, "topic_not_found")
	wantProblem(t, c.do("GET", topicPath("orders")+"/subscriptions", nil), http.StatusNotFound, "topic_not_found")

	// A topic made again under the same name starts empty.
	if tp := c.createTopic("orders", 2); tp.Messages != 0 || len(tp.Subscriptions) != 0 {
		t.Errorf("re-created topic = %+v, want it empty", tp)
	}
}

func TestE2EInvalidNames(t *testing.T) {
	t.Parallel()
	c := startServer(t, serverConfig{}).client(t)
	c.createTopic("ok", 1)
	for _, name := range []string{
		"-leading-dash", ".dot", "has%20space", "semi%3Bcolon", "slash%2Fin", "dollar$", "x" + strings.Repeat("y", 127), "%C3%A9t%C3%A9",
	} {
		wantProblem(t, c.do("PUT", topicPath(name), nil), http.StatusBadRequest, "invalid_name")
		wantProblem(t, c.do("GET", topicPath(name), nil), http.StatusBadRequest, "invalid_name")
		wantProblem(t, c.do("POST", sendPath(name), jsonMsg("x")), http.StatusBadRequest, "invalid_name")
		wantProblem(t, c.do("PUT", subPath("ok", name), nil), http.StatusBadRequest, "invalid_name")
		wantProblem(t, c.do("POST", pullPath("ok", name), nil), http.StatusBadRequest, "invalid_name")
	}
	// The longest name allowed is 127 characters.
	c.createTopic("x"+strings.Repeat("y", 126), 1)
}

func TestE2ESendPullRoundTrip(t *testing.T) {
	t.Parallel()
	c := startServer(t, serverConfig{}).client(t)
	c.createTopic("rt", 1) // one queue: pulls come in send order
	subscribe(c, "rt", "g")

	binary := []byte{0xff, 0xfe, 0x00, 0x80, 'a', 0xc3}
	big := strings.Repeat("a compressible body above 4 KiB; ", 400) // stored compressed, served as sent
	traceparent := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	type sent struct {
		req      map[string]any
		body     string
		encoding string
	}
	cases := []sent{
		{map[string]any{"body": "héllo wörld ✓", "bodyEncoding": "utf8", "tag": "TagA", "keys": []string{"order-1001", "order-1002"},
			"properties": map[string]string{"region": "hz", "tier": "gold"}, "shardingKey": "order-1001"}, "héllo wörld ✓", "utf8"},
		{map[string]any{"body": "no encoding given"}, "no encoding given", "utf8"},
		// base64 stays base64 even when the bytes are text.
		{map[string]any{"body": b64([]byte("hello")), "bodyEncoding": "base64"}, b64([]byte("hello")), "base64"},
		{map[string]any{"body": b64(binary), "bodyEncoding": "base64"}, b64(binary), "base64"},
		{map[string]any{"body": ""}, "", "utf8"},
		{map[string]any{"body": big}, big, "utf8"},
	}
	var results []sendReply
	for _, tc := range cases {
		results = append(results, c.send("rt", tc.req, hdr{"X-Producer-Group": "pg-1", "traceparent": traceparent}))
	}
	for i, res := range results {
		if res.MessageID == "" || res.QueueID != 0 || res.Offset == nil || *res.Offset != uint64(i) || res.Duplicate {
			t.Errorf("send %d reply = %+v, want queue 0 offset %d", i, res, i)
		}
	}

	msgs := c.pull("rt", "g", map[string]any{"maxMessages": 100})
	if len(msgs) != len(cases) {
		t.Fatalf("pulled %d messages, want %d", len(msgs), len(cases))
	}
	for i, m := range msgs {
		tc, res := cases[i], results[i]
		if m.MessageID != res.MessageID || m.Topic != "rt" || m.QueueID != res.QueueID || m.Offset != *res.Offset {
			t.Errorf("message %d: id/topic/queue/offset = %s/%s/%d/%d, want %s/rt/%d/%d", i, m.MessageID, m.Topic, m.QueueID, m.Offset, res.MessageID, res.QueueID, *res.Offset)
		}
		if m.Body != tc.body || m.BodyEncoding != tc.encoding {
			t.Errorf("message %d: body %q (%s), want %q (%s)", i, truncate([]byte(m.Body), 80), m.BodyEncoding, truncate([]byte(tc.body), 80), tc.encoding)
		}
		if m.DeliveryAttempt != 1 || m.ReceiptHandle == "" {
			t.Errorf("message %d: deliveryAttempt %d, receiptHandle %q", i, m.DeliveryAttempt, m.ReceiptHandle)
		}
		if m.ProducerGroup != "pg-1" || m.Traceparent != traceparent {
			t.Errorf("message %d: producerGroup %q traceparent %q", i, m.ProducerGroup, m.Traceparent)
		}
		if m.StoredAt != res.StoredAt {
			t.Errorf("message %d: storedAt %s, the send said %s", i, m.StoredAt, res.StoredAt)
		}
		born, err1 := time.Parse(time.RFC3339, m.BornAt)
		stored, err2 := time.Parse(time.RFC3339, m.StoredAt)
		if err1 != nil || err2 != nil || stored.Before(born) {
			t.Errorf("message %d: bornAt %s storedAt %s", i, m.BornAt, m.StoredAt)
		}
	}
	first := msgs[0]
	if first.Tag != "TagA" || strings.Join(first.Keys, ",") != "order-1001,order-1002" ||
		len(first.Properties) != 2 || first.Properties["region"] != "hz" || first.Properties["tier"] != "gold" || first.ShardingKey != "order-1001" {
		t.Errorf("tag/keys/properties/shardingKey did not round-trip: %+v", first)
	}
	if got, err := base64.StdEncoding.DecodeString(msgs[3].Body); err != nil || !bytes.Equal(got, binary) {
		t.Errorf("binary body came back as %x (%v), want %x", got, err, binary)
	}
	if a := c.ack("rt", "g", handles(msgs)...); a.Acked != len(msgs) || len(a.Failed) != 0 {
		t.Errorf("ack = %+v", a)
	}
}

func TestE2ESendSpreadsOverQueues(t *testing.T) {
	t.Parallel()
	c := startServer(t, serverConfig{}).client(t)
	c.createTopic("spread", 4)
	seen := map[int]bool{}
	for range 8 {
		seen[c.send("spread", jsonMsg("rr")).QueueID] = true
	}
	if len(seen) != 4 {
		t.Errorf("8 sends without shardingKey used queues %v, want all 4 (round-robin)", seen)
	}
	// One sharding key, one queue.
	q := c.send("spread", map[string]any{"body": "k", "shardingKey": "order-7"}).QueueID
	for range 5 {
		if got := c.send("spread", map[string]any{"body": "k", "shardingKey": "order-7"}).QueueID; got != q {
			t.Fatalf("shardingKey order-7 went to queues %d and %d", q, got)
		}
	}
}

func TestE2EAutoCreate(t *testing.T) {
	t.Parallel()
	c := startServer(t, serverConfig{}).client(t)
	c.send("fresh", jsonMsg("x"))
	if tp := c.getTopic("fresh"); tp.Queues != core.DefaultQueues || tp.Messages != 1 {
		t.Errorf("auto-created topic = %+v, want %d queues and 1 message", tp, core.DefaultQueues)
	}
	// A pull on an unknown subscription creates it (default: earliest).
	if msgs := c.pull("fresh", "newgroup", nil); len(msgs) != 1 {
		t.Errorf("pull on an auto-created subscription got %d messages, want 1", len(msgs))
	}
	c.getSubscription("fresh", "newgroup")
}

func TestE2EBatch(t *testing.T) {
	t.Parallel()
	c := startServer(t, serverConfig{}).client(t)
	c.createTopic("batch", 1)
	subscribe(c, "batch", "g")

	var entries []map[string]any
	for i := range 5 {
		e := map[string]any{"body": fmt.Sprintf("m%d", i), "tag": fmt.Sprintf("T%d", i)}
		if i%2 == 1 {
			e = map[string]any{"body": b64(fmt.Appendf(nil, "m%d", i)), "bodyEncoding": "base64", "tag": fmt.Sprintf("T%d", i)}
		}
		entries = append(entries, e)
	}
	r := c.do("POST", batchPath("batch"), map[string]any{"messages": entries})
	wantStatus(t, r, http.StatusCreated)
	results := decode[struct{ Results []sendReply }](t, r).Results
	if len(results) != 5 {
		t.Fatalf("batch results = %+v, want 5", results)
	}
	ids := map[string]bool{}
	for i, res := range results {
		if res.Offset == nil || *res.Offset != uint64(i) || ids[res.MessageID] {
			t.Errorf("result %d = %+v, want offset %d and a new id", i, res, i)
		}
		ids[res.MessageID] = true
	}
	msgs := c.pull("batch", "g", map[string]any{"maxMessages": 10})
	if len(msgs) != 5 {
		t.Fatalf("pulled %d, want 5", len(msgs))
	}
	for i, m := range msgs {
		body := m.Body
		if m.BodyEncoding == "base64" {
			b, _ := base64.StdEncoding.DecodeString(m.Body)
			body = string(b)
		}
		if m.MessageID != results[i].MessageID || body != fmt.Sprintf("m%d", i) || m.Tag != fmt.Sprintf("T%d", i) {
			t.Errorf("message %d = %s %q %s, want %s m%d T%d", i, m.MessageID, body, m.Tag, results[i].MessageID, i, i)
		}
	}
}

// A batch is validated whole: one bad entry fails it with 400 and its
// index in "entry", and nothing of it is stored.
func TestE2EBatchBadEntry(t *testing.T) {
	t.Parallel()
	c := startServer(t, serverConfig{}).client(t)
	c.createTopic("bb", 2)
	c.send("bb", jsonMsg("before"))
	for _, tc := range []struct {
		name string
		bad  map[string]any
	}{
		// Caught by the gateway after the schema.
		{"bad base64", map[string]any{"body": "%%%not base64", "bodyEncoding": "base64"}},
		{"delay and deliverAt", map[string]any{"body": "x", "delaySeconds": 5, "deliverAt": time.Now().Add(time.Hour).UTC().Format(time.RFC3339)}},
		// Caught by core (\v is white space to core, not to the schema's \s).
		{"vertical tab in tag", map[string]any{"body": "x", "tag": "a\vb"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := c.on(t)
			batch := []map[string]any{jsonMsg("ok-0"), tc.bad, jsonMsg("ok-2")}
			p := wantProblem(t, c.do("POST", batchPath("bb"), map[string]any{"messages": batch}), http.StatusBadRequest, "invalid_request")
			if p.Entry == nil || *p.Entry != 1 {
				t.Errorf("problem entry = %v, want 1: %+v", p.Entry, p)
			}
			if !strings.HasPrefix(p.Pointer, "/messages/1/") {
				t.Errorf("problem pointer = %q, want /messages/1/…", p.Pointer)
			}
			if got := c.getTopic("bb").Messages; got != 1 {
				t.Errorf("topic holds %d messages after a refused batch, want 1", got)
			}
		})
	}
}

// SPEC §2: "one bad entry fails it with 400 and "entry": i". Entries the
// openapi.yaml schema refuses (bad tag pattern, missing body, unknown
// field, too many keys) come back without "entry".
func TestRegressionBatchSchemaErrorHasEntry(t *testing.T) {
	t.Parallel()
	c := startServer(t, serverConfig{}).client(t)
	for _, tc := range []struct {
		name        string
		bad         map[string]any
		wantPointer string
	}{
		{"tag with space", map[string]any{"body": "x", "tag": "bad tag"}, "/messages/2/tag"},
		{"missing body", map[string]any{"tag": "t"}, "/messages/2/body"},
		{"empty key", map[string]any{"body": "x", "keys": []string{""}}, "/messages/2/keys/0"},
		{"unknown field", map[string]any{"body": "x", "bogus": 1}, "/messages/2/bogus"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := c.on(t)
			batch := []map[string]any{jsonMsg("ok-0"), jsonMsg("ok-1"), tc.bad}
			p := wantProblem(t, c.do("POST", batchPath("bbs"), map[string]any{"messages": batch}), http.StatusBadRequest, "invalid_request")
			if p.Entry == nil || *p.Entry != 2 {
				t.Errorf("problem entry = %v, want 2 (pointer %q)", p.Entry, p.Pointer)
			}
			if p.Pointer != tc.wantPointer {
				t.Errorf("problem pointer = %q, want %q", p.Pointer, tc.wantPointer)
			}
		})
	}
}

// A batch of one bad entry: core only numbers entries of batches of two or
// more, so the problem has no "entry" and its pointer lacks /messages/0.
func TestRegressionSingleEntryBatchHasEntry(t *testing.T) {
	t.Parallel()
	c := startServer(t, serverConfig{}).client(t)
	r := c.do("POST", batchPath("one"), map[string]any{"messages": []map[string]any{{"body": "x", "tag": "a\vb"}}})
	p := wantProblem(t, r, http.StatusBadRequest, "invalid_request")
	if p.Entry == nil || *p.Entry != 0 || p.Pointer != "/messages/0/tag" {
		t.Errorf("problem entry %v pointer %q, want entry 0 pointer /messages/0/tag", p.Entry, p.Pointer)
	}
}

func TestE2ERawSend(t *testing.T) {
	t.Parallel()
	c := startServer(t, serverConfig{}).client(t)
	c.createTopic("raw", 1)
	subscribe(c, "raw", "g")

	body := []byte{0xff, 0x00, 0xfe, 'h', 'i', 0x80, 0xc0, 0xaf, '\n'}
	res := c.send("raw", body, hdr{
		"Content-Type":                   "application/octet-stream",
		"X-Tidemq-Tag":                   "TagR",
		"X-Tidemq-Keys":                  "a, b ,c",
		"X-Tidemq-Sharding-Key":          "sk-1",
		"X-Tidemq-Property-Region":       "hz",
		"X-Tidemq-Property-Data-Center":  "dc 2",
		"X-Producer-Group":               "raw-producers",
		"X-Tidemq-Property-Empty-Ignore": "",
	})
	text := c.send("raw", "plain text body", hdr{"Content-Type": "application/octet-stream"})

	msgs := c.pull("raw", "g", map[string]any{"maxMessages": 10})
	if len(msgs) != 2 {
		t.Fatalf("pulled %d messages, want 2", len(msgs))
	}
	m := msgs[0]
	if m.MessageID != res.MessageID {
		t.Fatalf("pulled %s, sent %s", m.MessageID, res.MessageID)
	}
	got, err := base64.StdEncoding.DecodeString(m.Body)
	if m.BodyEncoding != "base64" || err != nil || !bytes.Equal(got, body) {
		t.Errorf("raw binary body came back as %q (%s), want base64 of %x", m.Body, m.BodyEncoding, body)
	}
	if m.Tag != "TagR" || strings.Join(m.Keys, "|") != "a|b|c" || m.ShardingKey != "sk-1" || m.ProducerGroup != "raw-producers" {
		t.Errorf("raw headers: tag %q keys %q shardingKey %q producerGroup %q", m.Tag, m.Keys, m.ShardingKey, m.ProducerGroup)
	}
	wantProps := map[string]string{"region": "hz", "data-center": "dc 2"}
	if len(m.Properties) != len(wantProps) || m.Properties["region"] != "hz" || m.Properties["data-center"] != "dc 2" {
		t.Errorf("properties = %v, want %v", m.Properties, wantProps)
	}
	if t2 := msgs[1]; t2.MessageID != text.MessageID || t2.Body != "plain text body" || t2.BodyEncoding != "utf8" {
		t.Errorf("raw text body = %q (%s)", t2.Body, t2.BodyEncoding)
	}
}

func TestE2EUnsupportedMediaType(t *testing.T) {
	t.Parallel()
	c := startServer(t, serverConfig{}).client(t)
	c.createTopic("media", 1)
	for _, ct := range []string{"text/plain", "application/xml", "multipart/form-data; boundary=x"} {
		wantProblem(t, c.do("POST", sendPath("media"), "hello", hdr{"Content-Type": ct}), http.StatusUnsupportedMediaType, "unsupported_media_type")
	}
	wantProblem(t, c.do("PUT", topicPath("media"), `{"queues":2}`, hdr{"Content-Type": "text/plain"}), http.StatusUnsupportedMediaType, "unsupported_media_type")
	wantProblem(t, c.do("POST", batchPath("media"), []byte{1, 2}, hdr{"Content-Type": "application/octet-stream"}), http.StatusUnsupportedMediaType, "unsupported_media_type")
	wantProblem(t, c.do("POST", sendPath("media"), `{"body":"x"}`, hdr{"Content-Encoding": "br"}), http.StatusUnsupportedMediaType, "unsupported_media_type")
	if got := c.getTopic("media").Messages; got != 0 {
		t.Errorf("%d messages stored by refused requests", got)
	}
	// The accepted types with parameters or in other cases are the same types.
	c.send("media", map[string]any{"body": "x"}, hdr{"Content-Type": "Application/JSON; charset=utf-8"})
	c.send("media", "raw", hdr{"Content-Type": "application/OCTET-STREAM ; x=y"})
	if got := c.getTopic("media").Messages; got != 2 {
		t.Errorf("%d messages stored, want the 2 sent with parameterised types", got)
	}
}

func TestE2EMessageTooLarge(t *testing.T) {
	t.Parallel()
	const limit = 1024
	c := startServer(t, serverConfig{core: core.Options{MaxMessageBytes: limit}, gateway: gateway.Options{MaxMessageBytes: limit}}).client(t)
	c.createTopic("big", 1)
	over := strings.Repeat("x", limit+1)
	wantProblem(t, c.do("POST", sendPath("big"), jsonMsg(over)), http.StatusRequestEntityTooLarge, "message_too_large")
	wantProblem(t, c.do("POST", sendPath("big"), map[string]any{"body": b64([]byte(over)), "bodyEncoding": "base64"}), http.StatusRequestEntityTooLarge, "message_too_large")
	wantProblem(t, c.do("POST", sendPath("big"), over, hdr{"Content-Type": "application/octet-stream"}), http.StatusRequestEntityTooLarge, "message_too_large")
	wantProblem(t, c.do("POST", batchPath("big"), map[string]any{"messages": []any{jsonMsg("small"), jsonMsg(over)}}), http.StatusRequestEntityTooLarge, "message_too_large")
	if got := c.getTopic("big").Messages; got != 0 {
		t.Errorf("%d messages stored by refused sends", got)
	}
	// Exactly the limit is fine; so is a multi-byte body of limit bytes.
	c.send("big", jsonMsg(strings.Repeat("y", limit)))
	c.send("big", jsonMsg(strings.Repeat("é", limit/2)))
}

func TestE2ERequestTooLarge(t *testing.T) {
	t.Parallel()
	c := startServer(t, serverConfig{}).client(t)
	c.createTopic("huge", 1)
	over := bytes.Repeat([]byte{'z'}, gateway.DefaultMaxRequestBytes+1)
	wantProblem(t, c.do("POST", sendPath("huge"), over, hdr{"Content-Type": "application/octet-stream"}), http.StatusRequestEntityTooLarge, "request_too_large")

	// A small gzip body that inflates past 16 MiB is refused as well.
	var zbuf bytes.Buffer
	zw := gzip.NewWriter(&zbuf)
	fmt.Fprintf(zw, `{"body":"%s"}`, bytes.Repeat([]byte{'0'}, gateway.DefaultMaxRequestBytes))
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	if zbuf.Len() > 1<<20 {
		t.Fatalf("gzip bomb is %d bytes", zbuf.Len())
	}
	wantProblem(t, c.do("POST", sendPath("huge"), zbuf.Bytes(), hdr{"Content-Encoding": "gzip"}), http.StatusRequestEntityTooLarge, "request_too_large")
	if got := c.getTopic("huge").Messages; got != 0 {
		t.Errorf("%d messages stored by refused sends", got)
	}
}

func TestE2ECompressedRequests(t *testing.T) {
	t.Parallel()
	c := startServer(t, serverConfig{}).client(t)
	c.createTopic("zip", 1)
	subscribe(c, "zip", "g")

	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write([]byte(`{"body":"sent gzipped","tag":"gz"}`))
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	c.send("zip", gz.Bytes(), hdr{"Content-Encoding": "gzip"})

	enc, err := zstd.NewWriter(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer enc.Close()
	c.send("zip", enc.EncodeAll([]byte(`{"body":"sent with zstd","tag":"zs"}`), nil), hdr{"Content-Encoding": "zstd"})

	gz.Reset()
	zw = gzip.NewWriter(&gz)
	_, _ = zw.Write([]byte{0xde, 0xad, 0xbe, 0xef})
	_ = zw.Close()
	c.send("zip", gz.Bytes(), hdr{"Content-Encoding": "gzip", "Content-Type": "application/octet-stream"})

	r := c.do("POST", batchPath("zip"), enc.EncodeAll([]byte(`{"messages":[{"body":"b1"},{"body":"b2"}]}`), nil), hdr{"Content-Encoding": "zstd"})
	wantStatus(t, r, http.StatusCreated)

	msgs := c.pull("zip", "g", map[string]any{"maxMessages": 10})
	var got []string
	for _, m := range msgs {
		got = append(got, m.Body)
	}
	want := []string{"sent gzipped", "sent with zstd", b64([]byte{0xde, 0xad, 0xbe, 0xef}), "b1", "b2"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("bodies = %q, want %q", got, want)
	}

	// A body that is not what Content-Encoding says is a 400.
	wantProblem(t, c.do("POST", sendPath("zip"), `{"body":"x"}`, hdr{"Content-Encoding": "gzip"}), http.StatusBadRequest, "invalid_request")
	wantProblem(t, c.do("POST", sendPath("zip"), `{"body":"x"}`, hdr{"Content-Encoding": "zstd"}), http.StatusBadRequest, "invalid_request")
}

func TestE2ECompressedResponses(t *testing.T) {
	t.Parallel()
	c := startServer(t, serverConfig{}).client(t)
	// 64 queues make the topic replies larger than the 256 bytes under
	// which replies are sent as they are (gzip costs more than it saves).
	c.createTopic("gzresp", 64)
	c.send("gzresp", jsonMsg(strings.Repeat("compress me ", 100)))
	if r := c.do("GET", "/healthz", nil, hdr{"Accept-Encoding": "gzip"}); r.header.Get("Content-Encoding") != "" {
		t.Errorf("a %d-byte reply was compressed (%q)", len(r.body), r.header.Get("Content-Encoding"))
	}

	for _, path := range []string{"/v1/topics", topicPath("gzresp"), "/openapi.yaml"} {
		r := c.do("GET", path, nil, hdr{"Accept-Encoding": "gzip"})
		wantStatus(t, r, http.StatusOK)
		if r.header.Get("Content-Encoding") != "gzip" {
			t.Errorf("GET %s with Accept-Encoding gzip: Content-Encoding %q", path, r.header.Get("Content-Encoding"))
		}
		if bytes.Equal(r.raw, r.body) {
			t.Errorf("GET %s: the body was not compressed", path)
		}
	}
	r := c.do("POST", pullPath("gzresp", "g"), nil, hdr{"Accept-Encoding": "gzip"})
	wantStatus(t, r, http.StatusOK)
	if r.header.Get("Content-Encoding") != "gzip" || len(decode[struct{ Messages []pulledMessage }](t, r).Messages) != 1 {
		t.Errorf("gzipped pull: Content-Encoding %q, body %s", r.header.Get("Content-Encoding"), r)
	}
	// A problem is compressed too, and still a problem.
	r = c.do("GET", topicPath("nope"), nil, hdr{"Accept-Encoding": "gzip"})
	wantProblem(t, r, http.StatusNotFound, "topic_not_found")

	// A client that does not ask gets plain bytes.
	plain := &http.Client{Transport: &http.Transport{DisableCompression: true}}
	defer plain.CloseIdleConnections()
	resp, err := plain.Get(c.base + "/v1/topics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.Header.Get("Content-Encoding") != "" || !json.Valid(body) {
		t.Errorf("no Accept-Encoding: Content-Encoding %q, body %q", resp.Header.Get("Content-Encoding"), truncate(body, 100))
	}
	// Caches keep the plain and the gzipped reply apart.
	if v := resp.Header.Get("Vary"); v != "Accept-Encoding" {
		t.Errorf("no Accept-Encoding: Vary %q, want Accept-Encoding", v)
	}
}

func TestE2EInvalidJSON(t *testing.T) {
	t.Parallel()
	c := startServer(t, serverConfig{}).client(t)
	c.createTopic("js", 1)

	p := wantProblem(t, c.do("POST", sendPath("js"), `{"body":"x","bogus":1}`), http.StatusBadRequest, "invalid_request")
	if p.Pointer == "" {
		t.Errorf("unknown field: problem has no pointer: %+v", p)
	}
	p = wantProblem(t, c.do("PUT", subPath("js", "g"), `{"mode":"clustering","nope":true}`), http.StatusBadRequest, "invalid_request")
	if p.Pointer == "" {
		t.Errorf("unknown field: problem has no pointer: %+v", p)
	}
	p = wantProblem(t, c.do("POST", sendPath("js"), `{"body":"x","tag":5}`), http.StatusBadRequest, "invalid_request")
	if p.Pointer != "/tag" {
		t.Errorf("wrong type: pointer %q, want /tag", p.Pointer)
	}
	for _, body := range []string{`{"body":`, `{"body":"x"`, `{body:"x"}`, `"just a string"`, `[]`, "\x00\x01"} {
		wantProblem(t, c.do("POST", sendPath("js"), body), http.StatusBadRequest, "invalid_request")
	}
	if got := c.getTopic("js").Messages; got != 0 {
		t.Errorf("%d messages stored by refused sends", got)
	}
}

// SPEC §4: invalid_request carries "the JSON pointer of the bad field". For
// an unknown field the gateway answers the pointer of the object holding it
// ("/"), which names no field at all (RFC 6901: "/" is the member "").
func TestRegressionUnknownFieldPointer(t *testing.T) {
	t.Parallel()
	c := startServer(t, serverConfig{}).client(t)
	p := wantProblem(t, c.do("POST", sendPath("ptr"), `{"body":"x","bogus":1}`), http.StatusBadRequest, "invalid_request")
	if p.Pointer != "/bogus" {
		t.Errorf("unknown field bogus: pointer %q, want /bogus", p.Pointer)
	}
}

// Malformed JSON is a 400, including a valid value followed by garbage:
// today only the first JSON value is read and the rest ignored, so
// `{"queues":1} x` creates a topic.
func TestRegressionTrailingJSONIsRefused(t *testing.T) {
	t.Parallel()
	c := startServer(t, serverConfig{}).client(t)
	for _, tc := range []struct{ method, path, body string }{
		{"PUT", topicPath("trail"), `{"queues":1} x`},
		{"PUT", topicPath("trail2"), `{"queues":1}{"queues":2}`},
		{"POST", sendPath("trail3"), `{"body":"x"}]`},
	} {
		r := c.do(tc.method, tc.path, tc.body)
		if r.status != http.StatusBadRequest {
			t.Errorf("%s %s %s: got %s, want 400 invalid_request", tc.method, tc.path, tc.body, r)
		}
	}
}

func TestE2ESubscriptionLifecycle(t *testing.T) {
	t.Parallel()
	c := startServer(t, serverConfig{}).client(t)
	c.createTopic("subs", 2)

	s := c.putSubscription("subs", "g1", map[string]any{
		"filter": "TagA || TagB", "maxRetries": 3, "retryDelays": []string{"1s", "500ms", "2m"}, "startFrom": "earliest",
	}, http.StatusCreated)
	if s.Topic != "subs" || s.Group != "g1" || s.Mode != "clustering" || s.Orderly || s.Filter != "TagA || TagB" || s.MaxRetries != 3 ||
		strings.Join(s.RetryDelays, ",") != "1s,500ms,2m" || len(s.Queues) != 2 {
		t.Errorf("created subscription = %+v", s)
	}
	s = c.putSubscription("subs", "g1", map[string]any{"maxRetries": 4, "filter": "TagC"}, http.StatusOK)
	if s.MaxRetries != 4 || s.Filter != "TagC" {
		t.Errorf("updated subscription = %+v, want maxRetries 4 filter TagC", s)
	}
	if s := c.getSubscription("subs", "g1"); s.MaxRetries != 4 || s.Filter != "TagC" {
		t.Errorf("GET after update = %+v", s)
	}
	// Defaults.
	s = c.putSubscription("subs", "g2", nil, http.StatusCreated)
	if s.Mode != "clustering" || s.Filter != "*" || s.MaxRetries != core.DefaultMaxRetries || s.StartFrom != "earliest" || len(s.RetryDelays) != len(core.DefaultRetryDelays) {
		t.Errorf("default subscription = %+v", s)
	}

	list := decode[struct{ Subscriptions []subscriptionReply }](t, c.do("GET", topicPath("subs")+"/subscriptions", nil)).Subscriptions
	if len(list) != 2 || list[0].Group != "g1" || list[1].Group != "g2" {
		t.Errorf("subscriptions = %+v, want g1, g2", list)
	}
	if tp := c.getTopic("subs"); strings.Join(tp.Subscriptions, ",") != "g1,g2" {
		t.Errorf("topic subscriptions = %v", tp.Subscriptions)
	}

	wantStatus(t, c.do("DELETE", subPath("subs", "g1"), nil), http.StatusNoContent)
	wantProblem(t, c.do("GET", subPath("subs", "g1"), nil), http.StatusNotFound, "subscription_not_found")
	wantProblem(t, c.do("DELETE", subPath("subs", "g1"), nil), http.StatusNotFound, "subscription_not_found")
	wantProblem(t, c.do("POST", ackPath("subs", "g1"), map[string]any{"receiptHandles": []string{"x"}}), http.StatusNotFound, "subscription_not_found")
	if tp := c.getTopic("subs"); strings.Join(tp.Subscriptions, ",") != "g2" {
		t.Errorf("topic subscriptions after delete = %v", tp.Subscriptions)
	}

	for _, f := range []string{"TagA ||", "|| TagA", "TagA | TagB", "Tag A", "TagA ||| TagB"} {
		wantProblem(t, c.do("PUT", subPath("subs", "bad"), map[string]any{"filter": f}), http.StatusBadRequest, "invalid_filter")
	}
	wantProblem(t, c.do("GET", subPath("subs", "bad"), nil), http.StatusNotFound, "subscription_not_found")
}

func TestE2EFilteredSubscription(t *testing.T) {
	t.Parallel()
	c := startServer(t, serverConfig{}).client(t)
	c.createTopic("flt", 1)
	c.putSubscription("flt", "a", map[string]any{"filter": "TagA"}, http.StatusCreated)
	for _, tag := range []string{"TagA", "TagB", "TagA", "TagAA"} {
		c.send("flt", map[string]any{"body": tag, "tag": tag})
	}
	msgs := c.pull("flt", "a", map[string]any{"maxMessages": 10})
	if len(msgs) != 2 || msgs[0].Tag != "TagA" || msgs[1].Tag != "TagA" {
		t.Fatalf("filter TagA delivered %+v", msgs)
	}
	c.ack("flt", "a", handles(msgs)...)
	// Filtered-out messages count as acked.
	if s := c.getSubscription("flt", "a"); s.Lag != 0 {
		t.Errorf("lag after acking every matching message = %d, want 0", s.Lag)
	}
}

func TestE2EPullAck(t *testing.T) {
	t.Parallel()
	c := startServer(t, serverConfig{}).client(t)
	c.createTopic("pa", 2)
	subscribe(c, "pa", "g")
	subscribe(c, "pa", "other")
	for i := range 5 {
		c.send("pa", jsonMsg(fmt.Sprint(i)))
	}
	msgs := c.pull("pa", "g", map[string]any{"maxMessages": 3})
	if len(msgs) != 3 {
		t.Fatalf("maxMessages 3 pulled %d", len(msgs))
	}
	rest := c.pull("pa", "g", map[string]any{"maxMessages": 10})
	if len(rest) != 2 {
		t.Fatalf("second pull got %d, want the other 2 (the first 3 are leased)", len(rest))
	}
	if again := c.pull("pa", "g", nil); len(again) != 0 {
		t.Fatalf("third pull got %d leased messages", len(again))
	}

	r := c.do("POST", ackPath("pa", "g"), map[string]any{"receiptHandles": handles(msgs)})
	wantStatus(t, r, http.StatusOK)
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(r.body, &raw); err != nil || string(raw["acked"]) != "3" || string(raw["failed"]) != "[]" {
		t.Errorf(`ack reply = %s, want {"acked":3,"failed":[]}`, r.body)
	}
	// An ack repeated (a client retrying) still counts.
	if a := c.ack("pa", "g", handles(msgs)...); a.Acked != 3 || len(a.Failed) != 0 {
		t.Errorf("repeated ack = %+v", a)
	}

	// A garbage handle, and a real handle of another subscription, are
	// receipt_invalid; the valid handle in the same call is acked.
	foreign := c.pull("pa", "other", map[string]any{"maxMessages": 1})
	garbage := []string{"garbage", foreign[0].ReceiptHandle, strings.Repeat("A", 34), rest[0].ReceiptHandle + "x"}
	a := c.ack("pa", "g", append(garbage, rest[0].ReceiptHandle)...)
	if a.Acked != 1 || len(a.Failed) != len(garbage) {
		t.Fatalf("ack = %+v, want 1 acked and %d failed", a, len(garbage))
	}
	for i, f := range a.Failed {
		if f.ReceiptHandle != garbage[i] || f.Code != "receipt_invalid" {
			t.Errorf("failed[%d] = %+v, want %q receipt_invalid", i, f, garbage[i])
		}
	}
	wantProblem(t, c.do("POST", ackPath("pa", "nosuchgroup"), map[string]any{"receiptHandles": []string{rest[1].ReceiptHandle}}), http.StatusNotFound, "subscription_not_found")
	wantProblem(t, c.do("POST", ackPath("nosuchtopic", "g"), map[string]any{"receiptHandles": []string{"x"}}), http.StatusNotFound, "topic_not_found")
}

func TestE2ELagFollowsSendsAndAcks(t *testing.T) {
	t.Parallel()
	c := startServer(t, serverConfig{}).client(t)
	c.createTopic("lag", 1)
	subscribe(c, "lag", "g")
	lag := func(want, wantInflight int64) {
		t.Helper()
		s := c.getSubscription("lag", "g")
		if s.Lag != want || s.Inflight != wantInflight {
			t.Errorf("lag %d inflight %d, want %d and %d", s.Lag, s.Inflight, want, wantInflight)
		}
		var sum int64
		for _, q := range s.Queues {
			sum += q.Lag
		}
		if sum != s.Lag {
			t.Errorf("queue lags sum to %d, subscription lag is %d", sum, s.Lag)
		}
	}
	lag(0, 0)
	for i := range 3 {
		c.send("lag", jsonMsg(fmt.Sprint(i)))
		lag(int64(i+1), 0)
	}
	msgs := c.pull("lag", "g", map[string]any{"maxMessages": 10})
	if len(msgs) != 3 {
		t.Fatalf("pulled %d", len(msgs))
	}
	lag(3, 3) // leased is not acked
	// Out of order: acking above the lowest outstanding offset lowers lag too.
	c.ack("lag", "g", msgs[2].ReceiptHandle)
	lag(2, 2)
	c.ack("lag", "g", msgs[0].ReceiptHandle)
	lag(1, 1)
	c.send("lag", jsonMsg("3"))
	lag(2, 1)
	c.ack("lag", "g", msgs[1].ReceiptHandle)
	lag(1, 0)
	c.ack("lag", "g", handles(c.pull("lag", "g", nil))...)
	lag(0, 0)
}

func TestE2ELongPoll(t *testing.T) {
	t.Parallel()
	c := startServer(t, serverConfig{}).client(t)
	c.createTopic("lp", 2)
	subscribe(c, "lp", "g")

	// Nothing arrives: the wait is honoured, then 200 with no messages.
	start := time.Now()
	if msgs := c.pull("lp", "g", map[string]any{"waitSeconds": 1}); len(msgs) != 0 {
		t.Fatalf("empty topic gave %d messages", len(msgs))
	}
	if d := time.Since(start); d < 900*time.Millisecond {
		t.Errorf("waitSeconds 1 answered after %v", d)
	}

	type result struct {
		msgs []pulledMessage
		err  error
		at   time.Time
	}
	done := make(chan result, 1)
	go func() {
		r, err := c.roundTrip(c.request(t.Context(), "POST", pullPath("lp", "g"), map[string]any{"waitSeconds": 10, "consumerId": "waiter"}, nil))
		res := result{err: err, at: time.Now()}
		if err == nil {
			if r.status != http.StatusOK {
				res.err = fmt.Errorf("long poll: %s", r)
			} else if err := json.Unmarshal(r.body, &struct{ Messages *[]pulledMessage }{&res.msgs}); err != nil {
				res.err = err
			}
		}
		done <- res
	}()
	c.waitParked("lp", "g", "waiter")
	sentAt := time.Now()
	id := c.send("lp", jsonMsg("wake up")).MessageID
	select {
	case res := <-done:
		if res.err != nil {
			t.Fatal(res.err)
		}
		if len(res.msgs) != 1 || res.msgs[0].MessageID != id {
			t.Fatalf("long poll got %+v, want message %s", res.msgs, id)
		}
		if d := res.at.Sub(sentAt); d > 2*time.Second {
			t.Errorf("long poll answered %v after the send, want a few ms", d)
		}
	case <-time.After(8 * time.Second):
		t.Fatal("long poll still parked 8 s after a send")
	}
}

// SPEC §2: "If the client goes away before the answer is written, the
// messages leased for it are released at once (not after their lease),
// without counting an attempt."
func TestE2EDisconnectedPullReleasesAtOnce(t *testing.T) {
	t.Parallel()
	ts := startServer(t, serverConfig{})
	c := ts.client(t)

	// The client is gone while the server writes the answer: it leased
	// messages and its write fails. The reply (8 MiB) is far larger than
	// the socket buffers (the client's is 4 KiB and it never reads; the
	// server's at most 4 MiB), so the server is stuck writing when the
	// client closes.
	t.Run("during the answer", func(t *testing.T) {
		c := c.on(t)
		c.createTopic("gone-w", 1)
		subscribe(c, "gone-w", "g")
		const n = 8
		want := map[string]bool{}
		for i := range n {
			body := bytes.Repeat([]byte{'a' + byte(i)}, 1<<20)
			want[c.send("gone-w", body, hdr{"Content-Type": "application/octet-stream"}).MessageID] = true
		}
		d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
			var serr error
			err := rc.Control(func(fd uintptr) {
				serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
			})
			return errors.Join(err, serr)
		}}
		conn, err := d.DialContext(t.Context(), "tcp", ts.Addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		rawPull(t, conn, ts.Addr, pullPath("gone-w", "g"), `{"maxMessages":100,"invisibleSeconds":60,"consumerId":"slow"}`)
		eventually(t, 10*time.Second, func() error {
			if s := c.getSubscription("gone-w", "g"); s.Inflight != n {
				return fmt.Errorf("%d of %d messages leased to the slow client", s.Inflight, n)
			}
			return nil
		})
		// The request log line comes when the handler returns: it must not
		// have, or the answer fitted in the buffers and this tests nothing.
		if strings.Contains(ts.logs.String(), "path="+pullPath("gone-w", "g")) {
			t.Fatal("the server finished writing the reply before the client left; make the reply larger")
		}
		if err := conn.Close(); err != nil {
			t.Fatal(err)
		}

		got := map[string]bool{}
		deadline := time.Now().Add(5 * time.Second)
		for len(got) < n && time.Now().Before(deadline) {
			for _, m := range c.pull("gone-w", "g", map[string]any{"maxMessages": 100, "waitSeconds": 1, "consumerId": "survivor"}) {
				if !want[m.MessageID] || got[m.MessageID] {
					t.Errorf("unexpected delivery of %s", m.MessageID)
				}
				if m.DeliveryAttempt != 1 {
					t.Errorf("%s: deliveryAttempt %d, want 1 (a release is not a failed attempt)", m.MessageID, m.DeliveryAttempt)
				}
				got[m.MessageID] = true
				c.ack("gone-w", "g", m.ReceiptHandle)
			}
		}
		if len(got) != n {
			t.Fatalf("5 s after the client left, %d of its %d leased messages were released (its lease was 60 s)", len(got), n)
		}
	})

	// The client is gone before any message is there: its parked pull must
	// not take the message that arrives next. Raw TCP clients closing, and
	// HTTP clients whose context is cancelled.
	t.Run("while parked", func(t *testing.T) {
		c := c.on(t)
		c.createTopic("gone-p", 1)
		subscribe(c, "gone-p", "g")
		for round := range 4 {
			consumer := fmt.Sprintf("gone-%d", round)
			pullBody := fmt.Sprintf(`{"waitSeconds":30,"invisibleSeconds":60,"consumerId":%q}`, consumer)
			var leave func()
			if round%2 == 0 {
				conn, err := (&net.Dialer{}).DialContext(t.Context(), "tcp", ts.Addr)
				if err != nil {
					t.Fatal(err)
				}
				rawPull(t, conn, ts.Addr, pullPath("gone-p", "g"), pullBody)
				leave = func() { _ = conn.Close() }
			} else {
				ctx, cancel := context.WithCancel(t.Context())
				errc := make(chan error, 1)
				go func() {
					_, err := c.roundTrip(c.request(ctx, "POST", pullPath("gone-p", "g"), pullBody, nil))
					errc <- err
				}()
				leave = func() {
					cancel()
					if err := <-errc; !errors.Is(err, context.Canceled) {
						t.Errorf("cancelled pull: err = %v, want context.Canceled", err)
					}
				}
			}
			c.waitParked("gone-p", "g", consumer)
			// The server learns that a client left when its read of the
			// connection ends; a message sent before that may still go to
			// the parked pull (a write to a socket the peer just closed
			// succeeds). What is tested is the pull once the server knows:
			// wait for its request to end (its log line), then send.
			pullLine := "path=" + pullPath("gone-p", "g")
			ended := strings.Count(ts.logs.String(), pullLine)
			leave()
			eventually(t, 10*time.Second, func() error {
				if strings.Count(ts.logs.String(), pullLine) == ended {
					return fmt.Errorf("the server has not ended the pull of %s, whose client left", consumer)
				}
				return nil
			})
			id := c.send("gone-p", jsonMsg(fmt.Sprintf("round %d", round))).MessageID

			start := time.Now()
			msgs := c.pull("gone-p", "g", map[string]any{"waitSeconds": 5, "consumerId": "survivor"})
			if len(msgs) != 1 || msgs[0].MessageID != id {
				t.Fatalf("round %d: the survivor got %+v after %v, want message %s", round, msgs, time.Since(start), id)
			}
			if msgs[0].DeliveryAttempt != 1 {
				t.Errorf("round %d: deliveryAttempt %d, want 1", round, msgs[0].DeliveryAttempt)
			}
			c.ack("gone-p", "g", msgs[0].ReceiptHandle)
		}
	})
}

// rawPull writes a pull request on a bare TCP connection and does not read.
func rawPull(t *testing.T, conn net.Conn, host, path, body string) {
	t.Helper()
	_, err := fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		path, host, len(body), body)
	if err != nil {
		t.Fatal(err)
	}
}

// Deleting the subscription or its topic answers a pull parked on it at
// once, never after its wait.
func TestE2EDeleteAnswersParkedPull(t *testing.T) {
	t.Parallel()
	c := startServer(t, serverConfig{}).client(t)
	for _, tc := range []struct{ name, topic, delete string }{
		{"subscription", "delsub", subPath("delsub", "g")},
		{"topic", "deltopic", topicPath("deltopic")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := c.on(t)
			c.createTopic(tc.topic, 1)
			subscribe(c, tc.topic, "g")
			type result struct {
				r   *reply
				err error
			}
			done := make(chan result, 1)
			go func() {
				r, err := c.roundTrip(c.request(t.Context(), "POST", pullPath(tc.topic, "g"), `{"waitSeconds":30,"consumerId":"parked"}`, nil))
				done <- result{r, err}
			}()
			c.waitParked(tc.topic, "g", "parked")
			wantStatus(t, c.do("DELETE", tc.delete, nil), http.StatusNoContent)
			select {
			case res := <-done:
				if res.err != nil {
					t.Fatalf("parked pull: %v", res.err)
				}
				if r := res.r; r.status != http.StatusOK && r.status != http.StatusNotFound {
					t.Errorf("parked pull after DELETE %s: %s, want 200 or 404", tc.delete, r)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("a pull parked on %s still waits 5 s after its DELETE", tc.delete)
			}
		})
	}
}

func TestE2EOperations(t *testing.T) {
	t.Parallel()
	ts := startServer(t, serverConfig{})
	c := ts.client(t)
	for _, path := range []string{"/healthz", "/readyz"} {
		r := c.do("GET", path, nil)
		wantStatus(t, r, http.StatusOK)
		if h := decode[struct{ Status string }](t, r); h.Status != "ok" {
			t.Errorf("%s = %s", path, r.body)
		}
	}
	r := c.do("GET", "/openapi.yaml", nil)
	wantStatus(t, r, http.StatusOK)
	if mt, _, _ := mime.ParseMediaType(r.header.Get("Content-Type")); mt != "application/yaml" {
		t.Errorf("/openapi.yaml Content-Type %q", r.header.Get("Content-Type"))
	}
	if !bytes.Equal(r.body, tidemq.OpenAPI) {
		t.Errorf("/openapi.yaml serves %d bytes that are not the embedded spec (%d bytes)", len(r.body), len(tidemq.OpenAPI))
	}
	// The console, the API reference and the metrics answer as the spec
	// says (their content is tested where they are built; with zero
	// Options, /metrics is an empty exposition).
	for _, path := range []string{"/", "/docs", "/metrics"} {
		r := c.do("GET", path, nil)
		wantStatus(t, r, http.StatusOK)
		if path != "/metrics" && len(r.body) == 0 {
			t.Errorf("GET %s: empty body", path)
		}
	}
	wantProblem(t, c.do("GET", "/no/such/path", nil), http.StatusNotFound, "not_found")
	wantProblem(t, c.do("PATCH", topicPath("x"), "{}"), http.StatusMethodNotAllowed, "method_not_allowed")
	wantProblem(t, c.do("DELETE", "/v1/topics", nil), http.StatusMethodNotAllowed, "method_not_allowed")

	// The request id is echoed, or made.
	if id := c.do("GET", "/healthz", nil, hdr{"X-Request-Id": "abc-123"}).header.Get("X-Request-Id"); id != "abc-123" {
		t.Errorf("X-Request-Id = %q, want abc-123", id)
	}
	if id := c.do("GET", "/healthz", nil).header.Get("X-Request-Id"); id == "" {
		t.Error("no X-Request-Id on the reply")
	}
}

// After the broker closes, readiness and writes answer 503 not_ready, never
// a 500.
func TestE2ENotReadyAfterClose(t *testing.T) {
	t.Parallel()
	ts := startServer(t, serverConfig{})
	c := ts.client(t)
	c.createTopic("closing", 1)
	subscribe(c, "closing", "g")
	if err := ts.b.Close(); err != nil {
		t.Fatal(err)
	}
	wantProblem(t, c.do("GET", "/readyz", nil), http.StatusServiceUnavailable, "not_ready")
	wantStatus(t, c.do("GET", "/healthz", nil), http.StatusOK)
	for _, tc := range []struct {
		method, path string
		body         any
	}{
		{"POST", sendPath("closing"), jsonMsg("x")},
		{"POST", batchPath("closing"), map[string]any{"messages": []any{jsonMsg("x")}}},
		{"PUT", topicPath("another"), nil},
		{"PUT", subPath("closing", "g2"), nil},
		{"DELETE", subPath("closing", "g"), nil},
	} {
		r := c.do(tc.method, tc.path, tc.body)
		if r.status != http.StatusServiceUnavailable {
			t.Errorf("%s %s after Close: got %s, want 503 not_ready", tc.method, tc.path, r)
		}
	}
}

// No malformed request gets a 5xx (SPEC §4): each gets the 4xx it names.
func TestE2EMalformedRequestsAre4xx(t *testing.T) {
	t.Parallel()
	c := startServer(t, serverConfig{}).client(t)
	c.createTopic("mal", 1)
	subscribe(c, "mal", "g")
	future := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	octet := hdr{"Content-Type": "application/octet-stream"}
	many := make([]map[string]any, core.MaxBatchMessages+1)
	for i := range many {
		many[i] = jsonMsg("x")
	}
	type row struct {
		method, path string
		body         any
		h            hdr
		status       int
	}
	rows := []row{
		// topics
		{"PUT", topicPath("mal2"), `{`, nil, 400},
		{"PUT", topicPath("mal2"), `{"queues":"8"}`, nil, 400},
		{"PUT", topicPath("mal2"), `{"queues":1e400}`, nil, 400},
		{"PUT", topicPath("mal2"), `{"queues":99999999999999999999999}`, nil, 400},
		{"PUT", topicPath("mal2"), `{"queues":-1}`, nil, 400},
		{"PUT", topicPath("mal2"), `{"queues":0}`, nil, 400},
		{"PUT", topicPath("mal2"), `{"queues":1.5}`, nil, 400},
		{"PUT", topicPath("mal2"), `{"queues":1025}`, nil, 400},
		{"PUT", topicPath("mal2"), `{"retentionHours":8761}`, nil, 400},
		{"PUT", topicPath("mal2"), `[]`, nil, 400},
		{"PUT", topicPath("mal2"), `null`, nil, 400},
		// send
		{"POST", sendPath("mal"), `{}`, nil, 400},
		{"POST", sendPath("mal"), `{"body":5}`, nil, 400},
		{"POST", sendPath("mal"), `{"body":null}`, nil, 400},
		{"POST", sendPath("mal"), `{"body":"x","bodyEncoding":"hex"}`, nil, 400},
		{"POST", sendPath("mal"), `{"body":"x","bodyEncoding":"base64"}`, nil, 400},
		{"POST", sendPath("mal"), `{"body":"x","tag":""}`, nil, 400},
		{"POST", sendPath("mal"), `{"body":"x","tag":"a|b"}`, nil, 400},
		{"POST", sendPath("mal"), map[string]any{"body": "x", "tag": strings.Repeat("t", 65)}, nil, 400},
		{"POST", sendPath("mal"), `{"body":"x","keys":"k"}`, nil, 400},
		{"POST", sendPath("mal"), map[string]any{"body": "x", "keys": make([]string, 33)}, nil, 400},
		{"POST", sendPath("mal"), map[string]any{"body": "x", "keys": []string{strings.Repeat("k", 129)}}, nil, 400},
		{"POST", sendPath("mal"), `{"body":"x","properties":{"a":1}}`, nil, 400},
		{"POST", sendPath("mal"), `{"body":"x","properties":["a"]}`, nil, 400},
		{"POST", sendPath("mal"), map[string]any{"body": "x", "shardingKey": strings.Repeat("s", 129)}, nil, 400},
		{"POST", sendPath("mal"), `{"body":"x","delaySeconds":-1}`, nil, 400},
		{"POST", sendPath("mal"), `{"body":"x","delaySeconds":604801}`, nil, 400},
		{"POST", sendPath("mal"), `{"body":"x","delaySeconds":1e400}`, nil, 400},
		{"POST", sendPath("mal"), `{"body":"x","delaySeconds":1,"deliverAt":"` + future + `"}`, nil, 400},
		{"POST", sendPath("mal"), `{"body":"x","deliverAt":"yesterday"}`, nil, 400},
		{"POST", sendPath("mal"), `{"body":"x","deliverAt":"` + time.Now().AddDate(0, 0, 8).UTC().Format(time.RFC3339) + `"}`, nil, 400},
		{"POST", sendPath("mal"), `{"body":"x","dedupKey":""}`, nil, 400},
		{"POST", sendPath("mal"), `{"body":"x"}`, hdr{"X-Producer-Group": strings.Repeat("p", 129)}, 400},
		{"POST", sendPath("mal"), nil, nil, 400},
		{"POST", sendPath("mal"), []byte{}, octet, 400},
		{"POST", sendPath("mal"), "x", hdr{"Content-Type": "application/octet-stream", "X-Tidemq-Delay-Seconds": "abc"}, 400},
		{"POST", sendPath("mal"), "x", hdr{"Content-Type": "application/octet-stream", "X-Tidemq-Delay-Seconds": "99999999999999999999"}, 400},
		{"POST", sendPath("mal"), "x", hdr{"Content-Type": "application/octet-stream", "X-Tidemq-Delay-Seconds": "-5"}, 400},
		{"POST", sendPath("mal"), "x", hdr{"Content-Type": "application/octet-stream", "X-Tidemq-Deliver-At": "soon"}, 400},
		{"POST", sendPath("mal"), "x", hdr{"Content-Type": "application/octet-stream", "X-Tidemq-Tag": "a b"}, 400},
		{"POST", sendPath("mal"), "x", hdr{"Content-Type": "application/octet-stream", "X-Tidemq-Keys": strings.Repeat("k,", 40)}, 400},
		{"POST", sendPath("mal"), "x", hdr{"Content-Type": "application/octet-stream", "X-Tidemq-Delay-Seconds": "1", "X-Tidemq-Deliver-At": future}, 400},
		{"POST", sendPath("mal"), "not json", hdr{"Content-Type": "application/json; charset=utf-8"}, 400},
		// batch
		{"POST", batchPath("mal"), `{"messages":[]}`, nil, 400},
		{"POST", batchPath("mal"), `{"messages":{}}`, nil, 400},
		{"POST", batchPath("mal"), `{"messages":null}`, nil, 400},
		{"POST", batchPath("mal"), `{}`, nil, 400},
		{"POST", batchPath("mal"), `{"messages":[5]}`, nil, 400},
		{"POST", batchPath("mal"), map[string]any{"messages": many}, nil, 400},
		// subscriptions
		{"PUT", subPath("mal", "s"), `{"mode":"fanout"}`, nil, 400},
		{"PUT", subPath("mal", "s"), `{"orderly":"yes"}`, nil, 400},
		{"PUT", subPath("mal", "s"), `{"maxRetries":33}`, nil, 400},
		{"PUT", subPath("mal", "s"), `{"maxRetries":-1}`, nil, 400},
		{"PUT", subPath("mal", "s"), `{"startFrom":"yesterday"}`, nil, 400},
		{"PUT", subPath("mal", "s"), `{"retryDelays":[]}`, nil, 400},
		{"PUT", subPath("mal", "s"), `{"retryDelays":["10x"]}`, nil, 400},
		{"PUT", subPath("mal", "s"), `{"retryDelays":["99999999999h"]}`, nil, 400},
		{"PUT", subPath("mal", "s"), `{"retryDelays":["25h"]}`, nil, 400},
		{"PUT", subPath("mal", "s"), `{"push":{"endpoint":"ftp://x"}}`, nil, 400},
		// pull
		{"POST", pullPath("mal", "g"), `{"maxMessages":-1}`, nil, 400},
		{"POST", pullPath("mal", "g"), `{"maxMessages":0}`, nil, 400},
		{"POST", pullPath("mal", "g"), `{"maxMessages":1001}`, nil, 400},
		{"POST", pullPath("mal", "g"), `{"maxMessages":"10"}`, nil, 400},
		{"POST", pullPath("mal", "g"), `{"maxMessages":1e400}`, nil, 400},
		{"POST", pullPath("mal", "g"), `{"maxMessages":9223372036854775808}`, nil, 400},
		{"POST", pullPath("mal", "g"), `{"maxMessages":2.5}`, nil, 400},
		{"POST", pullPath("mal", "g"), `{"waitSeconds":31}`, nil, 400},
		{"POST", pullPath("mal", "g"), `{"waitSeconds":-1}`, nil, 400},
		{"POST", pullPath("mal", "g"), `{"invisibleSeconds":0}`, nil, 400},
		{"POST", pullPath("mal", "g"), `{"invisibleSeconds":43201}`, nil, 400},
		{"POST", pullPath("mal", "g"), `{"consumerId":""}`, nil, 400},
		{"POST", pullPath("mal", "g"), map[string]any{"consumerId": strings.Repeat("c", 129)}, nil, 400},
		{"POST", pullPath("mal", "g"), `{"waitSeconds":1`, nil, 400},
		// ack
		{"POST", ackPath("mal", "g"), `{"receiptHandles":[]}`, nil, 400},
		{"POST", ackPath("mal", "g"), `{}`, nil, 400},
		{"POST", ackPath("mal", "g"), nil, nil, 400},
		{"POST", ackPath("mal", "g"), `{"receiptHandles":"x"}`, nil, 400},
		{"POST", ackPath("mal", "g"), `{"receiptHandles":[1]}`, nil, 400},
		{"POST", ackPath("mal", "g"), `{"receiptHandles":[null]}`, nil, 400},
		{"POST", ackPath("mal", "g"), map[string]any{"receiptHandles": make([]string, 1001)}, nil, 400},
		// transport-level
		{"POST", sendPath("mal"), `{"body":"x"}`, hdr{"Content-Encoding": "gzip"}, 400},
		{"POST", sendPath("mal"), `{"body":"x"}`, hdr{"Content-Encoding": "compress"}, 415},
		{"POST", sendPath("mal"), `{"body":"x"}`, hdr{"Content-Type": "text/plain"}, 415},
		{"POST", sendPath("mal"), `{"body":"x"}`, hdr{"Content-Type": "garbage;;;"}, 415},
		{"GET", "/v1/topics/mal/nothing", nil, nil, 404},
		{"GET", "/v1/topics/", nil, nil, 404},
		{"DELETE", "/v1/topics", nil, nil, 405},
		{"POST", pullPath("mal", "g") + "/", `{}`, nil, 404},
		{"PUT", "/v1/topics/a%00b", nil, nil, 400},
		{"POST", topicPath("mal"), `{}`, nil, 405},
	}
	for _, tc := range rows {
		r := c.do(tc.method, tc.path, tc.body, tc.h)
		if r.status != tc.status {
			t.Errorf("%s %s %s %v: got %s, want %d", tc.method, tc.path, truncate(fmt.Append(nil, tc.body), 80), tc.h, r, tc.status)
		}
	}
	if tp := c.getTopic("mal"); tp.Messages != 0 {
		t.Errorf("malformed sends stored %d messages", tp.Messages)
	}
	if s := c.getSubscription("mal", "g"); s.Inflight != 0 {
		t.Errorf("malformed pulls leased %d messages", s.Inflight)
	}
}
