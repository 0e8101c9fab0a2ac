package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// TestClusterNemesis runs producers and consumers against a 3-node cluster
// of real processes while a nemesis kills and pauses them, then drains
// both subscriptions and holds the record to SPEC §2 and §7.2 (see
// checkNemesis): nothing acknowledged is lost, no queue offset names two
// messages, orderly keys keep their order, a delayed message is stored
// once, a dedupKey sent again after a failover gets its first reply back,
// while two of three nodes are down nothing is acknowledged, and a send
// through a running node never waits much beyond the 5 s a request waits
// for a leader. For each leader SIGKILL it measures the failover (kill to
// the next 201 through a live node) and fails above 5 s.
//
// TIDEMQ_NEMESIS_KILLS sets the number of leader kills (default 3; `task
// cluster:nemesis` runs 20, with a pause, a follower kill or a majority
// outage after most of them), TIDEMQ_NEMESIS_PAUSE how long a leader stays
// under SIGSTOP (default 3s). TIDEMQ_NEMESIS=off skips it.
func TestClusterNemesis(t *testing.T) {
	if os.Getenv("TIDEMQ_NEMESIS") == "off" {
		t.Skip("TIDEMQ_NEMESIS=off")
	}
	skipUnlessClusterTest(t, "the nemesis runs for a minute or more")
	kills := nemesisKills(t)
	pause := 3 * time.Second
	if v := os.Getenv("TIDEMQ_NEMESIS_PAUSE"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 100*time.Millisecond || d > time.Minute {
			t.Fatalf("TIDEMQ_NEMESIS_PAUSE=%q: want a duration from 100ms to 1m", v)
		}
		pause = d
	}
	var steps []string
	for i := range kills {
		steps = append(steps, nemKillLeader)
		switch i % 4 {
		case 0:
			steps = append(steps, nemStopLeader)
		case 1:
			steps = append(steps, nemKillFollower)
		case 2:
			steps = append(steps, nemKillTwo)
		}
	}
	if !slices.Contains(steps, nemKillTwo) { // one majority outage in every run
		steps = append(steps, nemKillFollower, nemKillTwo)
	}
	runNemesis(t, 3, steps, pause, 5*time.Second)
}

// TestNemesisHarnessSingleNode runs the nemesis harness on one node started
// without cluster flags (a cluster of one, SPEC §7), with SIGKILL and a
// restart as its only fault: the harness, its clients and its checker on
// the single-node code path.
func TestNemesisHarnessSingleNode(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real broker processes for ~10 s")
	}
	runNemesis(t, 1, []string{nemKillLeader, nemKillLeader}, 0, 0)
}

// nemesisKills reads TIDEMQ_NEMESIS_KILLS (default 3).
func nemesisKills(t *testing.T) int {
	v := os.Getenv("TIDEMQ_NEMESIS_KILLS")
	if v == "" {
		return 3
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > 200 {
		t.Fatalf("TIDEMQ_NEMESIS_KILLS=%q: want a number of leader kills between 1 and 200", v)
	}
	return n
}

// binaryHasFlag reports whether tidemq --help lists the flag.
// skipUnlessClusterTest skips a test of broker processes in a cluster in
// -short runs (long says what it takes) and when the binary has no
// cluster flags.
func skipUnlessClusterTest(t *testing.T, long string) {
	t.Helper()
	if testing.Short() {
		t.Skip(long)
	}
	if !binaryHasFlag(t, "node-id") {
		t.Skip("tidemq has no --node-id flag: no cluster to test")
	}
}

func binaryHasFlag(t *testing.T, name string) bool {
	t.Helper()
	out, err := exec.Command(tidemqBinary(t), "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("tidemq --help: %v\n%s", err, out)
	}
	return bytes.Contains(out, []byte("-"+name+" "))
}

// nemNode is one node of the cluster under test; its addresses and data
// stay the same across restarts.
type nemNode struct {
	id     string
	base   string // http://host:port
	args   []string
	proc   *process // the running incarnation
	paused bool     // under SIGSTOP
}

type nemCluster struct {
	t     *testing.T
	nodes []*nemNode
	hc    *http.Client
}

// freeSharedPort is a TCP port free on every one of ips: picked on the
// first by binding :0, checked on the others by binding it there.
func freeSharedPort(t *testing.T, ips []string, not ...int) int {
	t.Helper()
	for range 100 {
		ln, err := net.Listen("tcp", net.JoinHostPort(ips[0], "0"))
		if err != nil {
			t.Fatal(err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		lns := []net.Listener{ln}
		ok := !slices.Contains(not, port)
		for _, ip := range ips[1:] {
			if !ok {
				break
			}
			l, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(port)))
			if err != nil {
				ok = false
				break
			}
			lns = append(lns, l)
		}
		for _, l := range lns {
			_ = l.Close()
		}
		if ok {
			return port
		}
	}
	t.Fatalf("no port free on all of %v", ips)
	return 0
}

// newNemCluster starts n nodes: node i on 127.0.0.i, every node on the
// same HTTP port and the same cluster port, each with extra flags. One
// node gets no cluster flags.
func newNemCluster(t *testing.T, n int, extra ...string) *nemCluster {
	t.Helper()
	dir := t.TempDir()
	var ips []string
	for i := range n {
		ips = append(ips, fmt.Sprintf("127.0.0.%d", i+1))
	}
	httpPort := freeSharedPort(t, ips)
	clusterPort := freeSharedPort(t, ips, httpPort)
	secret := filepath.Join(dir, "cluster-secret")
	if err := os.WriteFile(secret, []byte("nemesis-test-secret-0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var peers []string
	for i, ip := range ips {
		peers = append(peers, fmt.Sprintf("n%d=%s:%d", i+1, ip, clusterPort))
	}
	c := &nemCluster{t: t, hc: &http.Client{
		Timeout: 8 * time.Second, // above the 5 s a request waits for a leader
		Transport: &http.Transport{
			DialContext:         (&net.Dialer{Timeout: time.Second}).DialContext,
			MaxIdleConnsPerHost: 16,
		},
	}}
	t.Cleanup(c.hc.CloseIdleConnections)
	for i, ip := range ips {
		addr := fmt.Sprintf("%s:%d", ip, httpPort)
		nd := &nemNode{id: fmt.Sprintf("n%d", i+1), base: "http://" + addr}
		nd.args = []string{"--addr", addr, "--data", filepath.Join(dir, nd.id)}
		if n > 1 {
			nd.args = append(nd.args, "--node-id", nd.id,
				"--cluster-addr", fmt.Sprintf("%s:%d", ip, clusterPort),
				"--peers", strings.Join(peers, ","), "--cluster-secret", secret,
				// Snapshots and log truncation every few hundred entries, so
				// a node killed and restarted may have to catch up from one.
				"--raft-snapshot-threshold", "256", "--raft-trailing-logs", "64", "--raft-snapshot-interval", "500ms")
		}
		nd.args = append(nd.args, extra...)
		c.nodes = append(c.nodes, nd)
	}
	// All first, then wait: a node alone has no majority to be ready with.
	for _, nd := range c.nodes {
		nd.proc = spawnTidemq(t, nd.base, nd.args...)
	}
	for _, nd := range c.nodes {
		c.waitHealthy(nd)
	}
	return c
}

// waitHealthy waits (bounded) until nd answers /healthz.
func (c *nemCluster) waitHealthy(nd *nemNode) {
	c.t.Helper()
	hc := &http.Client{Timeout: 2 * time.Second}
	defer hc.CloseIdleConnections()
	deadline := time.Now().Add(20 * time.Second)
	for wait := time.Millisecond; ; wait = min(2*wait, 100*time.Millisecond) {
		select {
		case <-nd.proc.done:
			c.t.Fatalf("%s exited before it was up: %v\n%s", nd.id, nd.proc.waitErr, truncateLog(nd.proc.log.String()))
		default:
		}
		resp, err := hc.Get(nd.base + "/healthz")
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("%s not up on %s after 20 s: %v", nd.id, nd.base, err)
		}
		time.Sleep(wait)
	}
}

func (c *nemCluster) node(id string) *nemNode {
	for _, nd := range c.nodes {
		if nd.id == id {
			return nd
		}
	}
	return nil
}

func (c *nemCluster) running(nd *nemNode) bool {
	select {
	case <-nd.proc.done:
		return false
	default:
		return !nd.paused
	}
}

// leader is the node that leads the most groups, once every running node's
// GET /v1/cluster names the same running leader for each group (a node
// just resumed may still believe it leads); it waits, bounded.
func (c *nemCluster) leader(ctx context.Context) *nemNode {
	c.t.Helper()
	if len(c.nodes) == 1 {
		return c.nodes[0]
	}
	deadline := time.Now().Add(20 * time.Second)
	var last string
	for ctx.Err() == nil && time.Now().Before(deadline) {
		l, why := c.agreedLeader(ctx)
		if l != nil {
			return l
		}
		last = why
		time.Sleep(50 * time.Millisecond)
	}
	c.t.Fatalf("no leader agreed on in 20 s: %s", last)
	return nil
}

// agreedLeader is one round of leader: the leader, or why there is none.
func (c *nemCluster) agreedLeader(ctx context.Context) (*nemNode, string) {
	var agreed map[string]string // group → leader
	for _, nd := range c.nodes {
		if !c.running(nd) {
			continue
		}
		var cl struct {
			Groups []struct{ ID, Leader string }
		}
		if _, _, err := nemCall(ctx, c.hc, "GET", nd.base+"/v1/cluster", nil, &cl, nil); err != nil {
			return nil, err.Error()
		}
		view := map[string]string{}
		for _, g := range cl.Groups {
			if l := c.node(g.Leader); l == nil || !c.running(l) {
				return nil, fmt.Sprintf("%s: group %s has no running leader (%q)", nd.id, g.ID, g.Leader)
			}
			view[g.ID] = g.Leader
		}
		if len(view) == 0 {
			return nil, nd.id + ": no groups"
		}
		if agreed == nil {
			agreed = view
		} else if !maps.Equal(agreed, view) {
			return nil, fmt.Sprintf("nodes disagree on the leaders: %v and %s's %v", agreed, nd.id, view)
		}
	}
	led := map[string]int{}
	for _, l := range agreed {
		led[l]++
	}
	var best string
	for _, id := range slices.Sorted(maps.Keys(led)) {
		if best == "" || led[id] > led[best] {
			best = id
		}
	}
	if best == "" {
		return nil, "no node running"
	}
	return c.node(best), ""
}

func (c *nemCluster) kill(nd *nemNode) {
	c.t.Helper()
	if err := nd.proc.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		c.t.Fatal(err)
	}
	if err := nd.proc.waitExit(c.t, 10*time.Second); err == nil {
		c.t.Fatalf("%s exited cleanly after SIGKILL?", nd.id)
	}
	nd.paused = false
}

func (c *nemCluster) restart(nd *nemNode) {
	c.t.Helper()
	nd.proc = spawnTidemq(c.t, nd.base, nd.args...)
	c.waitHealthy(nd)
}

func (c *nemCluster) signal(nd *nemNode, sig syscall.Signal) {
	c.t.Helper()
	if err := nd.proc.cmd.Process.Signal(sig); err != nil {
		c.t.Fatal(err)
	}
	nd.paused = sig == syscall.SIGSTOP
}

// nemCall does one JSON request, decodes a 2xx reply into out (if not nil)
// and returns the status (0 for no answer) and, for a problem, its code;
// hdr, if not nil, receives the reply's headers.
func nemCall(ctx context.Context, hc *http.Client, method, url string, body, out any, hdr *http.Header) (int, string, error) {
	var rd io.Reader
	if body != nil {
		j, err := json.Marshal(body)
		if err != nil {
			return 0, "", err
		}
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return 0, "", err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	if hdr != nil {
		*hdr = resp.Header
	}
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, "", err
	}
	if resp.StatusCode >= 300 {
		var p struct{ Code string }
		_ = json.Unmarshal(data, &p)
		return resp.StatusCode, p.Code, fmt.Errorf("%s %s: %d %s", method, url, resp.StatusCode, bytes.TrimSpace(data))
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return resp.StatusCode, "", fmt.Errorf("%s %s: %v: %s", method, url, err, data)
		}
	}
	return resp.StatusCode, "", nil
}

// transientStatus says whether a request deserves a retry: no answer, or
// one that asks to come back later, or a 2xx cut short.
func transientStatus(status int, err error) bool {
	return status == 0 || status >= 500 || status == http.StatusTooManyRequests || (status < 300 && err != nil)
}

// nemRecorder is the shared record the clients and the nemesis write.
type nemRecorder struct {
	mu        sync.Mutex
	h         nemHistory
	ackedID   map[string]string          // body → id of its first 201
	delivered map[string]map[string]bool // sub → ids delivered
}

func newNemRecorder(subs []string, orderly string) *nemRecorder {
	r := &nemRecorder{h: nemHistory{msgs: map[string]nemMsg{}, subs: subs, orderly: orderly},
		ackedID: map[string]string{}, delivered: map[string]map[string]bool{}}
	for _, s := range subs {
		r.delivered[s] = map[string]bool{}
	}
	return r
}

func (r *nemRecorder) made(ms []nemMsg) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range ms {
		r.h.msgs[m.body] = m
	}
}

func (r *nemRecorder) attempt(a nemAttempt, replies []nemReply) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.h.attempts = append(r.h.attempts, a)
	r.h.replies = append(r.h.replies, replies...)
	for _, rp := range replies {
		if _, ok := r.ackedID[rp.body]; !ok {
			r.ackedID[rp.body] = rp.id
		}
	}
}

func (r *nemRecorder) deliveries(ds []nemDelivery) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.h.deliveries = append(r.h.deliveries, ds...)
	for _, d := range ds {
		r.delivered[d.sub][d.id] = true
	}
}

func (r *nemRecorder) fault(f nemFault) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.h.faults = append(r.h.faults, f)
}

func (r *nemRecorder) ackedCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.ackedID)
}

// backlog is roughly how many acknowledged messages the slowest
// subscription has not had yet.
func (r *nemRecorder) backlog() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	least := len(r.ackedID)
	for _, ids := range r.delivered {
		least = min(least, len(ids))
	}
	return len(r.ackedID) - least
}

// undelivered says what the drain still waits for, "" when nothing: an
// acknowledged message, or fewer offsets than the queues hold, not
// delivered on a subscription.
func (r *nemRecorder) undelivered(queues []nemQueue) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var why []string
	for _, s := range r.h.subs {
		missing := 0
		for _, id := range r.ackedID {
			if !r.delivered[s][id] {
				missing++
			}
		}
		if missing > 0 {
			why = append(why, fmt.Sprintf("%s: %d of %d acknowledged messages not delivered", s, missing, len(r.ackedID)))
		}
		var stored uint64
		for _, q := range queues {
			stored += q.max - q.min
		}
		if n := uint64(len(r.delivered[s])); n < stored {
			why = append(why, fmt.Sprintf("%s: %d messages delivered of the %d the queues hold", s, n, stored))
		}
	}
	return strings.Join(why, "; ")
}

// setQueues records the topic's queueStats once drained.
func (r *nemRecorder) setQueues(qs []nemQueue) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.h.queues = qs
}

// ackedSince picks up to n acknowledged messages whose first 201 arrived
// after from and before to, for re-sending.
func (r *nemRecorder) ackedSince(rng *rand.Rand, from, to time.Time, n int) []nemMsg {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ms []nemMsg
	for _, rp := range r.h.replies {
		if !rp.resend && rp.at.After(from) && rp.at.Before(to) && r.ackedID[rp.body] == rp.id {
			ms = append(ms, r.h.msgs[rp.body])
		}
	}
	rng.Shuffle(len(ms), func(i, j int) { ms[i], ms[j] = ms[j], ms[i] })
	return ms[:min(n, len(ms))]
}

// acknowledgedAfter reports whether a send that started at or after from
// got a 201 through a node not in dead.
func (r *nemRecorder) acknowledgedAfter(from time.Time, dead []string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, a := range slices.Backward(r.h.attempts) {
		if a.status == http.StatusCreated && !a.start.Before(from) && !slices.Contains(dead, a.node) {
			return true
		}
	}
	return false
}

// answersDuring sums up, for the log, how the sends in flight when f
// began were answered, and those begun during it: before it was over, or
// after; per answer, how many and the longest wait.
func (r *nemRecorder) answersDuring(f nemFault) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	type tally struct {
		n       int
		longest time.Duration
	}
	inFlight, during, after := map[string]tally{}, map[string]tally{}, map[string]tally{}
	for _, a := range r.h.attempts {
		if !a.start.Before(f.end) || a.end.Before(f.at) {
			continue
		}
		k := strconv.Itoa(a.status)
		switch {
		case a.status == 0:
			k = "no answer"
		case a.code != "":
			k += " " + a.code
		}
		m := after
		switch {
		case a.start.Before(f.at):
			m = inFlight
		case a.end.Before(f.end):
			m = during
		}
		m[k] = tally{m[k].n + 1, max(m[k].longest, a.end.Sub(a.start))}
	}
	sum := func(m map[string]tally) string {
		var parts []string
		for _, k := range slices.Sorted(maps.Keys(m)) {
			parts = append(parts, fmt.Sprintf("%s ×%d (≤%v)", k, m[k].n, m[k].longest.Round(10*time.Millisecond)))
		}
		return strings.Join(parts, ", ")
	}
	return fmt.Sprintf("in flight at it [%s], begun during it and answered during it [%s], after it [%s]", sum(inFlight), sum(during), sum(after))
}

// history is the record; call it once every client has stopped.
func (r *nemRecorder) history() *nemHistory {
	r.mu.Lock()
	defer r.mu.Unlock()
	return &r.h
}

// sendBody is a message as a send request carries it.
func (m nemMsg) sendBody() map[string]any {
	b := map[string]any{"body": m.body, "dedupKey": m.dedupKey}
	if m.key != "" {
		b["shardingKey"] = m.key
	}
	if m.delay > 0 {
		b["delaySeconds"] = int(m.delay / time.Second)
	}
	return b
}

type nemSendResult struct {
	MessageID string
	QueueID   int
	Offset    *uint64
	Duplicate bool
}

// send sends ms (alone, or as a batch when batch is set) through nd once
// and records the attempt and its replies; it returns the status and error.
func (c *nemCluster) send(ctx context.Context, rec *nemRecorder, nd *nemNode, topic string, ms []nemMsg, batch, resend bool) (int, error) {
	var (
		res    []nemSendResult
		status int
		code   string
		err    error
		hdr    http.Header
	)
	start := time.Now()
	if batch {
		bodies := make([]map[string]any, len(ms))
		for i, m := range ms {
			bodies[i] = m.sendBody()
		}
		var out struct{ Results []nemSendResult }
		status, code, err = nemCall(ctx, c.hc, "POST", nd.base+"/v1/topics/"+topic+"/messages:batch", map[string]any{"messages": bodies}, &out, &hdr)
		res = out.Results
	} else {
		var out nemSendResult
		status, code, err = nemCall(ctx, c.hc, "POST", nd.base+"/v1/topics/"+topic+"/messages", ms[0].sendBody(), &out, &hdr)
		res = []nemSendResult{out}
	}
	end := time.Now()
	a := nemAttempt{node: nd.id, start: start, end: end, status: status, code: code, messages: len(ms)}
	if hdr != nil {
		a.retryAfter = hdr.Get("Retry-After")
	}
	var replies []nemReply
	if status == http.StatusCreated && err == nil {
		if len(res) != len(ms) {
			err = fmt.Errorf("%d messages answered with %d results", len(ms), len(res))
		}
		for i := range min(len(res), len(ms)) {
			r := res[i]
			rp := nemReply{body: ms[i].body, id: r.MessageID, queue: r.QueueID, duplicate: r.Duplicate, node: nd.id, start: start, at: end, resend: resend}
			if r.Offset != nil {
				rp.offset, rp.hasOffset = *r.Offset, true
			} else if ms[i].delay == 0 {
				err = fmt.Errorf("%s: 201 without an offset", ms[i].body)
			}
			if r.MessageID == "" {
				err = fmt.Errorf("%s: 201 without a messageId", ms[i].body)
			}
			replies = append(replies, rp)
		}
		if err != nil {
			status = -1 // a broken 201: not retried, reported
		}
	}
	rec.attempt(a, replies)
	return status, err
}

// sendUntilAcked retries ms with the same dedupKeys through random nodes
// until one request gets a 201, or ctx ends.
func (c *nemCluster) sendUntilAcked(ctx context.Context, rng *rand.Rand, rec *nemRecorder, topic string, ms []nemMsg, batch, resend bool) error {
	for attempt := 0; ; attempt++ {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		nd := c.nodes[rng.IntN(len(c.nodes))]
		status, err := c.send(ctx, rec, nd, topic, ms, batch, resend)
		if status == http.StatusCreated && err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !transientStatus(status, err) {
			return fmt.Errorf("via %s: %d %v", nd.id, status, err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(min(10*time.Millisecond<<min(attempt, 4), 100*time.Millisecond)):
		}
	}
}

// nemSubInfo is what the drain reads of GET …/subscriptions/{group}.
type nemSubInfo struct{ Lag, Inflight, Retrying, DLQ int64 }

// drainState reads the topic's queues and the subscriptions through a
// random node and says what the drain still waits for ("" when nothing):
// a message not delivered, or a subscription with lag or messages in
// flight.
func (c *nemCluster) drainState(ctx context.Context, rng *rand.Rand, topic string, subs []string, rec *nemRecorder) ([]nemQueue, map[string]nemSubInfo, string) {
	nd := c.nodes[rng.IntN(len(c.nodes))]
	var ti struct {
		QueueStats []struct {
			QueueID              int
			MinOffset, MaxOffset uint64
		}
	}
	if _, _, err := nemCall(ctx, c.hc, "GET", nd.base+"/v1/topics/"+topic, nil, &ti, nil); err != nil {
		return nil, nil, err.Error()
	}
	var qs []nemQueue
	for _, q := range ti.QueueStats {
		qs = append(qs, nemQueue{q.QueueID, q.MinOffset, q.MaxOffset})
	}
	infos := map[string]nemSubInfo{}
	var why []string
	if w := rec.undelivered(qs); w != "" {
		why = append(why, w)
	}
	for _, s := range subs {
		var si nemSubInfo
		if _, _, err := nemCall(ctx, c.hc, "GET", nd.base+"/v1/topics/"+topic+"/subscriptions/"+s, nil, &si, nil); err != nil {
			return nil, nil, err.Error()
		}
		infos[s] = si
		if si.Lag != 0 || si.Inflight != 0 {
			why = append(why, fmt.Sprintf("%s: lag %d, inflight %d", s, si.Lag, si.Inflight))
		}
	}
	return qs, infos, strings.Join(why, "; ")
}

// setup retries one idempotent admin request through random nodes until
// it succeeds, bounded.
func (c *nemCluster) setup(ctx context.Context, rng *rand.Rand, method, path string, body any) {
	c.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		nd := c.nodes[rng.IntN(len(c.nodes))]
		status, _, err := nemCall(ctx, c.hc, method, nd.base+path, body, nil, nil)
		if err == nil {
			return
		}
		if !transientStatus(status, err) || time.Now().After(deadline) || ctx.Err() != nil {
			c.t.Fatalf("%s %s via %s: %d %v", method, path, nd.id, status, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// runNemesis starts n nodes, runs the clients, applies steps (fault kinds
// of nemFault) one after the other, drains and checks; a leader pause
// lasts pause; maxFailover, if not zero, bounds every leader kill's
// failover.
func runNemesis(t *testing.T, n int, steps []string, pause, maxFailover time.Duration) {
	const (
		producers  = 4
		probes     = 2 // producers of single sends, paced, never held back
		consumers  = 2 // per subscription
		keysPerP   = 3
		topic      = "nemesis"
		maxBacklog = 2000
	)
	subs := []string{"plain", "ord"}
	budget := 60*time.Second + time.Duration(len(steps))*(15*time.Second+pause)
	ctx, cancel := context.WithTimeout(t.Context(), budget)
	defer cancel()
	c := newNemCluster(t, n)
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 26))
	c.setup(ctx, rng, "PUT", "/v1/topics/"+topic, map[string]any{"queues": 4})
	// Retries short and many, so that a message leased at a fault comes
	// back soon and never reaches the DLQ.
	for _, s := range subs {
		c.setup(ctx, rng, "PUT", "/v1/topics/"+topic+"/subscriptions/"+s, map[string]any{
			"orderly": s == "ord", "maxRetries": 32, "retryDelays": []string{"100ms"}, "startFrom": "earliest",
		})
	}
	rec := newNemRecorder(subs, "ord")
	var ackFailed, ackErrors, pullErrors atomic.Int64

	// Producers: singles and batches of 2–10, a dedupKey on every message,
	// half of them with a sharding key of the producer's own, one send in
	// twenty delayed by 1–3 s; each request retried until it gets a 201.
	// The probes send one message every 20 ms whatever the backlog, so
	// that a failover is seen when it ends, not when the backlog allows.
	prodCtx, stopProducers := context.WithCancel(ctx)
	defer stopProducers()
	var prodWG sync.WaitGroup
	for g := range producers + probes {
		probe := g >= producers
		prodWG.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), uint64(time.Now().UnixNano())))
			for seq := 0; prodCtx.Err() == nil; {
				if probe {
					select {
					case <-prodCtx.Done():
					case <-time.After(20 * time.Millisecond):
					}
				}
				for !probe && rec.backlog() > maxBacklog && prodCtx.Err() == nil {
					time.Sleep(5 * time.Millisecond)
				}
				kind := rng.IntN(20)
				count, batch := 1, false
				switch {
				case probe:
					kind = 1 // a single send, not delayed
				case kind >= 8:
					count, batch = 2+rng.IntN(9), true
				}
				now := time.Now()
				ms := make([]nemMsg, count)
				for i := range ms {
					m := nemMsg{body: fmt.Sprintf("p%d-s%07d", g, seq), producer: g, seq: seq, firstSent: now}
					m.dedupKey = "dk-" + m.body
					seq++
					switch {
					case kind == 0:
						m.delay = time.Duration(1+rng.IntN(3)) * time.Second
					case rng.IntN(2) == 0:
						m.key = fmt.Sprintf("p%d-k%d", g, rng.IntN(keysPerP))
					}
					ms[i] = m
				}
				rec.made(ms)
				// Only the budget cuts a request short: a producer that stops
				// finishes the one it has begun.
				if err := c.sendUntilAcked(ctx, rng, rec, topic, ms, batch, false); err != nil {
					if ctx.Err() == nil {
						t.Errorf("producer %d: %v", g, err)
					}
					return
				}
			}
		})
	}

	// Consumers: short long polls through random nodes, each pull recorded
	// before it is acked (through the node that answered it).
	consCtx, stopConsumers := context.WithCancel(ctx)
	defer stopConsumers()
	var consWG sync.WaitGroup
	for _, sub := range subs {
		for k := range consumers {
			consWG.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(k), uint64(time.Now().UnixNano())))
				pull := map[string]any{"maxMessages": 32, "waitSeconds": 1, "invisibleSeconds": 5, "consumerId": fmt.Sprintf("%s-c%d", sub, k)}
				path := "/v1/topics/" + topic + "/subscriptions/" + sub
				for errs := 0; consCtx.Err() == nil; {
					nd := c.nodes[rng.IntN(len(c.nodes))]
					var got struct {
						Messages []struct {
							MessageID, Body, ReceiptHandle string
							QueueID                        int
							Offset                         uint64
							DeliveryAttempt                int
						}
					}
					status, _, err := nemCall(consCtx, c.hc, "POST", nd.base+path+"/pull", pull, &got, nil)
					at := time.Now()
					if err != nil {
						if consCtx.Err() != nil {
							return
						}
						if !transientStatus(status, err) {
							t.Errorf("%s consumer %d: pull via %s: %d %v", sub, k, nd.id, status, err)
							return
						}
						pullErrors.Add(1)
						errs++
						select {
						case <-consCtx.Done():
						case <-time.After(min(10*time.Millisecond<<min(errs, 4), 100*time.Millisecond)):
						}
						continue
					}
					errs = 0
					if len(got.Messages) == 0 {
						continue
					}
					handles := make([]string, len(got.Messages))
					ds := make([]nemDelivery, len(got.Messages))
					for i, m := range got.Messages {
						handles[i] = m.ReceiptHandle
						ds[i] = nemDelivery{sub: sub, id: m.MessageID, body: m.Body, queue: m.QueueID, offset: m.Offset, attempt: m.DeliveryAttempt, at: at}
					}
					rec.deliveries(ds)
					var ack struct {
						Failed []struct{ ReceiptHandle, Code string }
					}
					status, _, err = nemCall(consCtx, c.hc, "POST", nd.base+path+"/ack", map[string]any{"receiptHandles": handles}, &ack, nil)
					switch {
					case err == nil:
						ackFailed.Add(int64(len(ack.Failed)))
					case consCtx.Err() != nil:
						return
					case transientStatus(status, err):
						ackErrors.Add(1) // not acked: it comes again
					default:
						t.Errorf("%s consumer %d: ack via %s: %d %v", sub, k, nd.id, status, err)
						return
					}
				}
			})
		}
	}
	defer func() { // on t.Fatal too: nothing outlives the test
		cancel()
		prodWG.Wait()
		consWG.Wait()
	}()

	// progress waits (bounded) until more sends than since were acknowledged.
	progress := func(what string, since int) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for rec.ackedCount() <= since {
			if time.Now().After(deadline) || ctx.Err() != nil {
				t.Fatalf("%s: no send acknowledged in 20 s (%d so far)", what, since)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	// resend sends again, one by one, a few messages first acknowledged
	// between from and to: each must get its first reply back.
	resend := func(from, to time.Time) {
		t.Helper()
		for _, m := range rec.ackedSince(rng, from, to, 5) {
			rctx, rcancel := context.WithTimeout(ctx, 20*time.Second)
			err := c.sendUntilAcked(rctx, rng, rec, topic, []nemMsg{m}, false, true)
			rcancel()
			if err != nil {
				t.Fatalf("re-sending %s: %v", m.body, err)
			}
		}
	}
	clock := func(t time.Time) string { return t.Format("15:04:05.000") }
	runStart := time.Now()
	progress("before the first fault", 0)
	for i, step := range steps {
		since := rec.ackedCount()
		time.Sleep(time.Second + time.Duration(rng.Int64N(int64(1500*time.Millisecond))))
		progress(fmt.Sprintf("before fault %d (%s)", i+1, step), since)
		f := nemFault{kind: step}
		switch step {
		case nemKillLeader:
			l := c.leader(ctx)
			f.nodes = []string{l.id}
			f.at = time.Now()
			c.kill(l)
			if len(c.nodes) > 1 {
				// Restart only after the others answered a send, so that
				// the failover measured is theirs alone.
				deadline := time.Now().Add(20 * time.Second)
				for !rec.acknowledgedAfter(f.at, f.nodes) {
					if time.Now().After(deadline) || ctx.Err() != nil {
						t.Fatalf("fault %d: no send acknowledged through a live node in 20 s after killing the leader %s", i+1, l.id)
					}
					time.Sleep(5 * time.Millisecond)
				}
			}
			f.end = time.Now()
			c.restart(l)
			resend(f.at.Add(-time.Minute), f.at)
		case nemStopLeader:
			l := c.leader(ctx)
			f.nodes = []string{l.id}
			f.at = time.Now()
			c.signal(l, syscall.SIGSTOP)
			time.Sleep(pause)
			f.end = time.Now()
			c.signal(l, syscall.SIGCONT)
		case nemKillFollower:
			l := c.leader(ctx)
			var fl *nemNode
			for _, nd := range c.nodes {
				if nd != l {
					fl = nd
					break
				}
			}
			f.nodes = []string{fl.id}
			f.at = time.Now()
			c.kill(fl)
			since := rec.ackedCount()
			time.Sleep(1500 * time.Millisecond)
			progress(fmt.Sprintf("fault %d: follower %s down", i+1, fl.id), since)
			f.end = time.Now()
			c.restart(fl)
		case nemKillTwo:
			l := c.leader(ctx)
			var fl *nemNode
			for _, nd := range c.nodes {
				if nd != l {
					fl = nd
					break
				}
			}
			f.nodes = []string{l.id, fl.id}
			c.kill(l)
			c.kill(fl)
			f.at = time.Now()
			// Twice the 5 s a request waits for a leader, and more: a
			// request begun at the outage gets its 503, and the retry
			// begun after it gets its own before the outage ends.
			time.Sleep(11 * time.Second)
			f.end = time.Now()
			c.restart(l)
			c.restart(fl)
		default:
			t.Fatalf("unknown fault %q", step)
		}
		rec.fault(f)
		t.Logf("fault %d: %s %v at %s (+%v), over at %s (%v)", i+1, f.kind, f.nodes, clock(f.at),
			f.at.Sub(runStart).Round(time.Millisecond), clock(f.end), f.end.Sub(f.at).Round(time.Millisecond))
	}
	since := rec.ackedCount()
	time.Sleep(time.Second)
	progress("after the last fault", since)
	stopProducers()
	prodWG.Wait()
	if t.Failed() {
		return
	}

	// Drain: every acknowledged message on every subscription (delayed ones
	// come due within 3 s).
	var (
		queues []nemQueue
		infos  map[string]nemSubInfo
		why    string
	)
	drainStart := time.Now()
	for {
		queues, infos, why = c.drainState(ctx, rng, topic, subs, rec)
		if why == "" || time.Since(drainStart) > 30*time.Second || ctx.Err() != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	drained := time.Since(drainStart)
	stopConsumers()
	consWG.Wait()
	if why != "" {
		t.Errorf("not drained after 30 s: %s", why)
	}
	rec.setQueues(queues)
	for s, si := range infos {
		if si.DLQ != 0 || si.Retrying != 0 {
			t.Errorf("%s after the drain: dlq %d, retrying %d; want 0 (maxRetries 32)", s, si.DLQ, si.Retrying)
		}
	}

	// Every send has ended by now: what each fault did to them.
	for i, f := range rec.history().faults {
		t.Logf("fault %d, %s %v: sends %s", i+1, f.kind, f.nodes, rec.answersDuring(f))
	}
	h := rec.history()
	st, problems := checkNemesis(h)
	for _, p := range problems {
		t.Error(p)
	}
	ds, fproblems := failoverTimes(h, nemKillLeader)
	for _, p := range fproblems {
		t.Error(p)
	}
	med, worst := medianMax(ds)
	round := func(ds []time.Duration) string {
		var each []string
		for _, d := range ds {
			each = append(each, d.Round(time.Millisecond).String())
		}
		return strings.Join(each, " ")
	}
	// After a pause the old leader may answer again once resumed: shown,
	// not bounded.
	paused, _ := failoverTimes(h, nemStopLeader)
	t.Logf("%d nodes, %v: %v; %d ack handles failed, %d ack and %d pull requests failed; drained in %v",
		n, time.Since(runStart).Round(time.Second), st, ackFailed.Load(), ackErrors.Load(), pullErrors.Load(), drained.Round(time.Millisecond))
	pausedNote := ""
	if len(paused) > 0 {
		pausedNote = fmt.Sprintf("; first 201 after each %v leader pause: [%s]", pause, round(paused))
	}
	t.Logf("failover after each leader kill: [%s]; median %v, max %v%s",
		round(ds), med.Round(time.Millisecond), worst.Round(time.Millisecond), pausedNote)
	if maxFailover > 0 && worst > maxFailover {
		t.Errorf("failover took %v at worst, want ≤ %v (SPEC §7.2)", worst.Round(time.Millisecond), maxFailover)
	}
}
