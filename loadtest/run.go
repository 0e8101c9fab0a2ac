package loadtest

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tidemq/tidemq/sdk"
)

// runner is the state of one Run.
type runner struct {
	s       Scenario
	runID   string
	topic   string // path-escaped topic
	group   string // path-escaped group
	payload string
	bodies  []*rand.ChaCha8 // the plain client's random bodies, one source per producer

	sendRecs, pullRecs, ackRecs, e2eRecs []*recorder
	sendErrs, pullErrs, ackErrs          errorCounts

	remaining atomic.Int64 // messages producers may still claim (Messages > 0)

	sendReqs, sent                        atomic.Int64
	pullReqs, pulled, emptyPulls          atomic.Int64
	ackReqs, ackMsgs, acked               atomic.Int64
	delivered, redelivered, stale, missed atomic.Int64
	stopConsumers                         atomic.Bool
}

// Run runs the scenario and returns what it measured. It creates the topic
// and subscription (unless SkipSetup), starts the consumers, then the
// producers; when the producers stop (Duration or Messages reached) the
// consumers go on until every message sent was delivered once or
// DrainTimeout passes; then a topic Run made is deleted.
//
// The error is a setup or cleanup failure, an invalid scenario, or ctx's
// error when ctx ended the run early; the report then holds what was
// measured until then. Failed sends, pulls and acks are not errors of Run:
// they are counted in the report by problem code.
func (s Scenario) Run(ctx context.Context) (Report, error) {
	if err := s.Validate(); err != nil {
		return Report{}, err
	}
	s = s.withDefaults()
	r := &runner{s: s, runID: s.RunID}
	if r.runID == "" {
		r.runID = fmt.Sprintf("%08x", rand.Uint32())
	}
	ownTopic := s.Topic == ""
	if ownTopic {
		s.Topic = "loadtest-" + r.runID
		r.s.Topic = s.Topic
	}
	r.topic, r.group = url.PathEscape(s.Topic), url.PathEscape(s.Group)
	r.payload = letters(s.Producers.MessageBytes, rand.Uint64())
	rep := Report{RunID: r.runID, Scenario: s}

	if !s.SkipSetup {
		if err := r.setup(ctx); err != nil {
			return rep, err
		}
	}
	var cleanupErr error
	if ownTopic && !s.SkipSetup {
		defer func() {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			if err := r.do(cctx, "DELETE", "/v1/topics/"+r.topic, nil, nil); err != nil {
				cleanupErr = fmt.Errorf("loadtest: deleting topic %s: %w", s.Topic, err)
			}
		}()
	}
	rep = r.run(ctx, rep)
	return rep, errors.Join(ctx.Err(), cleanupErr)
}

// setup creates the topic and, with consumers, the subscription.
func (r *runner) setup(ctx context.Context) error {
	topicCfg := map[string]any{}
	if r.s.Queues > 0 {
		topicCfg["queues"] = r.s.Queues
	}
	body, _ := json.Marshal(topicCfg)
	if err := r.do(ctx, "PUT", "/v1/topics/"+r.topic, body, nil); err != nil {
		return fmt.Errorf("loadtest: creating topic %s: %w", r.s.Topic, err)
	}
	if r.s.Consumers.Count == 0 {
		return nil
	}
	body, _ = json.Marshal(map[string]string{"startFrom": r.s.Consumers.StartFrom})
	if err := r.do(ctx, "PUT", "/v1/topics/"+r.topic+"/subscriptions/"+r.group, body, nil); err != nil {
		return fmt.Errorf("loadtest: creating subscription %s/%s: %w", r.s.Topic, r.s.Group, err)
	}
	return nil
}

// run starts the workers and waits for them.
func (r *runner) run(ctx context.Context, rep Report) Report {
	s := r.s
	for i := range s.Producers.Count {
		r.sendRecs = append(r.sendRecs, newRecorder())
		if s.ClientKind == ClientPlain {
			var seed [32]byte
			binary.LittleEndian.PutUint64(seed[:], rand.Uint64())
			binary.LittleEndian.PutUint64(seed[8:], uint64(i))
			r.bodies = append(r.bodies, rand.NewChaCha8(seed))
		}
	}
	for range s.Consumers.Count {
		r.pullRecs = append(r.pullRecs, newRecorder())
		r.ackRecs = append(r.ackRecs, newRecorder())
		r.e2eRecs = append(r.e2eRecs, newRecorder())
	}
	r.remaining.Store(s.Messages)

	start := time.Now()
	rep.Start = start
	var deadline time.Time // zero: no time limit
	if s.Duration > 0 {
		deadline = start.Add(s.Duration)
	}

	consCtx, stopCons := context.WithCancel(ctx)
	defer stopCons()
	var consumers sync.WaitGroup
	for i := range s.Consumers.Count {
		consumers.Go(func() { r.consume(ctx, consCtx, i) })
	}

	stopProgress := make(chan struct{})
	var progress sync.WaitGroup
	if s.Progress != nil || s.OnInterval != nil {
		progress.Go(func() { r.progress(start, stopProgress) })
	}

	prodEnd := start
	if s.Producers.Count > 0 {
		var producers sync.WaitGroup
		if s.Producers.Rate > 0 {
			r.openLoop(ctx, &producers, start, deadline)
		} else {
			for i := range s.Producers.Count {
				producers.Go(func() { r.closedLoop(ctx, i, deadline) })
			}
		}
		producers.Wait()
		prodEnd = time.Now()
		// Consumers drain what was sent.
		if s.Consumers.Count > 0 {
			r.waitFor(ctx, time.Now().Add(s.DrainTimeout), func() bool { return r.delivered.Load() >= r.sent.Load() })
		}
	} else {
		// Consumers alone: for Duration, or until Messages were delivered.
		r.waitFor(ctx, deadline, func() bool { return s.Messages > 0 && r.delivered.Load() >= s.Messages })
	}
	r.stopConsumers.Store(true)
	stopCons()
	consumers.Wait()
	end := time.Now()
	close(stopProgress)
	progress.Wait()

	if s.Producers.Count > 0 {
		rep.Elapsed = Seconds(prodEnd.Sub(start))
		rep.Drain = Seconds(end.Sub(prodEnd))
	} else {
		rep.Elapsed = Seconds(end.Sub(start))
	}
	rep.Sent = r.sent.Load()
	rep.Delivered = r.delivered.Load()
	rep.Redelivered = r.redelivered.Load()
	rep.Acked = r.acked.Load()
	rep.Stale = r.stale.Load()
	rep.Missed = r.missed.Load()
	if e := time.Duration(rep.Elapsed).Seconds(); e > 0 {
		rep.SendRate = float64(rep.Sent) / e
	}
	if e := time.Duration(rep.Elapsed + rep.Drain).Seconds(); e > 0 {
		rep.DeliverRate = float64(rep.Delivered) / e
	}
	rep.Send = OpStats{Requests: r.sendReqs.Load(), Messages: rep.Sent, Errors: r.sendErrs.snapshot(), Latency: LatencyOf(mergeTotal(r.sendRecs))}
	rep.Pull = OpStats{Requests: r.pullReqs.Load(), Messages: r.pulled.Load(), Empty: r.emptyPulls.Load(), Errors: r.pullErrs.snapshot(), Latency: LatencyOf(mergeTotal(r.pullRecs))}
	rep.Ack = OpStats{Requests: r.ackReqs.Load(), Messages: r.ackMsgs.Load(), Errors: r.ackErrs.snapshot(), Latency: LatencyOf(mergeTotal(r.ackRecs))}
	rep.EndToEnd = LatencyOf(mergeTotal(r.e2eRecs))
	return rep
}

// waitFor polls done every few milliseconds until it holds, deadline
// passes (zero: never) or ctx ends.
func (r *runner) waitFor(ctx context.Context, deadline time.Time, done func() bool) {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for !done() {
		if !deadline.IsZero() && !time.Now().Before(deadline) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// claim takes the next request's messages: Batch, fewer at the end of a
// Messages budget, or 0 when it is spent.
func (r *runner) claim() int {
	batch := int64(r.s.Producers.Batch)
	if r.s.Messages == 0 {
		return int(batch)
	}
	for {
		rem := r.remaining.Load()
		if rem <= 0 {
			return 0
		}
		n := min(rem, batch)
		if r.remaining.CompareAndSwap(rem, rem-n) {
			return int(n)
		}
	}
}

func expired(deadline time.Time) bool {
	return !deadline.IsZero() && !time.Now().Before(deadline)
}

// closedLoop is producer i sending back to back until deadline, the
// Messages budget or ctx ends. A request in flight at the deadline is
// finished, so that every message the broker stored is counted.
func (r *runner) closedLoop(ctx context.Context, i int, deadline time.Time) {
	for ctx.Err() == nil && !expired(deadline) {
		n := r.claim()
		if n == 0 {
			return
		}
		r.send(ctx, i, n, time.Now())
	}
}

type tick struct {
	at time.Time
	n  int
}

// openLoop schedules a request of Batch messages every Batch/Rate seconds
// and has the producers send them. A request handed to a producer is sent
// even if the producer takes it after the deadline (by scheduling jitter or
// because all were busy): its latency counts from when it was due, so
// lateness shows there. What could not be handed to a producer by the
// deadline, or is left when ctx ends, is missed.
func (r *runner) openLoop(ctx context.Context, producers *sync.WaitGroup, start, deadline time.Time) {
	ticks := make(chan tick, r.s.Producers.Count)
	for i := range r.s.Producers.Count {
		producers.Go(func() {
			for t := range ticks {
				if ctx.Err() != nil {
					r.missed.Add(int64(t.n))
					continue
				}
				r.send(ctx, i, t.n, t.at)
			}
		})
	}
	interval := time.Duration(float64(r.s.Producers.Batch) / r.s.Producers.Rate * float64(time.Second))
	producers.Go(func() {
		defer close(ticks)
		var deadlineC <-chan time.Time
		if !deadline.IsZero() {
			dt := time.NewTimer(time.Until(deadline))
			defer dt.Stop()
			deadlineC = dt.C
		}
		wait := time.NewTimer(0)
		defer wait.Stop()
		for i := 0; ; i++ {
			at := start.Add(time.Duration(i) * interval)
			if !deadline.IsZero() && !at.Before(deadline) {
				return
			}
			n := r.claim()
			if n == 0 {
				return
			}
			if d := time.Until(at); d > 0 {
				wait.Reset(d)
				select {
				case <-wait.C:
				case <-ctx.Done():
					return
				}
			}
			select {
			case ticks <- tick{at, n}:
			case <-ctx.Done():
				return
			case <-deadlineC:
				// Every producer is busy and time is up: what was
				// scheduled before the deadline and not started is missed.
				r.missed.Add(int64(n))
				for j := i + 1; start.Add(time.Duration(j) * interval).Before(deadline); j++ {
					m := r.claim()
					if m == 0 {
						break
					}
					r.missed.Add(int64(m))
				}
				return
			}
		}
	})
}

// send sends n messages (one request) as producer i; its latency, and the
// end-to-end latency of its messages (their sentAt), count from began (now,
// or the scheduled time in open loop: a send that waited for a free
// producer shows the wait in both).
func (r *runner) send(ctx context.Context, i, n int, began time.Time) {
	batch := r.s.Producers.Batch > 1
	path := "/v1/topics/" + r.topic + "/messages"
	if batch {
		path += ":batch"
	}
	tx := r.s.Producers.Transactional
	var body []byte
	var out any // the lean client does not read a send's reply
	var txOut txReply
	if r.s.ClientKind == ClientPlain {
		var err error
		if body, err = plainSendBody(n, batch, tx, r.s.Producers.MessageBytes, r.bodies[i], r.runID, began.UnixNano()); err != nil {
			r.sendErrs.add("encoding", 1)
			return
		}
		if batch {
			out = new(sdk.BatchResult)
		} else {
			out = new(sdk.SendResult)
		}
	} else {
		body = sendBody(n, batch, tx, r.payload, r.runID, began.UnixNano())
		if tx {
			out = &txOut
		}
	}
	rctx, cancel := context.WithTimeout(ctx, r.s.RequestTimeout)
	err := r.doAt(rctx, i, "POST", path, body, out)
	cancel()
	if err == nil && tx {
		err = r.commit(ctx, i, out)
	}
	if err != nil && ctx.Err() != nil {
		return // the run was cancelled
	}
	r.sendReqs.Add(1)
	r.sendRecs[i].record(time.Since(began))
	if err != nil {
		code := errorCode(err)
		r.sendErrs.add(code, 1)
		if code == "transport" || code == "commit transport" {
			time.Sleep(10 * time.Millisecond) // no broker: don't spin
		}
		return
	}
	r.sent.Add(int64(n))
}

// commit commits the transaction whose half messages' send reply is out
// (as producer i). Its errors are "commit <code>".
func (r *runner) commit(ctx context.Context, i int, out any) error {
	var id string
	switch o := out.(type) {
	case *txReply:
		id = o.TransactionID
	case *sdk.SendResult:
		id = o.TransactionID
	case *sdk.BatchResult:
		id = o.TransactionID
		if id == "" && len(o.Results) > 0 {
			id = o.Results[0].TransactionID
		}
	}
	if id == "" {
		return &requestError{Code: "commit no_transaction_id"}
	}
	rctx, cancel := context.WithTimeout(ctx, r.s.RequestTimeout)
	defer cancel()
	err := r.doAt(rctx, i, "POST", "/v1/topics/"+r.topic+"/transactions/"+url.PathEscape(id)+":commit", nil, nil)
	if re, ok := errors.AsType[*requestError](err); ok {
		return &requestError{Code: "commit " + re.Code, Status: re.Status, Detail: re.Detail, Err: re.Err}
	}
	return err
}

// consume is consumer i pulling (with pullCtx, cancelled to stop it) and
// acking (with ctx, so that an ack in flight is finished) until stopped.
func (r *runner) consume(ctx, pullCtx context.Context, i int) {
	c := r.s.Consumers
	pullReq := pullRequest{
		MaxMessages: c.MaxMessages, WaitSeconds: c.WaitSeconds, InvisibleSeconds: c.InvisibleSeconds,
		ConsumerID: "loadtest-" + r.runID + "-" + strconv.Itoa(i),
	}
	pullBody, _ := json.Marshal(pullReq)
	plain := r.s.ClientKind == ClientPlain
	pullPath := "/v1/topics/" + r.topic + "/subscriptions/" + r.group + "/pull"
	ackPath := "/v1/topics/" + r.topic + "/subscriptions/" + r.group + "/ack"
	timeout := r.s.RequestTimeout + time.Duration(c.WaitSeconds)*time.Second
	var e2e []time.Duration
	for !r.stopConsumers.Load() && pullCtx.Err() == nil {
		var res pullResult
		began := time.Now()
		rctx, cancel := context.WithTimeout(pullCtx, timeout)
		var err error
		if plain {
			// Marshalled per pull, and read into the API's structs.
			var pres sdk.PullResult
			pullBody, _ = json.Marshal(pullReq)
			if err = r.doAt(rctx, i, "POST", pullPath, pullBody, &pres); err == nil {
				if res, err = plainPulled(&pres); err != nil {
					err = &requestError{Code: "decoding", Err: err}
				}
			}
		} else {
			err = r.doAt(rctx, i, "POST", pullPath, pullBody, &res)
		}
		cancel()
		if pullCtx.Err() != nil {
			return // stopped; the broker releases what it leased for this pull
		}
		now := time.Now()
		r.pullReqs.Add(1)
		if err != nil {
			r.pullErrs.add(errorCode(err), 1)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		if len(res.Messages) == 0 {
			r.emptyPulls.Add(1)
			continue
		}
		r.pullRecs[i].record(now.Sub(began))
		r.pulled.Add(int64(len(res.Messages)))
		handles := make([]string, 0, len(res.Messages))
		e2e = e2e[:0]
		for _, m := range res.Messages {
			handles = append(handles, m.ReceiptHandle)
			if m.Properties.Run != r.runID {
				r.stale.Add(1)
				continue
			}
			if m.DeliveryAttempt > 1 {
				r.redelivered.Add(1)
				continue
			}
			if ns, err := strconv.ParseInt(m.Properties.SentAt, 10, 64); err == nil {
				e2e = append(e2e, now.Sub(time.Unix(0, ns)))
			}
			r.delivered.Add(1)
		}
		r.e2eRecs[i].record(e2e...)
		if !c.NoAck {
			r.ack(ctx, i, ackPath, handles)
		}
	}
}

// ack acks handles in one request as consumer i.
func (r *runner) ack(ctx context.Context, i int, path string, handles []string) {
	body, _ := json.Marshal(ackRequest{ReceiptHandles: handles})
	var res ackResult
	began := time.Now()
	rctx, cancel := context.WithTimeout(ctx, r.s.RequestTimeout)
	err := r.doAt(rctx, i, "POST", path, body, &res)
	cancel()
	if err != nil && ctx.Err() != nil {
		return
	}
	r.ackReqs.Add(1)
	r.ackRecs[i].record(time.Since(began))
	r.ackMsgs.Add(int64(len(handles)))
	if err != nil {
		r.ackErrs.add(errorCode(err), 1)
		return
	}
	r.acked.Add(res.Acked)
	for _, f := range res.Failed {
		r.ackErrs.add(f.Code, 1)
	}
}

// progress makes an Interval of the last ProgressInterval, writes it as a
// line to Progress and hands it to OnInterval; once more for the last part
// interval when stop is closed.
func (r *runner) progress(start time.Time, stop <-chan struct{}) {
	t := time.NewTicker(r.s.ProgressInterval)
	defer t.Stop()
	last := start
	var lastSent, lastDelivered, lastAcked, lastErrs int64
	interval := func(now time.Time) {
		secs := now.Sub(last).Seconds()
		if secs <= 0 {
			return
		}
		sent, delivered, acked := r.sent.Load(), r.delivered.Load(), r.acked.Load()
		errs := r.sendErrs.total() + r.pullErrs.total() + r.ackErrs.total()
		iv := Interval{
			Start: last, Elapsed: Seconds(now.Sub(start)), Seconds: secs,
			Sent: sent - lastSent, Delivered: delivered - lastDelivered, Acked: acked - lastAcked, Errors: errs - lastErrs,
			Send: LatencyOf(takeInterval(r.sendRecs)), Pull: LatencyOf(takeInterval(r.pullRecs)),
			EndToEnd: LatencyOf(takeInterval(r.e2eRecs)),
		}
		takeInterval(r.ackRecs)
		iv.SendRate, iv.DeliverRate, iv.AckRate = float64(iv.Sent)/secs, float64(iv.Delivered)/secs, float64(iv.Acked)/secs
		if r.s.Progress != nil {
			b := fmt.Sprintf("loadtest %s %5.1fs", r.runID, now.Sub(start).Seconds())
			if r.s.Producers.Count > 0 {
				b += fmt.Sprintf(" | sent %8.0f msg/s send %s", iv.SendRate, short(iv.Send))
			}
			if r.s.Consumers.Count > 0 {
				if r.s.Producers.Count > 0 {
					b += fmt.Sprintf(" | delivered %8.0f msg/s e2e %s", iv.DeliverRate, short(iv.EndToEnd))
				} else {
					b += fmt.Sprintf(" | acked %8.0f msg/s pull %s", iv.AckRate, short(iv.Pull))
				}
			}
			b += fmt.Sprintf(" | errors %d\n", errs)
			_, _ = fmt.Fprint(r.s.Progress, b)
		}
		if r.s.OnInterval != nil {
			r.s.OnInterval(iv)
		}
		last, lastSent, lastDelivered, lastAcked, lastErrs = now, sent, delivered, acked, errs
	}
	for {
		select {
		case <-stop:
			interval(time.Now())
			return
		case now := <-t.C:
			interval(now)
		}
	}
}

func short(l Latency) string {
	if l.Count == 0 {
		return "p50 - p99 -"
	}
	return fmt.Sprintf("p50 %s p99 %s", round(l.P50), round(l.P99))
}
