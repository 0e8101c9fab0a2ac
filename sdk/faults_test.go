package sdk_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidemq/tidemq/sdk"
)

// faultProxy is a TCP proxy in front of a broker that reads each HTTP/1.1
// request of a client connection, forwards it and reads the broker's whole
// reply before passing it on, so that it can lose replies the broker gave.
// Down, it closes every connection at once, as a dead broker's host would.
type faultProxy struct {
	ln      net.Listener
	backend string
	// dropEvery: the reply of every dropEvery-th send (messages or
	// messages:batch) is not passed on; the client connection is closed
	// instead. 0 drops nothing.
	dropEvery int64

	down          atomic.Bool
	sends         atomic.Int64 // send requests the broker answered
	droppedSingle atomic.Int64 // single-send replies lost
	droppedBatch  atomic.Int64 // batch replies lost
	conns         atomic.Int64 // client connections accepted

	mu   sync.Mutex
	open map[net.Conn]struct{}
	wg   sync.WaitGroup
}

func startProxy(t testing.TB, backendURL string, dropEvery int64) *faultProxy {
	t.Helper()
	u, err := url.Parse(backendURL)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &faultProxy{ln: ln, backend: u.Host, dropEvery: dropEvery, open: map[net.Conn]struct{}{}}
	p.wg.Go(p.accept)
	t.Cleanup(func() {
		_ = ln.Close()
		p.closeAll()
		p.wg.Wait()
	})
	return p
}

func (p *faultProxy) URL() string { return "http://" + p.ln.Addr().String() }

// setDown makes the proxy refuse service (true) or serve again (false).
func (p *faultProxy) setDown(down bool) {
	p.down.Store(down)
	if down {
		p.closeAll()
	}
}

func (p *faultProxy) closeAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.open {
		_ = c.Close()
	}
}

func (p *faultProxy) track(c net.Conn, add bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if add {
		p.open[c] = struct{}{}
	} else {
		delete(p.open, c)
	}
}

func (p *faultProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // the listener is closed
		}
		p.conns.Add(1)
		p.wg.Go(func() { p.serve(c) })
	}
}

func (p *faultProxy) serve(c net.Conn) {
	defer c.Close()
	if p.down.Load() {
		return
	}
	up, err := net.Dial("tcp", p.backend)
	if err != nil {
		return
	}
	defer up.Close()
	p.track(c, true)
	p.track(up, true)
	defer p.track(c, false)
	defer p.track(up, false)
	cr, ur := bufio.NewReader(c), bufio.NewReader(up)
	for {
		req, err := http.ReadRequest(cr)
		if err != nil || p.down.Load() {
			return
		}
		if err := req.Write(up); err != nil {
			return
		}
		resp, err := http.ReadResponse(ur, req)
		if err != nil {
			return
		}
		body, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if err != nil {
			return
		}
		if single, batch := isSend(req); (single || batch) && p.dropEvery > 0 && p.sends.Add(1)%p.dropEvery == 0 {
			if single {
				p.droppedSingle.Add(1)
			} else {
				p.droppedBatch.Add(1)
			}
			return // the broker stored it; the client never hears
		}
		resp.Body = io.NopCloser(bytes.NewReader(body))
		resp.ContentLength, resp.TransferEncoding = int64(len(body)), nil
		if err := resp.Write(c); err != nil {
			return
		}
	}
}

func isSend(r *http.Request) (single, batch bool) {
	if r.Method != http.MethodPost {
		return false, false
	}
	return strings.HasSuffix(r.URL.Path, "/messages"), strings.HasSuffix(r.URL.Path, "/messages:batch")
}

// envInt is the integer in environment variable name, or def.
func envInt(t testing.TB, name string, def int) int {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		t.Fatalf("%s=%q: want a positive integer", name, s)
	}
	return n
}

// Behind a proxy that loses every third send reply after the broker stored
// the message, Send and SendAsync retry under the producer's dedup keys:
// every message is stored exactly once, under the id its sender was told,
// the retries after a lost reply come back duplicate:true, and every call
// returns within its RetryTimeout (plus a second). TIDEMQ_FAULT_SENDS sets
// the number of sends (default 10000, half Send, half SendAsync).
func TestProducerLostRepliesStoredOnce(t *testing.T) {
	t.Parallel()
	total := envInt(t, "TIDEMQ_FAULT_SENDS", 10000)
	srv := startServer(t)
	direct := newClient(t, srv.URL)
	px := startProxy(t, srv.URL, 3)
	c := newClient(t, px.URL())
	defer c.Close()
	ctx := t.Context()
	topic := topicName("lostreplies")
	if _, _, err := direct.PutTopic(ctx, topic, sdk.TopicConfig{Queues: 4}); err != nil {
		t.Fatal(err)
	}
	const retryTimeout = 10 * time.Second
	p, err := sdk.NewProducer(c, topic, sdk.ProducerOptions{
		RetryTimeout: retryTimeout, AttemptTimeout: 3 * time.Second,
		MinBackoff: 5 * time.Millisecond, MaxBackoff: 100 * time.Millisecond,
		BatchMaxMessages: 50, Linger: 2 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	var mu sync.Mutex
	told := map[string]string{} // body → message id its sender was told
	var sendErrs []error
	var maxCall time.Duration
	var dupSync, dupAsync int
	record := func(body string, took time.Duration, r sdk.SendResult, err error, async bool) {
		mu.Lock()
		defer mu.Unlock()
		maxCall = max(maxCall, took)
		if err != nil {
			sendErrs = append(sendErrs, fmt.Errorf("%s (after %v): %w", body, took, err))
			return
		}
		if _, ok := told[body]; ok {
			sendErrs = append(sendErrs, fmt.Errorf("%s: answered twice", body))
		}
		told[body] = r.MessageID
		if r.Duplicate {
			if async {
				dupAsync++
			} else {
				dupSync++
			}
		}
	}

	start := time.Now()
	syncN := total / 2
	asyncN := total - syncN
	const senders = 16
	var wg sync.WaitGroup
	for s := range senders {
		wg.Go(func() {
			for i := s; i < syncN; i += senders {
				body := "sync-" + strconv.Itoa(i)
				t0 := time.Now()
				r, err := p.Send(ctx, sdk.NewMessage(body))
				record(body, time.Since(t0), r, err, false)
			}
		})
	}
	wg.Go(func() {
		// Windows of 500, so that the async sends spread over the run
		// alongside the sync ones.
		const window = 500
		for w := 0; w < asyncN; w += window {
			var inWindow sync.WaitGroup
			for i := w; i < min(w+window, asyncN); i++ {
				body := "async-" + strconv.Itoa(i)
				inWindow.Add(1)
				t0 := time.Now()
				p.SendAsyncFunc(ctx, sdk.NewMessage(body), func(r sdk.SendResult, err error) {
					record(body, time.Since(t0), r, err, true)
					inWindow.Done()
				})
			}
			inWindow.Wait()
		}
	})
	wg.Wait()
	took := time.Since(start)

	mu.Lock()
	for i, err := range sendErrs {
		if i == 20 {
			t.Errorf("… and %d more send errors", len(sendErrs)-20)
			break
		}
		t.Errorf("send failed: %v", err)
	}
	t.Logf("%d sends (%d Send, %d SendAsync) in %v: %d send requests answered by the broker, %d single and %d batch replies lost; %d Send and %d SendAsync results duplicate:true; slowest call %v",
		total, syncN, asyncN, took.Round(time.Millisecond), px.sends.Load(), px.droppedSingle.Load(), px.droppedBatch.Load(),
		dupSync, dupAsync, maxCall.Round(time.Millisecond))
	if maxCall > retryTimeout+time.Second {
		t.Errorf("slowest call took %v, over RetryTimeout %v + 1s", maxCall, retryTimeout)
	}
	if px.droppedSingle.Load() == 0 || px.droppedBatch.Load() == 0 {
		t.Errorf("the proxy lost %d single and %d batch replies: the test did not test lost replies", px.droppedSingle.Load(), px.droppedBatch.Load())
	}
	// A lost reply's retry is answered duplicate:true (more lost replies
	// of the same send are retried again), so every lost single reply
	// shows as at least one duplicate within at most a few drops per send.
	if ds := int(px.droppedSingle.Load()); dupSync == 0 || dupSync > ds || dupSync < ds/3 {
		t.Errorf("%d Send results duplicate:true for %d lost single replies", dupSync, ds)
	}
	if dupAsync == 0 {
		t.Errorf("no SendAsync result was duplicate:true though %d batch replies were lost", px.droppedBatch.Load())
	}
	mu.Unlock()

	// Counted from the log: every queue read back from offset 0 through
	// the query API, straight from the broker.
	stored := map[string][]string{} // body → ids
	n := 0
	for m, err := range direct.Messages(ctx, topic, sdk.MessageQuery{Limit: 1000}) {
		if err != nil {
			t.Fatalf("Messages: %v", err)
		}
		stored[m.Body] = append(stored[m.Body], m.MessageID)
		n++
	}
	if n != total {
		t.Errorf("%d messages stored, want %d", n, total)
	}
	mu.Lock()
	defer mu.Unlock()
	bad := 0
	for body, id := range told {
		if ids := stored[body]; len(ids) != 1 || ids[0] != id {
			if bad++; bad <= 20 {
				t.Errorf("%s stored as %v, its sender was told %s", body, ids, id)
			}
		}
	}
	if bad > 20 {
		t.Errorf("… %d bodies in all not stored once under the id told", bad)
	}
}

// The broker goes away under a producer with the default options: a call
// rides out a short outage; in a longer one the first call fails within
// RetryTimeout plus AttemptTimeout with ErrUnavailable wrapping the
// transport error, and once the breaker is open calls fail at once with
// ErrCircuitOpen, without a request; after the outage calls succeed again.
func TestProducerBreakerOutage(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	direct := newClient(t, srv.URL)
	px := startProxy(t, srv.URL, 0)
	c := newClient(t, px.URL())
	defer c.Close()
	ctx := t.Context()
	topic := topicName("outage")
	if _, _, err := direct.PutTopic(ctx, topic, sdk.TopicConfig{Queues: 2}); err != nil {
		t.Fatal(err)
	}
	p, err := sdk.NewProducer(c, topic, sdk.ProducerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	// The defaults, as documented.
	const retryTimeout, attemptTimeout, openFor = 10 * time.Second, 10 * time.Second, 2 * time.Second
	if _, err := p.Send(ctx, sdk.NewMessage("before")); err != nil {
		t.Fatal(err)
	}

	// A short outage (under a second, the breaker may open in it) is
	// ridden out by the call that met it.
	px.setDown(true)
	type result struct {
		r    sdk.SendResult
		err  error
		took time.Duration
	}
	ridden := make(chan result, 1)
	before := px.conns.Load()
	go func() {
		t0 := time.Now()
		r, err := p.Send(ctx, sdk.NewMessage("short outage"))
		ridden <- result{r, err, time.Since(t0)}
	}()
	waitFor(t, 5*time.Second, "the send to meet the outage", func() (bool, error) { return px.conns.Load() > before, nil })
	time.Sleep(800 * time.Millisecond) // the outage's length
	px.setDown(false)
	select {
	case res := <-ridden:
		if res.err != nil {
			t.Fatalf("Send across a short outage = %v after %v", res.err, res.took)
		}
		t.Logf("Send rode out a short outage in %v", res.took.Round(time.Millisecond))
	case <-time.After(retryTimeout + attemptTimeout + 5*time.Second):
		t.Fatal("Send across a short outage did not return")
	}

	// A long outage: the call that meets it fails within its budget.
	px.setDown(true)
	t0 := time.Now()
	_, err = p.Send(ctx, sdk.NewMessage("long outage"))
	took := time.Since(t0)
	t.Logf("first Send in a long outage failed after %v: %v", took.Round(time.Millisecond), err)
	if !errors.Is(err, sdk.ErrUnavailable) {
		t.Errorf("Send in an outage = %v, want ErrUnavailable", err)
	}
	if errors.Is(err, sdk.ErrRejected) {
		t.Errorf("Send in an outage = %v, matches ErrRejected", err)
	}
	var ue *url.Error
	if !errors.As(err, &ue) {
		t.Errorf("Send in an outage = %v, does not wrap the *url.Error", err)
	}
	if took > retryTimeout+attemptTimeout {
		t.Errorf("Send in an outage took %v, over RetryTimeout + AttemptTimeout", took)
	}
	if took < retryTimeout-openFor-time.Second {
		t.Errorf("Send in an outage gave up after %v, well before RetryTimeout %v", took, retryTimeout)
	}

	// The breaker is open: calls fail at once, without a request.
	before = px.conns.Load()
	t0 = time.Now()
	_, err = p.Send(ctx, sdk.NewMessage("open"))
	if d := time.Since(t0); d > 200*time.Millisecond {
		t.Errorf("Send with the breaker open took %v", d)
	}
	if !errors.Is(err, sdk.ErrCircuitOpen) || !errors.Is(err, sdk.ErrUnavailable) {
		t.Errorf("Send with the breaker open = %v, want ErrCircuitOpen and ErrUnavailable", err)
	}
	t0 = time.Now()
	if _, err := p.SendBatch(ctx, []sdk.SendMessage{sdk.NewMessage("open")}); !errors.Is(err, sdk.ErrCircuitOpen) {
		t.Errorf("SendBatch with the breaker open = %v, want ErrCircuitOpen", err)
	}
	if _, err := p.SendAsync(ctx, sdk.NewMessage("open")).Wait(ctx); !errors.Is(err, sdk.ErrCircuitOpen) {
		t.Errorf("SendAsync with the breaker open = %v, want ErrCircuitOpen", err)
	}
	if d := time.Since(t0); d > 200*time.Millisecond {
		t.Errorf("SendBatch and SendAsync with the breaker open took %v", d)
	}
	if n := px.conns.Load() - before; n != 0 {
		t.Errorf("%d connections made with the breaker open", n)
	}

	// After the outage: once the breaker half-opens, a call gets through
	// and closes it.
	px.setDown(false)
	up := time.Now()
	waitFor(t, openFor+5*time.Second, "a send to succeed after the outage", func() (bool, error) {
		_, err := p.Send(ctx, sdk.NewMessage("after"))
		return err == nil, err
	})
	t.Logf("a Send succeeded %v after the outage", time.Since(up).Round(time.Millisecond))
	for i := range 3 {
		if _, err := p.Send(ctx, sdk.NewMessage("after-"+strconv.Itoa(i))); err != nil {
			t.Errorf("Send after the outage: %v", err)
		}
	}
	// Nothing was stored twice, and nothing refused was stored.
	counts := map[string]int{}
	for m, err := range direct.Messages(ctx, topic, sdk.MessageQuery{}) {
		if err != nil {
			t.Fatal(err)
		}
		counts[m.Body]++
	}
	for _, body := range []string{"before", "short outage", "after-0", "after-1", "after-2"} {
		if counts[body] != 1 {
			t.Errorf("%q stored %d times, want once", body, counts[body])
		}
	}
	if counts["open"] != 0 || counts["long outage"] != 0 {
		t.Errorf("refused sends stored: %v", counts)
	}
}

// errors.Is classifies failures: no broker is ErrUnavailable, a 4xx is
// ErrRejected (and the sentinel of its code), and a producer does not
// retry a rejected send.
func TestErrorClassification(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	c := newClient(t, srv.URL)
	ctx := t.Context()

	_, err := c.GetTopic(ctx, topicName("missing"))
	if !errors.Is(err, sdk.ErrRejected) || !errors.Is(err, sdk.ErrTopicNotFound) || errors.Is(err, sdk.ErrUnavailable) {
		t.Errorf("GetTopic of a missing topic = %v, want ErrRejected and ErrTopicNotFound only", err)
	}
	p, err := sdk.NewProducer(c, "bad name!", sdk.ProducerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	t0 := time.Now()
	_, err = p.Send(ctx, sdk.NewMessage("x"))
	if !errors.Is(err, sdk.ErrRejected) || !errors.Is(err, sdk.ErrInvalidName) || errors.Is(err, sdk.ErrUnavailable) {
		t.Errorf("Send to a bad topic name = %v, want ErrRejected and ErrInvalidName only", err)
	}
	var ae *sdk.APIError
	if !errors.As(err, &ae) || ae.Status != http.StatusBadRequest {
		t.Errorf("Send to a bad topic name = %v, want a 400 *APIError", err)
	}
	if d := time.Since(t0); d > 2*time.Second {
		t.Errorf("a rejected Send took %v: was it retried?", d)
	}
	for _, status := range []int{429, 502, 503, 504, 507} {
		e := &sdk.APIError{Status: status}
		if !errors.Is(e, sdk.ErrUnavailable) || errors.Is(e, sdk.ErrRejected) {
			t.Errorf("status %d: ErrUnavailable %v, ErrRejected %v; want unavailable only", status,
				errors.Is(e, sdk.ErrUnavailable), errors.Is(e, sdk.ErrRejected))
		}
	}
	if e := (&sdk.APIError{Status: 500, Code: "internal"}); errors.Is(e, sdk.ErrUnavailable) || errors.Is(e, sdk.ErrRejected) || !errors.Is(e, sdk.ErrInternal) {
		t.Errorf("a 500 is classified unavailable %v, rejected %v", errors.Is(e, sdk.ErrUnavailable), errors.Is(e, sdk.ErrRejected))
	}

	// Nothing listens: the transport error is ErrUnavailable.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	dead := newClient(t, "http://"+addr)
	defer dead.Close()
	if _, err := dead.GetTopic(ctx, "t"); !errors.Is(err, sdk.ErrUnavailable) || errors.Is(err, sdk.ErrRejected) {
		t.Errorf("GetTopic with no broker = %v, want ErrUnavailable", err)
	}
}

// Close closes the client's idle connections (the proxy sees them go),
// lets a call in flight finish and closes its connection after it, makes
// later calls fail at once with ErrClosed, and is idempotent.
func TestClientClose(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	px := startProxy(t, srv.URL, 0)
	c := newClient(t, px.URL())
	ctx := t.Context()
	topic := topicName("close")
	if _, _, err := c.PutTopic(ctx, topic, sdk.TopicConfig{Queues: 1}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.PutSubscription(ctx, topic, "g", sdk.SubscriptionConfig{}); err != nil {
		t.Fatal(err)
	}
	openConns := func() int {
		px.mu.Lock()
		defer px.mu.Unlock()
		return len(px.open) / 2 // each client connection has its broker one
	}
	if n := openConns(); n == 0 {
		t.Fatal("no keep-alive connection after two calls")
	}
	// A long poll in flight across Close.
	polled := make(chan error, 1)
	go func() {
		_, err := c.Pull(ctx, topic, "g", sdk.PullRequest{MaxMessages: 1, WaitSeconds: 1})
		polled <- err
	}()
	waitFor(t, 5*time.Second, "the long poll to be sent", func() (bool, error) { return px.conns.Load() >= 2 || openConns() >= 1, nil })
	time.Sleep(100 * time.Millisecond) // let the poll reach the broker
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	select {
	case err := <-polled:
		if err != nil {
			t.Errorf("long poll in flight across Close = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the long poll did not return")
	}
	waitFor(t, 5*time.Second, "the client's connections to close", func() (bool, error) { return openConns() == 0, nil })

	before := px.conns.Load()
	if _, err := c.GetTopic(ctx, topic); !errors.Is(err, sdk.ErrClosed) {
		t.Errorf("GetTopic after Close = %v, want ErrClosed", err)
	}
	p, err := sdk.NewProducer(c, topic, sdk.ProducerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, err := p.Send(ctx, sdk.NewMessage("x")); !errors.Is(err, sdk.ErrClosed) || errors.Is(err, sdk.ErrUnavailable) {
		t.Errorf("Send through a closed client = %v, want ErrClosed", err)
	}
	if n := px.conns.Load() - before; n != 0 {
		t.Errorf("%d connections made after Close", n)
	}
}

// A second Run of a running Consumer fails at once with ErrConsumerRunning.
func TestConsumerRunTwice(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	c := newClient(t, srv.URL)
	topic := topicName("twice")
	if _, _, err := c.PutSubscription(t.Context(), topic, "g", sdk.SubscriptionConfig{}); err != nil {
		t.Fatal(err)
	}
	cs, err := sdk.NewConsumer(c, topic, "g", sdk.ConsumerOptions{WaitSeconds: 1})
	if err != nil {
		t.Fatal(err)
	}
	h := func(context.Context, *sdk.PulledMessage) error { return nil }
	runConsumer(t, cs, h)
	waitFor(t, 10*time.Second, "the consumer to pull", func() (bool, error) {
		sub, err := c.GetSubscription(t.Context(), topic, "g")
		return err == nil && len(sub.Consumers) > 0, err
	})
	ended, cancel := context.WithCancel(t.Context())
	cancel() // were the second Run to run, it would stop at once
	if err := cs.Run(ended, h); !errors.Is(err, sdk.ErrConsumerRunning) {
		t.Errorf("second Run = %v, want ErrConsumerRunning", err)
	}
}

// Pace of an orderly consumer whose handler fails now and then: 1200
// messages on 20 sharding keys, every 10th handler call failing (the
// group's 1 s retry delay) and every 13th asking RetryAfter(1s). Each key
// waits out its ~10 delays one after the other, the keys side by side, so
// the whole takes some 20 s. A broker that does not wake parked long
// polls when a key's delay ends delivers in bursts, one per long-poll wait
// (20 s), and takes minutes.
func TestConsumerOrderlyRetryPace(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	c := newClient(t, srv.URL)
	ctx := t.Context()
	topic := topicName("pace")
	if _, _, err := c.PutTopic(ctx, topic, sdk.TopicConfig{Queues: 4}); err != nil {
		t.Fatal(err)
	}
	maxRetries := 32
	if _, _, err := c.PutSubscription(ctx, topic, "g", sdk.SubscriptionConfig{Orderly: true, RetryDelays: []string{"1s"}, MaxRetries: &maxRetries}); err != nil {
		t.Fatal(err)
	}
	const keys, total = 20, 1200
	p, err := sdk.NewProducer(c, topic, sdk.ProducerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for b := 0; b < total; b += 600 { // a batch holds at most 1000
		var msgs []sdk.SendMessage
		for i := b; i < b+600; i++ {
			m := sdk.NewMessage("")
			m.ShardingKey = "key-" + strconv.Itoa(i%keys)
			m.Body = fmt.Sprintf("%s/%04d", m.ShardingKey, i/keys)
			msgs = append(msgs, m)
		}
		if _, err := p.SendBatch(ctx, msgs); err != nil {
			t.Fatal(err)
		}
	}
	cs, err := sdk.NewConsumer(c, topic, "g", sdk.ConsumerOptions{}) // the default 20 s long poll
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	var mu sync.Mutex
	done := map[string]bool{}
	last := map[string]string{} // key → body of its last success
	start := time.Now()
	runConsumer(t, cs, func(_ context.Context, m *sdk.PulledMessage) error {
		switch n := calls.Add(1); {
		case n%10 == 0:
			return errors.New("every 10th call fails")
		case n%13 == 0:
			return sdk.RetryAfter(time.Second)
		}
		mu.Lock()
		defer mu.Unlock()
		if prev := last[m.ShardingKey]; !done[m.Body] && m.Body < prev {
			t.Errorf("key %s: %s after %s", m.ShardingKey, m.Body, prev)
		}
		last[m.ShardingKey] = max(last[m.ShardingKey], m.Body)
		done[m.Body] = true
		return nil
	})
	const bound = 45 * time.Second // ~3x the pace without bursts; bursts take minutes
	var took time.Duration
	for deadline := start.Add(4 * time.Minute); ; time.Sleep(50 * time.Millisecond) {
		mu.Lock()
		n := len(done)
		mu.Unlock()
		took = time.Since(start)
		if n >= total {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d messages consumed after %v (%d handler calls)", n, total, took.Round(time.Millisecond), calls.Load())
		}
	}
	t.Logf("%d messages on %d keys consumed in %v (%d handler calls)", total, keys, took.Round(time.Millisecond), calls.Load())
	if took > bound {
		t.Errorf("consuming took %v, over %v: deliveries come in bursts", took.Round(time.Millisecond), bound)
	}
}

// A backoff longer than the time left is cut to it, and the last attempt
// goes when the budget ends: a call with a 5 s backoff and a 1 s
// RetryTimeout rides out a 0.3 s outage, and in a longer one fails after
// about 1 s, not 5 s.
func TestProducerBackoffCappedAtDeadline(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	direct := newClient(t, srv.URL)
	px := startProxy(t, srv.URL, 0)
	c := newClient(t, px.URL())
	defer c.Close()
	ctx := t.Context()
	topic := topicName("capped")
	if _, _, err := direct.PutTopic(ctx, topic, sdk.TopicConfig{Queues: 1}); err != nil {
		t.Fatal(err)
	}
	const retryTimeout, attemptTimeout = time.Second, 2 * time.Second
	p, err := sdk.NewProducer(c, topic, sdk.ProducerOptions{NoBreaker: true, RetryTimeout: retryTimeout, AttemptTimeout: attemptTimeout,
		MinBackoff: 5 * time.Second, MaxBackoff: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	px.setDown(true)
	before := px.conns.Load()
	type result struct {
		err  error
		took time.Duration
	}
	done := make(chan result, 1)
	go func() {
		t0 := time.Now()
		_, err := p.Send(ctx, sdk.NewMessage("ridden"))
		done <- result{err, time.Since(t0)}
	}()
	waitFor(t, 5*time.Second, "the first attempt to fail", func() (bool, error) { return px.conns.Load() > before, nil })
	time.Sleep(300 * time.Millisecond) // the outage's length
	px.setDown(false)
	res := <-done
	if res.err != nil {
		t.Errorf("Send across a 0.3 s outage with a 5 s backoff = %v after %v", res.err, res.took)
	}
	if res.took > retryTimeout+time.Second {
		t.Errorf("Send took %v, over RetryTimeout + 1s", res.took)
	}
	t.Logf("Send rode out the outage in %v", res.took.Round(time.Millisecond))

	px.setDown(true)
	t0 := time.Now()
	_, err = p.Send(ctx, sdk.NewMessage("lost"))
	took := time.Since(t0)
	if !errors.Is(err, sdk.ErrUnavailable) {
		t.Errorf("Send in an outage = %v, want ErrUnavailable", err)
	}
	if took < retryTimeout-100*time.Millisecond || took > retryTimeout+attemptTimeout {
		t.Errorf("Send in an outage failed after %v, want about RetryTimeout %v", took, retryTimeout)
	}
	t.Logf("Send in an outage failed after %v: %v", took.Round(time.Millisecond), err)
}
