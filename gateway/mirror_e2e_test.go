package gateway_test

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidemq/tidemq/core"
	"github.com/tidemq/tidemq/gateway"
	"github.com/tidemq/tidemq/mirror"
	"github.com/tidemq/tidemq/sdk"
)

// Mirrors end to end: two brokers on loopback, each a real Pebble store,
// core and gateway behind an HTTP server, with a mirror runner; the
// destination copies over the source's public API.

const mirrorToken = "tmq_mirror-token-for-tests-000000004"

func mirrorTokens(t *testing.T, withMirror bool) *gateway.Tokens {
	t.Helper()
	doc := "tokens:\n  - name: ops\n    sha256: " + gateway.HashToken(adminToken) + "\n    grants: [{actions: [admin]}]\n"
	if withMirror {
		doc += "  - name: mirror\n    sha256: " + gateway.HashToken(mirrorToken) + "\n    grants: [{actions: [admin, subscribe]}]\n"
	}
	tokens, err := gateway.ParseTokens([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return tokens
}

// startRegion is a broker of region with a mirror runner quick to retry;
// opts, when given, are the broker's options.
func startRegion(t *testing.T, region string, opts ...core.Options) *testServer {
	t.Helper()
	cfg := serverConfig{gateway: gateway.Options{Region: region}}
	if len(opts) > 0 {
		cfg.core = opts[0]
	}
	ts := startServer(t, cfg)
	r, err := mirror.New(ts.b, mirror.Options{Region: region, Reconcile: 20 * time.Millisecond, Wait: time.Second,
		MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, OpenFor: 300 * time.Millisecond,
		StatusEvery: 50 * time.Millisecond, Client: &http.Client{Timeout: 10 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	// Cleanups run last-in first: the runner stops before the broker.
	t.Cleanup(func() {
		if err := r.Close(); err != nil {
			t.Errorf("runner Close: %v", err)
		}
	})
	return ts
}

// putOrders creates the topic orders, of queues queues, on each client's
// broker.
func putOrders(t *testing.T, queues int, clients ...*sdk.Client) {
	t.Helper()
	for _, c := range clients {
		if _, _, err := c.PutTopic(t.Context(), "orders", sdk.TopicConfig{Queues: queues}); err != nil {
			t.Fatal(err)
		}
	}
}

// twoRegions starts hz, the source region (with its mirror runner), beside
// sg, with an SDK client for each (src on hz, dst on sg) and the topic
// orders on both.
func twoRegions(t *testing.T, queues int, sg *testServer) (hz *testServer, src, dst *sdk.Client) {
	t.Helper()
	hz = startRegion(t, "hz")
	src, dst = sdkClient(t, hz.URL, ""), sdkClient(t, sg.URL, "")
	putOrders(t, queues, src, dst)
	return hz, src, dst
}

// mirrorOrders defines on dst the mirror name, which copies the topic
// orders of the broker at srcURL into dst's orders.
func mirrorOrders(t *testing.T, dst *sdk.Client, name, srcURL string) {
	t.Helper()
	cfg := sdk.MirrorConfig{Source: sdk.MirrorSource{URL: srcURL, Topic: "orders"}, Topic: "orders"}
	if _, _, err := dst.PutMirror(t.Context(), name, cfg); err != nil {
		t.Fatal(err)
	}
}

func sdkClient(t *testing.T, url, token string) *sdk.Client {
	t.Helper()
	c, err := sdk.NewClient(url, sdk.ClientOptions{Token: token})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// topicMessages reads every message stored on a topic, by query.
func topicMessages(t *testing.T, c *sdk.Client, topic string) []sdk.StoredMessage {
	t.Helper()
	var out []sdk.StoredMessage
	for m, err := range c.Messages(t.Context(), topic, sdk.MessageQuery{Limit: 1000}) {
		if err != nil {
			t.Fatalf("query %s: %v", topic, err)
		}
		out = append(out, m)
	}
	return out
}

func countMessages(t *testing.T, c *sdk.Client, topic string) int64 {
	t.Helper()
	tp, err := c.GetTopic(t.Context(), topic)
	if errors.Is(err, sdk.ErrTopicNotFound) {
		return 0
	}
	if err != nil {
		t.Fatalf("GetTopic %s: %v", topic, err)
	}
	var n int64
	for _, q := range tp.QueueStats {
		n += q.MaxOffset - q.MinOffset
	}
	return n
}

func TestMirrorCopiesKeepsFieldsAndRecovers(t *testing.T) {
	hz := startRegion(t, "hz")
	sg := startRegion(t, "sg")
	hz.gw.SetTokens(mirrorTokens(t, true))
	src := sdkClient(t, hz.URL, adminToken)
	dst := sdkClient(t, sg.URL, "")
	c := sg.client(t)
	ctx := t.Context()
	top := t

	if _, _, err := src.PutTopic(ctx, "orders", sdk.TopicConfig{Queues: 4}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := dst.PutTopic(ctx, "orders", sdk.TopicConfig{Queues: 2}); err != nil {
		t.Fatal(err)
	}
	var sent []sdk.SendMessage
	for i := range 40 {
		m := sdk.NewMessage(fmt.Sprintf("order %d", i))
		if i%5 == 0 {
			m = sdk.NewBinaryMessage([]byte{0xff, 0x00, byte(i)})
		}
		m.Tag = "TagA"
		m.Keys = []string{fmt.Sprintf("order-%d", i)}
		m.Properties = map[string]string{"color": "blue"}
		m.ShardingKey = fmt.Sprintf("customer-%d", i%3)
		sent = append(sent, m)
	}
	if _, err := src.SendBatch(ctx, "orders", "shop", sent); err != nil {
		t.Fatal(err)
	}

	t.Run("bad requests", func(t *testing.T) {
		c := c.on(t)
		good := map[string]any{"source": map[string]any{"url": hz.URL, "topic": "orders"}, "topic": "orders"}
		wantProblem(t, c.do("PUT", "/v1/mirrors/bad%20name", good), 400, "invalid_name")
		wantProblem(t, c.do("PUT", "/v1/mirrors/m1", map[string]any{"source": map[string]any{"url": "ftp://x", "topic": "orders"}, "topic": "orders"}), 400, "invalid_request")
		wantProblem(t, c.do("PUT", "/v1/mirrors/m1", map[string]any{"topic": "orders"}), 400, "invalid_request")
		wantProblem(t, c.do("PUT", "/v1/mirrors/m1", map[string]any{"source": map[string]any{"url": hz.URL, "topic": "orders"}, "topic": "orders", "filter": "a ||"}), 400, "invalid_filter")
		wantProblem(t, c.do("PUT", "/v1/mirrors/m1", `{"source":`), 400, "invalid_request")
		wantProblem(t, c.do("GET", "/v1/mirrors/nope", nil), 404, "mirror_not_found")
		wantProblem(t, c.do("DELETE", "/v1/mirrors/nope", nil), 404, "mirror_not_found")
	})

	body := map[string]any{"source": map[string]any{"url": hz.URL, "topic": "orders", "token": mirrorToken},
		"topic": "orders", "filter": "*", "startFrom": "earliest", "alerts": map[string]any{"maxLag": 1000}}
	r := c.do("PUT", "/v1/mirrors/from-hz", body)
	wantStatus(t, r, http.StatusCreated)
	if strings.Contains(string(r.body), mirrorToken) {
		t.Fatalf("PUT answered the token back: %s", r)
	}
	wantStatus(t, c.do("PUT", "/v1/mirrors/from-hz", body), http.StatusOK)

	eventually(t, 20*time.Second, func() error {
		if n := countMessages(t, dst, "orders"); n != int64(len(sent)) {
			return fmt.Errorf("%d of %d copied", n, len(sent))
		}
		m, err := dst.GetMirror(ctx, "from-hz")
		if err != nil {
			return err
		}
		if m.State != sdk.MirrorRunning || m.Copied != int64(len(sent)) || m.LastCopiedAt == nil || m.Lag != 0 {
			return fmt.Errorf("mirror %+v", m)
		}
		return nil
	})

	t.Run("copies keep fields and order", func(t *testing.T) {
		srcMsgs := topicMessages(t, src, "orders")
		byID := map[string]sdk.StoredMessage{}
		for _, m := range srcMsgs {
			byID[m.MessageID] = m
		}
		copies := topicMessages(t, dst, "orders")
		byOffset := func(x, y sdk.StoredMessage) int { return cmp.Compare(*x.Offset, *y.Offset) }
		slices.SortFunc(srcMsgs, byOffset)
		slices.SortFunc(copies, byOffset)
		if len(copies) != len(sent) {
			t.Fatalf("%d copies, want %d", len(copies), len(sent))
		}
		perKey := map[string][]string{}
		for _, cp := range copies {
			orig, ok := byID[cp.Properties[core.PropMirrorSourceMessageID]]
			if !ok {
				t.Fatalf("copy %s names no source message: %v", cp.MessageID, cp.Properties)
			}
			if cp.Body != orig.Body || cp.BodyEncoding != orig.BodyEncoding || cp.Tag != orig.Tag || !slices.Equal(cp.Keys, orig.Keys) ||
				cp.ShardingKey != orig.ShardingKey || !cp.BornAt.Equal(orig.BornAt) || cp.ProducerGroup != orig.ProducerGroup {
				t.Errorf("copy %+v\nof      %+v", cp, orig)
			}
			if cp.Properties["color"] != "blue" || cp.Properties[core.PropMirrorSourceRegion] != "hz" || cp.Properties[core.PropMirrorPath] != "hz" {
				t.Errorf("copy properties %v", cp.Properties)
			}
			perKey[cp.ShardingKey] = append(perKey[cp.ShardingKey], cp.Body)
		}
		// Per sharding key, the copies are in the source's order.
		want := map[string][]string{}
		for _, m := range srcMsgs {
			want[m.ShardingKey] = append(want[m.ShardingKey], m.Body)
		}
		for k, bodies := range want {
			if !slices.Equal(perKey[k], bodies) {
				t.Errorf("key %s: copies in order %v, source %v", k, perKey[k], bodies)
			}
		}
	})

	t.Run("list and metrics", func(t *testing.T) {
		r := c.on(t).do("GET", "/v1/mirrors", nil)
		wantStatus(t, r, 200)
		l := decode[sdk.MirrorList](t, r)
		if len(l.Mirrors) != 1 || l.Mirrors[0].Name != "from-hz" || l.Mirrors[0].Source.Token != "" {
			t.Errorf("list %+v", l)
		}
		h, err := src.Health(ctx)
		if err != nil || h.Region != "hz" {
			t.Errorf("source healthz = %+v, %v", h, err)
		}
	})

	t.Run("revoked token fails, then recovers", func(t *testing.T) {
		hz.gw.SetTokens(mirrorTokens(t, false))
		// Restored whatever happens, so that the later subtests can run.
		defer hz.gw.SetTokens(mirrorTokens(t, true))
		eventually(t, 20*time.Second, func() error {
			m, err := dst.GetMirror(ctx, "from-hz")
			if err != nil {
				return err
			}
			if m.State != sdk.MirrorFailing || m.LastError == nil || !strings.Contains(*m.LastError, "unauthenticated") {
				return fmt.Errorf("mirror %+v", m)
			}
			return nil
		})
		if _, err := src.Send(ctx, "orders", "", sdk.NewMessage("while revoked")); err != nil {
			t.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond) // a copier that could read would copy it by now
		if n := countMessages(t, dst, "orders"); n != int64(len(sent)) {
			t.Fatalf("%d copies while the token was revoked", n)
		}
		hz.gw.SetTokens(mirrorTokens(t, true))
		eventually(t, 30*time.Second, func() error {
			m, err := dst.GetMirror(ctx, "from-hz")
			if err != nil {
				return err
			}
			if n := countMessages(t, dst, "orders"); m.State != sdk.MirrorRunning || n != int64(len(sent))+1 {
				return fmt.Errorf("%d copies, mirror %+v", n, m)
			}
			return nil
		})
	})

	t.Run("source down fails, then recovers", func(t *testing.T) {
		hz.srv.Close()
		eventually(t, 20*time.Second, func() error {
			m, err := dst.GetMirror(ctx, "from-hz")
			if err != nil {
				return err
			}
			if m.State != sdk.MirrorFailing || m.LastError == nil || !strings.Contains(*m.LastError, "refused") {
				return fmt.Errorf("mirror %+v", m)
			}
			return nil
		})
		if _, err := hz.b.Send(ctx, "orders", []*core.Message{{Body: []byte("while down")}}); err != nil {
			t.Fatal(err)
		}
		// The source comes back at its address.
		ln, err := net.Listen("tcp", hz.Addr)
		if err != nil {
			t.Fatalf("listening again on %s: %v", hz.Addr, err)
		}
		back := &http.Server{Handler: hz.gw, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = back.Serve(ln) }()
		top.Cleanup(func() { // runs before the broker's cleanup, registered earlier
			hz.b.StopPolling()
			_ = back.Close()
		})
		eventually(t, 30*time.Second, func() error {
			m, err := dst.GetMirror(ctx, "from-hz")
			if err != nil {
				return err
			}
			if n := countMessages(t, dst, "orders"); m.State != sdk.MirrorRunning || n != int64(len(sent))+2 {
				return fmt.Errorf("%d copies, mirror %+v", n, m)
			}
			return nil
		})
	})

	t.Run("delete stops it", func(t *testing.T) {
		c := c.on(t)
		wantStatus(t, c.do("DELETE", "/v1/mirrors/from-hz", nil), http.StatusNoContent)
		wantProblem(t, c.do("GET", "/v1/mirrors/from-hz", nil), 404, "mirror_not_found")
		// The source subscription goes with it, so nothing more is read.
		eventually(t, 10*time.Second, func() error {
			_, err := src.GetSubscription(ctx, "orders", mirror.SourceGroup("sg", "from-hz"))
			if !errors.Is(err, sdk.ErrSubscriptionNotFound) {
				return fmt.Errorf("source subscription: %v", err)
			}
			return nil
		})
		if _, err := src.Send(ctx, "orders", "", sdk.NewMessage("after delete")); err != nil {
			t.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond) // a copier still running would copy it by now
		if n := countMessages(t, dst, "orders"); n != int64(len(sent))+2 {
			t.Errorf("%d copies after the delete, want %d", n, len(sent)+2)
		}
	})
}

// Two mirrors, hz → sg and sg → hz: every message ends up once in each
// region, none ping-pongs.
func TestMirrorsBothWaysDoNotLoop(t *testing.T) {
	sg := startRegion(t, "sg")
	hz, a, b := twoRegions(t, 2, sg)
	ctx := t.Context()
	mirrorOrders(t, b, "from-hz", hz.URL)
	mirrorOrders(t, a, "from-sg", sg.URL)
	for i := range 10 {
		if _, err := a.Send(ctx, "orders", "", sdk.NewMessage(fmt.Sprintf("hz %d", i))); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Send(ctx, "orders", "", sdk.NewMessage(fmt.Sprintf("sg %d", i))); err != nil {
			t.Fatal(err)
		}
	}
	settled := func() error {
		for _, c := range []struct {
			cl    *sdk.Client
			name  string
			src   *sdk.Client
			group string
		}{{b, "from-hz", a, mirror.SourceGroup("sg", "from-hz")}, {a, "from-sg", b, mirror.SourceGroup("hz", "from-sg")}} {
			if n := countMessages(t, c.cl, "orders"); n != 20 {
				return fmt.Errorf("%s side holds %d messages, want 20", c.name, n)
			}
			s, err := c.src.GetSubscription(ctx, "orders", c.group)
			if err != nil {
				return err
			}
			if s.Lag != 0 {
				return fmt.Errorf("%s: source lag %d", c.name, s.Lag)
			}
		}
		return nil
	}
	eventually(t, 30*time.Second, settled)
	time.Sleep(500 * time.Millisecond) // a loop would have copied copies by now
	if err := settled(); err != nil {
		t.Fatal(err)
	}
	for _, m := range topicMessages(t, a, "orders") {
		if strings.HasPrefix(m.Body, "sg") && m.Properties[core.PropMirrorPath] != "sg" {
			t.Errorf("copy in hz with path %q", m.Properties[core.PropMirrorPath])
		}
		if strings.HasPrefix(m.Body, "hz") && m.Properties[core.PropMirrorPath] != "" {
			t.Errorf("hz original was changed: %v", m.Properties)
		}
	}
	ma, err := a.GetMirror(ctx, "from-sg")
	if err != nil || ma.Copied != 10 {
		t.Errorf("from-sg = %+v, %v; want 10 copied (the copies of hz messages skipped)", ma, err)
	}
}

// The mirror metrics are served under the names the README gives
// (tidemq_mirror_lag, tidemq_mirror_copied_total, tidemq_mirror_failing),
// through the meter provider the broker process uses.
func TestMirrorMetricsNamedAsDocumented(t *testing.T) {
	ts := startMeteredServer(t)
	c := ts.client(t)
	c.createTopic("orders", 1)
	wantStatus(t, c.do("PUT", "/v1/mirrors/from-hz", map[string]any{"source": map[string]any{"url": "http://127.0.0.1:1", "topic": "orders"}, "topic": "orders"}), http.StatusCreated)
	ts.b.ReportMirror("from-hz", core.MirrorStatus{Failing: true, LastError: "source down", Lag: 7})
	r := c.do("GET", "/metrics", nil)
	wantStatus(t, r, http.StatusOK)
	for _, want := range []string{
		`tidemq_mirror_lag{mirror="from-hz",topic="orders"} 7`,
		`tidemq_mirror_copied_total{mirror="from-hz",topic="orders"} 0`,
		`tidemq_mirror_failing{mirror="from-hz",topic="orders"} 1`,
	} {
		if !slices.Contains(strings.Split(string(r.body), "\n"), want) {
			t.Errorf("/metrics has no line %s; its mirror lines:\n%s", want, grepLines(string(r.body), "tidemq_mirror_"))
		}
	}
}

// grepLines is the lines of s that start with prefix.
func grepLines(s, prefix string) string {
	var out []string
	for line := range strings.SplitSeq(s, "\n") {
		if strings.HasPrefix(line, prefix) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

// A delayed message is copied when it comes due at the source, not
// before, with its bornAt; a copy's traceparent is in the source
// message's trace.
func TestMirrorDelayedCopyKeepsDueTimeAndTrace(t *testing.T) {
	sg := startRegion(t, "sg")
	hz, src, dst := twoRegions(t, 2, sg)
	ctx := t.Context()
	mirrorOrders(t, dst, "from-hz", hz.URL)
	const trace = "4bf92f3577b34da6a3ce929d0e0e4736"
	c := hz.client(t)
	tp := hdr{"traceparent": "00-" + trace + "-00f067aa0ba902b7-01"}
	const delay = 3 * time.Second
	sentAt := time.Now()
	c.send("orders", map[string]any{"body": "later", "tag": "Later", "shardingKey": "k", "delaySeconds": int(delay / time.Second)}, tp)
	c.send("orders", map[string]any{"body": "now", "tag": "Now", "shardingKey": "k"}, tp)

	copyTagged := func(tag string) *sdk.StoredMessage {
		t.Helper()
		var found []sdk.StoredMessage
		for m, err := range dst.Messages(ctx, "orders", sdk.MessageQuery{Tag: tag}) {
			if err != nil {
				t.Fatal(err)
			}
			found = append(found, m)
		}
		if len(found) > 1 {
			t.Fatalf("%d copies tagged %s", len(found), tag)
		}
		if len(found) == 0 {
			return nil
		}
		return &found[0]
	}
	eventually(t, 20*time.Second, func() error {
		if copyTagged("Now") == nil {
			return errors.New("the message sent second, due at once, is not copied yet")
		}
		return nil
	})
	if early := copyTagged("Later"); early != nil && time.Since(sentAt) < delay-500*time.Millisecond {
		t.Fatalf("the delayed message was copied %v after it was sent, before it was due (%v): %+v", time.Since(sentAt), delay, early)
	}
	var cp *sdk.StoredMessage
	eventually(t, 20*time.Second, func() error {
		if cp = copyTagged("Later"); cp == nil {
			return errors.New("the delayed message is not copied")
		}
		return nil
	})
	var orig sdk.StoredMessage
	for m, err := range src.Messages(ctx, "orders", sdk.MessageQuery{Tag: "Later"}) {
		if err != nil {
			t.Fatal(err)
		}
		orig = m
	}
	if cp.Properties[core.PropMirrorSourceMessageID] != orig.MessageID || !cp.BornAt.Equal(orig.BornAt) || cp.StoredAt.Before(orig.StoredAt) ||
		cp.StoredAt.Before(sentAt.Add(delay).Truncate(time.Millisecond)) {
		t.Errorf("copy %+v\nof       %+v (sent %s, delay %v)", cp, orig, sentAt.Format(time.RFC3339Nano), delay)
	}
	for _, m := range []*sdk.StoredMessage{cp, copyTagged("Now")} {
		if len(m.Traceparent) != 55 || m.Traceparent[3:35] != trace {
			t.Errorf("copy %s has traceparent %q, not in the source's trace %s", m.Body, m.Traceparent, trace)
		}
	}
}

// A copy the destination refuses (a body over its limit) leaves the mirror
// failing with the error, and the message unacked at the source: a batch
// is acked there only once stored here.
func TestMirrorRefusedCopyIsNotAcked(t *testing.T) {
	sg := startRegion(t, "sg", core.Options{MaxMessageBytes: 1024})
	hz, src, dst := twoRegions(t, 1, sg)
	ctx := t.Context()
	if _, err := src.Send(ctx, "orders", "", sdk.NewMessage("small")); err != nil {
		t.Fatal(err)
	}
	big, err := src.Send(ctx, "orders", "", sdk.NewMessage(strings.Repeat("x", 2048)))
	if err != nil {
		t.Fatal(err)
	}
	mirrorOrders(t, dst, "from-hz", hz.URL)
	group := mirror.SourceGroup("sg", "from-hz")
	eventually(t, 20*time.Second, func() error {
		m, err := dst.GetMirror(ctx, "from-hz")
		if err != nil {
			return err
		}
		if m.State != sdk.MirrorFailing || m.LastError == nil || !strings.Contains(*m.LastError, "too large") || !strings.Contains(*m.LastError, big.MessageID) {
			return fmt.Errorf("mirror %+v", m)
		}
		return nil
	})
	// Several attempts later, the big message is still not acked at the
	// source, and nothing of its batch is stored here.
	time.Sleep(500 * time.Millisecond)
	r := hz.client(t).do("GET", "/v1/topics/orders/messages/"+big.MessageID, nil)
	wantStatus(t, r, http.StatusOK)
	where := decode[struct {
		Subscriptions []struct{ Group, State string }
	}](t, r)
	for _, s := range where.Subscriptions {
		if s.Group == group && s.State == "acked" {
			t.Errorf("the refused message is acked at the source: %+v", where)
		}
	}
	if s, err := src.GetSubscription(ctx, "orders", group); err != nil || s.Lag < 1 {
		t.Errorf("source subscription %s: %+v, %v; want the refused message in its lag", group, s, err)
	}
	if n := countMessages(t, dst, "orders"); n > 1 {
		t.Errorf("%d copies stored, want at most the one before the refused message", n)
	}
}

// A slow network that also loses replies: every request between the
// mirror and its source is delayed, and every other ack reaches the source
// while its reply is lost (502 to the mirror). The mirror copies every
// message once, per key in the source's order, and ends running.
func TestMirrorOverSlowLossyNetwork(t *testing.T) {
	hz := startRegion(t, "hz")
	sg := startRegion(t, "sg")
	target, err := url.Parse(hz.URL)
	if err != nil {
		t.Fatal(err)
	}
	fwd := httputil.NewSingleHostReverseProxy(target)
	var acks, lost atomic.Int64
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(100 * time.Millisecond) // there
		if strings.HasSuffix(r.URL.Path, "/ack") && acks.Add(1)%2 == 0 {
			rec := httptest.NewRecorder()
			fwd.ServeHTTP(rec, r)
			if rec.Code == http.StatusOK {
				lost.Add(1)
			}
			http.Error(w, "reply lost", http.StatusBadGateway)
			return
		}
		fwd.ServeHTTP(w, r)
		time.Sleep(100 * time.Millisecond) // and back (the reply is written; the handler only holds the connection)
	}))
	t.Cleanup(proxy.Close)
	src := sdkClient(t, hz.URL, "")
	dst := sdkClient(t, sg.URL, "")
	ctx := t.Context()
	if _, _, err := src.PutTopic(ctx, "orders", sdk.TopicConfig{Queues: 2}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := dst.PutTopic(ctx, "orders", sdk.TopicConfig{Queues: 2}); err != nil {
		t.Fatal(err)
	}
	mirrorOrders(t, dst, "from-hz", proxy.URL)
	const rounds, perRound = 8, 5
	for i := range rounds {
		var batch []sdk.SendMessage
		for j := range perRound {
			m := sdk.NewMessage(fmt.Sprintf("m-%02d-%d", i, j))
			m.ShardingKey = fmt.Sprintf("key-%d", j%3)
			batch = append(batch, m)
		}
		if _, err := src.SendBatch(ctx, "orders", "", batch); err != nil {
			t.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond) // more than a round trip: several pulls, several acks
	}
	eventually(t, 60*time.Second, func() error {
		if n := countMessages(t, dst, "orders"); n < rounds*perRound {
			return fmt.Errorf("%d of %d copied", n, rounds*perRound)
		}
		m, err := dst.GetMirror(ctx, "from-hz")
		if err != nil {
			return err
		}
		if s, err := src.GetSubscription(ctx, "orders", mirror.SourceGroup("sg", "from-hz")); err != nil || s.Lag != 0 || m.State != sdk.MirrorRunning {
			return fmt.Errorf("mirror %+v; source subscription %+v, %v", m, s, err)
		}
		return nil
	})
	if lost.Load() == 0 {
		t.Fatal("no ack reply was lost: the test did not test that")
	}
	time.Sleep(500 * time.Millisecond) // a batch handed out again would be stored by now
	copies := topicMessages(t, dst, "orders")
	slices.SortFunc(copies, func(x, y sdk.StoredMessage) int {
		return cmp.Or(cmp.Compare(x.QueueID, y.QueueID), cmp.Compare(*x.Offset, *y.Offset))
	})
	seen := map[string]int{}
	last := map[string]string{}
	for _, cp := range copies {
		seen[cp.Body]++
		if prev, ok := last[cp.ShardingKey]; ok && prev >= cp.Body {
			t.Errorf("key %s: %s stored after %s", cp.ShardingKey, cp.Body, prev)
		}
		last[cp.ShardingKey] = cp.Body
	}
	for body, n := range seen {
		if n != 1 {
			t.Errorf("%s stored %d times", body, n)
		}
	}
	if len(seen) != rounds*perRound {
		t.Errorf("%d distinct copies, want %d", len(seen), rounds*perRound)
	}
	t.Logf("%d acks through the proxy, %d replies lost after the ack took effect", acks.Load(), lost.Load())
}

// A pause holds from its answer on: a copier that pulled a batch before
// it learnt of the pause (the runner looks at the definitions only now
// and then; here once an hour) stores nothing, and leaves the batch unacked
// at the source; once resumed, the same copier stores it.
func TestMirrorPauseHoldsAtOnce(t *testing.T) {
	sg := startServer(t, serverConfig{gateway: gateway.Options{Region: "sg"}})
	hz, src, dst := twoRegions(t, 1, sg)
	ctx := t.Context()
	cfg := sdk.MirrorConfig{Source: sdk.MirrorSource{URL: hz.URL, Topic: "orders"}, Topic: "orders"}
	if _, _, err := dst.PutMirror(ctx, "from-hz", cfg); err != nil {
		t.Fatal(err)
	}
	r, err := mirror.New(sg.b, mirror.Options{Region: "sg", Reconcile: time.Hour, Wait: 2 * time.Second,
		MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, StatusEvery: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	copied := func(want int64) func() error {
		return func() error {
			if n := countMessages(t, dst, "orders"); n != want {
				return fmt.Errorf("%d copies, want %d", n, want)
			}
			return nil
		}
	}
	if _, err := src.Send(ctx, "orders", "", sdk.NewMessage("before")); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, copied(1))

	cfg.State = sdk.MirrorPaused
	if m, _, err := dst.PutMirror(ctx, "from-hz", cfg); err != nil || m.State != sdk.MirrorPaused {
		t.Fatalf("pause: %+v, %v", m, err)
	}
	if _, err := src.Send(ctx, "orders", "", sdk.NewMessage("while paused")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // the copier pulls it at once, and tries to store it
	if err := copied(1)(); err != nil {
		t.Fatalf("paused: %v", err)
	}
	if s, err := src.GetSubscription(ctx, "orders", mirror.SourceGroup("sg", "from-hz")); err != nil || s.Lag != 1 {
		t.Errorf("source subscription while paused: %+v, %v; want lag 1", s, err)
	}
	if m, err := dst.GetMirror(ctx, "from-hz"); err != nil || m.State != sdk.MirrorPaused || m.LastError != nil {
		t.Errorf("mirror while paused: %+v, %v; want paused, no error", m, err)
	}

	cfg.State = sdk.MirrorRunning
	if _, _, err := dst.PutMirror(ctx, "from-hz", cfg); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, copied(2))
	if m, err := dst.GetMirror(ctx, "from-hz"); err != nil || m.State != sdk.MirrorRunning || m.LastError != nil {
		t.Errorf("mirror resumed: %+v, %v; want running, no error", m, err)
	}
}

// A mirror that caught up says lag 0 within a few seconds, not only when
// its next long poll ends empty (20 s later): here every batch is full,
// so no short batch says the source ran out.
func TestMirrorLagSettlesSoonAfterCatchingUp(t *testing.T) {
	sg := startServer(t, serverConfig{gateway: gateway.Options{Region: "sg"}})
	hz, src, dst := twoRegions(t, 1, sg)
	ctx := t.Context()
	var batch []sdk.SendMessage
	for i := range 6 {
		batch = append(batch, sdk.NewMessage(fmt.Sprint("m", i)))
	}
	if _, err := src.SendBatch(ctx, "orders", "", batch); err != nil {
		t.Fatal(err)
	}
	mirrorOrders(t, dst, "from-hz", hz.URL)
	r, err := mirror.New(sg.b, mirror.Options{Region: "sg", Wait: 20 * time.Second, BatchSize: 2, StatusEvery: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	eventually(t, 20*time.Second, func() error {
		if n := countMessages(t, dst, "orders"); n != int64(len(batch)) {
			return fmt.Errorf("%d of %d copied", n, len(batch))
		}
		return nil
	})
	caughtUp := time.Now()
	eventually(t, 20*time.Second, func() error {
		m, err := dst.GetMirror(ctx, "from-hz")
		if err != nil {
			return err
		}
		if m.Lag != 0 {
			return fmt.Errorf("mirror %+v", m)
		}
		return nil
	})
	if d := time.Since(caughtUp); d > 5*time.Second {
		t.Errorf("the mirror said lag 0 %v after it had copied everything; want within a few seconds", d.Round(time.Millisecond))
	}
}
