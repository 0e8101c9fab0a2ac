package webhook

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/sony/gobreaker/v2"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"

	"github.com/tidemq/tidemq/core"
	"github.com/tidemq/tidemq/internal/wire"
)

// PusherOptions configures a Pusher. The zero value works.
type PusherOptions struct {
	Logger *slog.Logger
	Client *http.Client
	// Reconcile is how often push subscriptions are looked for (default 1s).
	Reconcile time.Duration
	// OpenFor is how long an endpoint's breaker stays open before it lets
	// one probe through (default 5s).
	OpenFor time.Duration
	// FailuresToOpen is how many failures in a row open the breaker
	// (default 5).
	FailuresToOpen uint32
	MeterProvider  metric.MeterProvider
}

// Broker is what the Pusher drives: the few operations of *core.Broker it
// calls to find push subscriptions and deliver their messages (a cluster
// node runs its pusher over the broker it builds when it leads). The
// methods mean what core.Broker's do.
type Broker interface {
	ListTopics() []core.TopicInfo
	// SubscriptionConfigs lists a topic's subscriptions with their
	// configuration and no stats: a subscription's stats are made holding
	// the lock its pulls wait for, and the reconciler asks every second.
	SubscriptionConfigs(topic string) ([]core.SubscriptionInfo, error)
	// SetPushState records a subscription's breaker state for its stats.
	SetPushState(topic, group, state string)

	// Pull leases ready messages, parking up to req.Wait for the first one.
	Pull(ctx context.Context, topic, group string, req core.PullRequest) ([]core.Delivered, error)
	// Release gives back leases without counting an attempt (a push the
	// breaker stopped).
	Release(topic, group string, handles []string)
	Ack(ctx context.Context, topic, group string, handles []string) (int, []core.HandleResult, error)
	// Nack hands messages back for delivery after delay (the subscription's
	// retry delay when delay < 0).
	Nack(ctx context.Context, topic, group string, handles []string, delay time.Duration, reason string) (int, []core.HandleResult, error)
}

// Pusher delivers the messages of push subscriptions: for each one it pulls
// from the broker and POSTs every message to the endpoint, acking on 2xx
// and nacking otherwise. While an endpoint fails its breaker opens and
// delivery pauses, so an outage does not burn messages into the DLQ.
type Pusher struct {
	b      Broker
	opts   PusherOptions
	log    *slog.Logger
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	workers map[[2]string]*pushWorker

	delivered metric.Int64Counter
}

type pushWorker struct {
	topic, group string
	cfg          core.PushConfig
	orderly      bool // the subscription's; it never changes
	breaker      *gobreaker.CircuitBreaker[*http.Response]
	cancel       context.CancelFunc
	done         chan struct{}
}

// NewPusher starts delivering push subscriptions; Close stops it.
func NewPusher(b Broker, opts PusherOptions) (*Pusher, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Client == nil {
		opts.Client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256, IdleConnTimeout: 90 * time.Second}}
	}
	if opts.Reconcile <= 0 {
		opts.Reconcile = time.Second
	}
	if opts.OpenFor <= 0 {
		opts.OpenFor = 5 * time.Second
	}
	if opts.FailuresToOpen == 0 {
		opts.FailuresToOpen = 5
	}
	if opts.MeterProvider == nil {
		opts.MeterProvider = metricnoop.NewMeterProvider()
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Pusher{b: b, opts: opts, log: opts.Logger.With("component", "push"), ctx: ctx, cancel: cancel,
		workers: map[[2]string]*pushWorker{}}
	m := opts.MeterProvider.Meter("github.com/tidemq/tidemq/webhook")
	var err error
	if p.delivered, err = m.Int64Counter("tidemq.push.deliveries", metric.WithUnit("{request}"),
		metric.WithDescription("Push POSTs, per topic, group and outcome (ack, nack, error).")); err != nil {
		cancel()
		return nil, err
	}
	state, err := m.Int64ObservableGauge("tidemq.push.breaker.state",
		metric.WithDescription("Push endpoint breaker per subscription: 0 closed, 1 half-open, 2 open."))
	if err != nil {
		cancel()
		return nil, err
	}
	if _, err := m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, w := range p.workers {
			o.ObserveInt64(state, int64(w.breaker.State()), metric.WithAttributes(
				attribute.String("topic", w.topic), attribute.String("group", w.group)))
		}
		return nil
	}, state); err != nil {
		cancel()
		return nil, err
	}
	p.wg.Go(p.reconcileLoop)
	return p, nil
}

// Close stops every worker: in-flight POSTs are cancelled and their
// messages released without counting an attempt. It is idempotent.
func (p *Pusher) Close() error {
	p.cancel()
	p.wg.Wait()
	return nil
}

// reconcileLoop starts a worker for each push subscription, restarts it
// when its config changes, and stops it when the subscription is gone.
func (p *Pusher) reconcileLoop() {
	t := time.NewTicker(p.opts.Reconcile)
	defer t.Stop()
	for {
		p.reconcile()
		select {
		case <-p.ctx.Done():
			p.mu.Lock()
			ws := make([]*pushWorker, 0, len(p.workers))
			for _, w := range p.workers {
				ws = append(ws, w)
			}
			p.mu.Unlock()
			for _, w := range ws {
				w.cancel()
				<-w.done
			}
			return
		case <-t.C:
		}
	}
}

func (p *Pusher) reconcile() {
	want := map[[2]string]core.PushConfig{}
	orderly := map[[2]string]bool{}
	for _, t := range p.b.ListTopics() {
		subs, err := p.b.SubscriptionConfigs(t.Name)
		if err != nil {
			continue
		}
		for _, s := range subs {
			if s.Config.Push != nil {
				want[[2]string{t.Name, s.Group}] = *s.Config.Push
				orderly[[2]string{t.Name, s.Group}] = s.Config.Orderly
			}
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for key, w := range p.workers {
		cfg, ok := want[key]
		if ok && samePush(cfg, w.cfg) {
			continue
		}
		w.cancel()
		<-w.done
		delete(p.workers, key)
	}
	for key, cfg := range want {
		if _, ok := p.workers[key]; ok {
			continue
		}
		ctx, cancel := context.WithCancel(p.ctx)
		w := &pushWorker{topic: key[0], group: key[1], cfg: cfg, orderly: orderly[key], cancel: cancel, done: make(chan struct{})}
		w.breaker = gobreaker.NewCircuitBreaker[*http.Response](gobreaker.Settings{
			Name:        key[0] + "/" + key[1],
			MaxRequests: 1,
			Timeout:     p.opts.OpenFor,
			ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= p.opts.FailuresToOpen },
			OnStateChange: func(name string, from, to gobreaker.State) {
				p.log.Info("push endpoint breaker", "subscription", name, "endpoint", cfg.Endpoint, "from", from.String(), "to", to.String())
				p.b.SetPushState(w.topic, w.group, to.String())
			},
		})
		p.workers[key] = w
		p.b.SetPushState(w.topic, w.group, gobreaker.StateClosed.String())
		p.wg.Go(func() {
			defer close(w.done)
			p.run(ctx, w)
		})
	}
}

func samePush(a, b core.PushConfig) bool {
	if a.Endpoint != b.Endpoint || a.MaxInFlight != b.MaxInFlight || a.TimeoutSeconds != b.TimeoutSeconds ||
		a.Secret != b.Secret || len(a.Headers) != len(b.Headers) {
		return false
	}
	for k, v := range a.Headers {
		if b.Headers[k] != v {
			return false
		}
	}
	return true
}

// run pulls and delivers one subscription's messages, at most MaxInFlight
// at once. An orderly pull may carry several consecutive messages of a
// key: they are POSTed one after another, and a failure ends the run (the
// broker revoked the leases of the key's later ones, which come again
// after it), so per-key order holds here too.
func (p *Pusher) run(ctx context.Context, w *pushWorker) {
	slots := make(chan struct{}, w.cfg.MaxInFlight)
	var inflight sync.WaitGroup
	defer inflight.Wait()
	timeout := time.Duration(w.cfg.TimeoutSeconds) * time.Second
	for ctx.Err() == nil {
		free := w.cfg.MaxInFlight - len(slots)
		switch w.breaker.State() {
		case gobreaker.StateOpen:
			// Paused: the messages wait in the broker, not in the DLQ.
			if !sleep(ctx, 50*time.Millisecond) {
				return
			}
			continue
		case gobreaker.StateHalfOpen:
			free = min(free, 1-len(slots)) // one probe at a time
		}
		if free <= 0 {
			select {
			case slots <- struct{}{}:
				<-slots
			case <-ctx.Done():
				return
			}
			if !sleep(ctx, time.Millisecond) {
				return
			}
			continue
		}
		msgs, err := p.b.Pull(ctx, w.topic, w.group, core.PullRequest{
			MaxMessages: free, Wait: 5 * time.Second, Invisible: timeout + 5*time.Second,
			ConsumerID: "push:" + w.cfg.Endpoint, Push: true,
		})
		if err != nil {
			if errors.Is(err, core.ErrSubscriptionNotFound) || errors.Is(err, core.ErrTopicNotFound) ||
				errors.Is(err, core.ErrModeConflict) || errors.Is(err, core.ErrClosed) {
				return
			}
			p.log.Error("push pull", "err", err, "topic", w.topic, "group", w.group)
			if !sleep(ctx, time.Second) {
				return
			}
			continue
		}
		if !w.orderly {
			for _, d := range msgs {
				slots <- struct{}{}
				inflight.Go(func() {
					defer func() { <-slots }()
					p.deliver(ctx, w, d, timeout)
				})
			}
			continue
		}
		for _, run := range keyRuns(msgs) {
			for range run {
				slots <- struct{}{}
			}
			inflight.Go(func() {
				for i, d := range run {
					if !p.deliver(ctx, w, d, timeout) {
						for range run[i:] {
							<-slots
						}
						return
					}
					<-slots
				}
			})
		}
	}
}

// keyRuns splits an orderly pull's messages into runs delivered one after
// another: the messages of one sharding key (of one queue, for messages
// without one), in pulled order.
func keyRuns(msgs []core.Delivered) [][]core.Delivered {
	out := make([][]core.Delivered, 0, len(msgs))
	type key struct {
		queue uint32
		key   string
	}
	at := map[key]int{}
	for _, d := range msgs {
		k := key{queue: d.Message.QueueID, key: d.Message.ShardingKey}
		if i, ok := at[k]; ok {
			out[i] = append(out[i], d)
			continue
		}
		at[k] = len(out)
		out = append(out, []core.Delivered{d})
	}
	return out
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// deliver POSTs one message and settles it: 2xx acks, anything else nacks
// (with Retry-After as the delay when the endpoint gives one). It reports
// whether the message was acked.
func (p *Pusher) deliver(ctx context.Context, w *pushWorker, d core.Delivered, timeout time.Duration) bool {
	handles := []string{d.ReceiptHandle}
	body := wire.PulledMessage(d)
	resp, err := w.breaker.Execute(func() (*http.Response, error) {
		rctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		resp, err := p.post(rctx, w, d, body)
		if err != nil {
			return nil, err
		}
		if resp.StatusCode/100 != 2 {
			return resp, fmt.Errorf("endpoint answered %s", resp.Status)
		}
		return resp, nil
	})
	settle := context.WithoutCancel(ctx)
	attrs := metric.WithAttributes(attribute.String("topic", w.topic), attribute.String("group", w.group))
	switch {
	case ctx.Err() != nil || errors.Is(err, gobreaker.ErrOpenState) || errors.Is(err, gobreaker.ErrTooManyRequests) ||
		err != nil && w.breaker.State() == gobreaker.StateOpen:
		// Not the message's fault: shutting down, the breaker refused the
		// call, or this failure tripped it (or was a failed probe): the
		// endpoint is down. Give the message back without counting the
		// attempt, so an outage never burns messages into the DLQ.
		p.b.Release(w.topic, w.group, handles)
	case err == nil:
		p.delivered.Add(settle, 1, attrs, metric.WithAttributes(attribute.String("outcome", "ack")))
		if _, _, err := p.b.Ack(settle, w.topic, w.group, handles); err != nil {
			p.log.Error("push ack", "err", err, "topic", w.topic, "group", w.group)
		}
		return true
	default:
		delay := time.Duration(-1)
		reason := err.Error()
		if resp != nil {
			if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s >= 0 {
				delay = time.Duration(min(s, core.MaxInvisibleSeconds)) * time.Second
			} else if t, err := http.ParseTime(resp.Header.Get("Retry-After")); err == nil {
				delay = max(time.Until(t), 0).Truncate(time.Second)
			}
			p.delivered.Add(settle, 1, attrs, metric.WithAttributes(attribute.String("outcome", "nack")))
		} else {
			p.delivered.Add(settle, 1, attrs, metric.WithAttributes(attribute.String("outcome", "error")))
		}
		if _, _, err := p.b.Nack(settle, w.topic, w.group, handles, delay, reason); err != nil {
			p.log.Error("push nack", "err", err, "topic", w.topic, "group", w.group)
		}
	}
	return false
}

func (p *Pusher) post(ctx context.Context, w *pushWorker, d core.Delivered, body []byte) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.cfg.Endpoint, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	h := req.Header
	for k, v := range w.cfg.Headers {
		h.Set(k, v)
	}
	h.Set("Content-Type", "application/json")
	h.Set("User-Agent", "tidemq-push/1")
	h.Set("X-Tidemq-Topic", w.topic)
	h.Set("X-Tidemq-Group", w.group)
	h.Set("X-Tidemq-Message-Id", d.Message.ID)
	h.Set("X-Tidemq-Delivery-Attempt", strconv.Itoa(d.Attempt))
	h.Set("X-Tidemq-Queue-Id", strconv.Itoa(int(d.Message.QueueID)))
	h.Set("X-Tidemq-Offset", strconv.FormatUint(d.Message.Offset, 10))
	if d.Message.Tag != "" {
		h.Set("X-Tidemq-Tag", d.Message.Tag)
	}
	if d.Traceparent != "" {
		h.Set("traceparent", d.Traceparent)
	}
	if w.cfg.Secret != "" {
		mac := hmac.New(sha256.New, []byte(w.cfg.Secret))
		mac.Write(body)
		h.Set("X-Tidemq-Signature", "sha256="+hex.EncodeToString(mac.Sum(nil)))
	}
	resp, err := p.opts.Client.Do(req)
	if err != nil {
		return nil, err
	}
	// Drain so the connection is reused; the answer's body means nothing.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	return resp, nil
}
