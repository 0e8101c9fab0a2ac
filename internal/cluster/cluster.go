package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	"go.opentelemetry.io/otel/metric"

	"github.com/tidemq/tidemq/core"
	"github.com/tidemq/tidemq/pebblestore"
)

// GroupID is the one broker group's name, and raftGroup its number in the
// store's keys; a cluster of several groups gives each its own.
const (
	GroupID   = "g1"
	raftGroup = 1
)

// Peer is one of a new cluster's first members.
type Peer struct {
	ID   string // node id
	Addr string // advertised cluster address, host:port
}

// ParsePeers reads --peers: id=host:port,id=host:port,…
func ParsePeers(s string) ([]Peer, error) {
	var peers []Peer
	seen := map[string]bool{}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		id, addr, ok := strings.Cut(part, "=")
		if !ok || id == "" || addr == "" {
			return nil, fmt.Errorf("peers: %q is not id=host:port", part)
		}
		if err := core.ValidateName("node", id); err != nil {
			return nil, fmt.Errorf("peers: node id %q: %w", id, err)
		}
		if seen[id] {
			return nil, fmt.Errorf("peers: node id %q twice", id)
		}
		seen[id] = true
		peers = append(peers, Peer{ID: id, Addr: addr})
	}
	return peers, nil
}

// Config is one node's part in a cluster.
type Config struct {
	NodeID           string
	ClusterAddr      string // listen address for node-to-node traffic
	ClusterAdvertise string // what the others dial (default ClusterAddr)
	HTTPAdvertise    string // where the others forward HTTP requests
	Peers            []Peer // a new cluster's first members; ignored once the store has raft state
	Security         Security
	Dir              string // raft's snapshots go under Dir/raft
	Store            *pebblestore.Store
	Logger           *slog.Logger

	// HeartbeatTimeout is raft's heartbeat and election timeout (default
	// 500 ms): a follower that hears nothing from its leader for it (to
	// twice it) starts an election.
	HeartbeatTimeout time.Duration
	// SnapshotThreshold is how many entries past the last snapshot make
	// the next one (default 1024); TrailingLogs how many stay in the log
	// behind a snapshot for followers a little behind (default 512). A
	// snapshot costs a WAL sync (snapstore.go), so they are frequent: the
	// log, which holds every batch a second time, stays short.
	SnapshotThreshold, TrailingLogs uint64
	SnapshotInterval                time.Duration // how often raft checks the threshold (default 5 s)

	// MaxForwardedPolls caps the connections this node holds to the leader
	// for the pulls it forwards (0: no cap). A long poll holds its
	// connection for its whole wait, and each counts against the leader's
	// client connections: uncapped, polls parked through the followers
	// could take them all and stall every other request.
	MaxForwardedPolls int

	// MeterProvider gets the raft metrics (metrics.go); nil drops them.
	MeterProvider metric.MeterProvider

	// Transport replaces the TCP transport (in-process tests: raft's
	// InmemTransport); then nodes are not asked about themselves and
	// requests are not forwarded.
	Transport raft.Transport

	// Lead starts the leader's serving state: a broker committing through
	// p, signing receipt handles with receiptKey, and what runs on it. Its
	// stop closes them again (leadership lost, or the node stops).
	Lead func(p core.Proposer, receiptKey []byte) (b *core.Broker, stop func() error, err error)
}

// Cluster is a node's membership in its broker group: the raft instance,
// and the broker it serves while it leads.
type Cluster struct {
	cfg   Config
	log   *slog.Logger
	raft  *raft.Raft
	fsm   *fsm
	layer *Layer
	trans raft.Transport
	snaps *stateSnapshots

	current atomic.Pointer[serving] // the broker served while leading, nil otherwise
	// running is set once raft is: the transport answers "who are you"
	// from before then, and reads c.raft only after it.
	running atomic.Bool
	leads   uint64 // lead calls so far (leadLoop's)

	changeMu sync.Mutex
	changed  chan struct{} // closed and replaced on every change of leader or serving state

	rebuild chan struct{} // a proposer failed: its broker must be replaced
	stop    chan struct{}
	wg      sync.WaitGroup
	obs     *raft.Observer
	metrics *metrics

	infoMu sync.Mutex
	infos  map[string]nodeInfo // by cluster address: what each node said of itself

	closeOnce sync.Once
	closeErr  error
}

type serving struct {
	broker   *core.Broker
	stop     func() error
	term     uint64
	proposer *proposer
}

// Start joins the cluster: it bootstraps a new one from cfg.Peers when
// the store has no raft state, or rejoins with what the store holds.
func Start(cfg Config) (_ *Cluster, err error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.ClusterAdvertise == "" {
		cfg.ClusterAdvertise = cfg.ClusterAddr
	}
	if cfg.HeartbeatTimeout <= 0 {
		cfg.HeartbeatTimeout = 500 * time.Millisecond
	}
	if cfg.SnapshotThreshold == 0 {
		cfg.SnapshotThreshold = 1024
	}
	if cfg.TrailingLogs == 0 {
		cfg.TrailingLogs = 512
	}
	if cfg.SnapshotInterval <= 0 {
		cfg.SnapshotInterval = 5 * time.Second
	}
	if err := core.ValidateName("node", cfg.NodeID); err != nil {
		return nil, fmt.Errorf("cluster: node id %q: %w", cfg.NodeID, err)
	}
	if cfg.Transport == nil {
		if err := cfg.Security.Check(cfg.ClusterAddr, cfg.ClusterAdvertise); err != nil {
			return nil, err
		}
	}
	c := &Cluster{
		cfg: cfg, log: cfg.Logger.With("component", "cluster", "node", cfg.NodeID),
		changed: make(chan struct{}), rebuild: make(chan struct{}, 1), stop: make(chan struct{}),
		infos: map[string]nodeInfo{},
	}
	var closers []func() error
	defer func() {
		if err != nil {
			for i := len(closers) - 1; i >= 0; i-- {
				err = errors.Join(err, closers[i]())
			}
		}
	}()
	hlog := newHCLogger(c.log)
	c.snaps, err = newStateSnapshots(filepath.Join(cfg.Dir, "raft-snapshots"), cfg.Store, c.log)
	if err != nil {
		return nil, err
	}
	if err := c.finishRestore(); err != nil {
		return nil, err
	}
	if c.metrics, err = newMetrics(c, cfg.MeterProvider); err != nil {
		return nil, fmt.Errorf("cluster: metrics: %w", err)
	}
	if c.fsm, err = newFSM(cfg.Store, raftGroup, c.log, c.metrics); err != nil {
		return nil, err
	}
	if c.trans = cfg.Transport; c.trans == nil {
		c.layer, err = Listen(cfg.ClusterAddr, cfg.ClusterAdvertise, cfg.Security, c.info)
		if err != nil {
			return nil, fmt.Errorf("cluster: listen on %s: %w", cfg.ClusterAddr, err)
		}
		nt := raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
			Stream: c.layer, MaxPool: 4, Timeout: 10 * time.Second, Logger: hlog,
		})
		c.trans = nt
		closers = append(closers, nt.Close)
	}

	conf := raft.DefaultConfig()
	conf.LocalID = raft.ServerID(cfg.NodeID)
	conf.HeartbeatTimeout = cfg.HeartbeatTimeout
	conf.ElectionTimeout = cfg.HeartbeatTimeout
	conf.LeaderLeaseTimeout = cfg.HeartbeatTimeout / 2
	conf.SnapshotThreshold = cfg.SnapshotThreshold
	conf.TrailingLogs = cfg.TrailingLogs
	conf.SnapshotInterval = cfg.SnapshotInterval
	conf.NoSnapshotRestoreOnStart = true // the store holds the applied state; replay only the tail
	conf.BatchApplyCh = true
	conf.Logger = hlog
	logs := cfg.Store.RaftStore(raftGroup)
	has, err := raft.HasExistingState(logs, logs, c.snaps)
	if err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	if !has {
		if err := c.bootstrap(conf, logs); err != nil {
			return nil, err
		}
	} else if len(cfg.Peers) > 0 {
		c.log.Info("data directory already belongs to a cluster: --peers ignored")
	}
	// The leader sends each entry to every follower right after storing
	// it: kept in memory, it is not read back from Pebble and decoded.
	cached, err := raft.NewLogCache(logCacheEntries, logs)
	if err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	c.raft, err = raft.NewRaft(conf, c.fsm, cached, logs, c.snaps, c.trans)
	if err != nil {
		return nil, fmt.Errorf("cluster: raft: %w", err)
	}
	obsCh := make(chan raft.Observation, 16)
	c.obs = raft.NewObserver(obsCh, false, func(o *raft.Observation) bool {
		switch o.Data.(type) {
		case raft.LeaderObservation, raft.RaftState:
			return true
		}
		return false
	})
	c.running.Store(true)
	c.raft.RegisterObserver(c.obs)
	if err := c.metrics.register(c); err != nil {
		return nil, errors.Join(fmt.Errorf("cluster: metrics: %w", err), c.raft.Shutdown().Error())
	}
	c.wg.Go(func() { c.watch(obsCh) })
	c.wg.Go(c.leadLoop)
	c.wg.Go(c.watchMembers)
	return c, nil
}

// bootstrap writes a new cluster's first configuration: every first
// member does the same with the same list, which hashicorp/raft allows.
func (c *Cluster) bootstrap(conf *raft.Config, logs *pebblestore.RaftStore) error {
	if len(c.cfg.Peers) == 0 {
		// A node for an existing cluster: it waits until a member adds it
		// (POST /v1/cluster/members), and the leader's log reaches it.
		c.log.Info("new node without --peers: waiting to be added to a cluster", "cluster_addr", c.cfg.ClusterAdvertise)
		return nil
	}
	var servers []raft.Server
	self := false
	for _, p := range c.cfg.Peers {
		servers = append(servers, raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(p.ID), Address: raft.ServerAddress(p.Addr)})
		self = self || p.ID == c.cfg.NodeID
	}
	if !self {
		return fmt.Errorf("cluster: --peers does not name this node (%s)", c.cfg.NodeID)
	}
	if err := raft.BootstrapCluster(conf, logs, logs, c.snaps, c.trans, raft.Configuration{Servers: servers}); err != nil {
		return fmt.Errorf("cluster: bootstrap: %w", err)
	}
	c.log.Info("new cluster bootstrapped", "peers", len(servers))
	return nil
}

// finishRestore completes a snapshot restore a crash interrupted: the
// state is half replaced and must not be served, so it is restored again
// from the newest snapshot raft kept.
func (c *Cluster) finishRestore() error {
	half, err := c.cfg.Store.RestoreInProgress()
	if err != nil || !half {
		return err
	}
	meta, err := c.snaps.received()
	if err != nil {
		return err
	}
	if meta == nil {
		return errors.New("cluster: the store was being restored from a snapshot and none received is kept; restore the node from another replica (remove its data directory and add it again)")
	}
	// Raft restores a received snapshot as soon as it has it, so the one
	// a crash interrupted is the newest. A newer one means raft's log
	// starts past what the received stream holds: restoring it would
	// leave the entries between them out.
	metas, err := c.snaps.List()
	if err != nil {
		return err
	}
	if newest := metas[0]; newest.Term > meta.Term || newest.Term == meta.Term && newest.Index > meta.Index {
		return fmt.Errorf("cluster: the store was being restored from a snapshot and the received one kept (%s) is older than the newest (%s); restore the node from another replica (remove its data directory and add it again)", meta.ID, newest.ID)
	}
	_, rc, err := c.snaps.Open(meta.ID)
	if err != nil {
		return err
	}
	defer rc.Close()
	if err := c.cfg.Store.RestoreState(rc); err != nil {
		return fmt.Errorf("cluster: restore snapshot %s: %w", meta.ID, err)
	}
	c.log.Info("interrupted snapshot restore completed", "snapshot", meta.ID)
	return nil
}

// watch turns raft's observations into changes that waiting requests see.
func (c *Cluster) watch(ch <-chan raft.Observation) {
	for {
		select {
		case <-c.stop:
			return
		case o := <-ch:
			if _, ok := o.Data.(raft.LeaderObservation); ok {
				c.metrics.leaderChanged()
			}
			c.notify()
		}
	}
}

func (c *Cluster) notify() {
	c.changeMu.Lock()
	close(c.changed)
	c.changed = make(chan struct{})
	c.changeMu.Unlock()
}

func (c *Cluster) changes() <-chan struct{} {
	c.changeMu.Lock()
	defer c.changeMu.Unlock()
	return c.changed
}

// leadLoop keeps the serving state in step with leadership: a broker
// while this node leads the group (made after the node's state caught up
// with everything committed before), none otherwise.
func (c *Cluster) leadLoop() {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		c.reconcile()
		select {
		case <-c.stop:
			c.stepDown()
			return
		case <-c.raft.LeaderCh():
		case <-c.rebuild:
		case <-tick.C:
		}
	}
}

func (c *Cluster) reconcile() {
	leading := c.raft.State() == raft.Leader
	if cur := c.current.Load(); cur != nil {
		if leading && cur.term == c.raft.CurrentTerm() && !cur.proposer.failed.Load() {
			return
		}
		c.stepDown()
	}
	if leading {
		c.lead()
	}
}

// logCacheEntries is how many of the newest raft entries stay in memory
// for replication: a few hundred milliseconds of batches at full load.
const logCacheEntries = 128

// applyTimeout bounds how long a proposal waits to enter raft's queue.
const applyTimeout = 5 * time.Second

// lead makes this node's serving state: a new session (so no batch of an
// earlier broker is applied after it), the receipt key, then the broker.
func (c *Cluster) lead() {
	term := c.raft.CurrentTerm()
	c.leads++
	session := term<<20 | c.leads&(1<<20-1)
	if err := c.apply(encodeEntry(entrySession, session, nil)); err != nil {
		c.log.Warn("leading: session not committed", "term", term, "err", err)
		return
	}
	key, err := c.cfg.Store.ReceiptKey()
	if err == nil && key == nil {
		if err = c.apply(encodeEntry(entryBatch, session, c.cfg.Store.NewReceiptKeyRepr())); err == nil {
			key, err = c.cfg.Store.ReceiptKey()
		}
	}
	if err != nil || key == nil {
		c.log.Warn("leading: no receipt key", "err", err)
		return
	}
	p := &proposer{raft: c.raft, session: session, rebuild: c.rebuild, metrics: c.metrics}
	b, stop, err := c.cfg.Lead(p, key)
	if err != nil {
		p.fail()
		c.log.Warn("leading: broker not started", "term", term, "err", err)
		return
	}
	c.current.Store(&serving{broker: b, stop: stop, term: term, proposer: p})
	c.notify()
	c.log.Info("leading the group", "group", GroupID, "term", term)
}

func (c *Cluster) apply(data []byte) error {
	f := c.raft.Apply(data, applyTimeout)
	if err := f.Error(); err != nil {
		return err
	}
	if err, _ := f.Response().(error); err != nil {
		return err
	}
	return nil
}

// stepDown drops the serving state whole: the broker's leases, parked
// polls (answered at once), timers and push workers go with it.
func (c *Cluster) stepDown() {
	cur := c.current.Swap(nil)
	if cur == nil {
		return
	}
	c.notify()
	cur.proposer.fail()
	if err := cur.stop(); err != nil {
		c.log.Warn("serving state stopped with an error", "err", err)
	}
	c.log.Info("no longer leading the group", "group", GroupID, "term", cur.term)
}

// Broker is the broker this node serves while it leads, nil otherwise.
func (c *Cluster) Broker() *core.Broker {
	if cur := c.current.Load(); cur != nil {
		return cur.broker
	}
	return nil
}

// Close leaves the serving state, shuts raft down and closes the
// transport. The store stays open: it belongs to the caller.
func (c *Cluster) Close() error {
	c.closeOnce.Do(func() {
		close(c.stop)
		c.wg.Wait()
		c.raft.DeregisterObserver(c.obs)
		c.closeErr = errors.Join(c.raft.Shutdown().Error(), c.metrics.unregister())
		if closer, ok := c.trans.(raft.WithClose); ok {
			c.closeErr = errors.Join(c.closeErr, closer.Close())
		}
	})
	return c.closeErr
}

// proposer is a leader's core.Proposer: each batch becomes one raft entry
// of its session, answered once committed and applied here. After any
// failure it refuses everything: the entry may still commit, so the
// broker's memory may be behind the log, and the broker is replaced.
type proposer struct {
	raft    *raft.Raft
	session uint64
	failed  atomic.Bool
	rebuild chan<- struct{}
	metrics *metrics
}

func (p *proposer) Propose(b core.Batch, _ bool) error {
	if p.failed.Load() {
		return core.ErrNoLeader
	}
	start := time.Now()
	f := p.raft.Apply(encodeEntry(entryBatch, p.session, b.Repr()), applyTimeout)
	err := f.Error()
	if err == nil {
		err, _ = f.Response().(error)
	}
	p.metrics.observeCommit(start)
	if err != nil {
		p.fail()
		return fmt.Errorf("%w: %v", core.ErrNoLeader, err)
	}
	return nil
}

func (p *proposer) fail() {
	if !p.failed.Swap(true) {
		select {
		case p.rebuild <- struct{}{}:
		default:
		}
	}
}

// nodeInfo is what a node tells of itself on its cluster port.
type nodeInfo struct {
	ID           string `json:"id"`
	HTTPAddr     string `json:"httpAddr"`
	ClusterAddr  string `json:"clusterAddr"`
	State        string `json:"state"`
	Term         uint64 `json:"term"`
	LastIndex    uint64 `json:"lastIndex"`
	AppliedIndex uint64 `json:"appliedIndex"`
}

func (c *Cluster) self() nodeInfo {
	ni := nodeInfo{ID: c.cfg.NodeID, HTTPAddr: c.cfg.HTTPAdvertise, ClusterAddr: c.cfg.ClusterAdvertise, State: "unknown"}
	if c.running.Load() {
		ni.State = strings.ToLower(c.raft.State().String())
		ni.Term = c.raft.CurrentTerm()
		ni.LastIndex = c.raft.LastIndex()
		ni.AppliedIndex = c.raft.AppliedIndex()
	}
	return ni
}

func (c *Cluster) info() []byte {
	b, _ := json.Marshal(c.self())
	return b
}

// infoOf asks the node at a cluster address about itself.
func (c *Cluster) infoOf(ctx context.Context, addr string) (nodeInfo, error) {
	var ni nodeInfo
	if c.layer == nil {
		return ni, errors.New("cluster: no transport to ask other nodes on")
	}
	b, err := c.layer.Info(ctx, addr)
	if err != nil {
		return ni, err
	}
	if err := json.Unmarshal(b, &ni); err != nil {
		return ni, fmt.Errorf("cluster: info from %s: %w", addr, err)
	}
	c.infoMu.Lock()
	c.infos[addr] = ni
	c.infoMu.Unlock()
	return ni, nil
}

// cachedInfo is what the node at addr said last time, if it was asked.
func (c *Cluster) cachedInfo(addr string) (nodeInfo, bool) {
	c.infoMu.Lock()
	defer c.infoMu.Unlock()
	ni, ok := c.infos[addr]
	return ni, ok
}

// hcLogger writes raft's logs to slog, warnings and errors only unless
// debugging: raft is chatty at info.
func newHCLogger(log *slog.Logger) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{
		Name: "raft", Level: hclog.Warn, Output: slogWriter{log.With("component", "raft")},
		DisableTime: true,
	})
}

type slogWriter struct{ log *slog.Logger }

func (w slogWriter) Write(p []byte) (int, error) {
	w.log.Warn(strings.TrimSpace(string(p)))
	return len(p), nil
}

var _ io.Writer = slogWriter{}
