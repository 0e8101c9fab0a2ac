package cluster_test

import (
	"bytes"
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
	cfg   cluster.Config
}

// groupOptions shrink raft's log for a test; zero keeps the defaults.
type groupOptions struct {
	snapshotThreshold, trailingLogs uint64
	// checker, when set, makes each node's transaction checker (by id).
	checker func(nodeID string) core.TransactionChecker
}

// startGroup starts n members on in-memory stores, every transport
// connected to every other.
func startGroup(t *testing.T, n int) []*testNode { return startGroupWith(t, n, groupOptions{}) }

func startGroupWith(t *testing.T, n int, o groupOptions) []*testNode {
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
		nd.cfg = cluster.Config{
			NodeID: nd.id, ClusterAddr: string(nd.trans.LocalAddr()), Peers: peers, Dir: t.TempDir(),
			Store: store, Logger: quiet, Transport: nd.trans, HeartbeatTimeout: 200 * time.Millisecond,
			SnapshotThreshold: o.snapshotThreshold, TrailingLogs: o.trailingLogs, SnapshotInterval: 20 * time.Millisecond,
			Lead: func(p core.Proposer, key []byte) (*core.Broker, func() error, error) {
				opts := core.Options{Logger: quiet, Proposer: p, ReceiptKey: key}
				if o.checker != nil {
					opts.TransactionChecker = o.checker(nd.id)
				}
				b, err := core.New(store, opts)
				if err != nil {
					return nil, nil, err
				}
				return b, b.Close, nil
			},
		}
		nd.c, err = cluster.Start(nd.cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if nd.c == nil {
				return
			}
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

// stop shuts a member down, keeping its store, as a node that died.
func (nd *testNode) stop(t *testing.T, all []*testNode) {
	t.Helper()
	isolate(nd, all)
	if err := nd.c.Close(); err != nil {
		t.Fatal(err)
	}
	nd.c = nil
}

// restart starts a stopped member again on its store, on a new transport
// at its address.
func (nd *testNode) restart(t *testing.T, all []*testNode) {
	t.Helper()
	_, nd.trans = raft.NewInmemTransport(nd.trans.LocalAddr())
	nd.cfg.Transport = nd.trans
	heal(all)
	c, err := cluster.Start(nd.cfg)
	if err != nil {
		t.Fatal(err)
	}
	nd.c = c
}

// A member that was down while the leader's log was truncated behind a
// snapshot catches up from the snapshot, with sends going on, and ends
// with the others' state.
func TestDownFollowerCatchesUpFromSnapshot(t *testing.T) {
	nodes, leader, down, downLast, acked := downPastTruncation(t, 300)
	ctx := t.Context()
	// Under load: sends go on while it catches up.
	done := make(chan int)
	go func() {
		n := 0
		for i := range 100 {
			if send(ctx, leader.c.Broker(), fmt.Sprint("during-", i)) == nil {
				n++
			}
		}
		done <- n
	}()
	down.restart(t, nodes)
	acked += <-done
	waitConverged(t, nodes)
	// The entry after the last it had reached it inside the snapshot, not
	// as a log entry: the leader no longer had it.
	var l raft.Log
	if err := down.store.RaftStore(1).GetLog(downLast+1, &l); !errors.Is(err, raft.ErrLogNotFound) {
		t.Errorf("the restarted node holds log entry %d (err %v): it did not catch up from the snapshot", downLast+1, err)
	}
	info, err := leader.c.Broker().GetTopic("t")
	if err != nil {
		t.Fatal(err)
	}
	if info.Messages != int64(acked) {
		t.Errorf("topic holds %d messages, want the %d acknowledged", info.Messages, acked)
	}
}

// A restore that a crash cut short leaves the store half replaced and
// marked; the next start completes it from the snapshot the node had
// received, before raft runs, and the node ends with the others' state.
func TestInterruptedRestoreIsCompletedAtStart(t *testing.T) {
	nodes, leader, down, _, _ := downPastTruncation(t, 200)
	ctx := t.Context()
	// A crash interrupts a restore while the received snapshot is the
	// newest (raft restores it as soon as it has it): the node takes no
	// snapshot of its own after it here.
	down.cfg.SnapshotThreshold = 1 << 40
	down.restart(t, nodes) // catches up from a snapshot it receives and keeps
	waitConverged(t, nodes)
	down.stop(t, nodes)
	// The crash: a restore of a stream that ends half-way.
	sn, err := leader.store.StateSnapshot()
	if err != nil {
		t.Fatal(err)
	}
	var stream bytes.Buffer
	if _, err := sn.WriteTo(&stream); err != nil {
		t.Fatal(err)
	}
	if err := sn.Close(); err != nil {
		t.Fatal(err)
	}
	if err := down.store.RestoreState(bytes.NewReader(stream.Bytes()[:stream.Len()/2])); err == nil {
		t.Fatal("a restore of half a stream succeeded")
	}
	if half, err := down.store.RestoreInProgress(); err != nil || !half {
		t.Fatalf("RestoreInProgress = %v, %v after a cut restore, want true", half, err)
	}

	down.restart(t, nodes)
	if half, err := down.store.RestoreInProgress(); err != nil || half {
		t.Fatalf("RestoreInProgress = %v, %v after the start, want false: the start did not complete the restore", half, err)
	}
	for i := range 20 {
		if err := send(ctx, leader.c.Broker(), fmt.Sprint("after-", i)); err != nil {
			t.Fatal(err)
		}
	}
	waitConverged(t, nodes)
}

// downPastTruncation starts a group that snapshots every 32 entries,
// stops a follower, and sends through the leader (sends messages, then
// more until a snapshot truncated the leader's log past the follower's
// last entry). It returns the follower's last index before it stopped and
// how many sends were acknowledged.
func downPastTruncation(t *testing.T, sends int) (nodes []*testNode, leader, down *testNode, downLast uint64, acked int) {
	t.Helper()
	nodes = startGroupWith(t, 3, groupOptions{snapshotThreshold: 32, trailingLogs: 8})
	leader = leaderAmong(t, nodes...)
	ctx := t.Context()
	if _, _, err := leader.c.Broker().PutTopic(ctx, "t", core.TopicConfig{Queues: 2}); err != nil {
		t.Fatal(err)
	}
	for _, nd := range nodes {
		if nd != leader {
			down = nd
			break
		}
	}
	waitConverged(t, nodes)
	downLast, err := down.store.RaftStore(1).LastIndex()
	if err != nil {
		t.Fatal(err)
	}
	down.stop(t, nodes)
	for i := range sends {
		if err := send(ctx, leader.c.Broker(), fmt.Sprint("while-down-", i)); err != nil {
			t.Fatal(err)
		}
		acked++
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		first, err := leader.store.RaftStore(1).FirstIndex()
		if err != nil {
			t.Fatal(err)
		}
		if first > downLast+1 {
			return nodes, leader, down, downLast, acked
		}
		if time.Now().After(deadline) {
			t.Fatalf("the leader's log still starts at %d (the down node has up to %d): no snapshot truncated it", first, downLast)
		}
		if err := send(ctx, leader.c.Broker(), "nudge"); err != nil {
			t.Fatal(err)
		}
		acked++
	}
}

// A request a follower forwarded to the leader is abandoned once another
// node leads (a paused or cut-off old leader would hold it), and not
// before: through the changes in between (no leader while the group
// elects), and not after the request ended.
func TestForwardedRequestAbandonedOnNewLeader(t *testing.T) {
	nodes := startGroup(t, 3)
	old := leaderAmong(t, nodes...)
	var follower *testNode
	for _, nd := range nodes {
		if nd != old {
			follower = nd
			break
		}
	}
	wrong, stopWrong := follower.c.AbandonOnNewLeader(t.Context(), "elsewhere")
	defer stopWrong()
	select {
	case <-wrong.Done():
		if cause := context.Cause(wrong); !errors.Is(cause, cluster.ErrLeaderChanged) {
			t.Errorf("a request forwarded to a node that does not lead: cause %v, want the leader change", cause)
		}
	case <-time.After(time.Second):
		t.Error("a request forwarded to a node that does not lead was not abandoned within 1 s")
	}
	watched, stopWatched := follower.c.AbandonOnNewLeader(t.Context(), old.id)
	defer stopWatched()
	ended, stopEnded := follower.c.AbandonOnNewLeader(t.Context(), old.id)
	stopEnded()
	if err := watched.Err(); err != nil {
		t.Fatalf("abandoned while its leader still leads: %v", context.Cause(watched))
	}
	isolate(old, nodes)
	select {
	case <-watched.Done():
		if cause := context.Cause(watched); !errors.Is(cause, cluster.ErrLeaderChanged) {
			t.Errorf("abandoned with cause %v, want the leader change", cause)
		}
		var rest []*testNode
		for _, nd := range nodes {
			if nd != old {
				rest = append(rest, nd)
			}
		}
		if next := leaderAmong(t, rest...); next == old {
			t.Error("the isolated node still serves")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a request forwarded to the old leader was not abandoned within 10 s of its isolation")
	}
	if cause := context.Cause(ended); errors.Is(cause, cluster.ErrLeaderChanged) {
		t.Error("a request that had ended was abandoned again on the leader change")
	}
}
