package cluster_test

import (
	"errors"
	"testing"
	"time"

	"github.com/tidemq/tidemq/core"
)

// The leader's gateway broker serves the mirror API; a follower's answers
// no_leader (the forwarder sends requests to the leader first). Mirror
// definitions and skip records replicate: after a failover the new leader
// has them.
func TestLeaderBrokerServesMirrors(t *testing.T) {
	ctx := t.Context()
	nodes := startGroup(t, 3)
	leader := leaderAmong(t, nodes...)
	gw := leader.c.Gateway()
	if _, _, err := gw.PutTopic(ctx, "copies", core.TopicConfig{Queues: 1}); err != nil {
		t.Fatal(err)
	}
	cfg := core.MirrorConfig{Source: core.MirrorSource{URL: "http://hz.example", Topic: "orders", Token: "t"}, Topic: "copies"}
	if _, created, err := gw.PutMirror(ctx, "from-hz", cfg); err != nil || !created {
		t.Fatalf("PutMirror: created %v, %v", created, err)
	}
	cp := core.MirrorCopy{SourceQueue: 0, SourceOff: 3, Msg: &core.Message{Body: []byte("copy"), DedupKey: "src-3"}}
	if n, err := leader.c.Broker().SendMirrored(ctx, "from-hz", []core.MirrorCopy{cp}); err != nil || n != 1 {
		t.Fatalf("SendMirrored: %d, %v", n, err)
	}
	for _, nd := range nodes {
		if nd == leader {
			continue
		}
		if _, err := nd.c.Gateway().GetMirror("from-hz"); !errors.Is(err, core.ErrNoLeader) {
			t.Errorf("%s (a follower): GetMirror = %v, want ErrNoLeader", nd.id, err)
		}
		if l := nd.c.Gateway().ListMirrors(); l != nil {
			t.Errorf("%s (a follower): ListMirrors = %+v", nd.id, l)
		}
	}
	waitConverged(t, nodes)

	leader.stop(t, nodes)
	var rest []*testNode
	for _, nd := range nodes {
		if nd != leader {
			rest = append(rest, nd)
		}
	}
	next := leaderAmong(t, rest...)
	deadline := time.Now().Add(10 * time.Second)
	var m core.MirrorInfo
	var err error
	for time.Now().Before(deadline) {
		if m, err = next.c.Gateway().GetMirror("from-hz"); err == nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil || m.Copied != 1 || m.Topic != "copies" {
		t.Fatalf("the new leader's mirror: %+v, %v", m, err)
	}
	if !next.c.Broker().MirrorStored("from-hz", 0, 3) {
		t.Error("the new leader lost the skip record")
	}
	if err := next.c.Gateway().DeleteMirror(ctx, "from-hz"); err != nil {
		t.Fatal(err)
	}
	if l := next.c.Gateway().ListMirrors(); len(l) != 0 {
		t.Errorf("after the delete: %+v", l)
	}
}
