package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tidemq/tidemq/internal/listenlog"
)

// TestCrashLoop runs producers and consumers against the real binary while
// the broker is killed with SIGKILL every few seconds and restarted on the
// same --data and --addr, then drains the subscription and checks SPEC §1
// and §2 over the whole run:
//
//   - every message whose send got a 201 is delivered at least once;
//   - per queue, the delivered offsets cover [minOffset, maxOffset) with no
//     gap, and each offset always carries the same message;
//   - per sharding key (an orderly subscription), the first deliveries come
//     in the order the messages were stored, and each producer's messages
//     of a key in the order it sent them;
//   - a dedupKey retried after a kill stores nothing new.
//
// Redeliveries are allowed (at least once) and only counted.
//
// TIDEMQ_CRASH_KILLS sets the number of kills (default 3; `task crash-loop`
// runs 20).
func TestCrashLoop(t *testing.T) {
	runCrashLoop(t, t.TempDir(), crashKills(t), nil)
}

// runCrashLoop is TestCrashLoop's run with the broker's data in dir;
// afterKill, if not nil, runs between each kill and the restart.
func runCrashLoop(t *testing.T, dir string, kills int, afterKill func(t *testing.T)) {
	const (
		producers, batchSize = 4, 10
		consumers            = 2
		keys                 = 16
		topic, group         = "loop", "g"
		maxBacklog           = 2000 // messages acknowledged and not delivered yet
	)
	p := startTidemqAt(t, "127.0.0.1:0", dir)
	base := p.base
	addr := strings.TrimPrefix(base, "http://") // where every restart listens

	// Every loop below ends by this deadline at the latest.
	budget := 30*time.Second + time.Duration(kills)*8*time.Second
	ctx, cancel := context.WithTimeout(t.Context(), budget)
	defer cancel()
	hc := &http.Client{
		Timeout: 10 * time.Second, // above the 2 s long poll
		Transport: &http.Transport{
			DialContext:         (&net.Dialer{Timeout: time.Second}).DialContext,
			MaxIdleConnsPerHost: producers + consumers + 2,
		},
	}
	defer hc.CloseIdleConnections()
	if _, err := call(ctx, hc, "PUT", base+"/v1/topics/"+topic, map[string]any{"queues": 4}, nil); err != nil {
		t.Fatal(err)
	}
	// Orderly; retries short and many, so a message leased at a kill comes
	// back soon and never reaches the DLQ.
	if _, err := call(ctx, hc, "PUT", base+"/v1/topics/"+topic+"/subscriptions/"+group, map[string]any{
		"orderly": true, "maxRetries": 32, "retryDelays": []string{"100ms"}, "startFrom": "earliest",
	}, nil); err != nil {
		t.Fatal(err)
	}

	rec := &crashLoopLog{acked: map[string]loopSent{}, keyOfBody: map[string]loopKey{}, seen: map[string]bool{}}
	var (
		sendRetries, dupReplies, inFlight atomic.Int64
		ackFailed, ackErrors, pullErrors  atomic.Int64
	)
	transient := func(status int, err error) bool {
		// No answer (the broker is down or died mid-reply), or an answer
		// that asks to come back later.
		return status == 0 || status >= 500 || status == http.StatusTooManyRequests || (status < 300 && err != nil)
	}
	backoff := func(ctx context.Context, n int) {
		select {
		case <-ctx.Done():
		case <-time.After(min(10*time.Millisecond<<min(n, 5), 200*time.Millisecond)):
		}
	}

	// Producers: batches of 10 with a dedupKey per message, each batch
	// retried until it gets a 201 (a retry after a kill must not store twice).
	prodCtx, stopProducers := context.WithCancel(ctx)
	defer stopProducers()
	var prodWG sync.WaitGroup
	for g := range producers {
		prodWG.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 42))
			seq := 0
			for prodCtx.Err() == nil {
				// Keep the backlog bounded, so that the drain is short
				// whatever the number of kills.
				for rec.backlog() > maxBacklog && prodCtx.Err() == nil {
					time.Sleep(5 * time.Millisecond)
				}
				msgs := make([]map[string]any, batchSize)
				sent := make([]loopKey, batchSize)
				for i := range msgs {
					k := loopKey{producer: g, seq: seq, key: rng.IntN(keys)}
					seq++
					sent[i] = k
					msgs[i] = map[string]any{"body": k.body(), "shardingKey": fmt.Sprintf("k%d", k.key), "dedupKey": k.dedupKey()}
				}
				rec.sending(sent)
				for attempt := 0; ; attempt++ {
					if ctx.Err() != nil { // the producers finish their batch; only the budget cuts it
						return
					}
					var res struct {
						Results []struct {
							MessageID string
							QueueID   int
							Offset    *uint64
							Duplicate bool
						}
					}
					inFlight.Add(1)
					status, err := call(ctx, hc, "POST", base+"/v1/topics/"+topic+"/messages:batch", map[string]any{"messages": msgs}, &res)
					inFlight.Add(-1)
					if status == http.StatusCreated && err == nil {
						if len(res.Results) != batchSize {
							t.Errorf("batch of %d answered with %d results", batchSize, len(res.Results))
							return
						}
						for i, r := range res.Results {
							if r.Duplicate {
								dupReplies.Add(1)
							}
							if r.Offset == nil {
								t.Errorf("%s: 201 without an offset", sent[i].body())
								return
							}
							rec.ack(sent[i], loopSent{id: r.MessageID, queue: r.QueueID, offset: *r.Offset})
						}
						break
					}
					if ctx.Err() != nil {
						return
					}
					if !transient(status, err) {
						t.Errorf("producer %d: send: %d %v", g, status, err)
						return
					}
					sendRetries.Add(1)
					backoff(ctx, attempt)
				}
			}
		})
	}

	// Consumers: long polls of 2 s, each message recorded before it is acked.
	consCtx, stopConsumers := context.WithCancel(ctx)
	defer stopConsumers()
	var consWG sync.WaitGroup
	for c := range consumers {
		consWG.Go(func() {
			pull := map[string]any{"maxMessages": 32, "waitSeconds": 2, "invisibleSeconds": 5, "consumerId": fmt.Sprintf("c%d", c)}
			for errs := 0; consCtx.Err() == nil; {
				var got struct {
					Messages []struct {
						MessageID, Body, ReceiptHandle string
						QueueID                        int
						Offset                         uint64
						DeliveryAttempt                int
					}
				}
				status, err := call(consCtx, hc, "POST", base+"/v1/topics/"+topic+"/subscriptions/"+group+"/pull", pull, &got)
				if err != nil {
					if consCtx.Err() != nil {
						return
					}
					if !transient(status, err) {
						t.Errorf("consumer %d: pull: %d %v", c, status, err)
						return
					}
					pullErrors.Add(1)
					errs++
					backoff(consCtx, errs)
					continue
				}
				errs = 0
				if len(got.Messages) == 0 {
					continue
				}
				handles := make([]string, len(got.Messages))
				ds := make([]loopDelivery, len(got.Messages))
				for i, m := range got.Messages {
					handles[i] = m.ReceiptHandle
					ds[i] = loopDelivery{id: m.MessageID, body: m.Body, queue: m.QueueID, offset: m.Offset, attempt: m.DeliveryAttempt}
				}
				rec.delivered(ds)
				var ack struct {
					Acked  int
					Failed []struct{ ReceiptHandle, Code string }
				}
				status, err = call(consCtx, hc, "POST", base+"/v1/topics/"+topic+"/subscriptions/"+group+"/ack", map[string]any{"receiptHandles": handles}, &ack)
				switch {
				case err == nil:
					ackFailed.Add(int64(len(ack.Failed)))
				case consCtx.Err() != nil:
					return
				case transient(status, err):
					ackErrors.Add(1) // not acked: it comes again
				default:
					t.Errorf("consumer %d: ack: %d %v", c, status, err)
					return
				}
			}
		})
	}
	defer func() { // on t.Fatal too: nothing outlives the test
		cancel()
		prodWG.Wait()
		consWG.Wait()
	}()

	// progress waits (bounded) until at least one more batch than before was
	// acknowledged, so that no kill lands on a broker that did nothing.
	progress := func(what string, since int) {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for rec.ackedCount() <= since {
			if time.Now().After(deadline) || ctx.Err() != nil {
				t.Fatalf("%s: no send acknowledged in 15 s (%d so far)", what, since)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	var inFlightAtKills []int64
	for k := range kills {
		since := rec.ackedCount()
		time.Sleep(1500*time.Millisecond + time.Duration(rng.Int64N(int64(1500*time.Millisecond))))
		progress(fmt.Sprintf("before kill %d", k+1), since)
		inFlightAtKills = append(inFlightAtKills, inFlight.Load())
		if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		if err := p.waitExit(t, 10*time.Second); err == nil {
			t.Fatalf("kill %d: tidemq exited cleanly after SIGKILL?", k+1)
		}
		if afterKill != nil {
			afterKill(t)
		}
		p = startTidemqAt(t, addr, dir)
	}
	// A last stretch of load on the last incarnation, then the drain.
	since := rec.ackedCount()
	time.Sleep(time.Second)
	progress("after the last restart", since)
	stopProducers()
	prodWG.Wait()
	if t.Failed() {
		return
	}

	type topicInfo struct{ QueueStats []loopQueueStat }
	type subInfo struct{ Lag, Inflight, Retrying, DLQ int64 }
	var (
		ti  topicInfo
		si  subInfo
		why string
	)
	drainStart := time.Now()
	drainDeadline := drainStart.Add(20 * time.Second)
	for {
		ti, si = topicInfo{}, subInfo{}
		_, err1 := call(ctx, hc, "GET", base+"/v1/topics/"+topic, nil, &ti)
		_, err2 := call(ctx, hc, "GET", base+"/v1/topics/"+topic+"/subscriptions/"+group, nil, &si)
		switch {
		case err1 != nil || err2 != nil:
			why = fmt.Sprintf("topic: %v; subscription: %v", err1, err2)
		default:
			why = rec.undelivered(ti.QueueStats)
			if why == "" && (si.Lag != 0 || si.Inflight != 0) {
				why = fmt.Sprintf("subscription lag %d, inflight %d", si.Lag, si.Inflight)
			}
		}
		if why == "" || time.Now().After(drainDeadline) || ctx.Err() != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	drained := time.Since(drainStart)
	stopConsumers()
	consWG.Wait()
	if why != "" {
		t.Errorf("not drained after 20 s: %s", why)
	}
	if si.DLQ != 0 || si.Retrying != 0 {
		t.Errorf("after the drain: dlq %d, retrying %d; want 0 (maxRetries 32)", si.DLQ, si.Retrying)
	}

	st, problems := rec.check(ti.QueueStats)
	for _, p := range problems {
		t.Error(p)
	}
	t.Logf("%d kills (requests in flight at each: %v); %d messages acknowledged (%d send retries, %d answered duplicate:true); "+
		"%d delivered, %d deliveries: %d redeliveries (allowed: at least once), highest attempt %d; "+
		"%d ack handles failed, %d ack and %d pull requests got no answer; drained in %v",
		kills, inFlightAtKills, st.acked, sendRetries.Load(), dupReplies.Load(),
		st.unique, st.deliveries, st.deliveries-st.unique, st.maxAttempt,
		ackFailed.Load(), ackErrors.Load(), pullErrors.Load(), drained.Round(time.Millisecond))
}

// crashKills reads TIDEMQ_CRASH_KILLS (default 3).
func crashKills(t *testing.T) int {
	v := os.Getenv("TIDEMQ_CRASH_KILLS")
	if v == "" {
		return 3
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > 1000 {
		t.Fatalf("TIDEMQ_CRASH_KILLS=%q: want a number of kills between 1 and 1000", v)
	}
	return n
}

// startTidemqAt is startTidemq on a given address, so that a restart after
// a kill listens where the clients already send. With port 0 the broker
// picks one and p.base is the address its "tidemq listening" line names:
// a port picked here and handed over could be taken by another package's
// test server in between, whose /readyz would pass for this broker's.
func startTidemqAt(t *testing.T, addr, dataDir string, args ...string) *process {
	t.Helper()
	base := ""
	if !strings.HasSuffix(addr, ":0") {
		base = "http://" + addr
	}
	p := spawnTidemq(t, base, append([]string{"--addr", addr, "--data", dataDir}, args...)...)
	waitReady(t, p, addr, 20*time.Second)
	return p
}

// spawnTidemq starts the binary with args, to be killed (if still running)
// when the test ends; base is where it will serve, "" if not known yet.
// It does not wait for the broker.
func spawnTidemq(t *testing.T, base string, args ...string) *process {
	t.Helper()
	bin := tidemqBinary(t)
	p := &process{base: base, log: &syncBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	for _, kv := range os.Environ() { // the flags say it all (and TIDEMQ_CRASH_KILLS is ours)
		if !strings.HasPrefix(kv, "TIDEMQ_") {
			p.cmd.Env = append(p.cmd.Env, kv)
		}
	}
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.waitErr = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("tidemq log (pid %d, %s):\n%s", p.cmd.Process.Pid, p.base, truncateLog(p.log.String()))
		}
	})
	return p
}

// waitReady waits until p answers /readyz (p.base from its listening line
// when it was started on port 0).
func waitReady(t *testing.T, p *process, addr string, timeout time.Duration) {
	t.Helper()
	hc := &http.Client{Timeout: 2 * time.Second}
	defer hc.CloseIdleConnections()
	deadline := time.Now().Add(timeout)
	for wait := time.Millisecond; ; wait = min(2*wait, 100*time.Millisecond) {
		select {
		case <-p.done:
			t.Fatalf("tidemq exited before it was ready: %v\n%s", p.waitErr, truncateLog(p.log.String()))
		default:
		}
		if a := listenlog.Addr(p.log.String()); p.base == "" && a != "" {
			p.base = "http://" + a
		}
		var err error
		if p.base != "" {
			var resp *http.Response
			if resp, err = hc.Get(p.base + "/readyz"); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					return
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("tidemq not ready on %s (%q) after %v: %v", addr, p.base, timeout, err)
		}
		time.Sleep(wait)
	}
}

// loopKey names one produced message: its producer, that producer's
// sequence number, and its sharding key k0..k15.
type loopKey struct{ producer, seq, key int }

func (k loopKey) body() string     { return fmt.Sprintf("p%d-s%07d-k%02d", k.producer, k.seq, k.key) }
func (k loopKey) dedupKey() string { return fmt.Sprintf("p%d-s%07d", k.producer, k.seq) }

// loopSent is what a 201 said about a message.
type loopSent struct {
	id     string
	queue  int
	offset uint64
}

type loopDelivery struct {
	id, body      string
	queue         int
	offset        uint64
	attempt       int
	order         int // position in the record of all deliveries
	key           loopKey
	keyKnown      bool
	firstOfItsMsg bool
}

// crashLoopLog is what the clients saw, in the order they saw it.
type crashLoopLog struct {
	mu         sync.Mutex
	acked      map[string]loopSent // body → the 201's answer
	keyOfBody  map[string]loopKey  // every body a producer sent
	deliveries []loopDelivery      // in the order the consumers received them
	seen       map[string]bool     // ids delivered
}

func (l *crashLoopLog) sending(ks []loopKey) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, k := range ks {
		l.keyOfBody[k.body()] = k
	}
}

func (l *crashLoopLog) ack(k loopKey, s loopSent) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.acked[k.body()] = s
}

func (l *crashLoopLog) ackedCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.acked)
}

// delivered records one pull's messages, in the order of the reply. A
// consumer records before it acks, so a message of a key handed out only
// after the previous one was acked is recorded after it.
func (l *crashLoopLog) delivered(ds []loopDelivery) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.deliveries = append(l.deliveries, ds...)
	for _, d := range ds {
		l.seen[d.id] = true
	}
}

// backlog is the number of messages acknowledged but not delivered yet
// (roughly: it ignores the few delivered before their 201 arrived).
func (l *crashLoopLog) backlog() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.acked) - len(l.seen)
}

// undelivered says what the drain still waits for ("" when nothing): an
// acknowledged message not delivered, or an offset below maxOffset never
// delivered.
func (l *crashLoopLog) undelivered(stats []loopQueueStat) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	ids := map[string]bool{}
	offsets := map[int]map[uint64]bool{}
	for _, d := range l.deliveries {
		ids[d.id] = true
		if offsets[d.queue] == nil {
			offsets[d.queue] = map[uint64]bool{}
		}
		offsets[d.queue][d.offset] = true
	}
	missing := 0
	for _, s := range l.acked {
		if !ids[s.id] {
			missing++
		}
	}
	if missing > 0 {
		return fmt.Sprintf("%d of %d acknowledged messages not delivered yet", missing, len(l.acked))
	}
	for _, q := range stats {
		if n := uint64(len(offsets[q.QueueID])); n < q.MaxOffset-q.MinOffset {
			return fmt.Sprintf("queue %d: %d offsets delivered of [%d, %d)", q.QueueID, n, q.MinOffset, q.MaxOffset)
		}
	}
	return ""
}

// loopQueueStat is one entry of GET /v1/topics/{t}'s queueStats:
// retained offsets [MinOffset, MaxOffset).
type loopQueueStat struct {
	QueueID              int
	MinOffset, MaxOffset uint64
}

type loopStats struct {
	acked, unique, deliveries, maxAttempt int
}

// check holds the whole record to the guarantees and returns what broke
// them, one entry per kind of problem; call it once every client has stopped.
func (l *crashLoopLog) check(stats []loopQueueStat) (loopStats, []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := loopStats{acked: len(l.acked), deliveries: len(l.deliveries)}
	var problems []string
	report := func(what string, bad []string) {
		if len(bad) > 0 {
			problems = append(problems, fmt.Sprintf("%s: %d times, e.g.\n  %s", what, len(bad), strings.Join(bad[:min(10, len(bad))], "\n  ")))
		}
	}
	if st.acked == 0 {
		report("no send was acknowledged", []string{"none"})
	}

	// Each message id: one body, one position; each position: one id.
	type pos struct {
		queue  int
		offset uint64
	}
	idAt := map[pos]string{}
	first := map[string]*loopDelivery{}
	idsOfBody := map[string][]string{}
	var bad []string
	for i := range l.deliveries {
		d := &l.deliveries[i]
		d.order = i
		st.maxAttempt = max(st.maxAttempt, d.attempt)
		d.key, d.keyKnown = l.keyOfBody[d.body]
		if !d.keyKnown {
			bad = append(bad, fmt.Sprintf("delivered %s with body %q, which no producer sent", d.id, d.body))
		}
		if prev, ok := idAt[pos{d.queue, d.offset}]; ok && prev != d.id {
			bad = append(bad, fmt.Sprintf("queue %d offset %d delivered as %s and as %s", d.queue, d.offset, prev, d.id))
		}
		idAt[pos{d.queue, d.offset}] = d.id
		f, seen := first[d.id]
		if !seen {
			d.firstOfItsMsg = true
			first[d.id] = d
			idsOfBody[d.body] = append(idsOfBody[d.body], d.id)
			continue
		}
		if f.body != d.body || f.queue != d.queue || f.offset != d.offset {
			bad = append(bad, fmt.Sprintf("%s delivered as %q at %d/%d, later as %q at %d/%d", d.id, f.body, f.queue, f.offset, d.body, d.queue, d.offset))
		}
	}
	st.unique = len(first)
	report("delivery inconsistent", bad)

	// At least once: every 201 is delivered, as the message the 201 named.
	var lost, moved []string
	for body, s := range l.acked {
		d, ok := first[s.id]
		switch {
		case !ok:
			lost = append(lost, fmt.Sprintf("%s (%s at %d/%d)", body, s.id, s.queue, s.offset))
		case d.body != body || d.queue != s.queue || d.offset != s.offset:
			moved = append(moved, fmt.Sprintf("%s: the send answered %s at %d/%d, delivered as %q at %d/%d", body, s.id, s.queue, s.offset, d.body, d.queue, d.offset))
		}
	}
	slices.Sort(lost)
	report("acknowledged message never delivered", lost)
	report("acknowledged message delivered as something else", moved)

	// A dedupKey retried after a kill stores nothing new (SPEC §2).
	var stored2 []string
	for body, ids := range idsOfBody {
		if len(ids) > 1 {
			stored2 = append(stored2, fmt.Sprintf("%s stored as %v", body, ids))
		}
	}
	slices.Sort(stored2)
	report("message stored twice despite its dedupKey", stored2)

	// Gap-free per queue: every retained offset was delivered, nothing beyond.
	var gaps []string
	for _, q := range stats {
		if q.MinOffset != 0 {
			gaps = append(gaps, fmt.Sprintf("queue %d: minOffset %d, want 0 (nothing is past retention)", q.QueueID, q.MinOffset))
		}
		var missing []uint64
		for o := q.MinOffset; o < q.MaxOffset; o++ {
			if _, ok := idAt[pos{q.QueueID, o}]; !ok {
				missing = append(missing, o)
			}
		}
		if len(missing) > 0 {
			gaps = append(gaps, fmt.Sprintf("queue %d: offsets %v of [%d, %d) never delivered", q.QueueID, missing[:min(10, len(missing))], q.MinOffset, q.MaxOffset))
		}
	}
	for p := range idAt {
		if p.queue < 0 || p.queue >= len(stats) || p.offset >= stats[p.queue].MaxOffset {
			gaps = append(gaps, fmt.Sprintf("delivered queue %d offset %d, beyond the topic's queueStats", p.queue, p.offset))
		}
	}
	slices.Sort(gaps)
	report("offsets not gap-free", gaps)

	// Orderly: per key, first deliveries in stored (offset) order, and each
	// producer's messages of the key in its send order.
	var order []string
	type lastSeen struct {
		queue  int
		offset uint64
		body   string
	}
	byKey := map[int]lastSeen{}
	byProducerKey := map[[2]int]loopKey{}
	for _, d := range l.deliveries {
		if !d.firstOfItsMsg || !d.keyKnown {
			continue
		}
		if prev, ok := byKey[d.key.key]; ok {
			if prev.queue != d.queue {
				order = append(order, fmt.Sprintf("k%d in queues %d and %d", d.key.key, prev.queue, d.queue))
			} else if d.offset < prev.offset {
				order = append(order, fmt.Sprintf("k%d: %s (offset %d) first delivered after %s (offset %d)", d.key.key, d.body, d.offset, prev.body, prev.offset))
			}
		}
		byKey[d.key.key] = lastSeen{d.queue, d.offset, d.body}
		pk := [2]int{d.key.producer, d.key.key}
		if prev, ok := byProducerKey[pk]; ok && d.key.seq < prev.seq {
			order = append(order, fmt.Sprintf("k%d: %s first delivered after %s, sent later", d.key.key, d.body, prev.body()))
		}
		byProducerKey[pk] = d.key
	}
	report("orderly subscription out of order", order)
	return st, problems
}

// TestCrashLoopCheckCatchesViolations keeps the crash loop's checks honest:
// a clean record passes, and each broken one is reported for its reason.
func TestCrashLoopCheckCatchesViolations(t *testing.T) {
	a0, a1, b0 := loopKey{0, 0, 3}, loopKey{0, 1, 3}, loopKey{1, 0, 5} // k3 in queue 0, k5 in queue 1
	del := func(id string, k loopKey, queue int, offset uint64) loopDelivery {
		return loopDelivery{id: id, body: k.body(), queue: queue, offset: offset, attempt: 1}
	}
	clean := func() (*crashLoopLog, []loopQueueStat) {
		l := &crashLoopLog{acked: map[string]loopSent{}, keyOfBody: map[string]loopKey{}, seen: map[string]bool{}}
		l.sending([]loopKey{a0, a1, b0})
		l.ack(a0, loopSent{"A0", 0, 0})
		l.ack(a1, loopSent{"A1", 0, 1})
		l.ack(b0, loopSent{"B0", 1, 0})
		l.delivered([]loopDelivery{del("A0", a0, 0, 0), del("B0", b0, 1, 0), del("A0", a0, 0, 0), del("A1", a1, 0, 1)})
		return l, []loopQueueStat{{0, 0, 2}, {1, 0, 1}}
	}
	l, stats := clean()
	st, problems := l.check(stats)
	if len(problems) > 0 {
		t.Fatalf("clean record reported: %q", problems)
	}
	if st != (loopStats{acked: 3, unique: 3, deliveries: 4, maxAttempt: 1}) {
		t.Errorf("clean record: %+v", st)
	}
	for _, tc := range []struct {
		name  string
		spoil func(l *crashLoopLog, stats []loopQueueStat)
		want  string
	}{
		{"lost", func(l *crashLoopLog, _ []loopQueueStat) { l.deliveries = l.deliveries[:3] }, "acknowledged message never delivered"},
		{"gap", func(_ *crashLoopLog, stats []loopQueueStat) { stats[1].MaxOffset = 2 }, "offsets not gap-free"},
		{"beyond maxOffset", func(_ *crashLoopLog, stats []loopQueueStat) { stats[0].MaxOffset = 1 }, "beyond the topic's queueStats"},
		{"retention cut", func(_ *crashLoopLog, stats []loopQueueStat) { stats[0].MinOffset = 1 }, "minOffset 1"},
		{"out of order", func(l *crashLoopLog, _ []loopQueueStat) {
			l.deliveries = []loopDelivery{del("A1", a1, 0, 1), del("A0", a0, 0, 0), del("B0", b0, 1, 0)}
		}, "orderly subscription out of order"},
		{"stored twice", func(l *crashLoopLog, stats []loopQueueStat) {
			l.deliveries = append(l.deliveries, del("A1bis", a1, 0, 2))
			stats[0].MaxOffset = 3
		}, "stored twice despite its dedupKey"},
		{"two ids at one offset", func(l *crashLoopLog, _ []loopQueueStat) {
			l.deliveries = append(l.deliveries, del("X", b0, 1, 0))
		}, "delivered as B0 and as X"},
		{"moved", func(l *crashLoopLog, _ []loopQueueStat) { l.acked[a1.body()] = loopSent{"A1", 0, 7} }, "delivered as something else"},
		{"unknown body", func(l *crashLoopLog, _ []loopQueueStat) { l.deliveries[1].body = "garbage" }, "which no producer sent"},
	} {
		l, stats := clean()
		tc.spoil(l, stats)
		_, problems := l.check(stats)
		if !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, tc.want) }) {
			t.Errorf("%s: not reported (want %q); got %q", tc.name, tc.want, problems)
		}
	}
}
