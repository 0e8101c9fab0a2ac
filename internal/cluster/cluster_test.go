package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/hashicorp/raft"

	"github.com/tidemq/tidemq/core"
	"github.com/tidemq/tidemq/internal/cluster"
	"github.com/tidemq/tidemq/pebblestore"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// testNode is one in-process member: its store, transport and cluster.
type testNode struct {
	id    string
	store *pebblestore.Store
	trans *raft.InmemTransport
	c     *cluster.Cluster
}

// startGroup starts n members on in-memory stores, every transport
// connected to every other.
func startGroup(t *testing.T, n int) []*testNode {
	t.Helper()
	nodes := make([]*testNode, n)
	var peers []cluster.Peer
	for i := range nodes {
		id := fmt.Sprintf("n%d", i+1)
		addr, trans := raft.NewInmemTransport(raft.ServerAddress(id))
		nodes[i] = &testNode{id: id, trans: trans}
		peers = append(peers, cluster.Peer{ID: id, Addr: string(addr)})
	}
	for _, a := range nodes {
		for _, b := range nodes {
			if a != b {
				a.trans.Connect(b.trans.LocalAddr(), b.trans)
			}
		}
	}
	for _, nd := range nodes {
		store, err := pebblestore.Open("db", pebblestore.Options{FS: vfs.NewMem(), Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		nd.store = store
		nd.c, err = cluster.Start(cluster.Config{
			NodeID: nd.id, ClusterAddr: string(nd.trans.LocalAddr()), Peers: peers, Dir: t.TempDir(),
			Store: store, Logger: quiet, Transport: nd.trans, HeartbeatTimeout: 200 * time.Millisecond,
			Lead: func(p core.Proposer, key []byte) (*core.Broker, func() error, error) {
				b, err := core.New(store, core.Options{Logger: quiet, Proposer: p, ReceiptKey: key})
				if err != nil {
					return nil, nil, err
				}
				return b, b.Close, nil
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := nd.c.Close(); err != nil {
				t.Errorf("%s: cluster Close: %v", nd.id, err)
			}
			if err := nd.store.Close(); err != nil {
				t.Errorf("%s: store Close: %v", nd.id, err)
			}
		})
	}
	return nodes
}

// leaderAmong waits for one of nodes to serve a broker.
func leaderAmong(t *testing.T, nodes ...*testNode) *testNode {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		for _, nd := range nodes {
			if nd.c.Broker() != nil {
				return nd
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("no leader serving within 10 s")
	return nil
}

// isolate cuts nd off from every other node, both ways; heal reconnects.
func isolate(nd *testNode, all []*testNode) {
	nd.trans.DisconnectAll()
	for _, o := range all {
		if o != nd {
			o.trans.Disconnect(nd.trans.LocalAddr())
		}
	}
}

func heal(all []*testNode) {
	for _, a := range all {
		for _, b := range all {
			if a != b {
				a.trans.Connect(b.trans.LocalAddr(), b.trans)
			}
		}
	}
}

func send(ctx context.Context, b *core.Broker, body string) error {
	_, err := b.Send(ctx, "t", []*core.Message{{Body: []byte(body)}})
	return err
}

// waitConverged waits until every node applied the same state.
func waitConverged(t *testing.T, nodes []*testNode) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		var sums [][32]byte
		var applied []uint64
		for _, nd := range nodes {
			sum, err := nd.store.Fingerprint()
			if err != nil {
				t.Fatal(err)
			}
			idx, err := nd.store.AppliedIndex(1)
			if err != nil {
				t.Fatal(err)
			}
			sums, applied = append(sums, sum), append(applied, idx)
		}
		same := true
		for i := range sums {
			same = same && sums[i] == sums[0] && applied[i] == applied[0]
		}
		if same {
			return
		}
		last = fmt.Sprint(applied)
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("replicas did not converge within 15 s (applied indexes %s)", last)
}

// An old leader cut off from the others acknowledges nothing; the others
// elect a leader that does, and once healed every replica holds the same
// state, with exactly the acknowledged messages.
func TestIsolatedLeaderNeverAcknowledges(t *testing.T) {
	nodes := startGroup(t, 3)
	old := leaderAmong(t, nodes...)
	ctx := t.Context()
	if _, _, err := old.c.Broker().PutTopic(ctx, "t", core.TopicConfig{Queues: 2}); err != nil {
		t.Fatal(err)
	}
	acked := 0
	for i := range 10 {
		if err := send(ctx, old.c.Broker(), fmt.Sprint("before-", i)); err != nil {
			t.Fatal(err)
		}
		acked++
	}
	oldBroker := old.c.Broker()
	isolate(old, nodes)
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := send(sctx, oldBroker, "isolated"); err == nil {
		t.Fatal("an isolated leader acknowledged a send")
	} else if !errors.Is(err, core.ErrNoLeader) && !errors.Is(err, core.ErrClosed) && !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("isolated leader's send failed with %v, want no leader", err)
	}
	var rest []*testNode
	for _, nd := range nodes {
		if nd != old {
			rest = append(rest, nd)
		}
	}
	next := leaderAmong(t, rest...)
	for i := range 10 {
		if err := send(ctx, next.c.Broker(), fmt.Sprint("after-", i)); err != nil {
			t.Fatal(err)
		}
		acked++
	}
	heal(nodes)
	waitConverged(t, nodes)
	leader := leaderAmong(t, nodes...)
	info, err := leader.c.Broker().GetTopic("t")
	if err != nil {
		t.Fatal(err)
	}
	if info.Messages != int64(acked) {
		t.Errorf("topic holds %d messages, want the %d acknowledged", info.Messages, acked)
	}
}

// A leader left in a minority commits nothing: its sends fail, and the
// replicas' applied state does not move.
func TestMinorityNeverCommits(t *testing.T) {
	nodes := startGroup(t, 3)
	leader := leaderAmong(t, nodes...)
	ctx := t.Context()
	if _, _, err := leader.c.Broker().PutTopic(ctx, "t", core.TopicConfig{Queues: 1}); err != nil {
		t.Fatal(err)
	}
	if err := send(ctx, leader.c.Broker(), "one"); err != nil {
		t.Fatal(err)
	}
	waitConverged(t, nodes)
	before, err := leader.store.Fingerprint()
	if err != nil {
		t.Fatal(err)
	}
	b := leader.c.Broker()
	for _, nd := range nodes {
		if nd != leader {
			isolate(nd, nodes)
		}
	}
	for i := range 3 {
		sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		err := send(sctx, b, fmt.Sprint("minority-", i))
		cancel()
		if err == nil {
			t.Fatalf("send %d acknowledged with the majority gone", i)
		}
		if nb := leader.c.Broker(); nb != nil {
			b = nb
		}
	}
	after, err := leader.store.Fingerprint()
	if err != nil {
		t.Fatal(err)
	}
	if after != before {
		t.Error("the minority leader's applied state changed without a majority")
	}
}
