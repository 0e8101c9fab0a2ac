package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestClusterSuite runs -suite cluster at a tiny scale on real broker
// processes (./cmd/tidemq built once): every phase ran on the brokers it
// names with nonzero rates and no errors, the cluster's phases on three
// nodes whose CPU adds up to the server's, spread over the three
// loopback addresses (or all on the leader), every acknowledged send is
// in the leader's count of the topic, every target has its round, the
// markdown went to stdout and -o alike, and no broker or work dir is left.
func TestClusterSuite(t *testing.T) {
	dir := t.TempDir()
	jsonPath, mdPath := filepath.Join(dir, "cluster.json"), filepath.Join(dir, "cluster.md")
	c, err := parseFlags([]string{"-suite", "cluster", "-dir", dir, "-json", jsonPath, "-o", mdPath, "-quiet", "-tracing=false",
		"-warmup", "200ms", "-duration", "700ms"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	if err := run(ctx, c, &stdout, &stderr); err != nil {
		t.Fatalf("run: %v\nstderr:\n%s", err, stderr.String())
	}
	raw, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var res clusterResult
	if err := json.Unmarshal(raw, &res); err != nil {
		t.Fatal(err)
	}

	var want []string
	for _, base := range []string{clBatch, clPull, clSingle, clE2E} {
		want = append(want, base, clusterPrefix+base)
	}
	want = append(want, clusterPrefix+clBatch+leaderSuffix)
	got := map[string]phase{}
	var pids []int
	for _, p := range res.Phases {
		got[p.Name] = p
		if p.Brokers != nil {
			pids = append(pids, p.Brokers.Pids...)
		}
	}
	for _, name := range want {
		p, ok := got[name]
		if !ok {
			t.Errorf("no phase %s", name)
			continue
		}
		br := p.Brokers
		if p.MsgsPerSec <= 0 || br == nil || p.Report == nil {
			t.Errorf("%s: %g msg/s, brokers %+v", name, p.MsgsPerSec, br)
			continue
		}
		// A cluster starved of CPU may answer no_leader for a while (a
		// raft apply that failed, an election); nothing else may fail.
		var failed int64
		for code, n := range p.Errors { // "no_leader", or "pull no_leader" in a pull phase
			if _, c, _ := strings.Cut(code, " "); c != "" {
				code = c
			}
			if code != "no_leader" || !strings.HasPrefix(name, clusterPrefix) {
				t.Errorf("%s: errors %v", name, p.Errors)
			}
			failed += n
		}
		if failed > 0 {
			t.Logf("%s: errors %v (the machine is busy)", name, p.Errors)
		}
		cluster := strings.HasPrefix(name, clusterPrefix)
		nodes := 1
		if cluster {
			nodes = clusterSize
		}
		if len(br.Nodes) != nodes || len(br.Pids) != nodes || !slices.Contains(br.Nodes, br.Leader) || (br.Kind == "cluster") != cluster {
			t.Errorf("%s: brokers %+v, want %d nodes", name, br, nodes)
		}
		var sum time.Duration
		for _, d := range p.NodeCPUPerMsg {
			sum += d
		}
		if len(p.NodeCPUPerMsg) != nodes || sum <= 0 || p.ClientCPUPerMsg <= 0 || sum-p.ServerCPUPerMsg > time.Duration(nodes) || p.ServerCPUPerMsg-sum > time.Duration(nodes) {
			t.Errorf("%s: node CPU/msg %v (sum %v), server %v, client %v", name, p.NodeCPUPerMsg, sum, p.ServerCPUPerMsg, p.ClientCPUPerMsg)
		}
		// Fresh processes that moved messages touched new memory.
		if len(p.NodeFaultsPerSec) != nodes || slices.Min(p.NodeFaultsPerSec) <= 0 {
			t.Errorf("%s: page faults a second %v, want %d above 0", name, p.NodeFaultsPerSec, nodes)
		}
		if cluster {
			wantURLs := 0
			if br.Clients == "all on the leader" {
				if !strings.HasSuffix(name, leaderSuffix) {
					t.Errorf("%s: clients %s", name, br.Clients)
				}
			} else {
				wantURLs = clusterSize
			}
			urls := p.Report.Scenario.URLs
			if len(urls) != wantURLs {
				t.Errorf("%s: clients went to %v, want %d URLs", name, urls, wantURLs)
			}
			for i, u := range urls {
				if pu, err := url.Parse(u); err != nil || pu.Hostname() != fmt.Sprintf("127.0.0.%d", i+1) {
					t.Errorf("%s: URL %d is %s, want node %d's on 127.0.0.%d", name, i, u, i+1, i+1)
				}
			}
		}
		if !strings.HasPrefix(strings.TrimPrefix(name, clusterPrefix), "pull") {
			// Every acknowledged send is stored; beyond them at most the
			// messages of sends that failed (their entries may have
			// committed all the same).
			batch := int64(max(p.Report.Scenario.Producers.Batch, 1))
			if !br.Checked || br.Acked <= 0 || br.Stored < br.Acked || br.Stored > br.Acked+failed*batch || br.Acked != p.Report.Sent {
				t.Errorf("%s: the leader stores %d of %d acknowledged, %d failed (checked %v, the run sent %d)", name, br.Stored, br.Acked, failed, br.Checked, p.Report.Sent)
			}
		}
	}
	if e := got[clusterPrefix+clE2E].Report; e == nil || e.Sent == 0 || e.Delivered != e.Sent {
		t.Errorf("cluster end to end: %+v", e)
	}
	if len(res.Targets) != 4 {
		t.Errorf("targets %+v, want 4", res.Targets)
	}
	for _, tg := range res.Targets {
		if len(tg.Rounds) != 1 || tg.Ratio <= 0 {
			t.Errorf("target %s: ratio %g, rounds %v", tg.Name, tg.Ratio, tg.Rounds)
		}
	}
	md, err := os.ReadFile(mdPath)
	if err != nil {
		t.Fatal(err)
	}
	if string(md) != stdout.String() {
		t.Errorf("-o differs from stdout")
	}
	if res.Machine.PageFault <= 0 || res.Machine.PageFault > 10*time.Millisecond {
		t.Errorf("a page fault measured as %v", res.Machine.PageFault)
	}
	wantMD := []string{"### Where the CPU goes", "the forwarding hop", "| cluster: batch send", "; a page fault " + res.Machine.PageFault.Round(100*time.Nanosecond).String()}
	for _, name := range want {
		wantMD = append(wantMD, "| "+name+" | 1 |")
	}
	for _, s := range wantMD {
		if !strings.Contains(stdout.String(), s) {
			t.Errorf("markdown lacks %q:\n%s", s, stdout.String())
		}
	}
	checkNoBroker(t, pids)
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "tidemq-load-brokers-") {
			t.Errorf("%s left behind", e.Name())
		}
	}
}

// TestClusterLeaderFromView reads the leader from GET /v1/cluster as the
// API documents it: every node must name the same leader and see every
// node alive; one that sees a node dead, or names another leader, is not
// yet a cluster to measure.
func TestClusterLeaderFromView(t *testing.T) {
	view := func(leader string, alive ...bool) string {
		var nodes []string
		for i, a := range alive {
			nodes = append(nodes, fmt.Sprintf(`{"id":"n%d","httpAddr":"x","alive":%v}`, i+1, a))
		}
		return fmt.Sprintf(`{"node":"n1","groups":[{"id":"g1","leader":%q,"term":3,"members":[{"id":"n1"},{"id":"n2"},{"id":"n3"}]}],"nodes":[%s]}`,
			leader, strings.Join(nodes, ","))
	}
	serve := func(body string) string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/v1/cluster" {
				http.NotFound(w, r)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(body))
		}))
		t.Cleanup(srv.Close)
		return srv.URL
	}
	set := func(bodies ...string) *brokerSet {
		b := &brokerSet{cluster: true, ids: []string{"n1", "n2", "n3"}}
		for _, body := range bodies {
			b.procs = append(b.procs, &brokerProc{URL: serve(body)})
		}
		return b
	}
	ok := view("n2", true, true, true)
	if i, from, err := set(ok, ok, ok).readLeader(t.Context()); err != nil || i != 1 || from != "GET /v1/cluster" {
		t.Errorf("agreed on n2: leader %d from %q, %v", i, from, err)
	}
	for name, b := range map[string]*brokerSet{
		"a node dead":      set(ok, view("n2", true, true, false), ok),
		"two leaders":      set(ok, view("n3", true, true, true), ok),
		"no leader yet":    set(view("", true, true, true), ok, ok),
		"an unknown node":  set(view("n9", true, true, true), view("n9", true, true, true), view("n9", true, true, true)),
		"a node not there": {cluster: true, ids: []string{"n1", "n2", "n3"}, procs: []*brokerProc{{URL: serve(ok)}, {URL: serve(ok)}, {URL: "http://127.0.0.1:1"}}},
	} {
		if i, _, err := b.readLeader(t.Context()); err == nil {
			t.Errorf("%s: leader %d, want an error", name, i)
		}
	}
}

// TestLastLeadership reads a node's leadership from its log as the
// cluster writes it: the last leadership line counts, with its term.
func TestLastLeadership(t *testing.T) {
	path := filepath.Join(t.TempDir(), "n1.log")
	old := "time=… level=INFO msg=\"leading the group\" component=cluster node=n1 group=g1 term=9\n=== tidemq-load restart\n"
	lines := old + strings.Join([]string{
		`time=… level=INFO msg="tidemq listening" addr=127.0.0.1:1`,
		`time=… level=INFO msg="leading the group" component=cluster node=n1 group=g1 term=2`,
		`time=… level=INFO msg="no longer leading the group" component=cluster node=n1 group=g1 term=2`,
		`time=… level=INFO msg="leading the group" component=cluster node=n1 group=g1 term=4`,
	}, "\n") + "\n"
	if err := os.WriteFile(path, []byte(lines), 0o644); err != nil {
		t.Fatal(err)
	}
	if leading, term := lastLeadership(path, int64(len(old))); !leading || term != 4 {
		t.Errorf("leading %v in term %d, want true in 4", leading, term)
	}
	stepped := lines + `time=… level=INFO msg="no longer leading the group" component=cluster node=n1 group=g1 term=4` + "\n"
	if err := os.WriteFile(path, []byte(stepped), 0o644); err != nil {
		t.Fatal(err)
	}
	if leading, _ := lastLeadership(path, int64(len(old))); leading {
		t.Error("leading after stepping down")
	}
	if err := os.WriteFile(path, []byte(old), 0o644); err != nil {
		t.Fatal(err)
	}
	if leading, _ := lastLeadership(path, int64(len(old))); leading {
		t.Error("an earlier run's line counted")
	}
}

// TestClusterFlags: -suite cluster starts its own brokers, so it takes
// none of -url, -inprocess and -broker-process; -o goes with it (and
// -plot-curve) only.
func TestClusterFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-suite", "cluster", "-inprocess"},
		{"-suite", "cluster", "-url", "http://127.0.0.1:1"},
		{"-suite", "cluster", "-broker-process"},
		{"-suite", "cluster", "-client", "lean,plain"},
		{"-suite", "cluster", "-phases", "batch"},
		{"-suite", "targets", "-inprocess", "-o", "x.md"},
	} {
		if _, err := parseFlags(args); err == nil {
			t.Errorf("%v: accepted", args)
		}
	}
	c, err := parseFlags([]string{"-suite", "cluster", "-rounds", "3", "-o", "x.md", "-broker-bin", "/bin/true"})
	if err != nil || c.sc.Duration != 5*time.Second || c.rounds != 3 || c.warmup != clusterWarmup {
		t.Errorf("-suite cluster -rounds 3: %v, duration %v, warm-up %v", err, c.sc.Duration, c.warmup)
	}
	if c, err := parseFlags([]string{"-suite", "cluster", "-warmup", "2s", "-o", "x.md", "-broker-bin", "/bin/true"}); err != nil || c.warmup != 2*time.Second {
		t.Errorf("-suite cluster -warmup 2s: %v, warm-up %v", err, c.warmup)
	}
}
