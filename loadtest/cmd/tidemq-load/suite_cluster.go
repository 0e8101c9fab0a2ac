package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tidemq/tidemq/loadtest"
)

// The cluster suite (-suite cluster): each scenario of the cluster's
// targets against a single broker process and against a fresh 3-node
// cluster of the same binary, in the same run and the same round, so
// that a change of load on a shared machine hits both sides alike. Each
// broker is a child process, so the CPU of every node and of the load
// generator is told apart from /proc. The cluster's clients are spread
// round-robin over the nodes' HTTP addresses, as behind a load balancer:
// two requests in three reach a follower and take the forwarding hop to
// the leader; the batch send runs once more with every client on the
// leader (@leader), which shows what that hop costs.

const (
	clusterSize = 3
	// clusterPrefix names a phase on the cluster, leaderSuffix the
	// variant whose clients all talk to the leader.
	clusterPrefix = "cluster3-"
	leaderSuffix  = "@leader"
	// The absolute end-to-end bounds on the cluster at 1,000 msg/s.
	clusterE2EP50 = 2 * time.Millisecond
	clusterE2EP99 = 10 * time.Millisecond
	// clusterWarmup is the suite's default warm-up: every phase runs on
	// fresh processes, and on this project's VM a fresh node spends its
	// first seconds under load touching memory for the first time (its
	// heap, memtables and block cache growing; ~10 µs of CPU a page
	// fault). With 1 s the cluster's batch and pull phases measured that
	// transient, three processes of it, more than the steady state
	// (docs/LOADTEST.md).
	clusterWarmup = 10 * time.Second
)

// The scenarios, each run on the single node and on the cluster.
const (
	clBatch  = "batch100-p16-1KiB"
	clPull   = "pull256-c4-1KiB"
	clSingle = "single-p64-1KiB"
	clE2E    = "e2e-r1000-p8-c4-1KiB"
)

// brokersResult is who served a phase of the cluster suite.
type brokersResult struct {
	Kind    string   `json:"kind"`    // single or cluster
	Clients string   `json:"clients"` // spread (round-robin over every node) or leader
	Nodes   []string `json:"nodes"`   // node ids, in the order of the phase's nodeCpuPerMsgNs
	Pids    []int    `json:"pids"`
	// Leader is the leader's id when the measured run began, LeaderAfter
	// when it had ended (they differ if leadership moved under the load);
	// LeaderFrom says how it was read: GET /v1/cluster, or the nodes' logs
	// where the binary has no cluster API.
	Leader      string `json:"leader"`
	LeaderAfter string `json:"leaderAfter"`
	LeaderFrom  string `json:"leaderFrom"`
	// Acked is the messages the measured run's sends were answered 2xx
	// for, Stored the message count of the run's topic read from the
	// leader after it (send phases only; Checked says they were read).
	Checked bool  `json:"checked,omitempty"`
	Acked   int64 `json:"acked,omitempty"`
	Stored  int64 `json:"stored,omitempty"`
}

// lost reports whether the leader holds fewer messages than the sends
// acknowledged.
func (b *brokersResult) lost() bool { return b != nil && b.Checked && b.Stored < b.Acked }

// clusterResult is the JSON output of -suite cluster.
type clusterResult struct {
	Command string   `json:"command"`
	Machine machine  `json:"machine"`
	Phases  []phase  `json:"phases"`
	Targets []target `json:"targets"`
}

// brokerSet is the broker processes of one phase: one single node, or
// the nodes of a cluster.
type brokerSet struct {
	cluster    bool
	ids        []string
	procs      []*brokerProc
	dir        string // their data and logs
	leader     int    // index of the leader in procs
	leaderFrom string
}

func (b *brokerSet) urls() []string {
	var u []string
	for _, p := range b.procs {
		u = append(u, p.URL)
	}
	return u
}

func (b *brokerSet) pids() []int {
	var ids []int
	for _, p := range b.procs {
		ids = append(ids, p.Pid())
	}
	return ids
}

// usage is each process's procUsage so far, in node order.
func (b *brokerSet) usage() []procUsage {
	var u []procUsage
	for _, p := range b.procs {
		u = append(u, p.usage())
	}
	return u
}

// stop stops every process (SIGTERM, together) and removes their data.
func (b *brokerSet) stop() error {
	errs := make([]error, len(b.procs))
	var wg sync.WaitGroup
	for i, p := range b.procs {
		wg.Go(func() {
			if _, err := p.terminate(30 * time.Second); err != nil {
				errs[i] = fmt.Errorf("stopping %s: %w", b.ids[i], err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errors.Join(errs...), os.RemoveAll(b.dir))
}

// kill kills every process at once (after a failed start).
func (b *brokerSet) kill() {
	for _, p := range b.procs {
		_ = p.kill()
	}
	_ = os.RemoveAll(b.dir)
}

// startSingle starts one broker process on a fresh data dir.
func (c *suite) startSingle(ctx context.Context) (*brokerSet, error) {
	dir, err := os.MkdirTemp(c.brokerWork, "single-")
	if err != nil {
		return nil, err
	}
	p, _, err := startBrokerProc(ctx, c.childBin, filepath.Join(dir, "data"), filepath.Join(dir, "broker.log"), time.Minute)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return &brokerSet{ids: []string{"node"}, procs: []*brokerProc{p}, dir: dir, leaderFrom: "single node"}, nil
}

// startCluster starts a fresh cluster and waits for its leader. The
// nodes' ports are picked here (every node must know the others'
// addresses before it starts), so another program may take one in
// between: a node that cannot listen exits, and the cluster is started
// again on new ports, at most three times.
func (c *suite) startCluster(ctx context.Context) (*brokerSet, error) {
	for attempt := 1; ; attempt++ {
		b, err := c.spawnCluster(ctx)
		if err == nil {
			return b, nil
		}
		if attempt == 3 || ctx.Err() != nil {
			return nil, err
		}
		c.logf("   starting the cluster failed (attempt %d; again on other ports): %v", attempt, err)
	}
}

func (c *suite) spawnCluster(ctx context.Context) (_ *brokerSet, err error) {
	dir, err := os.MkdirTemp(c.brokerWork, "cluster-")
	if err != nil {
		return nil, err
	}
	b := &brokerSet{cluster: true, dir: dir}
	defer func() {
		if err != nil {
			b.kill()
		}
	}()
	var httpAddrs, clusterAddrs, peers []string
	var held []net.Listener
	defer func() {
		for _, l := range held {
			_ = l.Close()
		}
	}()
	for i := range clusterSize {
		host := fmt.Sprintf("127.0.0.%d", i+1)
		for range 2 { // the HTTP and the cluster port, held open until all are picked
			l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
			if err != nil {
				return nil, fmt.Errorf("picking a port on %s: %w", host, err)
			}
			held = append(held, l)
		}
		id := fmt.Sprintf("n%d", i+1)
		b.ids = append(b.ids, id)
		httpAddrs = append(httpAddrs, held[2*i].Addr().String())
		clusterAddrs = append(clusterAddrs, held[2*i+1].Addr().String())
		peers = append(peers, id+"="+clusterAddrs[i])
	}
	for _, l := range held {
		_ = l.Close()
	}
	held = nil
	for i, id := range b.ids {
		args := []string{"--node-id", id, "--addr", httpAddrs[i], "--cluster-addr", clusterAddrs[i], "--peers", strings.Join(peers, ","),
			"--data", filepath.Join(dir, id), "--fsync", "always", "--log-level", "info"}
		p, err := spawnBrokerProc(c.childBin, filepath.Join(dir, id+".log"), args)
		if err != nil {
			return nil, err
		}
		b.procs = append(b.procs, p)
	}
	for i, p := range b.procs {
		if err := p.waitReady(ctx, time.Minute); err != nil {
			return nil, fmt.Errorf("%s: %w", b.ids[i], err)
		}
		if p.URL != "http://"+httpAddrs[i] {
			return nil, fmt.Errorf("%s listens on %s, not on %s as asked", b.ids[i], p.URL, httpAddrs[i])
		}
	}
	return b, b.waitLeader(ctx, 30*time.Second)
}

// waitLeader polls until every node agrees on a leader and sees every
// member alive (readLeader), at most timeout.
func (b *brokerSet) waitLeader(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		i, from, err := b.readLeader(ctx)
		if err == nil {
			b.leader, b.leaderFrom = i, from
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("no leader that every node agrees on after %v: %w", timeout, err)
		case <-tick.C:
		}
	}
}

// clusterView is the part of GET /v1/cluster the suite reads.
type clusterView struct {
	Groups []struct {
		Leader  string `json:"leader"`
		Members []struct {
			ID string `json:"id"`
		} `json:"members"`
	} `json:"groups"`
	Nodes []struct {
		ID    string `json:"id"`
		Alive bool   `json:"alive"`
	} `json:"nodes"`
}

// readLeader is the index of the cluster's leader: the one every node's
// GET /v1/cluster names, each listing every member and every node alive.
// A binary without that API (404) is read from the nodes' logs instead:
// the leader is the node whose latest "leading the group" line has the
// highest term and was not followed by its "no longer leading" line,
// and every node is alive when its /readyz answers 200 (a follower's
// does once it has heard from a leader).
func (b *brokerSet) readLeader(ctx context.Context) (idx int, from string, err error) {
	if !b.cluster {
		return 0, "single node", nil
	}
	hc := &http.Client{Timeout: 2 * time.Second}
	defer hc.CloseIdleConnections()
	var leader string
	for i, p := range b.procs {
		var v clusterView
		status, err := getJSON(ctx, hc, p.URL+"/v1/cluster", &v)
		if status == http.StatusNotFound {
			return b.leaderFromLogs(ctx, hc)
		}
		if err != nil {
			return 0, "", fmt.Errorf("%s: GET /v1/cluster: %w", b.ids[i], err)
		}
		if len(v.Groups) == 0 || v.Groups[0].Leader == "" {
			return 0, "", fmt.Errorf("%s: no leader yet", b.ids[i])
		}
		g := v.Groups[0]
		if len(g.Members) != len(b.procs) {
			return 0, "", fmt.Errorf("%s: %d members, want %d", b.ids[i], len(g.Members), len(b.procs))
		}
		for _, n := range v.Nodes {
			if !n.Alive {
				return 0, "", fmt.Errorf("%s: node %s not alive", b.ids[i], n.ID)
			}
		}
		if leader != "" && g.Leader != leader {
			return 0, "", fmt.Errorf("%s names leader %s, another node %s", b.ids[i], g.Leader, leader)
		}
		leader = g.Leader
	}
	idx = slices.Index(b.ids, leader)
	if idx < 0 {
		return 0, "", fmt.Errorf("the leader %q is none of the nodes %v", leader, b.ids)
	}
	return idx, "GET /v1/cluster", nil
}

func (b *brokerSet) leaderFromLogs(ctx context.Context, hc *http.Client) (int, string, error) {
	for i, p := range b.procs {
		if status, err := getJSON(ctx, hc, p.URL+"/readyz", nil); err != nil || status != http.StatusOK {
			return 0, "", fmt.Errorf("%s: /readyz %d: %v", b.ids[i], status, err)
		}
	}
	best, bestTerm := -1, int64(-1)
	for i, p := range b.procs {
		leading, term := lastLeadership(p.logPath, p.logStart)
		if leading && term > bestTerm {
			best, bestTerm = i, term
		}
	}
	if best < 0 {
		return 0, "", errors.New("no node's log says it leads")
	}
	return best, "the nodes' logs", nil
}

// lastLeadership reads the broker log at path from offset on: whether
// its last leadership line says it leads, and that line's term.
func lastLeadership(path string, offset int64) (leading bool, term int64) {
	f, err := os.Open(path)
	if err != nil {
		return false, 0
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return false, 0
	}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		var now bool
		switch {
		case strings.Contains(line, `msg="leading the group"`):
			now = true
		case strings.Contains(line, `msg="no longer leading the group"`):
		default:
			continue
		}
		leading, term = now, 0
		if _, v, ok := strings.Cut(line, " term="); ok {
			v, _, _ = strings.Cut(v, " ")
			term, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	return leading, term
}

// getJSON GETs url and decodes a 2xx reply into out (when not nil),
// returning the status.
func getJSON(ctx context.Context, hc *http.Client, url string, out any) (int, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return resp.StatusCode, err
	}
	if resp.StatusCode/100 != 2 {
		return resp.StatusCode, fmt.Errorf("status %d: %s", resp.StatusCode, strings.TrimSpace(string(body)))
	}
	if out != nil {
		if err := json.Unmarshal(body, out); err != nil {
			return resp.StatusCode, err
		}
	}
	return resp.StatusCode, nil
}

// clusterVariant is where a phase's clients go.
type clusterVariant struct {
	cluster, onLeader bool
}

func (v clusterVariant) name(base string) string {
	switch {
	case v.onLeader:
		return clusterPrefix + base + leaderSuffix
	case v.cluster:
		return clusterPrefix + base
	}
	return base
}

// onBrokers runs f on fresh brokers of variant v: f gets the URL setup
// requests go to (and, on the single node or with onLeader, every
// client), c.spread and c.brokerUsage are set for it, and the phase f
// appended to c.phases is told who served it.
func (c *suite) onBrokers(ctx context.Context, name string, v clusterVariant, f func(b *brokerSet, url string, res *brokersResult) error) (p phase, err error) {
	var b *brokerSet
	if v.cluster {
		b, err = c.startCluster(ctx)
	} else {
		b, err = c.startSingle(ctx)
	}
	if err != nil {
		return p, fmt.Errorf("%s: %w", name, err)
	}
	defer func() {
		if serr := b.stop(); serr != nil {
			err = errors.Join(err, fmt.Errorf("%s: %w", name, serr))
		}
	}()
	url := b.procs[0].URL
	switch {
	case v.onLeader:
		url = b.procs[b.leader].URL
	case v.cluster:
		c.spread = b.urls()
	}
	c.brokerUsage = b.usage
	defer func() { c.spread, c.brokerUsage = nil, nil }()
	res := &brokersResult{Kind: "single", Clients: "one node", Nodes: b.ids, Pids: b.pids(), Leader: b.ids[b.leader], LeaderFrom: b.leaderFrom}
	if v.cluster {
		res.Kind, res.Clients = "cluster", fmt.Sprintf("spread over %d nodes", len(b.procs))
		if v.onLeader {
			res.Clients = "all on the leader"
		}
	}
	c.logf("   brokers: %s (%s), leader %s, clients %s", res.Kind, strings.Join(b.urls(), " "), res.Leader, res.Clients)
	n := len(c.phases)
	if err := f(b, url, res); err != nil {
		return p, err
	}
	if len(c.phases) != n+1 || c.phases[n].Name != name {
		return p, fmt.Errorf("%s: the phase was not recorded", name)
	}
	res.LeaderAfter = res.Leader
	if i, _, err := b.readLeader(ctx); err == nil {
		res.LeaderAfter = b.ids[i]
	} else {
		res.LeaderAfter = "none (" + err.Error() + ")"
	}
	c.phases[n].Brokers = res
	return c.phases[n], nil
}

// clusterSendPhase runs sc (sends, maybe consumers) on brokers of
// variant v: a warm-up on a topic of its own, then the measured run on a
// fresh named topic whose message count is read from the leader after
// it, to check that every acknowledged send is stored there.
func (c *suite) clusterSendPhase(ctx context.Context, name string, v clusterVariant, sc loadtest.Scenario) (phase, error) {
	return c.onBrokers(ctx, name, v, func(b *brokerSet, url string, res *brokersResult) error {
		hc := loadtest.NewClient(sc.Producers.Count+2*sc.Consumers.Count+4, c.gzip)
		defer hc.CloseIdleConnections()
		if c.warmup > 0 {
			w := sc
			w.URL, w.URLs, w.Token, w.Client, w.Duration, w.Messages = url, c.spread, c.token, hc, c.warmup, 0
			if _, err := runLabeled(ctx, w); err != nil {
				return fmt.Errorf("%s warm-up: %w", name, err)
			}
		}
		topic := fmt.Sprintf("loadtest-cl-%08x", rand.Uint32())
		sc.Topic = topic
		warmup := c.warmup
		c.warmup = 0 // done above, on another topic
		p, err := c.httpPhase(ctx, name, "broker", url, sc)
		c.warmup = warmup
		if err != nil {
			return err
		}
		leader := b.leader
		if i, _, err := b.readLeader(ctx); err == nil {
			leader = i
		}
		admin := loadtest.Admin{URL: b.procs[leader].URL, Token: c.token, Client: hc}
		st, err := admin.Topic(ctx, topic)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		res.Checked, res.Acked, res.Stored = true, p.Report.Sent, st.Messages
		if res.lost() {
			c.logf("   the leader holds %d messages of %d acknowledged", res.Stored, res.Acked)
		}
		return admin.DeleteTopic(ctx, topic)
	})
}

// runCluster runs every phase c.rounds times, single node and cluster
// alternating which goes first, and checks the targets on the median of
// the rounds' ratios.
func (c *suite) runCluster(ctx context.Context) ([]target, error) {
	kind := loadtest.ClientLean
	if len(c.clients) > 0 {
		kind = c.clients[0]
	}
	scenario := func(producers, batch int) loadtest.Scenario {
		sc := sends(producers, batch, 1024)
		sc.ClientKind = kind
		return sc
	}
	e2e := scenario(8, 1)
	e2e.Producers.Rate = 1000
	e2e.Consumers = loadtest.Consumers{Count: 4, MaxMessages: 32, WaitSeconds: 5}
	node, spread, onLeader := clusterVariant{}, clusterVariant{cluster: true}, clusterVariant{cluster: true, onLeader: true}
	rounds := max(c.rounds, 1)
	got := make([]map[string]phase, rounds)
	for r := range rounds {
		c.round = r
		got[r] = map[string]phase{}
		order := func(vs ...clusterVariant) []clusterVariant {
			if r%2 == 1 {
				slices.Reverse(vs)
			}
			return vs
		}
		run := func(name string, f func() (phase, error)) error {
			p, err := f()
			if err == nil {
				got[r][name] = p
			}
			return err
		}
		for _, v := range order(node, spread, onLeader) {
			name := v.name(clBatch)
			if err := run(name, func() (phase, error) { return c.clusterSendPhase(ctx, name, v, scenario(16, 100)) }); err != nil {
				return nil, err
			}
		}
		for _, v := range order(node, spread) {
			name := v.name(clPull)
			// 1.5 times what this side's batch phase sent, as in the
			// target suite: consumers up to 1.5 times faster than the
			// sends still have work for the whole phase.
			rate := got[r][v.name(clBatch)].MsgsPerSec
			fill := int64(1.5*rate*(c.warmup+c.duration).Seconds()/100+1) * 100
			fill = min(max(fill, 10_000), 5_000_000)
			err := run(name, func() (phase, error) {
				return c.onBrokers(ctx, name, v, func(_ *brokerSet, url string, _ *brokersResult) error {
					_, err := c.pullFrom(ctx, name, kind, url, fill, 1024, loadtest.Consumers{Count: 4, MaxMessages: 256, WaitSeconds: 1})
					return err
				})
			})
			if err != nil {
				return nil, err
			}
		}
		for _, v := range order(node, spread) {
			name := v.name(clSingle)
			if err := run(name, func() (phase, error) { return c.clusterSendPhase(ctx, name, v, scenario(64, 1)) }); err != nil {
				return nil, err
			}
		}
		for _, v := range order(node, spread) {
			name := v.name(clE2E)
			if err := run(name, func() (phase, error) { return c.clusterSendPhase(ctx, name, v, e2e) }); err != nil {
				return nil, err
			}
		}
	}
	return clusterTargets(got), nil
}

// clusterTargets checks the targets on the rounds' phases: the
// cluster's rates against the single node's of the same round, and the
// cluster's end-to-end latency against absolute bounds.
func clusterTargets(got []map[string]phase) []target {
	var targets []target
	add := func(name, want string, pass func(float64) bool, one func(g map[string]phase) (ratio float64, measured, baseline string, bad bool)) {
		targets = append(targets, medianTarget(name, want, got, pass, one))
	}
	throughput := func(name string, want float64, base, unit string) {
		add(name, fmt.Sprintf("≥ %.0f%% of the single node", want*100), func(r float64) bool { return r >= want },
			func(g map[string]phase) (float64, string, string, bool) {
				m, b := g[clusterPrefix+base], g[base]
				return m.MsgsPerSec / b.MsgsPerSec, fmt.Sprintf("%s %s", thousands(m.MsgsPerSec), unit),
					fmt.Sprintf("%s %s (%s)", thousands(b.MsgsPerSec), unit, b.Name), len(m.Errors) > 0 || m.Brokers.lost()
			})
	}
	throughput("cluster: batch send, 100 msgs/request, 16 producers, 1 KiB", 0.4, clBatch, "msg/s")
	throughput("cluster: single send, 64 producers, 1 KiB", 0.6, clSingle, "msg/s")
	throughput("cluster: pull 256 + ack, 4 consumers, against a backlog, 1 KiB", 0.6, clPull, "msg/s acked")
	add("cluster: end to end (send → long-poll delivery), 1,000 msg/s open loop, 1 KiB: p50, p99",
		fmt.Sprintf("p50 ≤ %s, p99 ≤ %s", clusterE2EP50, clusterE2EP99), func(r float64) bool { return r <= 1 },
		func(g map[string]phase) (float64, string, string, bool) {
			p, single := g[clusterPrefix+clE2E], g[clE2E]
			var rep, srep loadtest.Report
			if p.Report != nil {
				rep = *p.Report
			}
			if single.Report != nil {
				srep = *single.Report
			}
			l := rep.EndToEnd
			ratio := max(float64(l.P50)/float64(clusterE2EP50), float64(l.P99)/float64(clusterE2EP99))
			bad := len(p.Errors) > 0 || rep.Pull.ErrorCount()+rep.Ack.ErrorCount() > 0 || rep.Missed > 0 || rep.Delivered < rep.Sent || rep.Sent == 0 || p.Brokers.lost()
			return ratio, fmt.Sprintf("p50 %s, p99 %s (p99.9 %s; %d delivered of %d sent, %d missed)", dur(l.P50), dur(l.P99), dur(l.P999), rep.Delivered, rep.Sent, rep.Missed),
				fmt.Sprintf("single node: p50 %s, p99 %s", dur(srep.EndToEnd.P50), dur(srep.EndToEnd.P99)), bad
		})
	return targets
}

// runClusterSuite runs -suite cluster and writes its report (also, as far
// as it goes, when the suite failed).
func runClusterSuite(ctx context.Context, c config, log *slog.Logger, progress, stdout io.Writer) error {
	bin, work, err := childBrokers(ctx, c.dir, c.brokerBin)
	if work != "" {
		defer os.RemoveAll(work)
	}
	if err != nil {
		return err
	}
	s := &suite{token: c.token, dir: c.dir, log: log, warmup: c.warmup, duration: c.sc.Duration, progress: progress, rounds: c.rounds,
		gzip: c.gzip, clients: c.clients, childBin: bin, brokerBin: bin, brokerWork: work}
	res := clusterResult{Command: strings.Join(append([]string{"tidemq-load"}, os.Args[1:]...), " ")}
	res.Machine = describeMachine(c.dir)
	targets, err := s.runCluster(ctx)
	res.Machine.LoadAfter = loadAverage()
	res.Machine.Took = time.Since(res.Machine.Start)
	res.Phases, res.Targets = s.phases, targets
	if c.plotOut != "" {
		var b strings.Builder
		if werr := res.writeMarkdown(&b); werr != nil {
			err = errors.Join(err, werr)
		} else if werr := os.WriteFile(c.plotOut, []byte(b.String()), 0o644); werr != nil {
			err = errors.Join(err, fmt.Errorf("-o: %w", werr))
		}
	}
	return errors.Join(err, writeReports(stdout, c, res, res.writeMarkdown))
}

// writeMarkdown renders the cluster suite's result.
func (r clusterResult) writeMarkdown(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "## tidemq load test: a %d-node cluster beside the single node\n\n`%s`\n\n", clusterSize, r.Command)
	m := r.Machine
	b.WriteString(m.header())
	fmt.Fprintf(&b, "- data: %s, fsync always; every broker a child process of the same binary, each phase on fresh ones; "+
		"cluster node i on 127.0.0.i, clients round-robin over the nodes (`@leader`: every client on the leader)\n", m.DataDir)
	var from []string
	for _, p := range r.Phases {
		if p.Brokers != nil && p.Brokers.Kind == "cluster" && !slices.Contains(from, p.Brokers.LeaderFrom) {
			from = append(from, p.Brokers.LeaderFrom)
		}
	}
	if len(from) > 0 {
		fmt.Fprintf(&b, "- the cluster's leader read from: %s\n", strings.Join(from, ", "))
	}
	fmt.Fprintf(&b, "- started %s, took %s\n\n", m.Start.Format(time.RFC3339), m.Took.Round(time.Second))
	b.WriteString("| target | measured | baseline | ratio | want | result | ratio per round |\n|---|---:|---|---:|---|---|---|\n")
	for _, t := range r.Targets {
		var rounds []string
		for _, x := range t.Rounds {
			rounds = append(rounds, fmt.Sprintf("%.0f%%", x*100))
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %.0f%% | %s | **%s** | %s |\n", t.Name, t.Measured, t.Baseline, t.Ratio*100, t.Want, t.result(), strings.Join(rounds, ", "))
	}
	b.WriteString("\nThroughput ratios are the cluster's msg/s over the single node's in the same round; the end-to-end ratio is the larger of p50 / 2 ms and p99 / 10 ms (≤ 100% passes). " +
		"A target fails whatever its ratio if any request failed, or (end to end) a send was missed or a message not delivered, or the leader held fewer messages than were acknowledged.\n")
	for _, g := range phasesByRound(r.Phases) {
		leader, spread, single := g[clusterPrefix+clBatch+leaderSuffix], g[clusterPrefix+clBatch], g[clBatch]
		if leader.MsgsPerSec > 0 && spread.MsgsPerSec > 0 && single.MsgsPerSec > 0 {
			fmt.Fprintf(&b, "\nRound %d, the forwarding hop: batch send with every client on the leader %s msg/s (%.0f%% of the single node), spread over the nodes %s msg/s (%.0f%%); "+
				"cluster CPU/msg (every node and the client) %s on the leader, %s spread.\n", leader.Round, thousands(leader.MsgsPerSec), 100*leader.MsgsPerSec/single.MsgsPerSec,
				thousands(spread.MsgsPerSec), 100*spread.MsgsPerSec/single.MsgsPerSec, dur(leader.CPUPerMsg), dur(spread.CPUPerMsg))
		}
	}
	b.WriteString("\n### Phases\n\n| phase | round | brokers | clients | msg/s | p50 | p99 | end to end p50 | p99 | errors | leader (after) | stored / acked |\n" +
		"|---|---:|---|---|---:|---:|---:|---:|---:|---|---|---|\n")
	for _, p := range r.Phases {
		br := p.Brokers
		if br == nil {
			br = &brokersResult{}
		}
		e2e50, e2e99 := "", ""
		if p.Report != nil && p.Report.Scenario.Producers.Count > 0 && p.Report.Scenario.Consumers.Count > 0 {
			e2e50, e2e99 = dur(p.Report.EndToEnd.P50), dur(p.Report.EndToEnd.P99)
		}
		leader := br.Leader
		if br.LeaderAfter != br.Leader {
			leader += " (" + br.LeaderAfter + ")"
		}
		stored := ""
		if br.Checked {
			stored = fmt.Sprintf("%d / %d", br.Stored, br.Acked)
			switch {
			case br.lost():
				stored += " **lost**"
			case br.Stored > br.Acked:
				stored += fmt.Sprintf(" (%d answered with an error, stored all the same)", br.Stored-br.Acked)
			}
		}
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", p.Name, p.Round, br.Kind, br.Clients, thousands(p.MsgsPerSec),
			dur(p.Latency.P50), dur(p.Latency.P99), e2e50, e2e99, errorsCell(p.Errors), leader, stored)
	}
	b.WriteString("\nLatency is per send request (per batch for batch sends) and, for the pull phases, per pull that returned messages (msg/s is messages acked). " +
		"End to end is a message's (scheduled) send time to the pull reply that delivered it. Stored is the message count of the measured run's topic read from the leader after it: " +
		"fewer than acknowledged is a loss; more is sends answered with an error (a 503 no_leader, say) whose raft entry committed all the same, which a client retrying would store twice (at least once).\n")
	b.WriteString("\n### Where the CPU goes\n\n" +
		"Each broker's CPU time (user+system, /proc/<pid>/stat) and the load tester's (load generator and the stand-in OTLP collector) over the measured run, per message; " +
		"cores ≈ CPU/msg × msg/s. The machine's CPUs are shared by all of them. " +
		"Page faults are each broker's minor faults a second (/proc/<pid>/stat): first touches of memory, which a fresh process makes while its heap, memtables and caches grow; " +
		"on a VM each can cost ~10 µs of CPU (docs/LOADTEST.md, warm-up).\n\n" +
		"| phase | round | msg/s | leader CPU/msg | followers CPU/msg | client CPU/msg | total CPU/msg | cores: leader, followers, client | page faults/s: leader, followers |\n|---|---:|---:|---:|---:|---:|---:|---|---|\n")
	for _, p := range r.Phases {
		br := p.Brokers
		if br == nil || len(p.NodeCPUPerMsg) != len(br.Nodes) || len(br.Nodes) == 0 {
			continue
		}
		li := max(slices.Index(br.Nodes, br.Leader), 0)
		var followers []string
		var fsum time.Duration
		for i, d := range p.NodeCPUPerMsg {
			if i != li {
				followers = append(followers, br.Nodes[i]+" "+dur(d))
				fsum += d
			}
		}
		rate := p.MsgsPerSec
		cores := func(d time.Duration) string { return fmt.Sprintf("%.2f", d.Seconds()*rate) }
		fcell, fcores := "—", "—"
		if len(followers) > 0 {
			fcell, fcores = strings.Join(followers, ", "), cores(fsum)
		}
		fmt.Fprintf(&b, "| %s | %d | %s | %s %s | %s | %s | %s | %s, %s, %s | %s |\n", p.Name, p.Round, thousands(rate), br.Nodes[li], dur(p.NodeCPUPerMsg[li]), fcell,
			dur(p.ClientCPUPerMsg), dur(p.CPUPerMsg), cores(p.NodeCPUPerMsg[li]), fcores, cores(p.ClientCPUPerMsg), faultsCell(p.NodeFaultsPerSec, li))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// faultsCell renders page faults a second, the leader's (node li) first,
// then the followers' ("—" when they were not read).
func faultsCell(perSec []float64, li int) string {
	if li >= len(perSec) {
		return "—"
	}
	cells := []string{thousands(perSec[li])}
	var followers []string
	for i, f := range perSec {
		if i != li {
			followers = append(followers, thousands(f))
		}
	}
	if len(followers) > 0 {
		cells = append(cells, strings.Join(followers, ", "))
	}
	return strings.Join(cells, "; ")
}

// phasesByRound groups phases by round, by name.
func phasesByRound(ps []phase) []map[string]phase {
	var g []map[string]phase
	for _, p := range ps {
		for len(g) < p.Round {
			g = append(g, map[string]phase{})
		}
		if p.Round > 0 {
			g[p.Round-1][p.Name] = p
		}
	}
	return g
}
