package gateway

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"

	"github.com/go-chi/chi/v5"

	"github.com/tidemq/tidemq/core"
)

// Cluster is what the gateway asks about the cluster the node is in. nil in Options: a single node,
// which answers one group "g1" with one member, itself, the leader (SPEC §7.1).
type Cluster interface {
	View(ctx context.Context) (ClusterView, error)
	AddMember(ctx context.Context, m MemberRequest) (ClusterGroup, error)
	RemoveMember(ctx context.Context, id, group string) (ClusterGroup, error)
}

// ClusterView is the reply to GET /v1/cluster: the node answering, every
// broker group with its members, and every node known to the cluster.
type ClusterView struct {
	Node   string         `json:"node"`
	Groups []ClusterGroup `json:"groups"`
	Nodes  []ClusterNode  `json:"nodes"`
}

// ClusterGroup is one broker group (a Raft group) and its membership.
type ClusterGroup struct {
	ID      string          `json:"id"`
	Leader  string          `json:"leader"` // the leader's node id; "" while there is none
	Term    uint64          `json:"term"`
	Members []ClusterMember `json:"members"`
}

// ClusterMember is one replica of a group, as its group's leader (or the
// answering node) sees it.
type ClusterMember struct {
	ID           string `json:"id"`
	ClusterAddr  string `json:"clusterAddr"`
	HTTPAddr     string `json:"httpAddr"`
	Suffrage     string `json:"suffrage"` // "voter" or "nonvoter"
	State        string `json:"state"`    // "leader", "follower", "candidate" or "unknown"
	LastIndex    uint64 `json:"lastIndex"`
	AppliedIndex uint64 `json:"appliedIndex"`
}

// ClusterNode is one node of the cluster and whether it answers.
type ClusterNode struct {
	ID       string `json:"id"`
	HTTPAddr string `json:"httpAddr"`
	Alive    bool   `json:"alive"`
}

// MemberRequest is the body of POST /v1/cluster/members, validated against
// openapi.yaml (id a name, both addresses host:port) with Group defaulted
// to DefaultGroup.
type MemberRequest struct {
	ID          string `json:"id"`
	ClusterAddr string `json:"clusterAddr"`
	HTTPAddr    string `json:"httpAddr"`
	Group       string `json:"group"`
}

// Errors a Cluster returns, mapped by the problem table:
var (
	ErrNoLeader       = core.ErrNoLeader               // 503 no_leader, Retry-After: 1
	ErrGroupNotFound  = errors.New("group not found")  // 404 group_not_found
	ErrMemberNotFound = errors.New("member not found") // 404 member_not_found
	ErrMemberConflict = errors.New("member conflict")  // 409 member_conflict (id or address already used differently)
)

// errNotClustered refuses a membership change on a node started without
// cluster flags: there is no Raft group to change.
var errNotClustered = errors.New("this node runs as a single node, not in a cluster: membership cannot change; start the nodes with --node-id, --cluster-addr and --peers")

// DefaultGroup is the broker group a single node has, and the one a
// membership request names when it names none.
const DefaultGroup = "g1"

// DefaultNodeID names a single node when Options.NodeID is empty.
const DefaultNodeID = "tidemq"

// Problem kinds of the cluster API; no_leader has its own writer
// (WriteNoLeader) for the cluster's forwarder.
var (
	kindNoLeader     = problemKind{503, "no_leader", "No leader"}
	kindNotClustered = problemKind{409, "not_clustered", "Not a cluster"}
)

// noLeaderRetryAfter is the Retry-After of a no_leader reply, in seconds:
// an election takes about a second, far less than a not_ready restart.
const noLeaderRetryAfter = "1"

// WriteTooManyForwardedPolls writes the 429 too_many_requests problem with
// Retry-After: 1 of a pull a cluster node could not forward in time: the
// connections it holds to the leader for pulls (limit) are all taken by
// parked polls.
func WriteTooManyForwardedPolls(w http.ResponseWriter, limit int) {
	w.Header().Set("Retry-After", "1") // a parked poll ends when a message comes or its wait does: any moment
	writeProblem(w, problemOf(kindTooManyRequests, fmt.Sprintf("this node forwards at most %d pulls to the leader at once, and as many are parked there; retry after Retry-After seconds, or ask the leader or another node", limit)))
}

// WriteNoLeader writes the 503 no_leader problem with Retry-After: 1, the
// answer to a request for a group that has no leader (SPEC §7.2).
func WriteNoLeader(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Retry-After", noLeaderRetryAfter)
	writeProblem(w, problemOf(kindNoLeader, "the broker group has no leader (an election is under way); retry after Retry-After seconds"))
}

func (s *Server) getCluster(w http.ResponseWriter, r *http.Request, _ []byte) error {
	if s.opts.Cluster == nil {
		return writeJSON(w, http.StatusOK, s.singleNodeView(r))
	}
	v, err := s.opts.Cluster.View(r.Context())
	if err != nil {
		return err
	}
	if v.Groups == nil {
		v.Groups = []ClusterGroup{}
	}
	if v.Nodes == nil {
		v.Nodes = []ClusterNode{}
	}
	for i := range v.Groups {
		v.Groups[i] = groupOut(v.Groups[i])
	}
	return writeJSON(w, http.StatusOK, v)
}

// singleNodeView is a node without a cluster: one group, one member,
// itself, the leader of term 0 with indexes 0, as it keeps no Raft log.
// Its HTTP address is Options.HTTPAddr, else the address the request came
// in on.
func (s *Server) singleNodeView(r *http.Request) ClusterView {
	addr := s.opts.HTTPAddr
	if addr == "" {
		if a, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
			addr = a.String()
		}
	}
	id := s.opts.NodeID
	return ClusterView{
		Node: id,
		Groups: []ClusterGroup{{ID: DefaultGroup, Leader: id, Members: []ClusterMember{{
			ID: id, HTTPAddr: addr, Suffrage: "voter", State: "leader",
		}}}},
		Nodes: []ClusterNode{{ID: id, HTTPAddr: addr, Alive: true}},
	}
}

func (s *Server) addMember(w http.ResponseWriter, r *http.Request, body []byte) error {
	var req MemberRequest
	if err := decodeJSON(body, &req); err != nil {
		return err
	}
	if req.Group == "" {
		req.Group = DefaultGroup
	}
	if s.opts.Cluster == nil {
		return errNotClustered
	}
	g, err := s.opts.Cluster.AddMember(r.Context(), req)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusAccepted, groupOut(g))
}

func (s *Server) removeMember(w http.ResponseWriter, r *http.Request, _ []byte) error {
	group := r.URL.Query().Get("group")
	if group == "" {
		group = DefaultGroup
	}
	if s.opts.Cluster == nil {
		return errNotClustered
	}
	g, err := s.opts.Cluster.RemoveMember(r.Context(), chi.URLParam(r, "id"), group)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusAccepted, groupOut(g))
}

// groupOut makes a group's members a JSON array even when a Cluster gave
// none, as openapi.yaml promises.
func groupOut(g ClusterGroup) ClusterGroup {
	if g.Members == nil {
		g.Members = []ClusterMember{}
	}
	return g
}
