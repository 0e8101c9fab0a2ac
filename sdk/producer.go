package sdk

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nuid"
	"github.com/sony/gobreaker/v2"
	"go.opentelemetry.io/otel/propagation"
)

// ProducerOptions configures a Producer. The zero value works; each zero
// field takes the default named in its comment.
type ProducerOptions struct {
	// Group is sent as X-Producer-Group and recorded on each message.
	Group string

	// RetryTimeout bounds how long a send keeps retrying temporary failures
	// (network errors, 429, 502, 503, 504, 507), counted from the call
	// (Send, SendBatch) or from SendAsync: no wait between attempts runs
	// past it, the last attempt starts at the latest when it ends, so a
	// call returns within RetryTimeout plus one AttemptTimeout. Default
	// 10s; negative: one attempt, no retries.
	RetryTimeout time.Duration
	// AttemptTimeout bounds one HTTP attempt (default 10s).
	AttemptTimeout time.Duration
	// MinBackoff and MaxBackoff bound the jittered exponential wait between
	// attempts (defaults 50ms and 2s). A longer Retry-After from the server
	// wins; one beyond RetryTimeout ends the call at once.
	MinBackoff, MaxBackoff time.Duration

	// NoAutoDedup stops the producer from giving every message without a
	// DedupKey a unique one (half messages of SendInTransaction never get
	// one: the broker takes none on them). With it, a retried send whose first attempt
	// was stored but not answered stores a duplicate. Without it, the
	// server remembers each key for 5 minutes (memory and disk).
	NoAutoDedup bool

	// BreakerFailures is how many consecutive failed attempts, of all the
	// producer's calls, open the circuit breaker (default 5), once the
	// broker has answered nothing for BreakerQuietFor. While it is
	// open no request is sent: a call that starts then fails at once with
	// ErrCircuitOpen. A call that started before, with the breaker closed,
	// is riding out the outage: it waits for the breaker to half-open if
	// that comes within its RetryTimeout, else it fails at once with
	// ErrCircuitOpen too. Attempts that failed for want of the broker
	// count (no reply, 502, 503, 504, 507); answers (even 4xx) and 429
	// do not.
	BreakerFailures uint32
	// BreakerQuietFor is how long the broker must have answered no
	// attempt before failures may open the breaker (default 1s), so that
	// replies lost among answered ones (a flaky link, a proxy) do not open
	// it and an outage shorter than it is ridden out by retries alone. A
	// producer that never got an answer opens it on failures alone.
	BreakerQuietFor time.Duration
	// BreakerOpenFor is how long the breaker stays open before one probe
	// request may go (default 2s): the call that sends it fails at once
	// with ErrCircuitOpen if the probe fails, unless it is riding out the
	// outage; when the probe succeeds the breaker closes.
	BreakerOpenFor time.Duration
	// NoBreaker turns the circuit breaker off.
	NoBreaker bool

	// BatchMaxMessages caps one async batch (default 100, at most 1000).
	BatchMaxMessages int
	// BatchMaxBytes caps the approximate JSON size of one async batch
	// (default 1 MiB, at most 15 MiB).
	BatchMaxBytes int
	// Linger is how long the first message of an async batch waits for
	// others (default 5ms).
	Linger time.Duration
	// BufferMessages caps messages accepted by SendAsync and not yet sent
	// (default 10000); SendAsync blocks while it is full.
	BufferMessages int

	// TransactionCheckAfter is how long the broker waits for the commit or
	// rollback of a SendInTransaction before its check-back asks the
	// topic's TransactionCheckURL (default 30s; whole seconds, rounded
	// up). It must exceed the local transaction's usual duration, or
	// checks arrive while it still runs (the check handler then answers
	// TransactionUnknown). The CheckAfter option sets it per call.
	TransactionCheckAfter time.Duration
}

// Limits of the API a producer must respect.
const (
	maxBatchMessages = 1000
	maxBatchBytes    = 15 << 20 // a request is at most 16 MiB
)

// Validate reports every bad field at once.
func (o ProducerOptions) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("tidemq: ProducerOptions."+format, args...))
	}
	if o.AttemptTimeout < 0 {
		bad("AttemptTimeout must not be negative")
	}
	if o.MinBackoff < 0 || o.MaxBackoff < 0 {
		bad("MinBackoff and MaxBackoff must not be negative")
	}
	if o.MinBackoff > 0 && o.MaxBackoff > 0 && o.MinBackoff > o.MaxBackoff {
		bad("MinBackoff %v is above MaxBackoff %v", o.MinBackoff, o.MaxBackoff)
	}
	if o.BreakerOpenFor < 0 || o.BreakerQuietFor < 0 {
		bad("BreakerOpenFor and BreakerQuietFor must not be negative")
	}
	if o.BatchMaxMessages < 0 || o.BatchMaxMessages > maxBatchMessages {
		bad("BatchMaxMessages must be between 1 and %d", maxBatchMessages)
	}
	if o.BatchMaxBytes < 0 || o.BatchMaxBytes > maxBatchBytes {
		bad("BatchMaxBytes must be between 1 and %d", maxBatchBytes)
	}
	if o.Linger < 0 {
		bad("Linger must not be negative")
	}
	if o.BufferMessages < 0 {
		bad("BufferMessages must not be negative")
	}
	if o.TransactionCheckAfter < 0 {
		bad("TransactionCheckAfter must not be negative")
	}
	return errors.Join(errs...)
}

func (o *ProducerOptions) withDefaults() {
	def := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	def(&o.RetryTimeout, 10*time.Second)
	def(&o.AttemptTimeout, 10*time.Second)
	def(&o.MinBackoff, 50*time.Millisecond)
	def(&o.MaxBackoff, 2*time.Second)
	o.MaxBackoff = max(o.MaxBackoff, o.MinBackoff)
	def(&o.BreakerOpenFor, 2*time.Second)
	def(&o.BreakerQuietFor, time.Second)
	def(&o.Linger, 5*time.Millisecond)
	def(&o.TransactionCheckAfter, 30*time.Second)
	if o.BreakerFailures == 0 {
		o.BreakerFailures = 5
	}
	if o.BatchMaxMessages == 0 {
		o.BatchMaxMessages = 100
	}
	if o.BatchMaxBytes == 0 {
		o.BatchMaxBytes = 1 << 20
	}
	if o.BufferMessages == 0 {
		o.BufferMessages = 10000
	}
}

// Producer sends messages to one topic: Send and SendBatch wait for the
// reply; SendAsync batches messages by size and linger time and answers
// through a Future. Every send retries temporary failures with backoff
// under a dedup key, so a retry never stores a duplicate, and goes through
// a circuit breaker so callers fail fast (ErrCircuitOpen) while the broker
// is down. A send that did not get through matches ErrUnavailable (with
// errors.Is), one the broker refused ErrRejected. The caller's trace (ctx)
// is sent as traceparent.
//
// A Producer is safe for concurrent use. It owns one goroutine, the async
// batcher, which Close stops.
type Producer struct {
	c     *Client
	topic string
	opts  ProducerOptions

	cb         *gobreaker.TwoStepCircuitBreaker[struct{}]
	openUntil  atomic.Int64 // UnixNano the breaker may half-open
	lastAnswer atomic.Int64 // UnixNano of the broker's last answer, 0 before the first

	mu     sync.RWMutex // guards closed against sends on in
	closed bool
	in     chan asyncItem
	wg     sync.WaitGroup
}

// NewProducer returns a producer of topic. Close it to flush SendAsync's
// messages and stop its goroutine.
func NewProducer(c *Client, topic string, opts ProducerOptions) (*Producer, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts.withDefaults()
	p := &Producer{c: c, topic: topic, opts: opts, in: make(chan asyncItem, opts.BufferMessages)}
	if !opts.NoBreaker {
		p.cb = gobreaker.NewTwoStepCircuitBreaker[struct{}](gobreaker.Settings{
			Name:        "tidemq producer " + topic,
			MaxRequests: 1,
			Timeout:     opts.BreakerOpenFor,
			ReadyToTrip: func(n gobreaker.Counts) bool {
				last := p.lastAnswer.Load()
				return n.ConsecutiveFailures >= opts.BreakerFailures &&
					(last == 0 || time.Since(time.Unix(0, last)) >= opts.BreakerQuietFor)
			},
			IsExcluded: func(err error) bool { return errors.Is(err, errBreakerIgnore) },
			OnStateChange: func(_ string, from, to gobreaker.State) {
				if to == gobreaker.StateOpen {
					p.openUntil.Store(time.Now().Add(opts.BreakerOpenFor).UnixNano())
				}
				c.log.Debug("tidemq producer circuit breaker", "topic", topic, "from", from.String(), "to", to.String())
			},
		})
	}
	p.wg.Go(p.batcher)
	return p, nil
}

// Topic is the topic the producer sends to.
func (p *Producer) Topic() string { return p.topic }

// Send sends one message and waits until it is stored. It retries temporary
// failures for up to RetryTimeout (or until ctx ends) under the message's
// DedupKey, generated when empty, so that the message is stored once.
// A retry whose earlier attempt was stored but not answered gets the stored
// message's result, with Duplicate set.
//
// Errors: *APIError for a refused message (ErrRejected; errors.Is(err,
// ErrMessageTooLarge)…); ErrUnavailable wrapping the last attempt's error
// when the budget ran out, and also ErrCircuitOpen when the breaker
// refused the call; ErrClosed; or ctx's error (joined with the last
// attempt's).
func (p *Producer) Send(ctx context.Context, m SendMessage) (SendResult, error) {
	if p.isClosed() {
		return SendResult{}, ErrClosed
	}
	p.prepare(&m)
	var res SendResult
	err := p.call(ctx, p.deadline(time.Now()), "send", func(actx context.Context) error {
		var err error
		res, err = p.c.Send(actx, p.topic, p.opts.Group, m)
		return err
	})
	return res, err
}

// SendBatch sends up to 1000 messages in one atomic request and waits until
// they are stored; results are in the order of msgs. Retries are those of
// Send. A bad message fails the whole batch with an *APIError whose Entry
// is its index, and nothing is stored.
func (p *Producer) SendBatch(ctx context.Context, msgs []SendMessage) ([]SendResult, error) {
	if p.isClosed() {
		return nil, ErrClosed
	}
	msgs = append([]SendMessage(nil), msgs...)
	for i := range msgs {
		p.prepare(&msgs[i])
	}
	var res []SendResult
	err := p.call(ctx, p.deadline(time.Now()), "send batch", func(actx context.Context) error {
		var err error
		res, err = p.c.SendBatch(actx, p.topic, p.opts.Group, msgs)
		return err
	})
	return res, err
}

func (p *Producer) prepare(m *SendMessage) {
	if m.DedupKey == "" && !p.opts.NoAutoDedup {
		m.DedupKey = nuid.Next()
	}
}

func (p *Producer) isClosed() bool {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.closed
}

func (p *Producer) deadline(start time.Time) time.Time {
	if p.opts.RetryTimeout < 0 {
		return time.Time{} // no retries
	}
	return start.Add(p.opts.RetryTimeout)
}

// errBreakerIgnore marks an outcome the breaker must not count.
var errBreakerIgnore = errors.New("not counted")

// call runs op until it succeeds, fails for good, or the retry budget
// (deadline; zero means a single attempt) or ctx ends. Each attempt goes
// through the circuit breaker and has its own timeout. No sleep runs past
// the deadline: a backoff longer than the time left is cut to it and one
// last attempt goes at the deadline, so that the call returns within
// RetryTimeout plus one AttemptTimeout.
//
// A call that finds the breaker open (or half-open with its probe out) at
// its start fails at once with ErrCircuitOpen. One that began with the
// breaker closed is riding out an outage it met: it waits for the breaker
// to let a request through again, if that comes within its budget.
func (p *Producer) call(ctx context.Context, deadline time.Time, what string, op func(context.Context) error) error {
	start := time.Now()
	riding := p.breakerClosed()
	var lastErr error
	for attempt := 1; ; {
		done, err := p.allow()
		if err != nil {
			if !riding || deadline.IsZero() {
				return p.gaveUp(what, attempt-1, start, true, lastErr)
			}
			// Open: wait for it to half-open. Half-open with its probe
			// out: the probe's answer is near.
			until := time.Until(time.Unix(0, p.openUntil.Load()))
			left := time.Until(deadline)
			if left <= 0 || until > left {
				return p.gaveUp(what, attempt-1, start, true, lastErr)
			}
			wait := max(until, p.opts.MinBackoff/2) + rand.N(p.opts.MinBackoff/2+1)
			if err := sleep(ctx, min(wait, left)); err != nil {
				return errors.Join(err, lastErr)
			}
			continue
		}
		actx, cancel := context.WithTimeout(ctx, p.opts.AttemptTimeout)
		err = op(actx)
		cancel()
		outcome := p.outcome(ctx, err)
		if outcome == nil {
			p.lastAnswer.Store(time.Now().UnixNano())
		}
		done(outcome)
		if err == nil {
			return nil
		}
		if !temporary(ctx, err) {
			return err
		}
		lastErr = err
		left := time.Until(deadline)
		if deadline.IsZero() || left <= 0 {
			return p.gaveUp(what, attempt, start, false, err)
		}
		wait := p.backoff(attempt)
		var ae *APIError
		if errors.As(err, &ae) && ae.RetryAfter > wait {
			if ae.RetryAfter > left {
				// The server asked for a wait beyond the budget.
				return p.gaveUp(what, attempt, start, false, err)
			}
			wait = ae.RetryAfter
		}
		if err := sleep(ctx, min(wait, left)); err != nil {
			return errors.Join(err, lastErr)
		}
		attempt++
	}
}

// gaveUp is the error of a call that did not get through: ErrUnavailable,
// with ErrCircuitOpen when the breaker refused it, wrapping the last
// attempt's error if there was one.
func (p *Producer) gaveUp(what string, attempts int, start time.Time, circuit bool, cause error) error {
	e := &gaveUpError{kinds: []error{ErrUnavailable}, cause: cause}
	took := time.Since(start).Round(time.Millisecond)
	switch {
	case circuit:
		e.kinds = append(e.kinds, ErrCircuitOpen)
		e.msg = fmt.Sprintf("tidemq: %s to %s: circuit breaker open after %d attempts in %v", what, p.topic, attempts, took)
		if attempts == 0 {
			e.msg = fmt.Sprintf("tidemq: %s to %s: circuit breaker open", what, p.topic)
		}
	default:
		e.msg = fmt.Sprintf("tidemq: %s to %s: broker unavailable after %d attempts in %v", what, p.topic, attempts, took)
	}
	return e
}

// breakerClosed reports whether requests go through freely.
func (p *Producer) breakerClosed() bool {
	return p.cb == nil || p.cb.State() == gobreaker.StateClosed
}

func (p *Producer) allow() (func(error), error) {
	if p.cb == nil {
		return func(error) {}, nil
	}
	return p.cb.Allow()
}

// outcome is what the breaker learns from an attempt: success when the
// broker answered (even with a client error), failure when it did not or
// said it cannot take writes, nothing when the caller gave up or was rate
// limited. A success resets the count of consecutive failures, and closes
// a half-open breaker.
func (p *Producer) outcome(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		return errBreakerIgnore
	}
	var ae *APIError
	if errors.As(err, &ae) {
		switch {
		case ae.Status == 429:
			return errBreakerIgnore
		case ae.Temporary():
			return err
		}
		return nil
	}
	if temporary(ctx, err) {
		return err
	}
	return nil
}

// backoff is the jittered exponential wait after the attempt-th failure.
func (p *Producer) backoff(attempt int) time.Duration {
	d := p.opts.MinBackoff
	for i := 1; i < attempt && d < p.opts.MaxBackoff; i++ {
		d *= 2
	}
	d = min(d, p.opts.MaxBackoff)
	return d/2 + rand.N(d/2+1)
}

// sleep waits d or until ctx ends (then it returns ctx's error).
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// ------------------------------------------------------------------ async

// Future is the result of SendAsync, ready when Done is closed.
type Future struct {
	done chan struct{}
	res  SendResult
	err  error
	cb   func(SendResult, error)
}

func newFuture(cb func(SendResult, error)) *Future {
	return &Future{done: make(chan struct{}), cb: cb}
}

func (f *Future) resolve(res SendResult, err error) {
	f.res, f.err = res, err
	close(f.done)
	if f.cb != nil {
		f.cb(res, err)
	}
}

// Done is closed once the result is known.
func (f *Future) Done() <-chan struct{} { return f.done }

// Wait waits for the result, or for ctx to end (then it returns ctx's
// error; the send goes on).
func (f *Future) Wait(ctx context.Context) (SendResult, error) {
	select {
	case <-f.done:
		return f.res, f.err
	case <-ctx.Done():
		return SendResult{}, ctx.Err()
	}
}

// asyncItem is a message accepted by SendAsync, or (flush != nil) a marker
// asking the batcher to send what it holds.
type asyncItem struct {
	msg      SendMessage
	trace    propagation.MapCarrier
	traceKey string
	size     int
	deadline time.Time
	fut      *Future
	flush    chan struct{}
}

// SendAsync queues m for sending in a batch (messages:batch) and returns at
// once, or when the buffer has room (BufferMessages) — ctx bounds only that
// wait. The message is stored at most once (see Send); its retry budget
// (RetryTimeout) runs from now. The Future gives the result; after Close it
// is ErrClosed. Messages of one producer are sent in the order given.
// Messages whose ctx carry different traces go in different requests, since
// traceparent is per request.
func (p *Producer) SendAsync(ctx context.Context, m SendMessage) *Future {
	return p.sendAsync(ctx, m, nil)
}

// SendAsyncFunc is SendAsync with a callback, called once with the result
// from the producer's goroutine (or from this call when m is refused at
// once). The callback must not block.
func (p *Producer) SendAsyncFunc(ctx context.Context, m SendMessage, cb func(SendResult, error)) {
	p.sendAsync(ctx, m, cb)
}

func (p *Producer) sendAsync(ctx context.Context, m SendMessage, cb func(SendResult, error)) *Future {
	f := newFuture(cb)
	p.prepare(&m)
	it := asyncItem{msg: m, trace: propagation.MapCarrier{}, fut: f, deadline: p.deadline(time.Now())}
	traceContext.Inject(ctx, it.trace)
	it.traceKey = it.trace.Get("traceparent") + "|" + it.trace.Get("tracestate")
	it.size = approxSize(&m)
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		f.resolve(SendResult{}, ErrClosed)
		return f
	}
	if err := ctx.Err(); err != nil {
		f.resolve(SendResult{}, err)
		return f
	}
	select {
	case p.in <- it:
	case <-ctx.Done():
		f.resolve(SendResult{}, ctx.Err())
	}
	return f
}

// approxSize estimates a message's JSON size, to cut batches below the
// server's request limit.
func approxSize(m *SendMessage) int {
	n := 64 + len(m.Body) + len(m.Tag) + len(m.ShardingKey) + len(m.DedupKey)
	for _, k := range m.Keys {
		n += len(k) + 4
	}
	for k, v := range m.Properties {
		n += len(k) + len(v) + 6
	}
	return n
}

// Flush waits until every message given to SendAsync before the call has
// its result, or ctx ends.
func (p *Producer) Flush(ctx context.Context) error {
	done := make(chan struct{})
	p.mu.RLock()
	if p.closed {
		p.mu.RUnlock()
		return ErrClosed
	}
	select {
	case p.in <- asyncItem{flush: done}:
	case <-ctx.Done():
		p.mu.RUnlock()
		return ctx.Err()
	}
	p.mu.RUnlock()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close stops accepting messages, sends those SendAsync queued (each within
// its retry budget), stops the batcher and waits for it. Later sends fail
// with ErrClosed. Close is idempotent and returns nil; each message's
// outcome is in its Future.
func (p *Producer) Close() error {
	p.mu.Lock()
	if !p.closed {
		p.closed = true
		close(p.in)
	}
	p.mu.Unlock()
	p.wg.Wait()
	return nil
}

// batcher is the producer's goroutine: it gathers SendAsync's messages
// into batches and sends them, one request at a time, in order.
func (p *Producer) batcher() {
	var pending []asyncItem
	size := 0
	linger := time.NewTimer(time.Hour)
	linger.Stop()
	defer linger.Stop()
	flush := func() {
		linger.Stop()
		if len(pending) > 0 {
			p.sendPending(pending)
			pending, size = nil, 0
		}
	}
	for {
		select {
		case it, ok := <-p.in:
			if !ok {
				flush()
				return
			}
			if it.flush != nil {
				flush()
				close(it.flush)
				continue
			}
			if len(pending) > 0 && size+it.size > p.opts.BatchMaxBytes {
				flush()
			}
			pending = append(pending, it)
			size += it.size
			if len(pending) == 1 {
				linger.Reset(p.opts.Linger)
			}
			if len(pending) >= p.opts.BatchMaxMessages || size >= p.opts.BatchMaxBytes {
				flush()
			}
		case <-linger.C:
			flush()
		}
	}
}

// sendPending sends one batch's worth of items: one request per distinct
// trace, in order of first appearance.
func (p *Producer) sendPending(items []asyncItem) {
	var order []string
	groups := map[string][]asyncItem{}
	for _, it := range items {
		if _, ok := groups[it.traceKey]; !ok {
			order = append(order, it.traceKey)
		}
		groups[it.traceKey] = append(groups[it.traceKey], it)
	}
	for _, k := range order {
		p.sendGroup(groups[k])
	}
}

// sendGroup sends items (of one trace) as a batch and resolves their
// futures. A batch refused for one bad entry is sent again without it; a
// batch refused as a whole for another reason (too large…) is sent message
// by message, so that each gets its own answer.
func (p *Producer) sendGroup(items []asyncItem) {
	ctx := traceContext.Extract(context.Background(), items[0].trace)
	for len(items) > 0 {
		msgs := make([]SendMessage, len(items))
		for i := range items {
			msgs[i] = items[i].msg
		}
		var res []SendResult
		err := p.call(ctx, items[0].deadline, "send batch", func(actx context.Context) error {
			var err error
			res, err = p.c.SendBatch(actx, p.topic, p.opts.Group, msgs)
			return err
		})
		if err == nil {
			for i, it := range items {
				it.fut.resolve(res[i], nil)
			}
			return
		}
		var ae *APIError
		bad, isEntry := -1, false
		if errors.As(err, &ae) && ae.Status == 400 {
			bad, isEntry = batchEntry(ae)
			isEntry = isEntry && bad < len(items)
		}
		switch {
		case isEntry:
			items[bad].fut.resolve(SendResult{}, err)
			items = append(items[:bad:bad], items[bad+1:]...)
		case len(items) > 1 && errors.As(err, &ae) && !ae.Temporary():
			for _, it := range items {
				p.sendGroup([]asyncItem{it})
			}
			return
		default:
			for _, it := range items {
				it.fut.resolve(SendResult{}, err)
			}
			return
		}
	}
}

// batchEntry is the index of the bad message of a refused batch: the
// problem's entry, or else the index in its pointer ("/messages/3/tag").
func batchEntry(ae *APIError) (int, bool) {
	if ae.Entry != nil {
		return *ae.Entry, *ae.Entry >= 0
	}
	rest, ok := strings.CutPrefix(ae.Pointer, "/messages/")
	if !ok {
		return 0, false
	}
	digits, _, _ := strings.Cut(rest, "/")
	n, err := strconv.Atoi(digits)
	return n, err == nil && n >= 0
}
