package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Long polls parked through the followers leave the leader room for its
// other clients: each follower holds at most an eighth of its
// --max-connections (here 5) for the pulls it forwards; a pull that waits
// a second for one is refused with 429 and Retry-After.
// Uncapped, the 50 polls below took all 40 of the leader's connections,
// and a send on a new connection waited in its listen backlog.
func TestClusterPollsThroughFollowersLeaveLeaderRoom(t *testing.T) {
	skipUnlessClusterTest(t, "runs three broker processes")
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	c := newNemCluster(t, 3, "--max-connections", "40")
	leader := c.leader(ctx)
	for _, path := range []string{"/v1/topics/polls", "/v1/topics/polls/subscriptions/g"} {
		if status, code, err := nemCall(ctx, c.hc, "PUT", leader.base+path, map[string]any{}, nil, nil); status != http.StatusCreated && status != http.StatusOK {
			t.Fatalf("PUT %s: %d %s %v", path, status, code, err)
		}
	}
	follower := c.follower(leader, "")

	const pollsPerFollower, capPerFollower = 25, 40 / 8
	pollClient := &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 2 * pollsPerFollower}}
	defer pollClient.CloseIdleConnections()
	type answer struct {
		status     int
		retryAfter string
		err        error
	}
	pull := func(nd *nemNode, wait int) answer {
		req, err := http.NewRequestWithContext(ctx, "POST", nd.base+"/v1/topics/polls/subscriptions/g/pull",
			strings.NewReader(fmt.Sprintf(`{"maxMessages":1,"waitSeconds":%d}`, wait)))
		if err != nil {
			return answer{err: err}
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := pollClient.Do(req)
		if err != nil {
			return answer{err: err}
		}
		resp.Body.Close()
		return answer{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After")}
	}
	var wg sync.WaitGroup
	answers := make(chan answer, 2*pollsPerFollower)
	for _, nd := range c.nodes {
		if nd == leader {
			continue
		}
		for range pollsPerFollower {
			wg.Go(func() { answers <- pull(nd, 5) })
		}
	}
	time.Sleep(1500 * time.Millisecond) // the polls park

	// A pull finding the follower's connections taken waits a second for
	// one, then is refused.
	start := time.Now()
	if a := pull(follower, 5); a.status != http.StatusTooManyRequests || a.retryAfter == "" {
		t.Errorf("a pull through %s with its pull connections parked: %d Retry-After %q %v, want 429 with Retry-After", follower.id, a.status, a.retryAfter, a.err)
	} else if took := time.Since(start); took < time.Second || took > 4*time.Second {
		t.Errorf("the refused pull was answered after %v, want after the second it waits for a connection", took)
	}
	if n := refusedPulls(t, c.hc, follower); n < 1 {
		t.Errorf("%s's /metrics counts %v refused pulls, want at least the one just refused", follower.id, n)
	}

	// On connections of their own: the leader still accepts new ones.
	fresh := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	for _, nd := range []*nemNode{leader, follower} {
		sctx, scancel := context.WithTimeout(ctx, 3*time.Second)
		start := time.Now()
		status, code, err := nemCall(sctx, fresh, "POST", nd.base+"/v1/topics/polls/messages", map[string]any{"body": "aGk="}, nil, nil)
		scancel()
		if status != http.StatusCreated {
			t.Fatalf("send to %s (leader %s) with %d polls parked through the followers: %d %s %v after %v, want 201",
				nd.id, leader.id, 2*pollsPerFollower, status, code, err, time.Since(start).Round(time.Millisecond))
		}
	}
	wg.Wait()
	close(answers)
	served, refused := 0, 0
	for a := range answers {
		switch {
		case a.status == http.StatusOK:
			served++
		case a.status == http.StatusTooManyRequests && a.retryAfter != "":
			refused++
		default:
			t.Errorf("a parked poll answered %d (Retry-After %q) %v, want 200, or 429 with Retry-After", a.status, a.retryAfter, a.err)
		}
	}
	t.Logf("parked polls through the followers: %d answered 200, %d refused with 429", served, refused)
	if served < 2*capPerFollower {
		t.Errorf("%d polls answered 200, want at least the %d the followers could forward at once", served, 2*capPerFollower)
	}
}

// refusedPulls reads nd's count of pulls it refused for want of a
// connection to the leader from /metrics (-1 when the series is missing).
func refusedPulls(t *testing.T, hc *http.Client, nd *nemNode) float64 {
	t.Helper()
	resp, err := hc.Get(nd.base + "/metrics")
	if err != nil {
		t.Fatalf("%s /metrics: %v", nd.id, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, "tidemq_cluster_forwarded_pulls_refused_total") {
			fields := strings.Fields(line)
			v, err := strconv.ParseFloat(fields[len(fields)-1], 64)
			if err != nil {
				t.Fatalf("%s /metrics: %q: %v", nd.id, line, err)
			}
			return v
		}
	}
	return -1
}
