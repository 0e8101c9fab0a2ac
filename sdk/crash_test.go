package sdk_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidemq/tidemq/internal/listenlog"
	"github.com/tidemq/tidemq/sdk"
)

// failCounter counts requests that got no reply.
type failCounter struct {
	base   http.RoundTripper
	failed atomic.Int64
}

func (f *failCounter) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := f.base.RoundTrip(r)
	if err != nil {
		f.failed.Add(1)
	}
	return resp, err
}

// buildBroker builds cmd/tidemq into a temporary directory.
func buildBroker(t *testing.T) string {
	t.Helper()
	out, err := exec.CommandContext(t.Context(), "go", "env", "GOMOD").Output()
	if err != nil || strings.TrimSpace(string(out)) == "" || strings.TrimSpace(string(out)) == os.DevNull {
		t.Fatalf("go env GOMOD = %q, %v", out, err)
	}
	root := filepath.Dir(strings.TrimSpace(string(out)))
	bin := filepath.Join(t.TempDir(), "tidemq")
	cmd := exec.CommandContext(t.Context(), "go", "build", "-o", bin, "./cmd/tidemq")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/tidemq: %v\n%s", err, out)
	}
	return bin
}

// broker is a running tidemq process.
type broker struct {
	cmd  *exec.Cmd
	addr string // as bound, from its listening line
	logs *syncBuffer
	done chan struct{}
}

// startBroker starts the broker binary on addr and data dir and waits
// until it is ready; with port 0 the address it bound is read from its
// listening line (a port picked beforehand could be taken by another
// test's socket before the broker binds it).
func startBroker(t *testing.T, bin, addr, dir string) *broker {
	t.Helper()
	b := &broker{logs: &syncBuffer{}, done: make(chan struct{})}
	b.cmd = exec.Command(bin, "--addr", addr, "--data", dir, "--log-level", "info")
	b.cmd.Stdout, b.cmd.Stderr = b.logs, b.logs
	if err := b.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = b.cmd.Wait(); close(b.done) }()
	t.Cleanup(func() { b.kill() })
	var ready *sdk.Client // once the address is known
	waitFor(t, 20*time.Second, "the broker to be ready", func() (bool, error) {
		select {
		case <-b.done:
			t.Fatalf("broker exited at start:\n%s", b.logs.String())
		default:
		}
		if ready == nil {
			if b.addr = listenlog.Addr(b.logs.String()); b.addr == "" {
				return false, nil
			}
			c, err := sdk.NewClient("http://"+b.addr, sdk.ClientOptions{Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			ready = c
		}
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		err := ready.Ready(ctx)
		return err == nil, err
	})
	return b
}

// kill sends SIGKILL and waits for the process to be gone.
func (b *broker) kill() {
	_ = b.cmd.Process.Kill()
	<-b.done
}

// The broker is SIGKILLed and restarted on the same port and data while a
// producer sends 500 messages (sync and async, retrying for up to 15 s):
// every send succeeds, and every message is stored exactly once.
func TestProducerSurvivesBrokerRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the broker binary")
	}
	t.Parallel()
	bin := buildBroker(t)
	dir := t.TempDir()
	first := startBroker(t, bin, "127.0.0.1:0", dir)
	tr := &failCounter{base: http.DefaultTransport}
	c, err := sdk.NewClient("http://"+first.addr, sdk.ClientOptions{HTTPClient: &http.Client{Transport: tr}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	const topic = "crash"
	if _, _, err := c.PutTopic(ctx, topic, sdk.TopicConfig{Queues: 4}); err != nil {
		t.Fatal(err)
	}
	p, err := sdk.NewProducer(c, topic, sdk.ProducerOptions{
		RetryTimeout: 15 * time.Second, AttemptTimeout: 3 * time.Second,
		MaxBackoff: 300 * time.Millisecond, BreakerOpenFor: 200 * time.Millisecond,
		BatchMaxMessages: 10, Linger: time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	const total, syncSenders, perSender = 500, 5, 60 // 300 sync, 200 async
	var stored atomic.Int64
	half := make(chan struct{})
	var halfOnce sync.Once
	note := func() {
		if stored.Add(1) == total/3 {
			halfOnce.Do(func() { close(half) })
		}
	}
	var mu sync.Mutex
	var sendErrs []error
	ids := map[string]string{} // body → message id the producer was told
	record := func(body string, r sdk.SendResult, err error) {
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			sendErrs = append(sendErrs, fmt.Errorf("%s: %w", body, err))
			return
		}
		ids[body] = r.MessageID
	}

	var senders sync.WaitGroup
	for s := range syncSenders {
		senders.Go(func() {
			for i := range perSender {
				body := fmt.Sprintf("sync-%d-%d", s, i)
				r, err := p.Send(ctx, sdk.NewMessage(body))
				record(body, r, err)
				note()
			}
		})
	}
	senders.Go(func() {
		var pending []*sdk.Future
		var bodies []string
		for i := range total - syncSenders*perSender {
			body := fmt.Sprintf("async-%d", i)
			pending = append(pending, p.SendAsync(ctx, sdk.NewMessage(body)))
			bodies = append(bodies, body)
			if len(pending) == 20 { // keep the async sends spread over the run
				for j, f := range pending {
					r, err := f.Wait(ctx)
					record(bodies[j], r, err)
					note()
				}
				pending, bodies = nil, nil
			}
		}
		for j, f := range pending {
			r, err := f.Wait(ctx)
			record(bodies[j], r, err)
		}
	})

	// In the middle: SIGKILL, then the same port and data again.
	select {
	case <-half:
	case <-time.After(30 * time.Second):
		t.Fatal("sends did not get going")
	}
	first.kill()
	killedAt, down := stored.Load(), time.Now()
	// Restart once sends have failed: the retries span the restart.
	waitFor(t, 10*time.Second, "sends to fail", func() (bool, error) { return tr.failed.Load() > 0, nil })
	startBroker(t, bin, first.addr, dir)
	t.Logf("SIGKILL after %d of %d sends; restarted in %v; %d failed attempts", killedAt, total, time.Since(down).Round(time.Millisecond), tr.failed.Load())
	senders.Wait()
	if killedAt >= total {
		t.Errorf("the broker was killed after all sends were done")
	}
	mu.Lock()
	for _, err := range sendErrs {
		t.Errorf("send failed: %v", err)
	}
	if len(ids) != total {
		t.Fatalf("%d sends succeeded, want %d", len(ids), total)
	}
	mu.Unlock()

	// Every body is stored once, under the id its sender was told.
	got := pullAll(t, c, topic, "verify", total)
	byBody := map[string][]string{}
	for id, m := range got {
		byBody[m.Body] = append(byBody[m.Body], id)
	}
	for body, id := range ids {
		if len(byBody[body]) != 1 || byBody[body][0] != id {
			t.Errorf("%s stored as %v, sender was told %s", body, byBody[body], id)
		}
	}
	if len(got) != total {
		t.Errorf("%d messages stored, want %d", len(got), total)
	}
	// One more round: nothing else is there.
	more, err := c.Pull(ctx, topic, "verify", sdk.PullRequest{MaxMessages: 100})
	if err != nil || len(more) != 0 {
		t.Errorf("extra messages after the %d: %d, %v", total, len(more), err)
	}
}
