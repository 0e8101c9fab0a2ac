package sdk

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Handler processes one message. Returning nil acks it. Returning an error
// nacks it: it is delivered again after the subscription's next retry
// delay, or after d when the error is (or wraps) RetryAfter(d); an error
// that is (or wraps) DeadLetter(err) moves it to the DLQ at once. A panic
// counts as an error.
//
// ctx continues the producer's trace (the message's traceparent), and ends
// when the consumer's grace period after stopping is over, or with cause
// ErrLeaseLost when the message's lease could not be kept. m is the
// handler's own until it returns.
type Handler func(ctx context.Context, m *PulledMessage) error

// ConsumerOptions configures a Consumer. The zero value works; each zero
// field takes the default named in its comment.
type ConsumerOptions struct {
	// ConsumerID names this consumer in the group (default
	// "<hostname>-<pid>"). Broadcast consumers should give a stable one:
	// their position is kept under it.
	ConsumerID string
	// Concurrency is how many handlers run at once (default 4). At most
	// that many messages are held (leased) at a time.
	Concurrency int
	// MaxMessages caps one pull (default Concurrency, at most 1000).
	MaxMessages int
	// WaitSeconds is the long-poll wait of a pull (default 20, at most 30).
	WaitSeconds int
	// InvisibleSeconds is the lease of pulled messages (default 30). While
	// a handler runs, its lease is extended when half of it is left.
	InvisibleSeconds int
	// Orderly processes the messages of one sharding key (of one queue,
	// for messages without a key) one at a time, in the order pulled. Run
	// turns it on by itself when the subscription is orderly (it reads the
	// subscription once when it starts; if that read is not allowed, only
	// this field counts).
	Orderly bool
	// Grace is how long running handlers may go on after Run's ctx ends
	// before their ctx is cancelled (default 30s).
	Grace time.Duration
	// TracerProvider makes the span "tidemq.process" around each handler
	// call (default otel.GetTracerProvider()).
	TracerProvider trace.TracerProvider
}

// Validate reports every bad field at once.
func (o ConsumerOptions) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("tidemq: ConsumerOptions."+format, args...))
	}
	if o.Concurrency < 0 {
		bad("Concurrency must not be negative")
	}
	if o.MaxMessages < 0 || o.MaxMessages > 1000 {
		bad("MaxMessages must be between 1 and 1000")
	}
	if o.WaitSeconds < 0 || o.WaitSeconds > 30 {
		bad("WaitSeconds must be between 1 and 30")
	}
	if o.InvisibleSeconds < 0 || o.InvisibleSeconds > 43200 {
		bad("InvisibleSeconds must be between 1 and 43200")
	}
	if o.Grace < 0 {
		bad("Grace must not be negative")
	}
	if len(o.ConsumerID) > 128 {
		bad("ConsumerID must be at most 128 bytes")
	}
	return errors.Join(errs...)
}

func (o *ConsumerOptions) withDefaults() {
	if o.ConsumerID == "" {
		host, _ := os.Hostname()
		if host == "" {
			host = "consumer"
		}
		o.ConsumerID = host + "-" + strconv.Itoa(os.Getpid())
		if len(o.ConsumerID) > 128 {
			o.ConsumerID = o.ConsumerID[len(o.ConsumerID)-128:]
		}
	}
	if o.Concurrency == 0 {
		o.Concurrency = 4
	}
	if o.MaxMessages == 0 {
		o.MaxMessages = min(o.Concurrency, 1000)
	}
	if o.WaitSeconds == 0 {
		o.WaitSeconds = 20
	}
	if o.InvisibleSeconds == 0 {
		o.InvisibleSeconds = 30
	}
	if o.Grace == 0 {
		o.Grace = 30 * time.Second
	}
	if o.TracerProvider == nil {
		o.TracerProvider = otel.GetTracerProvider()
	}
}

// Consumer consumes one subscription (topic, group) with a Handler: see
// Run. It is safe for concurrent use, but runs one Run at a time.
type Consumer struct {
	c       *Client
	topic   string
	group   string
	opts    ConsumerOptions
	tracer  trace.Tracer
	running atomic.Bool
}

// NewConsumer returns a consumer of the group's subscription to topic.
func NewConsumer(c *Client, topic, group string, opts ConsumerOptions) (*Consumer, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts.withDefaults()
	return &Consumer{c: c, topic: topic, group: group, opts: opts,
		tracer: opts.TracerProvider.Tracer("github.com/tidemq/tidemq/sdk")}, nil
}

// Run pulls messages (long polls) and hands each to h, with up to
// Concurrency handlers at once: nil acks (acks are batched), an error
// nacks (see Handler). While a handler runs, its message's lease is
// extended. Orderly (see ConsumerOptions.Orderly): messages of one key are
// handled one after the other, in order; after a failure the key's later
// messages already pulled are nacked at once, so that the failed one comes
// first again.
//
// When ctx ends Run stops pulling, nacks (delay 0) the messages it pulled
// but did not start, lets running handlers finish (for up to Grace, then
// cancels their ctx and waits for them), sends the last acks, and returns
// nil. Temporary failures (network, 429, 503…) are retried with backoff;
// Run returns the first permanent one (ErrForbidden, ErrTopicNotFound
// without auto-create, ErrSubscriptionModeConflict, ErrClosed after the
// Client's Close…) after the same orderly stop. A second Run while one is
// going on returns ErrConsumerRunning at once.
func (cs *Consumer) Run(ctx context.Context, h Handler) error {
	if !cs.running.CompareAndSwap(false, true) {
		return ErrConsumerRunning
	}
	defer cs.running.Store(false)
	r := &run{
		cs: cs, h: h, orderly: cs.opts.Orderly,
		invisible: time.Duration(cs.opts.InvisibleSeconds) * time.Second,
		sem:       make(chan struct{}, cs.opts.Concurrency),
		work:      make(chan *task, cs.opts.Concurrency),
		settle:    make(chan settleOp, cs.opts.Concurrency),
		inHand:    map[string]*task{},
		busy:      map[string]bool{},
		keyQ:      map[string][]*task{},
	}
	if !r.orderly {
		if sub, err := cs.c.GetSubscription(ctx, cs.topic, cs.group); err == nil && sub.Orderly {
			r.orderly = true
		}
	}
	var hardStop context.CancelFunc
	r.handlerBase, hardStop = context.WithCancel(context.WithoutCancel(ctx))
	defer hardStop()

	var settlers, workers, keepers sync.WaitGroup
	settlers.Go(r.settler)
	for range cs.opts.Concurrency {
		workers.Go(r.worker)
	}
	stopKeeper := make(chan struct{})
	keepers.Go(func() { r.keeper(stopKeeper) })

	err := r.pullLoop(ctx)

	// Stop: no more dispatching; what was not started is given back.
	r.mu.Lock()
	r.stopping = true
	close(r.work)
	var unstarted []*task
	for k, q := range r.keyQ {
		unstarted = append(unstarted, q...)
		delete(r.keyQ, k)
	}
	r.mu.Unlock()
	for _, t := range unstarted {
		r.finish(t, errNotStarted)
	}
	grace := time.AfterFunc(cs.opts.Grace, hardStop)
	workers.Wait()
	grace.Stop()
	close(stopKeeper)
	keepers.Wait()
	close(r.settle)
	settlers.Wait()
	return err
}

// run is the state of one Run.
type run struct {
	cs          *Consumer
	h           Handler
	orderly     bool
	invisible   time.Duration
	handlerBase context.Context

	sem    chan struct{} // one token per message held
	work   chan *task    // ready to start; never more than held
	settle chan settleOp

	mu       sync.Mutex
	stopping bool
	inHand   map[string]*task   // by receipt handle: held, started or not
	busy     map[string]bool    // orderly keys with a message dispatched
	keyQ     map[string][]*task // orderly: held messages waiting for their key
}

type task struct {
	m     PulledMessage
	key   string
	lease time.Time // under run.mu: when the lease ends
	lost  bool      // under run.mu: the lease could not be extended
	// cancel ends the handler's ctx; set under run.mu when it starts.
	cancel context.CancelCauseFunc
}

// errNotStarted marks a held message given back unprocessed.
var errNotStarted = errors.New("consumer stopping; message not started")

// errKeyFailed marks an orderly message given back because an earlier
// message of its key failed.
var errKeyFailed = errors.New("an earlier message of its sharding key failed")

func (r *run) pullLoop(ctx context.Context) error {
	o := &r.cs.opts
	failures := 0
	for {
		select {
		case r.sem <- struct{}{}:
		case <-ctx.Done():
			return nil
		}
		n := 1
	more:
		for n < o.MaxMessages {
			select {
			case r.sem <- struct{}{}:
				n++
			default:
				break more
			}
		}
		start := time.Now()
		pctx, cancel := context.WithTimeout(ctx, time.Duration(o.WaitSeconds)*time.Second+15*time.Second)
		msgs, err := r.cs.c.Pull(pctx, r.cs.topic, r.cs.group, PullRequest{
			MaxMessages: n, WaitSeconds: o.WaitSeconds, InvisibleSeconds: o.InvisibleSeconds, ConsumerID: o.ConsumerID,
		})
		cancel()
		if len(msgs) > n {
			// More than asked for: give the extra back rather than hold
			// messages no slot was taken for.
			for _, m := range msgs[n:] {
				r.settle <- settleOp{kind: settleNack, handle: m.ReceiptHandle, delay: 0, reason: "consumer over capacity"}
			}
			msgs = msgs[:n]
		}
		for range n - len(msgs) {
			<-r.sem
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if !temporary(ctx, err) {
				return fmt.Errorf("tidemq: consumer %s/%s: %w", r.cs.topic, r.cs.group, err)
			}
			failures++
			wait := min(100*time.Millisecond<<min(failures, 6), 5*time.Second)
			var ae *APIError
			if errors.As(err, &ae) && ae.RetryAfter > wait {
				wait = ae.RetryAfter
			}
			r.cs.c.log.Warn("tidemq pull failed; retrying", "topic", r.cs.topic, "group", r.cs.group, "err", err, "wait", wait)
			if sleep(ctx, wait) != nil {
				return nil
			}
			continue
		}
		failures = 0
		r.dispatch(msgs, start)
		if ctx.Err() != nil {
			return nil
		}
	}
}

// keyOf is the ordering key of m: empty when order does not matter.
func (r *run) keyOf(m *PulledMessage) string {
	switch {
	case !r.orderly:
		return ""
	case m.ShardingKey != "":
		return "k:" + m.ShardingKey
	}
	return "q:" + strconv.Itoa(m.QueueID)
}

// dispatch hands pulled messages to the workers, holding back those whose
// key is busy. The sends never block: work has room for every message held.
func (r *run) dispatch(msgs []PulledMessage, leasedAt time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range msgs {
		t := &task{m: msgs[i], lease: leasedAt.Add(r.invisible)}
		t.key = r.keyOf(&t.m)
		r.inHand[t.m.ReceiptHandle] = t
		if t.key != "" {
			if r.busy[t.key] {
				r.keyQ[t.key] = append(r.keyQ[t.key], t)
				continue
			}
			r.busy[t.key] = true
		}
		r.work <- t
	}
}

func (r *run) worker() {
	for t := range r.work {
		r.mu.Lock()
		if r.stopping {
			r.mu.Unlock()
			r.finish(t, errNotStarted)
			continue
		}
		ctx, cancel := context.WithCancelCause(r.handlerBase)
		t.cancel = cancel
		r.mu.Unlock()
		err := r.handle(ctx, t)
		cancel(nil)
		r.finish(t, err)
	}
}

func (r *run) handle(ctx context.Context, t *task) (err error) {
	m := &t.m
	if m.Traceparent != "" {
		ctx = traceContext.Extract(ctx, propagation.MapCarrier{"traceparent": m.Traceparent})
	}
	ctx, span := r.cs.tracer.Start(ctx, "tidemq.process", trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(
			attribute.String("messaging.system", "tidemq"),
			attribute.String("messaging.operation.type", "process"),
			attribute.String("messaging.destination.name", r.cs.topic),
			attribute.String("messaging.consumer.group.name", r.cs.group),
			attribute.String("messaging.message.id", m.MessageID),
			attribute.Int("messaging.tidemq.delivery_attempt", m.DeliveryAttempt),
		))
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("tidemq: handler panicked: %v", v)
		}
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}()
	return r.h(ctx, m)
}

// finish settles a held message by the handler's outcome and frees its
// slot; an orderly key moves on to its next message.
func (r *run) finish(t *task, err error) {
	op := r.settleOpFor(t, err)
	var release []*task
	cause := errKeyFailed
	r.mu.Lock()
	if r.stopping {
		cause = errNotStarted
	}
	delete(r.inHand, t.m.ReceiptHandle)
	if t.key != "" && r.busy[t.key] && !errors.Is(err, errNotStarted) && !errors.Is(err, errKeyFailed) {
		q := r.keyQ[t.key]
		switch {
		case len(q) > 0 && (r.stopping || op.kind == settleNack):
			release = q
			delete(r.keyQ, t.key)
			delete(r.busy, t.key)
		case len(q) > 0:
			r.keyQ[t.key] = q[1:]
			if len(q) == 1 {
				delete(r.keyQ, t.key)
			}
			r.work <- q[0]
		default:
			delete(r.busy, t.key)
		}
	}
	r.mu.Unlock()
	r.settle <- op
	<-r.sem
	for _, next := range release {
		r.finish(next, cause)
	}
}

type settleKind int

const (
	settleAck settleKind = iota
	settleNack
	settleDead
)

type settleOp struct {
	kind   settleKind
	handle string
	delay  int // nack: seconds, or -1 for the subscription's schedule
	reason string
}

func (r *run) settleOpFor(t *task, err error) settleOp {
	op := settleOp{handle: t.m.ReceiptHandle, delay: -1}
	var ra *retryAfterError
	var dl *deadLetterError
	switch {
	case err == nil:
		op.kind = settleAck
	case errors.Is(err, errNotStarted), errors.Is(err, errKeyFailed):
		op.kind, op.delay, op.reason = settleNack, 0, err.Error()
	case errors.As(err, &dl):
		op.kind, op.reason = settleDead, reason(err, "dead-lettered by the handler")
	case errors.As(err, &ra):
		secs := (ra.delay + time.Second - 1) / time.Second
		op.kind, op.delay, op.reason = settleNack, int(min(secs, 43200)), reason(err, "retry after "+ra.delay.String())
	default:
		op.kind, op.reason = settleNack, reason(err, "")
	}
	return op
}

// reason is err's text cut to the API's 1024 characters.
func reason(err error, def string) string {
	s := err.Error()
	if s == "" {
		s = def
	}
	if utf8.RuneCountInString(s) <= 1024 {
		return s
	}
	r := []rune(s)
	return string(r[:1021]) + "..."
}

// settler sends acks, nacks and dead-letters, batching what is waiting.
// It keeps going after Run's ctx ended, until settle is closed and drained.
func (r *run) settler() {
	for op := range r.settle {
		ops := []settleOp{op}
	drain:
		for len(ops) < 1000 {
			select {
			case op, ok := <-r.settle:
				if !ok {
					break drain
				}
				ops = append(ops, op)
			default:
				break drain
			}
		}
		r.flushSettle(ops)
	}
}

type nackGroup struct {
	delay  int
	reason string
}

func (r *run) flushSettle(ops []settleOp) {
	var acks []string
	nacks := map[nackGroup][]string{}
	dead := map[string][]string{}
	for _, op := range ops {
		switch op.kind {
		case settleAck:
			acks = append(acks, op.handle)
		case settleNack:
			g := nackGroup{op.delay, op.reason}
			nacks[g] = append(nacks[g], op.handle)
		case settleDead:
			dead[op.reason] = append(dead[op.reason], op.handle)
		}
	}
	c, topic, group := r.cs.c, r.cs.topic, r.cs.group
	if len(acks) > 0 {
		r.settleCall("ack", func(ctx context.Context) ([]HandleFailure, error) {
			res, err := c.Ack(ctx, topic, group, AckRequest{ReceiptHandles: acks})
			return res.Failed, err
		})
	}
	for g, hs := range nacks {
		req := NackRequest{ReceiptHandles: hs, Reason: g.reason}
		if g.delay >= 0 {
			req.DelaySeconds = &g.delay
		}
		r.settleCall("nack", func(ctx context.Context) ([]HandleFailure, error) {
			res, err := c.Nack(ctx, topic, group, req)
			return res.Failed, err
		})
	}
	for why, hs := range dead {
		r.settleCall("deadletter", func(ctx context.Context) ([]HandleFailure, error) {
			res, err := c.DeadLetter(ctx, topic, group, DeadLetterRequest{ReceiptHandles: hs, Reason: why})
			return res.Failed, err
		})
	}
}

// settleCall makes one settle request, retrying temporary failures for up
// to 15 seconds. A message whose settle is lost is delivered again when its
// lease ends: at least once.
func (r *run) settleCall(what string, call func(context.Context) ([]HandleFailure, error)) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	log := r.cs.c.log
	for attempt := 0; ; attempt++ {
		actx, acancel := context.WithTimeout(ctx, 5*time.Second)
		failed, err := call(actx)
		acancel()
		if err == nil {
			for _, f := range failed {
				log.Debug("tidemq "+what+" refused", "topic", r.cs.topic, "group", r.cs.group, "code", f.Code)
			}
			return
		}
		if !temporary(ctx, err) {
			log.Warn("tidemq "+what+" failed", "topic", r.cs.topic, "group", r.cs.group, "err", err)
			return
		}
		if sleep(ctx, min(50*time.Millisecond<<min(attempt, 5), time.Second)) != nil {
			log.Warn("tidemq "+what+" failed; giving up", "topic", r.cs.topic, "group", r.cs.group, "err", err)
			return
		}
	}
}

// keeper extends the leases of held messages when half of the lease is
// left, in one request per tick.
func (r *run) keeper(stop <-chan struct{}) {
	tick := time.NewTicker(max(r.invisible/4, 100*time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
			r.extendDue()
		}
	}
}

func (r *run) extendDue() {
	now := time.Now()
	var due []string
	r.mu.Lock()
	for h, t := range r.inHand {
		if !t.lost && t.lease.Sub(now) < r.invisible/2 {
			due = append(due, h)
		}
	}
	r.mu.Unlock()
	for len(due) > 0 {
		chunk := due[:min(len(due), 1000)]
		due = due[len(chunk):]
		ctx, cancel := context.WithTimeout(context.Background(), max(r.invisible/4, time.Second))
		sent := time.Now()
		res, err := r.cs.c.Extend(ctx, r.cs.topic, r.cs.group, ExtendRequest{ReceiptHandles: chunk, InvisibleSeconds: r.cs.opts.InvisibleSeconds})
		cancel()
		if err != nil {
			r.cs.c.log.Warn("tidemq extend failed; trying again", "topic", r.cs.topic, "group", r.cs.group, "err", err)
			continue
		}
		failed := map[string]bool{}
		for _, f := range res.Failed {
			failed[f.ReceiptHandle] = true
		}
		r.mu.Lock()
		for _, h := range chunk {
			t := r.inHand[h]
			switch {
			case t == nil:
			case failed[h]:
				t.lost = true
				if t.cancel != nil {
					t.cancel(ErrLeaseLost)
				}
			default:
				t.lease = sent.Add(r.invisible)
			}
		}
		r.mu.Unlock()
	}
}
