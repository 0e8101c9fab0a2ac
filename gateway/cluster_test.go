package gateway_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/tidemq/tidemq/gateway"
)

// The cluster API (/v1/cluster) through the real wiring, with a test
// double of gateway.Cluster: the real one is a Raft cluster, tested with
// its package. Every reply is held to openapi.yaml by the test client.

// fakeCluster is a three-node cluster, one group g1 led by n2, whose
// membership changes apply at once. err, when set, is what every method
// returns instead.
type fakeCluster struct {
	mu      sync.Mutex
	view    gateway.ClusterView
	err     error
	added   []gateway.MemberRequest
	removed [][2]string // id, group
}

func newFakeCluster() *fakeCluster {
	member := func(id, state string, last, applied uint64) gateway.ClusterMember {
		n := id[1:]
		return gateway.ClusterMember{ID: id, ClusterAddr: "127.0.0.1:700" + n, HTTPAddr: "127.0.0.1:808" + n,
			Suffrage: "voter", State: state, LastIndex: last, AppliedIndex: applied}
	}
	return &fakeCluster{view: gateway.ClusterView{
		Node: "n1",
		Groups: []gateway.ClusterGroup{{ID: "g1", Leader: "n2", Term: 7, Members: []gateway.ClusterMember{
			member("n1", "follower", 1234, 1230), member("n2", "leader", 1240, 1240), member("n3", "follower", 1200, 1190),
		}}},
		Nodes: []gateway.ClusterNode{
			{ID: "n1", HTTPAddr: "127.0.0.1:8081", Alive: true},
			{ID: "n2", HTTPAddr: "127.0.0.1:8082", Alive: true},
			{ID: "n3", HTTPAddr: "127.0.0.1:8083", Alive: false},
		},
	}}
}

func (f *fakeCluster) setErr(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.err = err
}

func (f *fakeCluster) View(context.Context) (gateway.ClusterView, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return gateway.ClusterView{}, f.err
	}
	v := f.view
	v.Groups = slices.Clone(v.Groups)
	for i := range v.Groups {
		v.Groups[i].Members = slices.Clone(v.Groups[i].Members)
	}
	v.Nodes = slices.Clone(v.Nodes)
	return v, nil
}

func (f *fakeCluster) group(id string) (*gateway.ClusterGroup, error) {
	for i := range f.view.Groups {
		if f.view.Groups[i].ID == id {
			return &f.view.Groups[i], nil
		}
	}
	return nil, fmt.Errorf("group %s: %w", id, gateway.ErrGroupNotFound)
}

func (f *fakeCluster) AddMember(_ context.Context, m gateway.MemberRequest) (gateway.ClusterGroup, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.added = append(f.added, m)
	if f.err != nil {
		return gateway.ClusterGroup{}, f.err
	}
	g, err := f.group(m.Group)
	if err != nil {
		return gateway.ClusterGroup{}, err
	}
	for _, x := range g.Members {
		if x.ID == m.ID || x.ClusterAddr == m.ClusterAddr {
			return gateway.ClusterGroup{}, fmt.Errorf("%s at %s: %w", m.ID, m.ClusterAddr, gateway.ErrMemberConflict)
		}
	}
	g.Members = append(g.Members, gateway.ClusterMember{ID: m.ID, ClusterAddr: m.ClusterAddr, HTTPAddr: m.HTTPAddr,
		Suffrage: "nonvoter", State: "follower"})
	return *g, nil
}

func (f *fakeCluster) RemoveMember(_ context.Context, id, group string) (gateway.ClusterGroup, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.removed = append(f.removed, [2]string{id, group})
	if f.err != nil {
		return gateway.ClusterGroup{}, f.err
	}
	g, err := f.group(group)
	if err != nil {
		return gateway.ClusterGroup{}, err
	}
	i := slices.IndexFunc(g.Members, func(m gateway.ClusterMember) bool { return m.ID == id })
	if i < 0 {
		return gateway.ClusterGroup{}, fmt.Errorf("%s in %s: %w", id, group, gateway.ErrMemberNotFound)
	}
	g.Members = slices.Delete(g.Members, i, i+1)
	return *g, nil
}

func clusterPath(id string) string { return "/v1/cluster/members/" + id }

var newMember = map[string]any{"id": "n4", "clusterAddr": "127.0.0.1:7004", "httpAddr": "127.0.0.1:8084"}

// TestClusterSingleNode: without a Cluster the node is a cluster of one:
// one group g1, one voter member, itself the leader; membership changes
// are 409 not_clustered, after the body is validated.
func TestClusterSingleNode(t *testing.T) {
	ts := startServer(t, serverConfig{})
	c := ts.client(t)
	v := decode[gateway.ClusterView](t, c.do("GET", "/v1/cluster", nil))
	want := gateway.ClusterView{
		Node: "tidemq",
		Groups: []gateway.ClusterGroup{{ID: "g1", Leader: "tidemq", Term: 0, Members: []gateway.ClusterMember{
			{ID: "tidemq", HTTPAddr: ts.Addr, Suffrage: "voter", State: "leader"},
		}}},
		Nodes: []gateway.ClusterNode{{ID: "tidemq", HTTPAddr: ts.Addr, Alive: true}},
	}
	if fmt.Sprint(v) != fmt.Sprint(want) {
		t.Errorf("single node view\n got %+v\nwant %+v", v, want)
	}

	r := c.do("POST", "/v1/cluster/members", newMember)
	wantProblem(t, r, http.StatusConflict, "not_clustered")
	wantProblem(t, c.do("DELETE", clusterPath("tidemq"), nil), http.StatusConflict, "not_clustered")
	wantProblem(t, c.do("DELETE", clusterPath("tidemq")+"?group=g2", nil), http.StatusConflict, "not_clustered")
	// Validation comes first: a bad body is a 400 even on a single node.
	wantProblem(t, c.do("POST", "/v1/cluster/members", map[string]any{"id": "n4", "clusterAddr": "x", "httpAddr": "127.0.0.1:8084"}), 400, "invalid_request")

	// The node's name and advertised address, when given.
	named := startServer(t, serverConfig{gateway: gateway.Options{NodeID: "solo-1", HTTPAddr: "node1.internal:8080"}})
	v = decode[gateway.ClusterView](t, named.client(t).do("GET", "/v1/cluster", nil))
	g := v.Groups[0]
	if v.Node != "solo-1" || g.Leader != "solo-1" || g.Members[0].ID != "solo-1" || g.Members[0].HTTPAddr != "node1.internal:8080" ||
		v.Nodes[0] != (gateway.ClusterNode{ID: "solo-1", HTTPAddr: "node1.internal:8080", Alive: true}) {
		t.Errorf("named single node view %+v", v)
	}
}

// TestClusterNeedsAdmin: every cluster operation is refused without a
// token (401) and with a token that is not an admin of everything (403),
// before its body or the cluster is looked at.
func TestClusterNeedsAdmin(t *testing.T) {
	fc := newFakeCluster()
	ts := startServer(t, serverConfig{gateway: gateway.Options{Cluster: fc}})
	ts.gw.SetTokens(testTokens(t))
	c := ts.client(t)
	ops := []struct {
		method, path string
		body         any
		ok           int
	}{
		{"GET", "/v1/cluster", nil, 200},
		{"POST", "/v1/cluster/members", newMember, 202},
		{"DELETE", clusterPath("n4"), nil, 202},
	}
	for _, op := range ops {
		for _, tc := range []struct {
			token  string
			status int
			code   string
		}{
			{"", 401, "unauthenticated"},
			{"tmq_unknown", 401, "unauthenticated"},
			{publisherToken, 403, "forbidden"},
			{consumerToken, 403, "forbidden"},
		} {
			h := hdr{}
			if tc.token != "" {
				h = bearer(tc.token)
			}
			wantProblem(t, c.do(op.method, op.path, op.body, h), tc.status, tc.code)
		}
		// A bad body from a non-admin is still a 403: permission first.
		if op.body != nil {
			wantProblem(t, c.do(op.method, op.path, "{", bearer(publisherToken)), 403, "forbidden")
		}
	}
	fc.mu.Lock()
	calls := len(fc.added) + len(fc.removed)
	fc.mu.Unlock()
	if calls != 0 {
		t.Fatalf("refused requests reached the cluster %d times", calls)
	}
	for _, op := range ops {
		wantStatus(t, c.do(op.method, op.path, op.body, bearer(adminToken)), op.ok)
	}
}

// TestClusterMemberValidation: a membership request is checked against
// openapi.yaml (id a name, addresses host:port, group a name) and refused
// with the pointer of the bad field, before the cluster sees it.
func TestClusterMemberValidation(t *testing.T) {
	fc := newFakeCluster()
	ts := startServer(t, serverConfig{gateway: gateway.Options{Cluster: fc}})
	c := ts.client(t)
	with := func(k string, v any) map[string]any {
		m := map[string]any{"id": "n4", "clusterAddr": "127.0.0.1:7004", "httpAddr": "127.0.0.1:8084"}
		if v == nil {
			delete(m, k)
		} else {
			m[k] = v
		}
		return m
	}
	for _, tc := range []struct {
		name    string
		body    any
		pointer string
	}{
		{"id not a name", with("id", "-n4"), "/id"},
		{"id with a slash", with("id", "n/4"), "/id"},
		{"id too long", with("id", strings.Repeat("n", 128)), "/id"},
		{"id not a string", with("id", 4), "/id"},
		{"clusterAddr without port", with("clusterAddr", "127.0.0.1"), "/clusterAddr"},
		{"clusterAddr port 0", with("clusterAddr", "127.0.0.1:0"), "/clusterAddr"},
		{"clusterAddr port 65536", with("clusterAddr", "127.0.0.1:65536"), "/clusterAddr"},
		{"clusterAddr a URL", with("clusterAddr", "http://127.0.0.1:7004"), "/clusterAddr"},
		{"httpAddr empty", with("httpAddr", ""), "/httpAddr"},
		{"httpAddr unbracketed IPv6", with("httpAddr", "::1:8084"), "/httpAddr"},
		{"group not a name", with("group", "g 1"), "/group"},
		{"unknown field", with("voter", true), "/voter"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := wantProblem(t, c.on(t).do("POST", "/v1/cluster/members", tc.body), 400, "invalid_request")
			if p.Pointer != tc.pointer {
				t.Errorf("pointer %q, want %q: %+v", p.Pointer, tc.pointer, p)
			}
		})
	}
	for _, missing := range []string{"id", "clusterAddr", "httpAddr"} {
		p := wantProblem(t, c.do("POST", "/v1/cluster/members", with(missing, nil)), 400, "invalid_request")
		if p.Pointer != "/"+missing || !strings.Contains(p.Detail, missing) {
			t.Errorf("without %s: pointer %q, detail %q", missing, p.Pointer, p.Detail)
		}
	}
	wantProblem(t, c.do("POST", "/v1/cluster/members", nil), 400, "invalid_request")
	wantProblem(t, c.do("POST", "/v1/cluster/members", "{"), 400, "invalid_request")
	wantProblem(t, c.do("DELETE", clusterPath("-n4"), nil), 400, "invalid_request")
	wantProblem(t, c.do("DELETE", clusterPath("n3")+"?group=g%201", nil), 400, "invalid_request")
	fc.mu.Lock()
	calls := len(fc.added) + len(fc.removed)
	fc.mu.Unlock()
	if calls != 0 {
		t.Fatalf("invalid requests reached the cluster %d times", calls)
	}

	// What is valid reaches it, with the group defaulted.
	for _, addr := range []string{"[::1]:7004", "node4.internal:7004", "10.0.0.4:65535"} {
		wantStatus(t, c.do("POST", "/v1/cluster/members", with("clusterAddr", addr)), 202)
		wantStatus(t, c.do("DELETE", clusterPath("n4"), nil), 202)
	}
	fc.mu.Lock()
	defer fc.mu.Unlock()
	for _, m := range fc.added {
		if m.Group != "g1" || m.ID != "n4" || m.HTTPAddr != "127.0.0.1:8084" {
			t.Errorf("the cluster got %+v, want n4 in g1", m)
		}
	}
}

// TestClusterMembership: a 202 answers each change with the group's new
// membership, as the Cluster gave it; the group is the one asked for.
func TestClusterMembership(t *testing.T) {
	fc := newFakeCluster()
	fc.view.Groups = append(fc.view.Groups, gateway.ClusterGroup{ID: "g2", Leader: "n3", Term: 2})
	ts := startServer(t, serverConfig{gateway: gateway.Options{Cluster: fc}})
	c := ts.client(t)

	v := decode[gateway.ClusterView](t, c.do("GET", "/v1/cluster", nil))
	if v.Node != "n1" || len(v.Groups) != 2 || v.Groups[0].Leader != "n2" || v.Groups[0].Term != 7 || len(v.Groups[0].Members) != 3 ||
		v.Groups[0].Members[2].AppliedIndex != 1190 || len(v.Nodes) != 3 || v.Nodes[2].Alive {
		t.Fatalf("view %+v", v)
	}
	if v.Groups[1].Members == nil {
		t.Error("a group the Cluster gave no members is not an empty array")
	}

	r := c.do("POST", "/v1/cluster/members", newMember)
	wantStatus(t, r, http.StatusAccepted)
	g := decode[gateway.ClusterGroup](t, r)
	if g.ID != "g1" || len(g.Members) != 4 || g.Members[3] != (gateway.ClusterMember{ID: "n4", ClusterAddr: "127.0.0.1:7004", HTTPAddr: "127.0.0.1:8084", Suffrage: "nonvoter", State: "follower"}) {
		t.Errorf("after adding n4: %+v", g)
	}
	r = c.do("POST", "/v1/cluster/members", map[string]any{"id": "n5", "clusterAddr": "127.0.0.1:7005", "httpAddr": "127.0.0.1:8085", "group": "g2"})
	wantStatus(t, r, http.StatusAccepted)
	if g := decode[gateway.ClusterGroup](t, r); g.ID != "g2" || len(g.Members) != 1 || g.Members[0].ID != "n5" {
		t.Errorf("after adding n5 to g2: %+v", g)
	}

	r = c.do("DELETE", clusterPath("n4"), nil)
	wantStatus(t, r, http.StatusAccepted)
	if g := decode[gateway.ClusterGroup](t, r); g.ID != "g1" || len(g.Members) != 3 || slices.ContainsFunc(g.Members, func(m gateway.ClusterMember) bool { return m.ID == "n4" }) {
		t.Errorf("after removing n4: %+v", g)
	}
	r = c.do("DELETE", clusterPath("n5")+"?group=g2", nil)
	wantStatus(t, r, http.StatusAccepted)
	if g := decode[gateway.ClusterGroup](t, r); g.ID != "g2" || len(g.Members) != 0 {
		t.Errorf("after removing n5 from g2: %+v", g)
	}
	fc.mu.Lock()
	defer fc.mu.Unlock()
	if want := [][2]string{{"n4", "g1"}, {"n5", "g2"}}; !slices.Equal(fc.removed, want) {
		t.Errorf("the cluster was asked to remove %v, want %v", fc.removed, want)
	}
}

// TestClusterErrors: the Cluster's errors, wrapped or not, map to their
// problems; no_leader carries Retry-After: 1.
func TestClusterErrors(t *testing.T) {
	fc := newFakeCluster()
	ts := startServer(t, serverConfig{gateway: gateway.Options{Cluster: fc}})
	c := ts.client(t)

	// From the Cluster's own logic: a missing group or member, a conflict.
	wantProblem(t, c.do("POST", "/v1/cluster/members", map[string]any{"id": "n4", "clusterAddr": "127.0.0.1:7004", "httpAddr": "127.0.0.1:8084", "group": "g9"}), 404, "group_not_found")
	wantProblem(t, c.do("DELETE", clusterPath("n9"), nil), 404, "member_not_found")
	wantProblem(t, c.do("DELETE", clusterPath("n1")+"?group=g9", nil), 404, "group_not_found")
	wantProblem(t, c.do("POST", "/v1/cluster/members", map[string]any{"id": "n2", "clusterAddr": "127.0.0.1:7009", "httpAddr": "127.0.0.1:8089"}), 409, "member_conflict")

	ops := []struct{ method, path string }{
		{"GET", "/v1/cluster"}, {"POST", "/v1/cluster/members"}, {"DELETE", clusterPath("n3")},
	}
	for _, tc := range []struct {
		err    error
		status int
		code   string
	}{
		{gateway.ErrNoLeader, 503, "no_leader"},
		{fmt.Errorf("group g1: waited 5s: %w", gateway.ErrNoLeader), 503, "no_leader"},
		{fmt.Errorf("g1: %w", gateway.ErrGroupNotFound), 404, "group_not_found"},
		{fmt.Errorf("n3: %w", gateway.ErrMemberNotFound), 404, "member_not_found"},
		{fmt.Errorf("n3: %w", gateway.ErrMemberConflict), 409, "member_conflict"},
	} {
		fc.setErr(tc.err)
		for _, op := range ops {
			if op.method == "GET" && tc.status != 503 {
				continue // a view has no group or member to miss
			}
			var body any
			if op.method == "POST" {
				body = newMember
			}
			r := c.do(op.method, op.path, body)
			p := wantProblem(t, r, tc.status, tc.code)
			if p.Detail != tc.err.Error() {
				t.Errorf("%s %s: detail %q, want the error's %q", op.method, op.path, p.Detail, tc.err)
			}
			if ra := r.header.Get("Retry-After"); tc.status == 503 && ra != "1" {
				t.Errorf("%s %s: no_leader with Retry-After %q, want 1", op.method, op.path, ra)
			}
		}
	}
}

// TestWriteNoLeader: the writer the cluster's forwarder answers with is
// the 503 no_leader problem with Retry-After: 1, a reply openapi.yaml
// documents on the operations that touch a queue.
func TestWriteNoLeader(t *testing.T) {
	rec := httptest.NewRecorder()
	gateway.WriteNoLeader(rec, httptest.NewRequest("POST", "/v1/topics/orders/messages", nil))
	res := rec.Result()
	if res.StatusCode != 503 || res.Header.Get("Retry-After") != "1" || res.Header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("WriteNoLeader: %d %v", res.StatusCode, res.Header)
	}
	p, err := decodeProblem(rec.Body.Bytes())
	if err != nil || p.Code != "no_leader" || p.Status != 503 || p.Title == "" || p.Detail == "" {
		t.Fatalf("WriteNoLeader problem %+v (%v)", p, err)
	}
	c := (&testServer{URL: "http://127.0.0.1:1"}).client(t)
	for _, op := range []struct{ method, path string }{
		{"POST", "/v1/topics/orders/messages"}, {"POST", "/v1/topics/orders/messages:batch"},
		{"POST", "/v1/topics/orders/subscriptions/billing/pull"}, {"POST", "/v1/topics/orders/subscriptions/billing/ack"},
		{"PUT", "/v1/topics/orders"}, {"GET", "/v1/topics/orders/messages/abc"}, {"GET", "/v1/cluster"},
	} {
		req := c.request(context.Background(), op.method, op.path, nil, nil)
		if v := c.violations(req, &reply{status: res.StatusCode, header: res.Header, body: rec.Body.Bytes()}); len(v) > 0 {
			t.Errorf("a no_leader reply to %s %s breaks the contract: %v", op.method, op.path, v)
		}
	}
}

// TestSpecDocumentsNoLeader: every /v1 operation has the 503 response
// that names no_leader and its Retry-After, and the error codes of the
// cluster API are in the Problem code enum.
func TestSpecDocumentsNoLeader(t *testing.T) {
	doc, err := gateway.LoadSpec()
	if err != nil {
		t.Fatal(err)
	}
	var n int
	for path, item := range doc.Paths.Map() {
		if !strings.HasPrefix(path, "/v1/") {
			continue
		}
		for method, op := range item.Operations() {
			n++
			r := op.Responses.Status(503)
			if r == nil || r.Value == nil || r.Value.Description == nil || !strings.Contains(*r.Value.Description, "no_leader") || r.Value.Headers["Retry-After"] == nil {
				t.Errorf("%s %s: no 503 response documenting no_leader with Retry-After", method, path)
			}
		}
	}
	if n == 0 {
		t.Fatal("the spec has no /v1 operations")
	}
	enum := doc.Components.Schemas["Problem"].Value.Properties["code"].Value.Enum
	for _, code := range []string{"no_leader", "group_not_found", "member_not_found", "member_conflict", "not_clustered"} {
		if !slices.Contains(enum, any(code)) {
			t.Errorf("the Problem code enum lacks %s", code)
		}
	}
}
