package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tidemq/tidemq/gateway"
)

// memberTopic is the topic the membership tests send to.
const memberTopic = "members"

// memberSends sends numbered messages through the cluster's running
// nodes and keeps the bodies that were acknowledged.
type memberSends struct {
	c     *nemCluster
	next  int
	acked []string
}

// sendOne sends one new message through nd once; the body counts as
// acknowledged on a 201.
func (s *memberSends) sendOne(ctx context.Context, nd *nemNode) (int, string, error) {
	s.next++
	body := fmt.Sprintf("m%04d", s.next)
	var res nemSendResult
	status, code, err := nemCall(ctx, s.c.hc, "POST", nd.base+"/v1/topics/"+memberTopic+"/messages",
		map[string]any{"body": body, "dedupKey": body}, &res, nil)
	if status == http.StatusCreated && err == nil {
		s.acked = append(s.acked, body)
	}
	return status, code, err
}

// sendAcked sends n messages through the running nodes in turn, each
// retried (same dedupKey, so a retry cannot store it twice) until it is
// acknowledged, bounded.
func (s *memberSends) sendAcked(ctx context.Context, n int) {
	s.c.t.Helper()
	for range n {
		s.next++
		body := fmt.Sprintf("m%04d", s.next)
		deadline := time.Now().Add(15 * time.Second)
		for attempt := 0; ; attempt++ {
			nd := s.c.runningNodes()[attempt%len(s.c.runningNodes())]
			var res nemSendResult
			status, _, err := nemCall(ctx, s.c.hc, "POST", nd.base+"/v1/topics/"+memberTopic+"/messages",
				map[string]any{"body": body, "dedupKey": body}, &res, nil)
			if status == http.StatusCreated && err == nil {
				s.acked = append(s.acked, body)
				break
			}
			if !transientStatus(status, err) || time.Now().After(deadline) {
				s.c.t.Fatalf("send %s through %s: %d %v", body, nd.id, status, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// checkAllReadable reads the topic back through nd and fails for any
// acknowledged message that is missing.
func (s *memberSends) checkAllReadable(ctx context.Context, nd *nemNode) {
	s.c.t.Helper()
	found := readBack(ctx, s.c.t, s.c.hc, nd.base, memberTopic)
	var missing []string
	for _, b := range s.acked {
		if _, ok := found[b]; !ok {
			missing = append(missing, b)
		}
	}
	if len(missing) > 0 {
		s.c.t.Fatalf("%d of %d acknowledged messages missing on %s: %v", len(missing), len(s.acked), nd.id, missing)
	}
}

func (c *nemCluster) runningNodes() []*nemNode {
	var out []*nemNode
	for _, nd := range c.nodes {
		if c.running(nd) {
			out = append(out, nd)
		}
	}
	return out
}

// group is nd's view of the cluster's one group.
func (c *nemCluster) group(ctx context.Context, nd *nemNode) (gateway.ClusterGroup, error) {
	var v gateway.ClusterView
	if _, _, err := nemCall(ctx, c.hc, "GET", nd.base+"/v1/cluster", nil, &v, nil); err != nil {
		return gateway.ClusterGroup{}, err
	}
	if len(v.Groups) != 1 {
		return gateway.ClusterGroup{}, fmt.Errorf("%s: %d groups, want 1", nd.id, len(v.Groups))
	}
	return v.Groups[0], nil
}

func memberOf(g gateway.ClusterGroup, id string) (gateway.ClusterMember, bool) {
	for _, m := range g.Members {
		if m.ID == id {
			return m, true
		}
	}
	return gateway.ClusterMember{}, false
}

// membership is the group's members as "id@clusterAddr/suffrage", sorted.
func membership(g gateway.ClusterGroup) []string {
	var out []string
	for _, m := range g.Members {
		out = append(out, m.ID+"@"+m.ClusterAddr+"/"+m.Suffrage)
	}
	slices.Sort(out)
	return out
}

// waitVoter waits (bounded) until the leader's view has id as a voter
// whose applied index reached the leader's.
func (c *nemCluster) waitVoter(ctx context.Context, id string, bound time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(bound)
	last := "no answer"
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if l, _ := c.agreedLeader(ctx); l != nil {
			g, err := c.group(ctx, l)
			if err != nil {
				last = err.Error()
			} else {
				m, ok := memberOf(g, id)
				lm, _ := memberOf(g, l.id)
				switch {
				case !ok:
					last = fmt.Sprintf("%s not a member: %v", id, membership(g))
				case m.Suffrage != "voter":
					last = fmt.Sprintf("%s is a %s (applied %d, leader %d)", id, m.Suffrage, m.AppliedIndex, lm.AppliedIndex)
				case m.AppliedIndex < lm.AppliedIndex:
					last = fmt.Sprintf("%s is a voter, applied %d behind the leader's %d", id, m.AppliedIndex, lm.AppliedIndex)
				default:
					return
				}
			}
		} else {
			last = "no agreed leader"
		}
		time.Sleep(100 * time.Millisecond)
	}
	c.t.Fatalf("%s not a caught-up voter within %v: %s", id, bound, last)
}

// follower is a running node other than the leader.
func (c *nemCluster) follower(leader *nemNode, prefer string) *nemNode {
	c.t.Helper()
	var pick *nemNode
	for _, nd := range c.runningNodes() {
		if nd == leader {
			continue
		}
		if pick == nil || nd.id == prefer {
			pick = nd
		}
	}
	if pick == nil {
		c.t.Fatal("no running follower")
	}
	return pick
}

// memberCluster is n1..n3 started with --peers on 127.0.0.1..3, with
// addresses picked free on 127.0.0.1..5 for the nodes added later.
func memberCluster(t *testing.T) (c *nemCluster, addNode func(id string) *nemNode) {
	t.Helper()
	dir := t.TempDir()
	ips := []string{"127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"}
	httpPort := freeSharedPort(t, ips)
	clusterPort := freeSharedPort(t, ips, httpPort)
	secret := filepath.Join(dir, "cluster-secret")
	if err := os.WriteFile(secret, []byte("members-test-secret-0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c = &nemCluster{t: t, hc: &http.Client{Timeout: 8 * time.Second}}
	t.Cleanup(c.hc.CloseIdleConnections)
	ip := func(id string) string { n, _ := strconv.Atoi(id[1:]); return ips[n-1] }
	newNode := func(id string, peers []string) *nemNode {
		addr := fmt.Sprintf("%s:%d", ip(id), httpPort)
		nd := &nemNode{id: id, base: "http://" + addr}
		nd.args = []string{"--addr", addr, "--data", filepath.Join(dir, id), "--node-id", id,
			"--cluster-addr", fmt.Sprintf("%s:%d", ip(id), clusterPort), "--cluster-secret", secret}
		if len(peers) > 0 {
			nd.args = append(nd.args, "--peers", strings.Join(peers, ","))
		}
		return nd
	}
	var peers []string
	for _, id := range []string{"n1", "n2", "n3"} {
		peers = append(peers, fmt.Sprintf("%s=%s:%d", id, ip(id), clusterPort))
	}
	for _, id := range []string{"n1", "n2", "n3"} {
		c.nodes = append(c.nodes, newNode(id, peers))
	}
	for _, nd := range c.nodes {
		nd.proc = spawnTidemq(t, nd.base, nd.args...)
	}
	for _, nd := range c.nodes {
		c.waitHealthy(nd)
	}
	addNode = func(id string) *nemNode {
		nd := newNode(id, nil)
		nd.proc = spawnTidemq(t, nd.base, nd.args...)
		c.waitHealthy(nd)
		return nd
	}
	return c, addNode
}

// checkForwardedReply reads a message through a follower: the reply is the
// leader's as it sent it, compressed only when the caller asked (a
// forwarder that asked for gzip itself would have the leader compress and
// itself decompress every reply, and answer without its length).
func checkForwardedReply(ctx context.Context, t *testing.T, c *nemCluster, leader *nemNode) {
	t.Helper()
	var sent nemSendResult
	body := strings.Repeat("forwarded reply ", 128)
	if status, _, err := nemCall(ctx, c.hc, "POST", leader.base+"/v1/topics/"+memberTopic+"/messages", map[string]any{"body": body}, &sent, nil); status != http.StatusCreated {
		t.Fatalf("send through the leader: %d %v", status, err)
	}
	hc := &http.Client{Timeout: 8 * time.Second, Transport: &http.Transport{DisableCompression: true}}
	defer hc.CloseIdleConnections()
	via := c.follower(leader, "")
	for _, gzipped := range []bool{false, true} {
		req, err := http.NewRequestWithContext(ctx, "GET", via.base+"/v1/topics/"+memberTopic+"/messages/"+sent.MessageID, nil)
		if err != nil {
			t.Fatal(err)
		}
		if gzipped {
			req.Header.Set("Accept-Encoding", "gzip")
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("GET the message through follower %s (gzip %v): %d %v", via.id, gzipped, resp.StatusCode, err)
		}
		enc := resp.Header.Get("Content-Encoding")
		switch {
		case gzipped && enc != "gzip":
			t.Errorf("asked for gzip through a follower: Content-Encoding %q", enc)
		case !gzipped && enc != "":
			t.Errorf("asked for no encoding through a follower: Content-Encoding %q", enc)
		case !gzipped && !strings.Contains(string(data), body):
			t.Errorf("the reply through a follower does not hold the body: %.200s", data)
		}
		if resp.ContentLength != int64(len(data)) {
			t.Errorf("reply through a follower (gzip %v): Content-Length %d for %d bytes: not the leader's reply as sent", gzipped, resp.ContentLength, len(data))
		}
	}
}

// clusterAddrOf is the --cluster-addr nd was started with.
func clusterAddrOf(nd *nemNode) string {
	i := slices.Index(nd.args, "--cluster-addr")
	return nd.args[i+1]
}

func memberRequest(nd *nemNode) map[string]any {
	return map[string]any{"id": nd.id, "clusterAddr": clusterAddrOf(nd), "httpAddr": strings.TrimPrefix(nd.base, "http://")}
}

// TestClusterMembership changes a running cluster of real processes
// through the membership API (SPEC §7.1): a node started without --peers
// is added through a follower and promoted to voter once caught up, adding
// it again changes nothing, a taken address, a missing member and an
// unknown group are refused, a dead follower is replaced, the leader
// removes itself and a successor serves, and every acknowledged message is
// on the final leader.
func TestClusterMembership(t *testing.T) {
	skipUnlessClusterTest(t, "runs five broker processes for ~10 s")
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	c, addNode := memberCluster(t)
	s := &memberSends{c: c}
	leader := c.leader(ctx)
	s.sendAcked(ctx, 10)
	checkForwardedReply(ctx, t, c, leader)

	// Add n4 through a follower: it joins as a non-voter (or, promoted
	// already, a voter).
	n4 := addNode("n4")
	via := c.follower(leader, "")
	var g gateway.ClusterGroup
	if status, code, err := nemCall(ctx, c.hc, "POST", via.base+"/v1/cluster/members", memberRequest(n4), &g, nil); status != http.StatusAccepted {
		t.Fatalf("POST n4 through follower %s: %d %s %v, want 202", via.id, status, code, err)
	}
	if m, ok := memberOf(g, "n4"); !ok || (m.Suffrage != "nonvoter" && m.Suffrage != "voter") || m.ClusterAddr != clusterAddrOf(n4) {
		t.Fatalf("membership after adding n4: %v", membership(g))
	}
	t.Logf("n4 added through %s: %v", via.id, membership(g))
	c.nodes = append(c.nodes, n4)
	c.waitVoter(ctx, "n4", 20*time.Second)
	s.sendAcked(ctx, 5)

	// The same request again changes nothing.
	leader = c.leader(ctx)
	before, err := c.group(ctx, leader)
	if err != nil {
		t.Fatal(err)
	}
	if status, code, err := nemCall(ctx, c.hc, "POST", c.follower(leader, "").base+"/v1/cluster/members", memberRequest(n4), &g, nil); status != http.StatusAccepted {
		t.Fatalf("POST n4 again: %d %s %v, want 202", status, code, err)
	}
	if !slices.Equal(membership(g), membership(before)) {
		t.Fatalf("adding n4 again changed the membership: %v, was %v", membership(g), membership(before))
	}

	// Refusals.
	conflict := map[string]any{"id": "n5", "clusterAddr": clusterAddrOf(n4), "httpAddr": "127.0.0.5:1"}
	for _, tc := range []struct {
		name, method, path string
		body               any
		status             int
		code               string
	}{
		{"n5 at n4's address", "POST", "/v1/cluster/members", conflict, http.StatusConflict, "member_conflict"},
		{"missing member", "DELETE", "/v1/cluster/members/n9", nil, http.StatusNotFound, "member_not_found"},
		{"unknown group on DELETE", "DELETE", "/v1/cluster/members/n4?group=g9", nil, http.StatusNotFound, "group_not_found"},
		{"unknown group on POST", "POST", "/v1/cluster/members", map[string]any{"id": "n5", "clusterAddr": "127.0.0.5:1", "httpAddr": "127.0.0.5:2", "group": "g9"}, http.StatusNotFound, "group_not_found"},
	} {
		status, code, err := nemCall(ctx, c.hc, tc.method, c.follower(leader, "").base+tc.path, tc.body, nil, nil)
		if status != tc.status || code != tc.code {
			t.Errorf("%s: %d %q (%v), want %d %s", tc.name, status, code, err, tc.status, tc.code)
		}
	}
	if after, err := c.group(ctx, leader); err != nil || !slices.Equal(membership(after), membership(before)) {
		t.Fatalf("membership after the refused requests: %v (%v), was %v", membership(after), err, membership(before))
	}

	// Replace a dead follower: DELETE it, POST a fresh n5.
	dead := c.follower(leader, "n2")
	c.kill(dead)
	c.nodes = slices.DeleteFunc(c.nodes, func(nd *nemNode) bool { return nd == dead })
	if status, code, err := nemCall(ctx, c.hc, "DELETE", c.follower(leader, "").base+"/v1/cluster/members/"+dead.id, nil, &g, nil); status != http.StatusAccepted {
		t.Fatalf("DELETE dead %s: %d %s %v, want 202", dead.id, status, code, err)
	}
	if _, ok := memberOf(g, dead.id); ok {
		t.Fatalf("%s still a member after its removal: %v", dead.id, membership(g))
	}
	n5 := addNode("n5")
	if status, code, err := nemCall(ctx, c.hc, "POST", leader.base+"/v1/cluster/members", memberRequest(n5), &g, nil); status != http.StatusAccepted {
		t.Fatalf("POST n5: %d %s %v, want 202", status, code, err)
	}
	t.Logf("%s replaced by n5: %v", dead.id, membership(g))
	c.nodes = append(c.nodes, n5)
	c.waitVoter(ctx, "n5", 20*time.Second)
	s.sendAcked(ctx, 5)

	// The leader removes itself: it hands leadership on and its successor
	// removes it.
	leader = c.leader(ctx)
	if status, code, err := nemCall(ctx, c.hc, "DELETE", leader.base+"/v1/cluster/members/"+leader.id, nil, &g, nil); status != http.StatusAccepted {
		t.Fatalf("DELETE the leader %s through itself: %d %s %v, want 202", leader.id, status, code, err)
	}
	if _, ok := memberOf(g, leader.id); ok {
		t.Fatalf("the leader %s still a member after removing itself: %v", leader.id, membership(g))
	}
	old := leader
	c.nodes = slices.DeleteFunc(c.nodes, func(nd *nemNode) bool { return nd == old })
	leader = c.leader(ctx)
	if leader == old {
		t.Fatalf("%s still leads after removing itself", old.id)
	}
	t.Logf("%s removed itself, %s leads", old.id, leader.id)
	if g, err := c.group(ctx, leader); err != nil || len(g.Members) != 3 {
		t.Fatalf("final membership on %s: %v (%v), want three members without %s", leader.id, membership(g), err, old.id)
	} else if _, ok := memberOf(g, old.id); ok {
		t.Fatalf("final membership still has %s: %v", old.id, membership(g))
	}
	// The new leader serves sends (through every remaining node).
	for _, nd := range c.nodes {
		if status, code, err := s.sendOne(ctx, nd); status != http.StatusCreated {
			t.Fatalf("send through %s after the leader left: %d %s %v, want 201", nd.id, status, code, err)
		}
	}
	s.checkAllReadable(ctx, leader)
}

// TestFiveNodeCluster: a group of five keeps answering sends with two of
// them dead (one the leader), answers 503 no_leader and acknowledges
// nothing with three dead, serves again once they are back, and keeps
// every acknowledged message (SPEC §7.2).
func TestFiveNodeCluster(t *testing.T) {
	skipUnlessClusterTest(t, "runs five broker processes for ~10 s")
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	c := newNemCluster(t, 5)
	s := &memberSends{c: c}
	s.sendAcked(ctx, 10)

	// Two down, one of them the leader: a majority of three remains.
	leader := c.leader(ctx)
	follower := c.follower(leader, "")
	c.kill(leader)
	c.kill(follower)
	killed := time.Now()
	for attempt := 0; ; attempt++ {
		live := c.runningNodes()
		nd := live[attempt%len(live)]
		status, _, err := s.sendOne(ctx, nd)
		if status == http.StatusCreated && err == nil {
			t.Logf("first 201 %v after killing the leader %s and %s", time.Since(killed).Round(time.Millisecond), leader.id, follower.id)
			break
		}
		if !transientStatus(status, err) {
			t.Fatalf("send through %s with two nodes dead: %d %v", nd.id, status, err)
		}
		if time.Since(killed) > 5*time.Second {
			t.Fatalf("no send answered 201 within 5 s of killing the leader %s and %s: last %d %v", leader.id, follower.id, status, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.sendAcked(ctx, 5)

	// A third down: two of five cannot commit anything.
	third := c.follower(c.leader(ctx), "")
	c.kill(third)
	for i, nd := range c.runningNodes() {
		start := time.Now()
		status, code, err := s.sendOne(ctx, nd)
		took := time.Since(start)
		if status == http.StatusCreated {
			t.Fatalf("send %d through %s acknowledged with three of five nodes dead", i, nd.id)
		}
		if status != http.StatusServiceUnavailable || code != "no_leader" || took > nemMaxWait {
			t.Fatalf("send through %s with three of five dead: %d %q after %v (%v), want 503 no_leader within %v", nd.id, status, code, took, err, nemMaxWait)
		}
		t.Logf("three of five dead: a send through %s answered 503 no_leader after %v", nd.id, took.Round(time.Millisecond))
	}

	// Back up: sends succeed again and nothing acknowledged is lost.
	for _, nd := range []*nemNode{leader, follower, third} {
		c.restart(nd)
	}
	s.sendAcked(ctx, 10)
	s.checkAllReadable(ctx, c.leader(ctx))
}
