package cluster

import (
	"context"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
)

// metrics are the group's raft numbers for /metrics.
type metrics struct {
	meter         metric.Meter
	leaderChanges metric.Int64Counter
	snapshots     metric.Int64Counter
	pullsRefused  metric.Int64Counter     // pulls refused for want of a connection to the leader
	commit        metric.Float64Histogram // a proposal, from Apply to applied on the leader
	apply         metric.Float64Histogram // the state machine applying one entry
	registration  metric.Registration

	lagMu sync.Mutex
	lag   map[string]int64 // entries each follower's applied index is behind the leader's last index
}

func newMetrics(c *Cluster, mp metric.MeterProvider) (*metrics, error) {
	if mp == nil {
		mp = metricnoop.NewMeterProvider()
	}
	m := mp.Meter("github.com/tidemq/tidemq/internal/cluster")
	out := &metrics{meter: m, lag: map[string]int64{}}
	var err error
	counter := func(name, unit, desc string) metric.Int64Counter {
		if err != nil {
			return nil
		}
		var c metric.Int64Counter
		c, err = m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		return c
	}
	seconds := func(name, desc string) metric.Float64Histogram {
		if err != nil {
			return nil
		}
		var h metric.Float64Histogram
		h, err = m.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc),
			metric.WithExplicitBucketBoundaries(0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5))
		return h
	}
	out.leaderChanges = counter("tidemq.raft.leader_changes", "{change}", "Changes of the group's leader this node saw.")
	out.snapshots = counter("tidemq.raft.snapshots", "{snapshot}", "Snapshots of the group's state, taken here or restored here (kind).")
	out.pullsRefused = counter("tidemq.cluster.forwarded_pulls.refused", "{pull}", "Pulls this node refused with 429 instead of forwarding: its connections to the leader for pulls were all taken by parked polls.")
	out.commit = seconds("tidemq.raft.commit.duration", "A leader's proposal, from raft Apply until committed and applied here.")
	out.apply = seconds("tidemq.raft.apply.duration", "The state machine applying one committed entry.")
	return out, err
}

// register reports the node's raft numbers at every collection, from
// c.raft on (call it once raft runs).
func (m *metrics) register(c *Cluster) error {
	var err error
	gauge := func(name, unit, desc string) metric.Int64ObservableGauge {
		if err != nil {
			return nil
		}
		var g metric.Int64ObservableGauge
		g, err = m.meter.Int64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(desc))
		return g
	}
	term := gauge("tidemq.raft.term", "{term}", "The node's current raft term.")
	leader := gauge("tidemq.raft.leader", "{bool}", "1 while this node leads the group.")
	lastIndex := gauge("tidemq.raft.last_index", "{entry}", "The last index of this node's raft log.")
	commitIndex := gauge("tidemq.raft.commit_index", "{entry}", "The last index this node knows committed.")
	appliedIndex := gauge("tidemq.raft.applied_index", "{entry}", "The last index this node's state machine applied.")
	lag := gauge("tidemq.raft.replication.lag", "{entry}", "On the leader: how many entries each follower's applied index is behind the leader's log.")
	if err != nil {
		return err
	}
	group := metric.WithAttributes(attribute.String("group", GroupID))
	m.registration, err = m.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		r := c.raft
		o.ObserveInt64(term, int64(r.CurrentTerm()), group)
		isLeader := int64(0)
		if c.Broker() != nil {
			isLeader = 1
		}
		o.ObserveInt64(leader, isLeader, group)
		o.ObserveInt64(lastIndex, int64(r.LastIndex()), group)
		o.ObserveInt64(commitIndex, int64(r.CommitIndex()), group)
		o.ObserveInt64(appliedIndex, int64(c.fsm.applied.Load()), group)
		m.lagMu.Lock()
		for id, n := range m.lag {
			o.ObserveInt64(lag, n, metric.WithAttributes(attribute.String("group", GroupID), attribute.String("follower", id)))
		}
		m.lagMu.Unlock()
		return nil
	}, term, leader, lastIndex, commitIndex, appliedIndex, lag)
	return err
}

func (m *metrics) unregister() error {
	if m.registration == nil {
		return nil
	}
	return m.registration.Unregister()
}

func (m *metrics) observeCommit(start time.Time) {
	m.commit.Record(context.Background(), time.Since(start).Seconds())
}

func (m *metrics) observeApply(start time.Time) {
	m.apply.Record(context.Background(), time.Since(start).Seconds())
}

func (m *metrics) snapshot(kind string) {
	m.snapshots.Add(context.Background(), 1, metric.WithAttributes(attribute.String("group", GroupID), attribute.String("kind", kind)))
}

func (m *metrics) pullRefused() {
	m.pullsRefused.Add(context.Background(), 1, metric.WithAttributes(attribute.String("group", GroupID)))
}

func (m *metrics) leaderChanged() {
	m.leaderChanges.Add(context.Background(), 1, metric.WithAttributes(attribute.String("group", GroupID)))
}

// setLag replaces the followers' lag with what the leader measured; nil
// clears it (this node does not lead).
func (m *metrics) setLag(lag map[string]int64) {
	m.lagMu.Lock()
	m.lag = lag
	m.lagMu.Unlock()
}

// watchMembers runs while the node is up: on the leader, once a second,
// it asks every member about itself, records how far each follower is
// behind and promotes caught-up non-voters.
func (c *Cluster) watchMembers() {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-c.stop
		cancel()
	}()
	for {
		select {
		case <-c.stop:
			return
		case <-tick.C:
		}
		if c.Broker() == nil || c.layer == nil {
			c.metrics.setLag(nil)
			continue
		}
		members, err := c.membersNow(ctx)
		if err != nil {
			continue
		}
		last := c.raft.LastIndex()
		lag := map[string]int64{}
		for _, m := range members {
			if string(m.server.ID) != c.cfg.NodeID && m.alive {
				lag[string(m.server.ID)] = int64(last) - int64(m.info.AppliedIndex)
			}
		}
		c.metrics.setLag(lag)
		c.promoteCaughtUp(ctx)
	}
}
