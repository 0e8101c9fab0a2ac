package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The mirror process tests (SPEC §8): two real broker processes, region hz
// on 127.0.0.2 and region sg on 127.0.0.3, each with its own data dir and
// fsync on, a mirror copying hz's topic into sg's (and, in the second
// test, one the other way too), producers and consumers over HTTP, and
// SIGKILLs on either side. checkMirror (mirror_check_test.go) then holds
// both topics, read back in storage order, to the spec.

const (
	mirTopic = "orders"
	// mirDedupWindow is the send dedup window both brokers run with: sg
	// stays down for more than three of them, so that only the mirror's
	// own record of what it stored keeps a redelivered batch from being
	// stored twice.
	mirDedupWindow = 2 * time.Second
)

// skipWithoutMirrors skips when the binary cannot run a region.
func skipWithoutMirrors(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("runs two broker processes for ~30 s")
	}
	if !binaryHasFlag(t, "region") || !binaryHasFlag(t, "dedup-window") {
		t.Skip("tidemq has no --region or --dedup-window flag: no mirrors to test")
	}
}

// newMirRegions starts one broker per region, region i on 127.0.0.(i+2),
// all on the same port, each with --region and the short dedup window,
// and checks that /healthz names the region.
func newMirRegions(t *testing.T, ctx context.Context, regions ...string) *nemCluster {
	t.Helper()
	dir := t.TempDir()
	var ips []string
	for i := range regions {
		ips = append(ips, fmt.Sprintf("127.0.0.%d", i+2))
	}
	port := freeSharedPort(t, ips)
	c := &nemCluster{t: t, hc: &http.Client{Timeout: 10 * time.Second}}
	t.Cleanup(c.hc.CloseIdleConnections)
	for i, r := range regions {
		addr := fmt.Sprintf("%s:%d", ips[i], port)
		nd := &nemNode{id: r, base: "http://" + addr,
			args: []string{"--addr", addr, "--data", filepath.Join(dir, r), "--region", r, "--dedup-window", mirDedupWindow.String()}}
		nd.proc = spawnTidemq(t, nd.base, nd.args...)
		waitReady(t, nd.proc, addr, 20*time.Second)
		c.nodes = append(c.nodes, nd)
		var h struct{ Status, Region string }
		if _, _, err := nemCall(ctx, c.hc, "GET", nd.base+"/healthz", nil, &h, nil); err != nil || h.Status != "ok" || h.Region != r {
			t.Fatalf("GET /healthz on %s: %+v, %v; want status ok, region %s (SPEC §8)", r, h, err, r)
		}
		if _, _, err := nemCall(ctx, c.hc, "PUT", nd.base+"/v1/topics/"+mirTopic, map[string]any{"queues": 4}, nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// putMirror creates mirror name in region to, copying from's topic from
// the earliest message.
func putMirror(t *testing.T, ctx context.Context, c *nemCluster, name, from, to string) {
	t.Helper()
	body := map[string]any{"source": map[string]any{"url": c.node(from).base, "topic": mirTopic}, "topic": mirTopic, "filter": "*", "startFrom": "earliest"}
	status, _, err := nemCall(ctx, c.hc, "PUT", c.node(to).base+"/v1/mirrors/"+name, body, nil, nil)
	if err != nil || (status != http.StatusCreated && status != http.StatusOK) {
		t.Fatalf("PUT /v1/mirrors/%s on %s: %d %v", name, to, status, err)
	}
}

// mirStatus is GET /v1/mirrors/{name}.
type mirStatus struct {
	State        string
	Lag          int64
	Copied       int64
	LastCopiedAt string
	LastError    string
}

func getMirror(ctx context.Context, c *nemCluster, region, name string) (mirStatus, error) {
	var st mirStatus
	_, _, err := nemCall(ctx, c.hc, "GET", c.node(region).base+"/v1/mirrors/"+name, nil, &st, nil)
	return st, err
}

// mirRecorder is the shared record the clients write.
type mirRecorder struct {
	mu         sync.Mutex
	msgs       map[string]mirMsg
	acked      map[string]string
	deliveries []mirDelivery
	delivered  map[string]bool // region/sub/id
	failed     int             // send requests not answered 201
}

func newMirRecorder() *mirRecorder {
	return &mirRecorder{msgs: map[string]mirMsg{}, acked: map[string]string{}, delivered: map[string]bool{}}
}

func (r *mirRecorder) ackedCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.acked)
}

// deliveredCount is how many distinct messages region's sub got.
func (r *mirRecorder) deliveredCount(region, sub string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for k := range r.delivered {
		if strings.HasPrefix(k, region+"/"+sub+"/") {
			n++
		}
	}
	return n
}

// produce sends, until ctx ends, requests of 1–3 messages of the
// producer's own keys to region, one request after the other, paced. A
// failed request is not retried: its messages may or may not be stored,
// and the next request carries new ones (the checker holds whatever the
// source stored to the mirror, acknowledged or not).
func produce(ctx context.Context, c *nemCluster, rec *mirRecorder, region string, g int) {
	const keys = 2
	rng := rand.New(rand.NewPCG(uint64(g), uint64(time.Now().UnixNano())))
	base := c.node(region).base + "/v1/topics/" + mirTopic + "/messages"
	for seq := 0; ctx.Err() == nil; {
		select {
		case <-ctx.Done():
			return
		case <-time.After(40 * time.Millisecond):
		}
		ms := make([]mirMsg, 1+rng.IntN(3))
		bodies := make([]map[string]any, len(ms))
		for i := range ms {
			key := fmt.Sprintf("%s-p%d-k%d", region, g, rng.IntN(keys))
			ms[i] = mirMsg{body: fmt.Sprintf("%s-s%06d", key, seq), key: key, region: region, producer: g, seq: seq}
			bodies[i] = map[string]any{"body": ms[i].body, "shardingKey": key}
			seq++
		}
		rec.mu.Lock()
		for _, m := range ms {
			rec.msgs[m.body] = m
		}
		rec.mu.Unlock()
		var out struct {
			Results []struct{ MessageID string }
		}
		status, _, err := nemCall(ctx, c.hc, "POST", base+":batch", map[string]any{"messages": bodies}, &out, nil)
		rec.mu.Lock()
		if status == http.StatusCreated && err == nil && len(out.Results) == len(ms) {
			for i, r := range out.Results {
				rec.acked[ms[i].body] = r.MessageID
			}
		} else {
			rec.failed++
		}
		rec.mu.Unlock()
		if err != nil {
			select { // the region is down: not a tight loop
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
}

// consume pulls region's orderly subscription sub until ctx ends,
// recording each pull before acking it; errors (the region down) are
// retried with a short back-off.
func consume(ctx context.Context, t *testing.T, c *nemCluster, rec *mirRecorder, region, sub string, k int) {
	path := c.node(region).base + "/v1/topics/" + mirTopic + "/subscriptions/" + sub
	pull := map[string]any{"maxMessages": 32, "waitSeconds": 1, "invisibleSeconds": 5, "consumerId": fmt.Sprintf("c%d", k)}
	for errs := 0; ctx.Err() == nil; {
		var got struct {
			Messages []struct {
				MessageID, Body, ReceiptHandle string
				QueueID                        int
				Offset                         uint64
			}
		}
		status, _, err := nemCall(ctx, c.hc, "POST", path+"/pull", pull, &got, nil)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if !transientStatus(status, err) {
				t.Errorf("%s/%s consumer %d: pull: %d %v", region, sub, k, status, err)
				return
			}
			errs++
			select {
			case <-ctx.Done():
			case <-time.After(min(10*time.Millisecond<<min(errs, 4), 100*time.Millisecond)):
			}
			continue
		}
		errs = 0
		if len(got.Messages) == 0 {
			continue
		}
		handles := make([]string, len(got.Messages))
		rec.mu.Lock()
		for i, m := range got.Messages {
			handles[i] = m.ReceiptHandle
			rec.deliveries = append(rec.deliveries, mirDelivery{region: region, sub: sub, id: m.MessageID, body: m.Body, queue: m.QueueID, offset: m.Offset})
			rec.delivered[region+"/"+sub+"/"+m.MessageID] = true
		}
		rec.mu.Unlock()
		// An ack that fails leaves the messages to come again: allowed.
		_, _, _ = nemCall(ctx, c.hc, "POST", path+"/ack", map[string]any{"receiptHandles": handles}, nil, nil)
	}
}

// walkTopic reads every message of region's topic, queue by queue in
// offset order, through the query API (GET …/messages?queueId=&offset=).
func walkTopic(ctx context.Context, c *nemCluster, region string) ([]mirStored, error) {
	base := c.node(region).base + "/v1/topics/" + mirTopic
	var ti struct {
		QueueStats []struct {
			QueueID              int
			MinOffset, MaxOffset uint64
		}
	}
	if _, _, err := nemCall(ctx, c.hc, "GET", base, nil, &ti, nil); err != nil {
		return nil, err
	}
	var out []mirStored
	for _, q := range ti.QueueStats {
		for off, pages := q.MinOffset, 0; off < q.MaxOffset; pages++ {
			if pages > 1000 {
				return nil, fmt.Errorf("%s: queue %d: more than 1000 pages", region, q.QueueID)
			}
			var page struct {
				Messages []struct {
					MessageID, Body, ShardingKey string
					QueueID                      int
					Offset                       *uint64
					BornAt, StoredAt             time.Time
					Properties                   map[string]string
				}
			}
			v := url.Values{"queueId": {fmt.Sprint(q.QueueID)}, "offset": {fmt.Sprint(off)}, "limit": {"1000"}}
			if _, _, err := nemCall(ctx, c.hc, "GET", base+"/messages?"+v.Encode(), nil, &page, nil); err != nil {
				return nil, err
			}
			if len(page.Messages) == 0 {
				return nil, fmt.Errorf("%s: queue %d: no message from offset %d, below its maxOffset %d", region, q.QueueID, off, q.MaxOffset)
			}
			for _, m := range page.Messages {
				if m.Offset == nil || *m.Offset < off || m.QueueID != q.QueueID {
					return nil, fmt.Errorf("%s: queue %d from offset %d: got %s at queue %d offset %v", region, q.QueueID, off, m.MessageID, m.QueueID, m.Offset)
				}
				off = *m.Offset + 1
				out = append(out, mirStored{id: m.MessageID, body: m.Body, key: m.ShardingKey, queue: m.QueueID, offset: *m.Offset,
					bornAt: m.BornAt, storedAt: m.StoredAt, sourceID: m.Properties["mirror.sourceMessageId"],
					sourceRegion: m.Properties["mirror.sourceRegion"], path: m.Properties["mirror.path"]})
			}
		}
	}
	return out, nil
}

// topicMessages is region's topic's message count.
func topicMessages(ctx context.Context, c *nemCluster, region string) (int64, error) {
	var ti struct{ Messages int64 }
	_, _, err := nemCall(ctx, c.hc, "GET", c.node(region).base+"/v1/topics/"+mirTopic, nil, &ti, nil)
	return ti.Messages, err
}

// waitFor polls cond every 100 ms until it returns "" (done) or timeout
// passes; it returns the last reason not to be done.
func waitFor(ctx context.Context, timeout time.Duration, cond func() string) string {
	deadline := time.Now().Add(timeout)
	for {
		why := cond()
		if why == "" || time.Now().After(deadline) || ctx.Err() != nil {
			return why
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// mirDrained says what keeps the mirrors of routes from being caught up
// ("" when nothing): a mirror not running, a mirror's subscription at the
// source with lag or messages in flight, or a destination holding fewer
// messages than the source. The lag a mirror reports is not looked at
// here: it is the runner's last reading of the source subscription's,
// checked on its own by mirStatusCaughtUp.
func mirDrained(ctx context.Context, c *nemCluster, routes map[string]mirRoute) string {
	var why []string
	counts := map[string]int64{}
	for _, nd := range c.nodes {
		n, err := topicMessages(ctx, c, nd.id)
		if err != nil {
			return err.Error()
		}
		counts[nd.id] = n
	}
	for name, rt := range routes {
		st, err := getMirror(ctx, c, rt.to, name)
		if err != nil {
			return err.Error()
		}
		if st.State != "running" {
			why = append(why, fmt.Sprintf("%s on %s: %s, lag %d, last error %q", name, rt.to, st.State, st.Lag, st.LastError))
		}
		var src struct{ Lag, Inflight int64 }
		if _, _, err := nemCall(ctx, c.hc, "GET", c.node(rt.from).base+"/v1/topics/"+mirTopic+"/subscriptions/mirror."+rt.to+"."+name, nil, &src, nil); err != nil {
			return err.Error()
		}
		if src.Lag != 0 || src.Inflight != 0 {
			why = append(why, fmt.Sprintf("%s's source subscription on %s: lag %d, inflight %d", name, rt.from, src.Lag, src.Inflight))
		}
		if counts[rt.to] < counts[rt.from] {
			why = append(why, fmt.Sprintf("%s holds %d messages, %s %d", rt.to, counts[rt.to], rt.from, counts[rt.from]))
		}
	}
	return strings.Join(why, "; ")
}

// mirStatusCaughtUp waits (bounded) until GET /v1/mirrors/{name} of every
// route, once drained, says running with lag 0 and a lastCopiedAt, and
// fails the test if one does not; else it logs how long that took.
func mirStatusCaughtUp(t *testing.T, ctx context.Context, c *nemCluster, routes map[string]mirRoute) {
	t.Helper()
	start := time.Now()
	why := waitFor(ctx, 25*time.Second, func() string {
		var why []string
		for name, rt := range routes {
			st, err := getMirror(ctx, c, rt.to, name)
			if err != nil {
				return err.Error()
			}
			if st.State != "running" || st.Lag != 0 || st.LastCopiedAt == "" {
				why = append(why, fmt.Sprintf("%s on %s: %+v", name, rt.to, st))
			}
		}
		return strings.Join(why, "; ")
	})
	if why != "" {
		t.Errorf("GET /v1/mirrors/{name} not running with lag 0 %v after the source subscriptions had none: %s", time.Since(start).Round(time.Millisecond), why)
		return
	}
	// The lag a mirror reports is the runner's last reading of its source
	// subscription's: shown, not bounded beyond the wait above.
	t.Logf("GET /v1/mirrors/{name} said lag 0 %v after the source subscriptions did", time.Since(start).Round(time.Millisecond))
}

// TestMirrorSurvivesKills: producers on hz, a mirror from hz on sg and an
// orderly subscription consumed on sg, while hz is SIGKILLed and
// restarted, sg is SIGKILLed and restarted, and sg stays down for more
// than three dedup windows; then, once drained and more than a dedup
// window later, the mirror's subscription on hz is rewound to earliest, so
// that hz hands every message out again. Then every message hz stored
// (every acknowledged one among them) is stored on sg exactly once, as a
// copy that names it and keeps its fields, per key in hz's order, and the
// consumers on sg got every copy, per key in order.
func TestMirrorSurvivesKills(t *testing.T) {
	skipWithoutMirrors(t)
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	c := newMirRegions(t, ctx, "hz", "sg")
	hz, sg := c.node("hz"), c.node("sg")
	const mirror = "from-hz"
	if _, _, err := nemCall(ctx, c.hc, "PUT", sg.base+"/v1/topics/"+mirTopic+"/subscriptions/ord",
		map[string]any{"orderly": true, "startFrom": "earliest", "maxRetries": 32, "retryDelays": []string{"100ms"}}, nil, nil); err != nil {
		t.Fatal(err)
	}
	putMirror(t, ctx, c, mirror, "hz", "sg")
	routes := map[string]mirRoute{mirror: {"hz", "sg"}}
	rec := newMirRecorder()

	prodCtx, stopProducers := context.WithCancel(ctx)
	consCtx, stopConsumers := context.WithCancel(ctx)
	var prodWG, consWG sync.WaitGroup
	for g := range 3 {
		prodWG.Go(func() { produce(prodCtx, c, rec, "hz", g) })
	}
	for k := range 2 {
		consWG.Go(func() { consume(consCtx, t, c, rec, "sg", "ord", k) })
	}
	defer func() { // on t.Fatal too: nothing outlives the test
		stopProducers()
		stopConsumers()
		prodWG.Wait()
		consWG.Wait()
	}()

	// progress waits (bounded) until hz acknowledged more sends and sg's
	// consumers got more copies than before.
	progress := func(what string) {
		t.Helper()
		acked, got := rec.ackedCount(), rec.deliveredCount("sg", "ord")
		if why := waitFor(ctx, 20*time.Second, func() string {
			if rec.ackedCount() <= acked || rec.deliveredCount("sg", "ord") <= got {
				return fmt.Sprintf("%d acked on hz (%d before), %d delivered on sg (%d before)", rec.ackedCount(), acked, rec.deliveredCount("sg", "ord"), got)
			}
			return ""
		}); why != "" {
			t.Fatalf("%s: no progress in 20 s: %s; the mirror: %s", what, why, mirDrained(ctx, c, routes))
		}
	}
	kill := func(nd *nemNode) time.Time {
		t.Helper()
		at := time.Now()
		if err := nd.proc.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		if err := nd.proc.waitExit(t, 10*time.Second); err == nil {
			t.Fatalf("%s exited cleanly after SIGKILL?", nd.id)
		}
		return at
	}
	start := time.Now()
	progress("before the first fault")
	time.Sleep(1500 * time.Millisecond)

	// hz down: the mirror fails and retries. Its state while hz is down is
	// logged, not asserted: how soon it says failing is the runner's.
	at := kill(hz)
	var states []string
	for time.Since(at) < 2*time.Second {
		if st, err := getMirror(ctx, c, "sg", mirror); err == nil && (len(states) == 0 || states[len(states)-1] != st.State) {
			states = append(states, st.State)
		}
		time.Sleep(200 * time.Millisecond)
	}
	c.restart(hz)
	t.Logf("hz SIGKILLed at +%v for %v; the mirror's states meanwhile: %v", at.Sub(start).Round(time.Millisecond), time.Since(at).Round(time.Millisecond), states)
	progress("after hz's restart")
	time.Sleep(1500 * time.Millisecond)

	at = kill(sg)
	c.restart(sg)
	t.Logf("sg SIGKILLed at +%v and restarted at once (%v)", at.Sub(start).Round(time.Millisecond), time.Since(at).Round(time.Millisecond))
	progress("after sg's first restart")
	time.Sleep(1500 * time.Millisecond)

	// sg down for more than three dedup windows, while hz takes sends: a
	// batch sg stored before the kill and hz hands out again after it is
	// no longer a dedup hit.
	at = kill(sg)
	acked := rec.ackedCount()
	time.Sleep(3*mirDedupWindow + 500*time.Millisecond)
	c.restart(sg)
	t.Logf("sg SIGKILLed at +%v, down %v (dedup window %v) while hz acknowledged %d sends", at.Sub(start).Round(time.Millisecond),
		time.Since(at).Round(time.Millisecond), mirDedupWindow, rec.ackedCount()-acked)
	progress("after sg's long outage")
	time.Sleep(1500 * time.Millisecond)
	stopProducers()
	prodWG.Wait()

	drainStart := time.Now()
	why := waitFor(ctx, 30*time.Second, func() string {
		if w := mirDrained(ctx, c, routes); w != "" {
			return w
		}
		n, err := topicMessages(ctx, c, "sg")
		if err != nil {
			return err.Error()
		}
		if got := rec.deliveredCount("sg", "ord"); int64(got) < n {
			return fmt.Sprintf("sg's consumers got %d of %d messages", got, n)
		}
		return ""
	})
	if why != "" {
		// What is missing or doubled is the checker's to say.
		t.Errorf("not drained 30 s after the producers stopped: %s", why)
	} else {
		t.Logf("drained in %v", time.Since(drainStart).Round(time.Millisecond))
		// The source hands everything out again, more than a dedup window
		// after the last copy: only the mirror's record of what it stored
		// keeps sg from storing it all twice.
		time.Sleep(mirDedupWindow + 500*time.Millisecond)
		if _, _, err := nemCall(ctx, c.hc, "POST", hz.base+"/v1/topics/"+mirTopic+"/subscriptions/mirror.sg."+mirror+"/seek", map[string]any{"to": "earliest"}, nil, nil); err != nil {
			t.Fatal(err)
		}
		seekStart := time.Now()
		if why := waitFor(ctx, 30*time.Second, func() string { return mirDrained(ctx, c, routes) }); why != "" {
			t.Errorf("not drained 30 s after the source subscription was rewound: %s", why)
		}
		t.Logf("source subscription rewound to earliest; handed out again and settled in %v", time.Since(seekStart).Round(time.Millisecond))
		mirStatusCaughtUp(t, ctx, c, routes)
	}
	stopConsumers()
	consWG.Wait()

	h := &mirHistory{msgs: rec.msgs, acked: rec.acked, deliveries: rec.deliveries, stored: map[string][]mirStored{},
		subs: []mirSub{{"sg", "ord"}}, routes: []mirRoute{{"hz", "sg"}}}
	for _, r := range []string{"hz", "sg"} {
		ms, err := walkTopic(ctx, c, r)
		if err != nil {
			t.Fatal(err)
		}
		h.stored[r] = ms
	}
	st, problems := checkMirror(h)
	for _, p := range problems {
		t.Error(p)
	}
	ms, err := getMirror(ctx, c, "sg", mirror)
	switch {
	case err != nil:
		t.Errorf("GET /v1/mirrors/%s: %v", mirror, err)
	case ms.Copied != int64(st.copies["sg"]):
		// copied is counted in the mirror's durable record, so it
		// survives the restarts and counts each stored copy once.
		t.Errorf("GET /v1/mirrors/%s: copied %d, but sg holds %d copies", mirror, ms.Copied, st.copies["sg"])
	}
	t.Logf("%v; %d send requests failed; mirror %+v; took %v", st, rec.failed, ms, time.Since(start).Round(time.Millisecond))
}

// TestMirrorBothWays: mirrors hz → sg and sg → hz at once on the same
// topic, producers in both regions, sg SIGKILLed and restarted once in
// the middle. Once both mirrors are caught up, each message sent in
// either region is stored exactly once in each region: nothing missing,
// and no copy copied back (no ping-pong).
func TestMirrorBothWays(t *testing.T) {
	skipWithoutMirrors(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	c := newMirRegions(t, ctx, "hz", "sg")
	routes := map[string]mirRoute{"from-hz": {"hz", "sg"}, "from-sg": {"sg", "hz"}}
	for name, rt := range routes {
		putMirror(t, ctx, c, name, rt.from, rt.to)
	}
	rec := newMirRecorder()
	prodCtx, stopProducers := context.WithCancel(ctx)
	var prodWG sync.WaitGroup
	for g := range 2 {
		prodWG.Go(func() { produce(prodCtx, c, rec, "hz", g) })
		prodWG.Go(func() { produce(prodCtx, c, rec, "sg", g) })
	}
	defer func() {
		stopProducers()
		prodWG.Wait()
	}()
	time.Sleep(2 * time.Second)
	sg := c.node("sg")
	if err := sg.proc.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := sg.proc.waitExit(t, 10*time.Second); err == nil {
		t.Fatal("sg exited cleanly after SIGKILL?")
	}
	c.restart(sg)
	time.Sleep(2 * time.Second)
	stopProducers()
	prodWG.Wait()

	// Caught up: both mirrors without lag and both regions holding the
	// same number of messages, unchanged for 1 s (a ping-pong copy stored
	// after the first look would change the counts).
	var last [2]int64
	stable := 0
	why := waitFor(ctx, 30*time.Second, func() string {
		if w := mirDrained(ctx, c, routes); w != "" {
			stable = 0
			return w
		}
		hzN, err1 := topicMessages(ctx, c, "hz")
		sgN, err2 := topicMessages(ctx, c, "sg")
		if err1 != nil || err2 != nil {
			return fmt.Sprint(err1, err2)
		}
		if hzN != sgN || [2]int64{hzN, sgN} != last {
			last, stable = [2]int64{hzN, sgN}, 0
			return fmt.Sprintf("hz holds %d, sg %d", hzN, sgN)
		}
		if stable++; stable < 10 {
			return "waiting for the counts to stay"
		}
		return ""
	})
	if why != "" {
		t.Errorf("not caught up 30 s after the producers stopped: %s", why)
	} else {
		mirStatusCaughtUp(t, ctx, c, routes)
	}

	h := &mirHistory{msgs: rec.msgs, acked: rec.acked, stored: map[string][]mirStored{}, routes: []mirRoute{{"hz", "sg"}, {"sg", "hz"}}}
	for _, r := range []string{"hz", "sg"} {
		ms, err := walkTopic(ctx, c, r)
		if err != nil {
			t.Fatal(err)
		}
		h.stored[r] = ms
	}
	st, problems := checkMirror(h)
	for _, p := range problems {
		t.Error(p)
	}
	for name, rt := range routes {
		ms, err := getMirror(ctx, c, rt.to, name)
		if err != nil {
			t.Errorf("GET /v1/mirrors/%s on %s: %v", name, rt.to, err)
			continue
		}
		t.Logf("mirror %s on %s: %+v", name, rt.to, ms)
	}
	t.Logf("%v; %d send requests failed", st, rec.failed)
}
