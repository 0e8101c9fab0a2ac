package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/tidemq/tidemq/gateway"
)

var _ gateway.Cluster = (*Cluster)(nil)

// askTimeout bounds asking one node about itself for a view.
const askTimeout = 500 * time.Millisecond

// memberInfo is one configured server of the group and what it said.
type memberInfo struct {
	server raft.Server
	info   nodeInfo
	alive  bool
}

// membersNow asks every member of the group's configuration about itself,
// at once; a member that does not answer is not alive, and keeps what it
// said last.
func (c *Cluster) membersNow(ctx context.Context) ([]memberInfo, error) {
	f := c.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return nil, fmt.Errorf("cluster: configuration: %w", err)
	}
	servers := f.Configuration().Servers
	out := make([]memberInfo, len(servers))
	var wg sync.WaitGroup
	for i, s := range servers {
		out[i].server = s
		if string(s.ID) == c.cfg.NodeID {
			out[i].info, out[i].alive = c.self(), true
			continue
		}
		wg.Go(func() {
			ictx, cancel := context.WithTimeout(ctx, askTimeout)
			defer cancel()
			ni, err := c.infoOf(ictx, string(s.Address))
			if err == nil && ni.ID == string(s.ID) {
				out[i].info, out[i].alive = ni, true
				return
			}
			out[i].info, _ = c.cachedInfo(string(s.Address))
			out[i].info.ID, out[i].info.State = string(s.ID), "unknown"
		})
	}
	wg.Wait()
	return out, nil
}

func (c *Cluster) groupView(members []memberInfo) gateway.ClusterGroup {
	_, leader := c.raft.LeaderWithID()
	g := gateway.ClusterGroup{ID: GroupID, Leader: string(leader), Term: c.raft.CurrentTerm(), Members: []gateway.ClusterMember{}}
	for _, m := range members {
		suffrage := "voter"
		if m.server.Suffrage != raft.Voter {
			suffrage = "nonvoter"
		}
		state := m.info.State
		if !m.alive || (state != "leader" && state != "follower" && state != "candidate") {
			state = "unknown"
		}
		g.Members = append(g.Members, gateway.ClusterMember{
			ID: string(m.server.ID), ClusterAddr: string(m.server.Address), HTTPAddr: m.info.HTTPAddr,
			Suffrage: suffrage, State: state, LastIndex: m.info.LastIndex, AppliedIndex: m.info.AppliedIndex,
		})
	}
	return g
}

// View implements gateway.Cluster: this node's view of its group, every
// member asked about itself.
func (c *Cluster) View(ctx context.Context) (gateway.ClusterView, error) {
	members, err := c.membersNow(ctx)
	if err != nil {
		return gateway.ClusterView{}, err
	}
	v := gateway.ClusterView{Node: c.cfg.NodeID, Groups: []gateway.ClusterGroup{c.groupView(members)}, Nodes: []gateway.ClusterNode{}}
	for _, m := range members {
		v.Nodes = append(v.Nodes, gateway.ClusterNode{ID: string(m.server.ID), HTTPAddr: m.info.HTTPAddr, Alive: m.alive})
	}
	return v, nil
}

func checkGroup(group string) error {
	if group != "" && group != GroupID {
		return fmt.Errorf("%w: %q (this cluster has one group, %s)", gateway.ErrGroupNotFound, group, GroupID)
	}
	return nil
}

// membershipTimeout bounds one configuration change.
const membershipTimeout = 10 * time.Second

// AddMember implements gateway.Cluster: the node joins as a non-voter; the
// leader promotes it to voter once it has caught up (promoteCaughtUp).
func (c *Cluster) AddMember(ctx context.Context, m gateway.MemberRequest) (gateway.ClusterGroup, error) {
	if err := checkGroup(m.Group); err != nil {
		return gateway.ClusterGroup{}, err
	}
	if c.raft.State() != raft.Leader {
		return gateway.ClusterGroup{}, gateway.ErrNoLeader
	}
	f := c.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return gateway.ClusterGroup{}, err
	}
	for _, s := range f.Configuration().Servers {
		switch {
		case string(s.ID) == m.ID && string(s.Address) == m.ClusterAddr:
			return c.groupNow(ctx) // already a member: nothing to change
		case string(s.ID) == m.ID:
			return gateway.ClusterGroup{}, fmt.Errorf("%w: node %s is a member at %s", gateway.ErrMemberConflict, m.ID, s.Address)
		case string(s.Address) == m.ClusterAddr:
			return gateway.ClusterGroup{}, fmt.Errorf("%w: %s is node %s's cluster address", gateway.ErrMemberConflict, m.ClusterAddr, s.ID)
		}
	}
	c.infoMu.Lock()
	c.infos[m.ClusterAddr] = nodeInfo{ID: m.ID, HTTPAddr: m.HTTPAddr, ClusterAddr: m.ClusterAddr, State: "unknown"}
	c.infoMu.Unlock()
	if err := c.raft.AddNonvoter(raft.ServerID(m.ID), raft.ServerAddress(m.ClusterAddr), 0, membershipTimeout).Error(); err != nil {
		return gateway.ClusterGroup{}, membershipError(err)
	}
	c.log.Info("member added as a non-voter", "member", m.ID, "cluster_addr", m.ClusterAddr)
	return c.groupNow(ctx)
}

// RemoveMember implements gateway.Cluster. A leader asked to remove itself
// hands leadership on first, and the new leader removes it.
func (c *Cluster) RemoveMember(ctx context.Context, id, group string) (gateway.ClusterGroup, error) {
	if err := checkGroup(group); err != nil {
		return gateway.ClusterGroup{}, err
	}
	if c.raft.State() != raft.Leader {
		return gateway.ClusterGroup{}, gateway.ErrNoLeader
	}
	f := c.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return gateway.ClusterGroup{}, err
	}
	found := false
	for _, s := range f.Configuration().Servers {
		found = found || string(s.ID) == id
	}
	if !found {
		return gateway.ClusterGroup{}, fmt.Errorf("%w: %s", gateway.ErrMemberNotFound, id)
	}
	if id == c.cfg.NodeID {
		return c.removeSelf(ctx, id)
	}
	if err := c.raft.RemoveServer(raft.ServerID(id), 0, membershipTimeout).Error(); err != nil {
		return gateway.ClusterGroup{}, membershipError(err)
	}
	c.log.Info("member removed", "member", id)
	return c.groupNow(ctx)
}

// removeSelf hands leadership to another voter, then asks the new leader,
// with the caller's credentials, to remove this node.
func (c *Cluster) removeSelf(ctx context.Context, id string) (gateway.ClusterGroup, error) {
	if err := c.raft.LeadershipTransfer().Error(); err != nil {
		return gateway.ClusterGroup{}, membershipError(err)
	}
	c.log.Info("leadership handed on before removing this node")
	wctx, cancel := context.WithTimeout(ctx, leaderWait)
	defer cancel()
	for {
		if addr, _ := c.leaderHTTP(wctx); addr != "" {
			g, err := c.removeAt(wctx, addr, id)
			if !errors.Is(err, errNotReady) {
				return g, err
			}
		}
		select {
		case <-wctx.Done():
			return gateway.ClusterGroup{}, gateway.ErrNoLeader
		case <-c.changes():
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (c *Cluster) removeAt(ctx context.Context, addr, id string) (gateway.ClusterGroup, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodDelete, "http://"+addr+"/v1/cluster/members/"+id+"?group="+GroupID, nil)
	if err != nil {
		return gateway.ClusterGroup{}, err
	}
	if h, ok := ctx.Value(callerKey{}).(http.Header); ok {
		for _, k := range []string{"Authorization", "Traceparent", "Tracestate"} {
			if v := h.Get(k); v != "" {
				req.Header.Set(k, v)
			}
		}
	}
	req.Header.Set(forwardedHeader, c.cfg.NodeID)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return gateway.ClusterGroup{}, fmt.Errorf("%w: new leader at %s: %v", gateway.ErrNoLeader, addr, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusServiceUnavailable && resp.Header.Get(notLeaderHeader) != "" {
		return gateway.ClusterGroup{}, errNotReady
	}
	if resp.StatusCode != http.StatusAccepted {
		return gateway.ClusterGroup{}, fmt.Errorf("%w: the new leader answered %s", gateway.ErrNoLeader, resp.Status)
	}
	var g gateway.ClusterGroup
	if err := json.NewDecoder(resp.Body).Decode(&g); err != nil {
		return gateway.ClusterGroup{}, fmt.Errorf("cluster: the new leader's reply: %w", err)
	}
	return g, nil
}

// errNotReady: the new leader is not serving yet.
var errNotReady = errors.New("cluster: the new leader is not serving yet")

// callerKey carries the caller's headers to a removal the new leader does.
type callerKey struct{}

func (c *Cluster) groupNow(ctx context.Context) (gateway.ClusterGroup, error) {
	members, err := c.membersNow(ctx)
	if err != nil {
		return gateway.ClusterGroup{}, err
	}
	return c.groupView(members), nil
}

// membershipError maps raft's refusals of a configuration change.
func membershipError(err error) error {
	if errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipLost) ||
		errors.Is(err, raft.ErrLeadershipTransferInProgress) || errors.Is(err, raft.ErrEnqueueTimeout) {
		return fmt.Errorf("%w: %v", gateway.ErrNoLeader, err)
	}
	if strings.Contains(err.Error(), "configuration changed since") {
		return fmt.Errorf("%w: %v", gateway.ErrMemberConflict, err)
	}
	return fmt.Errorf("cluster: membership change: %w", err)
}

// promoteCaughtUp makes voters of non-voters that have applied everything
// the leader had committed when they were last asked: a node added to the
// group votes once it could serve as leader without a long catch-up.
func (c *Cluster) promoteCaughtUp(ctx context.Context) {
	if c.raft.State() != raft.Leader || c.layer == nil {
		return
	}
	f := c.raft.GetConfiguration()
	if f.Error() != nil {
		return
	}
	commit := c.raft.CommitIndex()
	for _, s := range f.Configuration().Servers {
		if s.Suffrage == raft.Voter {
			continue
		}
		ictx, cancel := context.WithTimeout(ctx, askTimeout)
		ni, err := c.infoOf(ictx, string(s.Address))
		cancel()
		if err != nil || ni.ID != string(s.ID) || ni.AppliedIndex+catchUpSlack < commit {
			continue
		}
		if err := c.raft.AddVoter(s.ID, s.Address, 0, membershipTimeout).Error(); err != nil {
			c.log.Warn("caught-up member not promoted", "member", s.ID, "err", err)
			continue
		}
		c.log.Info("member caught up, promoted to voter", "member", s.ID, "applied_index", ni.AppliedIndex)
	}
}

// catchUpSlack is how far behind the leader's commit index a non-voter
// may be and still be promoted: writes go on while it catches up.
const catchUpSlack = 64
