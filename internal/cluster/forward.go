package cluster

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tidemq/tidemq/gateway"
)

// Headers of a forwarded request and of a reply that refuses one.
const (
	// forwardedHeader names the node a request was forwarded from: the
	// node it reaches serves it or refuses it, never forwards it again.
	forwardedHeader = "Tidemq-Forwarded-By"
	// notLeaderHeader marks a refusal by a node that does not lead
	// (anymore): nothing was done, the forwarder may try the new leader.
	notLeaderHeader = "Tidemq-Not-Leader"
	// leaderWait is how long a request waits for a leader (SPEC §7.2).
	leaderWait = 5 * time.Second
	// maxBufferedBody is the largest body kept to send again to a new
	// leader: the largest the gateway accepts. A larger one is forwarded
	// once, and the leader refuses it.
	maxBufferedBody = gateway.DefaultMaxRequestBytes
)

// Handler serves the HTTP API on a cluster node: requests that need the
// group's leader are served by local while this node leads, forwarded in
// one hop to the leader's HTTP address while another node does, and wait
// up to 5 s for a leader while there is none (then 503 no_leader). What
// every node answers for itself (console, health, metrics, /v1/cluster)
// is served by local.
func (c *Cluster) Handler(local http.Handler) http.Handler {
	others, polls := newForwarder(0), newForwarder(c.cfg.MaxForwardedPolls)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !needsLeader(r) {
			local.ServeHTTP(w, r)
			return
		}
		if isPoll(r) {
			c.serveLeader(w, r, local, polls)
			return
		}
		c.serveLeader(w, r, local, others)
	})
}

// forwarder is an HTTP client to the leader holding at most maxConns
// connections to it (0: no limit). A request past them waits for one, at
// most pollConnWait (it is then refused with 429): the cap is the pulls'.
type forwarder struct {
	client   *http.Client
	maxConns int
}

func newForwarder(maxConns int) *forwarder {
	return &forwarder{maxConns: maxConns, client: &http.Client{
		Transport: &http.Transport{
			DialContext:         (&net.Dialer{Timeout: 2 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns:        1024,
			MaxIdleConnsPerHost: 512,
			MaxConnsPerHost:     maxConns,
			IdleConnTimeout:     90 * time.Second,
			// The caller's Accept-Encoding goes to the leader as it is, and
			// the leader's reply comes back as it is: a transport asking for
			// gzip on its own would have the leader compress every reply and
			// this node decompress it.
			DisableCompression: true,
		},
		// A redirect is the client's to follow, not the forwarder's.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
}

// isPoll reports whether r is a pull: a long poll holds its connection to
// the leader for up to its waitSeconds.
func isPoll(r *http.Request) bool {
	return r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/pull")
}

// needsLeader reports whether r is answered by the group's leader: every
// /v1 request but the node's own view of the cluster.
func needsLeader(r *http.Request) bool {
	p := r.URL.Path
	if !strings.HasPrefix(p, "/v1/") {
		return false
	}
	return !(p == "/v1/cluster" && r.Method == http.MethodGet)
}

// serveLeader serves r here, or at the leader through fw.
func (c *Cluster) serveLeader(w http.ResponseWriter, r *http.Request, local http.Handler, fw *forwarder) {
	if r.Method == http.MethodDelete && strings.HasPrefix(r.URL.Path, "/v1/cluster/members/") {
		// A leader removing itself asks its successor with the caller's
		// credentials (removeSelf).
		r = r.WithContext(context.WithValue(r.Context(), callerKey{}, r.Header))
	}
	ctx, cancel := context.WithTimeout(r.Context(), leaderWait)
	defer cancel()
	forwarded := r.Header.Get(forwardedHeader) != ""
	var body []byte
	buffered := false
	for {
		if c.Broker() != nil {
			if buffered {
				r.Body = io.NopCloser(bytes.NewReader(body))
			}
			local.ServeHTTP(w, r)
			return
		}
		if forwarded {
			// Whoever forwarded it looks for the leader again.
			w.Header().Set(notLeaderHeader, "1")
			gateway.WriteNoLeader(w, r)
			return
		}
		if addr, leader := c.leaderHTTP(ctx); addr != "" {
			if !buffered && r.Body != nil && r.Body != http.NoBody {
				b, err := io.ReadAll(io.LimitReader(r.Body, maxBufferedBody+1))
				if err != nil {
					gateway.WriteNoLeader(w, r)
					return
				}
				if len(b) > maxBufferedBody {
					// Too large to keep: forwarded once, whatever comes of it.
					r.Body = io.NopCloser(io.MultiReader(bytes.NewReader(b), r.Body))
					c.forward(w, r, fw, addr, leader, nil, false)
					return
				}
				body, buffered = b, true
			}
			if c.forward(w, r, fw, addr, leader, body, buffered) {
				return
			}
		}
		select {
		case <-ctx.Done():
			if r.Context().Err() == nil {
				gateway.WriteNoLeader(w, r)
			}
			return
		case <-c.changes():
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// leaderHTTP is the HTTP address and id of the group's leader when it is
// another node, "" when there is none or this node leads (and is getting
// ready).
func (c *Cluster) leaderHTTP(ctx context.Context) (addr, id string) {
	raddr, rid := c.raft.LeaderWithID()
	if rid == "" || string(rid) == c.cfg.NodeID {
		return "", ""
	}
	if ni, ok := c.cachedInfo(string(raddr)); ok && ni.ID == string(rid) && ni.HTTPAddr != "" {
		return ni.HTTPAddr, ni.ID
	}
	ictx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	ni, err := c.infoOf(ictx, string(raddr))
	if err != nil || ni.ID != string(rid) {
		return "", ""
	}
	return ni.HTTPAddr, ni.ID
}

// errLeaderChanged ends a forwarded request whose leader was replaced
// while it waited: a paused or cut-off old leader would hold it as long
// as it is gone, and cannot commit it anyway.
var errLeaderChanged = errors.New("cluster: the leader changed while the request was forwarded to it")

// abandonOnNewLeader cancels ctx once another node than leader is known
// to lead; stop ends the watch.
func (c *Cluster) abandonOnNewLeader(ctx context.Context, leader string) (_ context.Context, stop func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	done := make(chan struct{})
	go func() {
		for {
			ch := c.changes()
			if _, id := c.raft.LeaderWithID(); id != "" && string(id) != leader {
				cancel(errLeaderChanged)
				return
			}
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-ch:
			}
		}
	}()
	return ctx, func() {
		close(done)
		cancel(nil)
	}
}

// errNoPollConn ends a pull that waited out pollConnWait for a connection
// to the leader.
var errNoPollConn = errors.New("cluster: no connection to the leader free for a pull in time")

// pollConnWait is how long a pull waits for a connection to the leader
// before it is refused. Short: the wait comes on top of the pull's own
// waitSeconds at the leader, and consumers time their pulls by that.
const pollConnWait = time.Second

// waitForPollConn cancels ctx with errNoPollConn unless the request got
// a connection within wait (trace's GotConn, which it sets); a request
// that got one in time is never cancelled by it.
func waitForPollConn(ctx context.Context, trace *httptrace.ClientTrace, wait time.Duration) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	const waiting, connected, timedOut = 0, 1, 2
	var state atomic.Int32
	trace.GotConn = func(httptrace.GotConnInfo) { state.CompareAndSwap(waiting, connected) }
	t := time.AfterFunc(wait, func() {
		if state.CompareAndSwap(waiting, timedOut) {
			cancel(errNoPollConn)
		}
	})
	return ctx, func() {
		t.Stop()
		cancel(nil)
	}
}

// hopHeaders are the connection's own, not the request's (RFC 9110 §7.6.1).
var hopHeaders = []string{"Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// forward sends r to the leader at addr and copies its reply to w; it
// reports false, having written nothing, when the leader could not have
// acted on it (it was not reached, or answered that it does not lead) and
// the body can be sent again.
func (c *Cluster) forward(w http.ResponseWriter, r *http.Request, fw *forwarder, addr, leader string, body []byte, retry bool) bool {
	var wrote atomic.Bool
	trace := &httptrace.ClientTrace{WroteRequest: func(httptrace.WroteRequestInfo) { wrote.Store(true) }}
	ctx, stop := c.abandonOnNewLeader(r.Context(), leader)
	defer stop()
	if fw.maxConns > 0 {
		var stopWait func()
		ctx, stopWait = waitForPollConn(ctx, trace, pollConnWait)
		defer stopWait()
	}
	ctx = httptrace.WithClientTrace(ctx, trace)
	var rb io.Reader = http.NoBody
	switch {
	case retry && body != nil:
		rb = bytes.NewReader(body)
	case !retry && r.Body != nil:
		rb = r.Body
	}
	out, err := http.NewRequestWithContext(ctx, r.Method, "http://"+addr+r.URL.RequestURI(), rb)
	if err != nil {
		gateway.WriteNoLeader(w, r)
		return true
	}
	out.Header = r.Header.Clone()
	for _, h := range hopHeaders {
		out.Header.Del(h)
	}
	out.Header.Set(forwardedHeader, c.cfg.NodeID)
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		if prior := r.Header.Get("X-Forwarded-For"); prior != "" {
			host = prior + ", " + host
		}
		out.Header.Set("X-Forwarded-For", host)
	}
	if retry {
		out.ContentLength = int64(len(body))
	} else {
		out.ContentLength = r.ContentLength
	}
	resp, err := fw.client.Do(out)
	if err != nil {
		if r.Context().Err() != nil {
			return true // the caller went away
		}
		if errors.Is(context.Cause(ctx), errNoPollConn) {
			c.metrics.pullRefused()
			gateway.WriteTooManyForwardedPolls(w, fw.maxConns)
			return true
		}
		if retry && !wrote.Load() {
			return false
		}
		if errors.Is(context.Cause(ctx), errLeaderChanged) {
			c.log.Info("forwarded request abandoned: its leader was replaced; its outcome is unknown", "leader", leader, "path", r.URL.Path)
			gateway.WriteNoLeader(w, r)
			return true
		}
		c.log.Warn("forwarded request failed after it was sent; its outcome is unknown", "leader", addr, "path", r.URL.Path, "err", err)
		gateway.WriteNoLeader(w, r)
		return true
	}
	defer resp.Body.Close()
	if retry && resp.StatusCode == http.StatusServiceUnavailable && resp.Header.Get(notLeaderHeader) != "" {
		_, _ = io.Copy(io.Discard, resp.Body)
		return false
	}
	h := w.Header()
	for k, v := range resp.Header {
		h[k] = v
	}
	for _, hh := range hopHeaders {
		h.Del(hh)
	}
	w.WriteHeader(resp.StatusCode)
	if _, err := copyFlushing(w, resp.Body); err != nil && !errors.Is(err, context.Canceled) {
		c.log.Debug("forwarded reply cut short", "leader", addr, "err", err)
	}
	return true
}

// copyBufs are copyFlushing's buffers: every forwarded reply would
// otherwise allocate one (2% of a follower's CPU under single sends).
var copyBufs = sync.Pool{New: func() any { return new([32 << 10]byte) }}

// copyFlushing copies a reply as it comes: a long poll's answer is sent
// when the leader sends it.
func copyFlushing(w http.ResponseWriter, r io.Reader) (int64, error) {
	rc := http.NewResponseController(w)
	pooled := copyBufs.Get().(*[32 << 10]byte)
	defer copyBufs.Put(pooled)
	buf := pooled[:]
	var n int64
	for {
		k, err := r.Read(buf)
		if k > 0 {
			if _, werr := w.Write(buf[:k]); werr != nil {
				return n, werr
			}
			n += int64(k)
			_ = rc.Flush()
		}
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}
