package sdk_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidemq/tidemq/gateway"
	"github.com/tidemq/tidemq/sdk"
)

// noLeaderFront stands for a cluster node whose group is electing its
// leader: the first n sends get the gateway's own 503 no_leader (with
// Retry-After: 1), the rest go through to the real server behind.
type noLeaderFront struct {
	mu       sync.Mutex
	n        int
	attempts []time.Time // of every send that arrived
}

func startNoLeaderFront(t *testing.T, n int) (*noLeaderFront, *httptest.Server) {
	t.Helper()
	backend := startServer(t)
	u, err := url.Parse(backend.URL)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(u)
	f := &noLeaderFront{n: n}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/messages") {
			f.mu.Lock()
			f.attempts = append(f.attempts, time.Now())
			refuse := len(f.attempts) <= f.n
			f.mu.Unlock()
			if refuse {
				gateway.WriteNoLeader(w, r)
				return
			}
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return f, srv
}

// TestProducerRetriesNoLeader: a send that meets 503 no_leader twice (a
// failover) succeeds on the third attempt, each retry waiting the
// reply's Retry-After (1 s) rather than the producer's much shorter
// backoff, and the message is stored once.
func TestProducerRetriesNoLeader(t *testing.T) {
	t.Parallel()
	front, srv := startNoLeaderFront(t, 2)
	c := newClient(t, srv.URL)
	ctx := t.Context()
	topic := topicName("noleader")
	p, err := sdk.NewProducer(c, topic, sdk.ProducerOptions{
		RetryTimeout: 10 * time.Second, MinBackoff: 10 * time.Millisecond, MaxBackoff: 20 * time.Millisecond, NoBreaker: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	res, err := p.Send(ctx, sdk.SendMessage{Body: "after the election"})
	if err != nil {
		t.Fatalf("Send through two no_leader replies: %v", err)
	}
	if res.MessageID == "" {
		t.Fatalf("Send result %+v", res)
	}
	front.mu.Lock()
	attempts := append([]time.Time(nil), front.attempts...)
	front.mu.Unlock()
	if len(attempts) != 3 {
		t.Fatalf("%d send attempts, want 3 (two no_leader, then the one stored)", len(attempts))
	}
	for i := 1; i < len(attempts); i++ {
		// The backoff alone would be at most 20 ms; a little under the
		// second allows for the timers' slack.
		if gap := attempts[i].Sub(attempts[i-1]); gap < 950*time.Millisecond {
			t.Errorf("attempt %d came %v after the no_leader reply, want Retry-After's 1s", i+1, gap)
		}
	}
	topicInfo, err := c.GetTopic(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	if topicInfo.Messages != 1 {
		t.Errorf("the topic holds %d messages, want 1", topicInfo.Messages)
	}
}

// TestNoLeaderError: a Client call, which does not retry, returns the
// no_leader problem as an *APIError that is ErrNoLeader, counts as
// ErrUnavailable (worth sending again) and carries its Retry-After.
func TestNoLeaderError(t *testing.T) {
	t.Parallel()
	_, srv := startNoLeaderFront(t, 1)
	c := newClient(t, srv.URL)
	_, err := c.Send(t.Context(), topicName("noleader"), "", sdk.SendMessage{Body: "x"})
	if !errors.Is(err, sdk.ErrNoLeader) || !errors.Is(err, sdk.ErrUnavailable) || errors.Is(err, sdk.ErrRejected) || errors.Is(err, sdk.ErrNotReady) {
		t.Fatalf("Send = %v; want ErrNoLeader and ErrUnavailable only", err)
	}
	var ae *sdk.APIError
	if !errors.As(err, &ae) || ae.Status != 503 || ae.Code != "no_leader" || ae.RetryAfter != time.Second {
		t.Errorf("APIError = %+v, want 503 no_leader with RetryAfter 1s", ae)
	}
}
