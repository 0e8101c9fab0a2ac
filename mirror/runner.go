// Package mirror copies topics of other regions' brokers into local
// topics (SPEC §8): the serving side of the mirrors whose definitions and
// skip records core keeps.
//
// A Runner is serving state like the push workers: built with the broker it
// drives (on a cluster, by the leader only, so one node copies at a time)
// and closed with it. It reconciles one copier per running mirror with the
// broker's definitions. A copier reads the source only through its public
// HTTP API (the repo's sdk.Client, the mirror's token as bearer): an orderly
// subscription mirror.<region>.<name> on the source topic, long-polled in
// batches; each batch is stored with core.Broker.SendMirrored (copies and
// their source offsets in one durable batch) and acked at the source only
// then. Failures (source or destination down, a revoked token) put the
// mirror in state failing with the error, and are retried with growing
// backoff behind a circuit breaker (sony/gobreaker): never a tight loop.
package mirror

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sony/gobreaker/v2"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"

	"github.com/tidemq/tidemq/core"
	"github.com/tidemq/tidemq/sdk"
)

// Broker is what the Runner drives: the mirror operations of *core.Broker.
// The methods mean what core.Broker's do.
type Broker interface {
	// MirrorDefinitions answers every mirror, source tokens included.
	MirrorDefinitions() []core.MirrorRecord
	// SendMirrored stores the copies of one pulled batch and records their
	// source offsets in one batch.
	SendMirrored(ctx context.Context, name string, copies []core.MirrorCopy) (int, error)
	// MirrorStored reports whether a source offset is stored here already.
	MirrorStored(name string, queue uint32, offset uint64) bool
	// RaiseMirrorWatermarks records the source subscription's acked offsets.
	RaiseMirrorWatermarks(ctx context.Context, name string, acked map[uint32]uint64) error
	// ReportMirror records a mirror's state, lag and last error.
	ReportMirror(name string, st core.MirrorStatus)
}

// Options configures a Runner. The zero value works.
type Options struct {
	Logger *slog.Logger
	// Region is this broker's region (default "local"): the source
	// subscription is mirror.<Region>.<name>, and copies whose path holds
	// it are not stored.
	Region string
	// Client reaches the sources; nil is a client with a 60 s timeout.
	Client *http.Client
	// Reconcile is how often mirror definitions are looked at (default 1s).
	Reconcile time.Duration
	// Wait is a pull's long-poll wait (default 20s, at most 30s).
	Wait time.Duration
	// BatchSize is the most messages pulled and stored at once (default 256).
	BatchSize int
	// MinBackoff and MaxBackoff bound the wait after a failure, which
	// doubles with each failure in a row (defaults 200ms and 30s).
	MinBackoff, MaxBackoff time.Duration
	// FailuresToOpen failures in a row open a mirror's breaker (default 5);
	// it stays open OpenFor (default 10s), then lets one attempt through.
	FailuresToOpen uint32
	OpenFor        time.Duration
	// StatusEvery is how often the source subscription's lag is read
	// (default 2s).
	StatusEvery   time.Duration
	MeterProvider metric.MeterProvider
}

func (o *Options) withDefaults() {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Region == "" {
		o.Region = "local"
	}
	if o.Client == nil {
		o.Client = &http.Client{Timeout: 60 * time.Second}
	}
	if o.Reconcile <= 0 {
		o.Reconcile = time.Second
	}
	if o.Wait <= 0 {
		o.Wait = 20 * time.Second
	}
	// Whole seconds, as the pull takes them: a wait of 0 would answer at
	// once and the copier would poll in a tight loop.
	o.Wait = min(max(o.Wait, time.Second), 30*time.Second)
	if o.BatchSize <= 0 {
		o.BatchSize = 256
	}
	o.BatchSize = min(o.BatchSize, core.MaxBatchMessages)
	if o.MinBackoff <= 0 {
		o.MinBackoff = 200 * time.Millisecond
	}
	if o.MaxBackoff <= 0 {
		o.MaxBackoff = 30 * time.Second
	}
	if o.FailuresToOpen == 0 {
		o.FailuresToOpen = 5
	}
	if o.OpenFor <= 0 {
		o.OpenFor = 10 * time.Second
	}
	if o.StatusEvery <= 0 {
		o.StatusEvery = 2 * time.Second
	}
	if o.MeterProvider == nil {
		o.MeterProvider = metricnoop.NewMeterProvider()
	}
}

// Runner runs the broker's mirrors until Close.
type Runner struct {
	b      Broker
	opts   Options
	log    *slog.Logger
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	copiers map[string]*copier

	errs metric.Int64Counter
}

// New starts running b's mirrors; Close stops them.
func New(b Broker, opts Options) (*Runner, error) {
	opts.withDefaults()
	m := opts.MeterProvider.Meter("github.com/tidemq/tidemq/mirror")
	// Lag, copies and state are the broker's metrics (core), from what
	// the runner reports and the skip records count.
	errs, err := m.Int64Counter("tidemq.mirror.errors", metric.WithUnit("{error}"),
		metric.WithDescription("Failed attempts of a mirror to read its source or store here, per mirror."))
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &Runner{b: b, opts: opts, log: opts.Logger.With("component", "mirror"), ctx: ctx, cancel: cancel,
		copiers: map[string]*copier{}, errs: errs}
	r.wg.Go(r.reconcileLoop)
	return r, nil
}

// Close stops every copier and waits for them. It is idempotent.
func (r *Runner) Close() error {
	r.cancel()
	r.wg.Wait()
	return nil
}

func (r *Runner) reconcileLoop() {
	t := time.NewTicker(r.opts.Reconcile)
	defer t.Stop()
	for {
		r.reconcile()
		select {
		case <-r.ctx.Done():
			r.mu.Lock()
			cs := make([]*copier, 0, len(r.copiers))
			for _, c := range r.copiers {
				cs = append(cs, c)
			}
			r.mu.Unlock()
			for _, c := range cs {
				c.stop()
			}
			return
		case <-t.C:
		}
	}
}

// reconcile starts a copier for each running mirror, restarts it when its
// definition changed, and stops it when the mirror is paused or gone; the
// source subscription of a deleted mirror, or of one moved to another
// source, is deleted too.
func (r *Runner) reconcile() {
	want := map[string]core.MirrorRecord{}
	for _, rec := range r.b.MirrorDefinitions() {
		want[rec.Name] = rec
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for name, c := range r.copiers {
		rec, ok := want[name]
		if ok && !rec.Paused && sameSource(rec, c.rec) {
			continue
		}
		c.stop()
		delete(r.copiers, name)
		if !ok || rec.Source.URL != c.rec.Source.URL || rec.Source.Topic != c.rec.Source.Topic {
			// Deleted, or reading another source now: the old source
			// keeps no subscription (and backlog) for it.
			r.wg.Go(func() { r.dropSource(c) })
		}
	}
	for name, rec := range want {
		if _, ok := r.copiers[name]; ok || rec.Paused {
			continue
		}
		c, err := r.newCopier(rec)
		if err != nil {
			r.b.ReportMirror(name, core.MirrorStatus{Failing: true, LastError: err.Error(), Lag: -1})
			continue
		}
		r.copiers[name] = c
		r.wg.Go(func() {
			defer close(c.done)
			c.run()
		})
	}
}

// sameSource reports whether a copier made for b can go on serving a.
func sameSource(a, b core.MirrorRecord) bool {
	return a.Source == b.Source && a.Topic == b.Topic && a.Filter == b.Filter && a.StartFrom == b.StartFrom
}

// dropSource deletes a deleted mirror's subscription at the source, so the
// source keeps no backlog for it; a source that refuses keeps it.
func (r *Runner) dropSource(c *copier) {
	ctx, cancel := context.WithTimeout(r.ctx, 10*time.Second)
	defer cancel()
	client, err := sdk.NewClient(c.rec.Source.URL, sdk.ClientOptions{HTTPClient: r.opts.Client, Token: c.rec.Source.Token})
	if err != nil {
		return
	}
	defer client.Close()
	if err := client.DeleteSubscription(ctx, c.rec.Source.Topic, c.group); err != nil && !errors.Is(err, sdk.ErrSubscriptionNotFound) {
		r.log.Warn("deleting a deleted mirror's source subscription", "mirror", c.rec.Name, "group", c.group, "err", err)
	}
}

// copier copies one mirror.
type copier struct {
	r       *Runner
	rec     core.MirrorRecord
	group   string
	client  *sdk.Client
	breaker *gobreaker.CircuitBreaker[struct{}]
	attrs   metric.MeasurementOption
	ctx     context.Context
	cancel  context.CancelFunc
	done    chan struct{}

	// the copier goroutine's
	sourceRegion string
	subscribed   bool
	failures     int
	lag          int64
	lastErr      string
	failing      bool
	statusAt     time.Time
	// statusDue says that copies were stored since the lag was last read:
	// the next pull waits at most a second, so that a mirror that caught
	// up reads its lag then, not when a long poll ends empty.
	statusDue bool
	// held is a pulled batch not yet stored and acked, tried again before
	// anything new is pulled (its messages stay leased at the source), until
	// heldUntil, when its leases have run out and it comes again anyway.
	held      []sdk.PulledMessage
	heldUntil time.Time
}

func (r *Runner) newCopier(rec core.MirrorRecord) (*copier, error) {
	client, err := sdk.NewClient(rec.Source.URL, sdk.ClientOptions{HTTPClient: r.opts.Client, Token: rec.Source.Token,
		UserAgent: "tidemq-mirror/" + r.opts.Region, Logger: r.log})
	if err != nil {
		return nil, fmt.Errorf("source url: %w", err)
	}
	ctx, cancel := context.WithCancel(r.ctx)
	c := &copier{r: r, rec: rec, group: SourceGroup(r.opts.Region, rec.Name), client: client, ctx: ctx, cancel: cancel,
		done: make(chan struct{}), lag: -1, attrs: metric.WithAttributes(attribute.String("mirror", rec.Name))}
	c.breaker = gobreaker.NewCircuitBreaker[struct{}](gobreaker.Settings{
		Name:        rec.Name,
		MaxRequests: 1,
		Timeout:     r.opts.OpenFor,
		ReadyToTrip: func(n gobreaker.Counts) bool { return n.ConsecutiveFailures >= r.opts.FailuresToOpen },
		// A pause is no failure of the source or of this broker.
		IsExcluded: func(err error) bool { return errors.Is(err, core.ErrMirrorPaused) },
		OnStateChange: func(name string, from, to gobreaker.State) {
			r.log.Info("mirror breaker", "mirror", name, "source", rec.Source.URL, "from", from.String(), "to", to.String())
		},
	})
	return c, nil
}

// SourceGroup is the subscription a mirror reads its source through.
func SourceGroup(region, name string) string { return "mirror." + region + "." + name }

func (c *copier) stop() {
	c.cancel()
	<-c.done
}

// run copies until stopped: one attempt (pull a batch, store it, ack it)
// after another, through the breaker, waiting after each failure.
func (c *copier) run() {
	defer c.client.Close()
	c.report()
	for c.ctx.Err() == nil {
		_, err := c.breaker.Execute(func() (struct{}, error) { return struct{}{}, c.attempt() })
		if c.ctx.Err() != nil {
			return
		}
		if errors.Is(err, core.ErrMirrorPaused) {
			// Paused since this copier started: not a failure. The
			// batch stays unacked at the source; the runner stops this
			// copier at its next look at the definitions, or, resumed by
			// then, the batch is stored on the next attempt.
			if !sleep(c.ctx, min(c.r.opts.Reconcile, time.Second)) {
				return
			}
			continue
		}
		if err != nil {
			c.failed(err)
			if !sleep(c.ctx, c.backoff()) {
				return
			}
			continue
		}
		if c.failures > 0 {
			c.r.log.Info("mirror recovered", "mirror", c.rec.Name, "after_failures", c.failures)
		}
		c.failures, c.failing = 0, false
		c.report()
	}
}

func (c *copier) failed(err error) {
	c.failures++
	c.failing = true
	// While the breaker is open no attempt is made: the last real error
	// still says what is wrong.
	if !errors.Is(err, gobreaker.ErrOpenState) && !errors.Is(err, gobreaker.ErrTooManyRequests) {
		c.lastErr = err.Error()
		c.r.errs.Add(context.Background(), 1, c.attrs)
		if c.failures == 1 || c.failures%10 == 0 {
			c.r.log.Warn("mirror failing", "mirror", c.rec.Name, "source", c.rec.Source.URL, "failures", c.failures, "err", err)
		}
	}
	if errors.Is(err, sdk.ErrSubscriptionNotFound) || errors.Is(err, sdk.ErrTopicNotFound) {
		c.subscribed = false // made again on the next attempt
	}
	c.report()
}

// backoff is the wait after the failures so far: doubling from MinBackoff,
// capped at MaxBackoff, with jitter so that mirrors of one source spread.
func (c *copier) backoff() time.Duration {
	d := c.r.opts.MinBackoff << min(c.failures-1, 20)
	d = min(d, c.r.opts.MaxBackoff)
	return d/2 + rand.N(d/2+1)
}

func (c *copier) report() {
	c.r.b.ReportMirror(c.rec.Name, core.MirrorStatus{Failing: c.failing, LastError: c.lastErr, Lag: c.lag})
}

// attempt is one round: subscribe if needed, pull, store, ack.
func (c *copier) attempt() error {
	if !c.subscribed {
		if err := c.subscribe(); err != nil {
			return err
		}
	}
	if c.held != nil && time.Now().Before(c.heldUntil) {
		if err := c.store(c.held); err != nil {
			return err
		}
		c.held = nil
	}
	c.held = nil
	wait := c.r.opts.Wait
	if c.statusDue {
		wait = min(wait, time.Second)
	}
	began := time.Now()
	msgs, err := c.client.Pull(c.ctx, c.rec.Source.Topic, c.group, sdk.PullRequest{MaxMessages: c.r.opts.BatchSize,
		WaitSeconds: int(wait / time.Second), InvisibleSeconds: leaseSeconds, ConsumerID: c.group})
	if err != nil {
		return fmt.Errorf("pulling from the source: %w", err)
	}
	if len(msgs) > 0 {
		c.held, c.heldUntil = msgs, time.Now().Add(leaseSeconds*time.Second/2)
		if err := c.store(msgs); err != nil {
			return err
		}
		c.held = nil
	}
	// A batch short of full means the source had no more: the lag is read
	// then (at most every caughtUpStatus), so that a mirror that caught up
	// does not go on reporting the lag of a few seconds before while its
	// next pull is parked. A batch whose lag is not read now (full, or
	// right after the last reading) leaves it due: the next pull waits a
	// second at most, and an empty one reads it.
	sinceStatus := time.Since(c.statusAt)
	if len(msgs) == 0 || sinceStatus >= c.r.opts.StatusEvery || len(msgs) < c.r.opts.BatchSize && sinceStatus >= caughtUpStatus {
		c.readStatus()
		c.statusDue = false
	} else {
		c.statusDue = true
	}
	if len(msgs) == 0 && time.Since(began) < wait/2 {
		// An empty answer before the wait was up: the source is stopping
		// (it answers parked polls at once then). Not a tight loop.
		sleep(c.ctx, c.r.opts.MinBackoff)
	}
	return nil
}

// leaseSeconds is how long a pulled batch stays leased at the source: long
// enough to store it here and ack it, so that an ack rarely finds its lease
// run out (a run-out lease only means the batch comes again, and is
// skipped), and short, since the source subscription is orderly: a batch
// held by a destination that died holds its keys at the source until the
// lease runs out.
const leaseSeconds = 15

// caughtUpStatus bounds how often a caught-up mirror reads its lag.
const caughtUpStatus = 200 * time.Millisecond

// subscribe learns the source's region and makes the source subscription:
// orderly, so each sharding key keeps its order; many retries and short
// delays, since a failure here is ours, not the message's.
func (c *copier) subscribe() error {
	h, err := c.client.Health(c.ctx)
	if err != nil {
		return fmt.Errorf("reading the source's region (GET /healthz): %w", err)
	}
	if h.Region == c.r.opts.Region {
		return fmt.Errorf("the source's region is this broker's region (%s): every message would be skipped; give the brokers different --region", h.Region)
	}
	c.sourceRegion = h.Region
	maxRetries := core.MaxMaxRetries
	cfg := sdk.SubscriptionConfig{Orderly: true, Filter: c.rec.Filter, StartFrom: c.rec.StartFrom, MaxRetries: &maxRetries,
		RetryDelays: []string{"1s", "5s", "10s", "30s"}}
	if _, _, err := c.client.PutSubscription(c.ctx, c.rec.Source.Topic, c.group, cfg); err != nil {
		return fmt.Errorf("subscribing at the source (%s): %w", c.group, err)
	}
	c.subscribed = true
	return nil
}

// store stores the copies of a pulled batch, then acks it at the source.
func (c *copier) store(msgs []sdk.PulledMessage) error {
	copies := make([]core.MirrorCopy, len(msgs))
	handles := make([]string, len(msgs))
	for i := range msgs {
		m := &msgs[i]
		handles[i] = m.ReceiptHandle
		copies[i] = core.MirrorCopy{SourceQueue: uint32(m.QueueID), SourceOff: uint64(m.Offset)}
		if c.loops(m) || c.r.b.MirrorStored(c.rec.Name, uint32(m.QueueID), uint64(m.Offset)) {
			continue // recorded, not stored
		}
		cp, err := c.copyOf(m)
		if err != nil {
			return err
		}
		copies[i].Msg = cp
	}
	if _, err := c.r.b.SendMirrored(c.ctx, c.rec.Name, copies); err != nil {
		// A copy refused here is named by its source message: its index
		// in the pulled batch says nothing to whoever reads lastError.
		if ee, ok := errors.AsType[*core.EntryError](err); ok && ee.Entry >= 0 && ee.Entry < len(msgs) {
			m := &msgs[ee.Entry]
			return fmt.Errorf("storing copies here: source message %s (queue %d, offset %d): %w", m.MessageID, m.QueueID, m.Offset, ee.Err)
		}
		return fmt.Errorf("storing copies here: %w", err)
	}
	res, err := c.client.Ack(c.ctx, c.rec.Source.Topic, c.group, sdk.AckRequest{ReceiptHandles: handles})
	if err != nil {
		// Stored and recorded: the batch comes again and is skipped.
		return fmt.Errorf("acking at the source: %w", err)
	}
	if len(res.Failed) > 0 {
		c.r.log.Debug("mirror acks refused at the source; those messages come again and are skipped", "mirror", c.rec.Name, "failed", len(res.Failed))
	}
	return nil
}

// loops reports whether m has been stored in this region before (its path,
// or its source's region, names it): it is not copied again.
func (c *copier) loops(m *sdk.PulledMessage) bool {
	if c.sourceRegion == c.r.opts.Region {
		return true
	}
	return slices.Contains(strings.Split(m.Properties[core.PropMirrorPath], ","), c.r.opts.Region)
}

// copyOf is the copy of m: its body, tag, keys, properties, sharding key,
// producer group and birth time, its source trace, the mirror properties,
// and the source message id as dedup key.
func (c *copier) copyOf(m *sdk.PulledMessage) (*core.Message, error) {
	body, err := m.Bytes()
	if err != nil {
		return nil, fmt.Errorf("source message %s: %w", m.MessageID, err)
	}
	props := make(map[string]string, len(m.Properties)+3)
	for k, v := range m.Properties {
		props[k] = v
	}
	path := c.sourceRegion
	if p := m.Properties[core.PropMirrorPath]; p != "" {
		path = p + "," + c.sourceRegion
	}
	props[core.PropMirrorPath] = path
	props[core.PropMirrorSourceRegion] = c.sourceRegion
	props[core.PropMirrorSourceMessageID] = m.MessageID
	cp := &core.Message{Body: body, BodyBase64: m.BodyEncoding == sdk.EncodingBase64, Tag: m.Tag, Keys: m.Keys,
		Properties: props, ShardingKey: m.ShardingKey, ProducerGroup: m.ProducerGroup, Traceparent: m.Traceparent,
		BornAtMs: m.BornAt.UnixMilli()}
	if m.BornAt.IsZero() {
		cp.BornAtMs = m.StoredAt.UnixMilli()
	}
	if len(m.MessageID) <= core.MaxDedupKeyLen {
		cp.DedupKey = m.MessageID
	}
	return cp, nil
}

// readStatus reads the source subscription's lag, and raises the skip
// record's watermarks to its acked offsets: nothing below them comes again,
// so the gaps the filter leaves need not be kept.
func (c *copier) readStatus() {
	c.statusAt = time.Now()
	ctx, cancel := context.WithTimeout(c.ctx, 10*time.Second)
	defer cancel()
	s, err := c.client.GetSubscription(ctx, c.rec.Source.Topic, c.group)
	if err != nil {
		return // the next attempt says what is wrong
	}
	c.lag = s.Lag
	acked := make(map[uint32]uint64, len(s.Queues))
	for _, q := range s.Queues {
		if q.AckedOffset > 0 {
			acked[uint32(q.QueueID)] = uint64(q.AckedOffset)
		}
	}
	if len(acked) > 0 {
		if err := c.r.b.RaiseMirrorWatermarks(ctx, c.rec.Name, acked); err != nil && ctx.Err() == nil {
			c.r.log.Debug("raising a mirror's watermarks", "mirror", c.rec.Name, "err", err)
		}
	}
	c.report()
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
