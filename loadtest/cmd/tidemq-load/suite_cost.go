package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptrace"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tidemq/tidemq/loadtest"
)

// The cost-growth phases: the hot-topic phases (single send, batch send,
// pull + ack) against a broker holding extra work (many topics, many
// parked long polls), beside the same phases on a fresh broker in the same
// run; send with many subscriptions beside one; and large bodies against
// raw Pebble of the same size.
//
// The brokers holding extra work run as child processes (the binary of
// ./cmd/tidemq, or -broker-bin), so that their RSS is their own, a restart
// is a real one, and the 10,000 parked polls' sockets are not counted
// twice in one process's descriptors. Their fresh baseline is a child
// process too, so that both sides pay the same. The load generator's CPU
// alone is in those phases' CPU columns.

// costOptions are the scales of the cost-growth phases.
type costOptions struct {
	topics int // extra topics of 8 queues each
	subs   int // subscriptions on the one topic
	polls  int // parked long polls
}

// costResult is what a cost-growth phase measured beside its rates.
type costResult struct {
	Topics        int `json:"topics,omitempty"`
	Subscriptions int `json:"subscriptions,omitempty"`
	Polls         int `json:"polls,omitempty"`
	// Setup is how long creating the extra work took.
	Setup loadtest.Seconds `json:"setupSeconds,omitempty"`
	// RSSBefore is the broker's RSS before the extra work was added (the
	// empty broker), RSSLoaded once it was (before any hot-topic phase),
	// RSS at the phase's end, HWM the peak of the process's life so far;
	// bytes.
	RSSBefore int64 `json:"rssBefore,omitempty"`
	RSSLoaded int64 `json:"rssLoaded,omitempty"`
	RSS       int64 `json:"rss,omitempty"`
	HWM       int64 `json:"hwm,omitempty"`
	// StopTook is SIGTERM to exit, Ready the restart on the same data
	// dir to GET /readyz answering 200, RSSAtReady the restarted
	// broker's RSS then.
	StopTook   loadtest.Seconds `json:"stopSeconds,omitempty"`
	Ready      loadtest.Seconds `json:"readySeconds,omitempty"`
	RSSAtReady int64            `json:"rssAtReady,omitempty"`
	// GroupsWithCopy is how many of the subscriptions pulled messages
	// after the send; Pulled is how many they pulled in all.
	GroupsWithCopy int   `json:"groupsWithCopy,omitempty"`
	Pulled         int64 `json:"pulled,omitempty"`
	// Parked is how many polls were parked when the phase ended.
	Parked int64 `json:"parked,omitempty"`
	// WakeFromReply is, per wake-up sample, the time from the send's
	// reply to the parked poll's (0 when the poll answered first),
	// WakeFromSend from the send's start; Missed is samples whose poll
	// came back without the message.
	WakeFromReply loadtest.Latency `json:"wakeFromReply"`
	WakeFromSend  loadtest.Latency `json:"wakeFromSend"`
	Missed        int              `json:"missed,omitempty"`
}

// costEnv is a broker child process and the extra work it holds, kept
// from one cost-growth phase to the next of the same group.
type costEnv struct {
	key     string
	bin     string
	data    string
	logPath string
	args    []string
	proc    *brokerProc
	admin   loadtest.Admin
	client  *http.Client
	res     costResult  // what setting up measured
	batch   float64     // the group's batch send rate, for the pull's backlog
	polls   *pollHolder // nil until parkPolls
}

// parked is how many polls the holder last reported parked.
func (e *costEnv) parked() int64 {
	if e.polls == nil {
		return 0
	}
	return e.polls.counts.parked.Load()
}

// close stops the parked polls and the broker and removes its data.
func (e *costEnv) close() error {
	if e.polls != nil {
		e.polls.close()
	}
	e.client.CloseIdleConnections()
	var err error
	if e.proc != nil {
		if _, terr := e.proc.terminate(time.Minute); terr != nil {
			err = terr
		}
	}
	return errors.Join(err, os.RemoveAll(e.data), os.Remove(e.logPath))
}

// costState is the suite's cost-growth state: the running environment.
type costState struct {
	env   *costEnv
	fresh float64 // the fresh broker's batch send rate
}

// closeCostEnv stops the running cost environment.
func (c *suite) closeCostEnv() error {
	e := c.costs.env
	if e == nil {
		return nil
	}
	c.costs.env = nil
	return e.close()
}

// closeCost stops the running cost environment and removes the binary the
// suite built.
func (c *suite) closeCost() error {
	err := c.closeCostEnv()
	if c.builtBinDir != "" {
		err = errors.Join(err, os.RemoveAll(c.builtBinDir))
		c.builtBinDir, c.brokerBin = "", ""
	}
	return err
}

// brokerBinary is the broker binary the phases that run a broker process
// start (the cost-growth phases, the flood): -broker-bin, or ./cmd/tidemq
// built on first use and kept for the rest of the run.
func (c *suite) brokerBinary(ctx context.Context) (string, error) {
	if c.brokerBin != "" {
		return c.brokerBin, nil
	}
	dir, err := os.MkdirTemp(c.dir, "tidemq-load-bin-")
	if err != nil {
		return "", err
	}
	c.logf("== building ./cmd/tidemq for the phases that run a broker process")
	bin, err := buildBroker(ctx, dir)
	if err != nil {
		return "", errors.Join(err, os.RemoveAll(dir))
	}
	c.brokerBin, c.builtBinDir = bin, dir
	return bin, nil
}

// costEnvFor returns the environment key, started and set up by setup when
// it is not the one running (which is closed first).
func (c *suite) costEnvFor(ctx context.Context, key string, args []string, setup func(ctx context.Context, e *costEnv) error) (*costEnv, error) {
	if e := c.costs.env; e != nil && e.key == key {
		return e, nil
	}
	if e := c.costs.env; e != nil {
		c.costs.env = nil
		if err := e.close(); err != nil {
			return nil, err
		}
	}
	bin, err := c.brokerBinary(ctx)
	if err != nil {
		return nil, err
	}
	data, err := os.MkdirTemp(c.dir, "tidemq-load-cost-")
	if err != nil {
		return nil, err
	}
	e := &costEnv{key: key, bin: bin, data: data, logPath: data + ".log", args: args, client: loadtest.NewClient(64, c.gzip)}
	proc, ready, err := startBrokerProc(ctx, bin, data, e.logPath, 2*time.Minute, args...)
	if err != nil {
		return nil, errors.Join(err, e.close())
	}
	e.proc = proc
	e.admin = loadtest.Admin{URL: proc.URL, Client: e.client}
	e.res.RSSBefore, _, _ = proc.memory()
	c.logf("== %s: broker pid %d on %s, ready in %s, RSS %s; log %s", key, proc.Pid(), proc.URL, dur(ready), mib(e.res.RSSBefore), e.logPath)
	if setup != nil {
		began := time.Now()
		if err := setup(ctx, e); err != nil {
			return nil, errors.Join(fmt.Errorf("%s: setting up: %w", key, err), e.close())
		}
		e.res.Setup = loadtest.Seconds(time.Since(began))
		e.res.RSSLoaded, _, _ = proc.memory()
		c.logf("   set up in %.1fs, RSS %s", time.Duration(e.res.Setup).Seconds(), mib(e.res.RSSLoaded))
	}
	c.costs.env = e
	return e, nil
}

func mib(b int64) string { return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20)) }

// costStep is runTargets' step.
type costStep struct {
	name string
	run  func(name string) (phase, error)
}

// costSteps are the cost-growth phases, in order: the fresh broker's
// hot-topic phases, the many-topics broker's and its restart, the
// subscriptions' send, the parked polls' broker's and its wake-ups. With
// a running broker (-url) only the subscriptions' phases run, against it.
func (c *suite) costSteps(ctx context.Context) []costStep {
	o := c.cost
	kind := loadtest.ClientLean
	if len(c.clients) > 0 {
		kind = c.clients[0]
	}
	var steps []costStep
	hot := func(prefix string, env func() (*costEnv, error)) {
		single, batch := sends(16, 1, 1024), sends(16, 100, 1024)
		single.ClientKind, batch.ClientKind = kind, kind
		for _, s := range []struct {
			name string
			sc   loadtest.Scenario
		}{{"single-p16-1KiB", single}, {"batch100-p16-1KiB", batch}} {
			steps = append(steps, costStep{prefix + s.name, func(name string) (phase, error) {
				e, err := env()
				if err != nil {
					return phase{}, err
				}
				p, err := c.httpPhase(ctx, name, "broker", e.proc.URL, s.sc)
				if err == nil && s.sc.Producers.Batch > 1 {
					e.batch = p.MsgsPerSec
					if e.key == "cost-fresh" {
						c.costs.fresh = p.MsgsPerSec
					}
				}
				return c.costNoted(p, e), err
			}})
		}
		steps = append(steps, costStep{prefix + "pull256-c4-1KiB", func(name string) (phase, error) {
			e, err := env()
			if err != nil {
				return phase{}, err
			}
			// The same backlog on every broker: from the fresh broker's
			// batch rate when it ran, as the suite's pull phase fills.
			rate := c.costs.fresh
			if rate == 0 {
				rate = e.batch
			}
			if rate == 0 {
				rate = 100_000
			}
			fill := min(max(int64(1.5*rate*(c.warmup+c.duration).Seconds()/100+1)*100, 10_000), 5_000_000)
			p, err := c.pullFrom(ctx, name, kind, e.proc.URL, fill, 1024, loadtest.Consumers{Count: 4, MaxMessages: 256, WaitSeconds: 1})
			return c.costNoted(p, e), err
		}})
	}
	if c.url == "" {
		fresh := func() (*costEnv, error) { return c.costEnvFor(ctx, "cost-fresh", nil, nil) }
		hot("cost-fresh-", fresh)

		tkey := fmt.Sprintf("cost-topics%d", o.topics)
		topics := func() (*costEnv, error) {
			return c.costEnvFor(ctx, tkey, nil, func(ctx context.Context, e *costEnv) error {
				e.res.Topics = o.topics
				return c.createTopics(ctx, e, o.topics)
			})
		}
		hot(tkey+"-", topics)
		steps = append(steps, costStep{tkey + "-restart", func(name string) (phase, error) {
			e, err := topics()
			if err != nil {
				return phase{}, err
			}
			return c.restartPhase(ctx, name, e)
		}})
	}

	skey := fmt.Sprintf("cost-subs%d", o.subs)
	steps = append(steps,
		costStep{"cost-subs1-batch100-p16-1KiB", func(name string) (phase, error) { return c.subsPhase(ctx, name, kind, 1) }},
		costStep{skey + "-batch100-p16-1KiB", func(name string) (phase, error) { return c.subsPhase(ctx, name, kind, o.subs) }})

	if c.url == "" {
		pkey := fmt.Sprintf("cost-polls%d", o.polls)
		// Room for the parked polls beside the hot topic's connections:
		// the broker's default of 10,000 would queue the rest unserved.
		args := []string{"--max-connections", strconv.Itoa(max(10_000, o.polls+1024))}
		polls := func() (*costEnv, error) {
			return c.costEnvFor(ctx, pkey, args, func(ctx context.Context, e *costEnv) error {
				e.res.Polls = o.polls
				return c.parkPolls(ctx, e, idlePolls(o.polls))
			})
		}
		hot(pkey+"-", polls)
		steps = append(steps, costStep{pkey + "-wake", func(name string) (phase, error) {
			e, err := polls()
			if err != nil {
				return phase{}, err
			}
			return c.wakePhase(ctx, name, e)
		}})
	}
	return steps
}

// costNoted adds the environment's numbers to a hot-topic phase.
func (c *suite) costNoted(p phase, e *costEnv) phase {
	if p.Name == "" {
		return p
	}
	res := e.res
	res.RSS, res.HWM, _ = e.proc.memory()
	res.Parked = e.parked()
	p.Cost = &res
	p.Description += "; broker a child process (CPU is the load generator's)"
	if res.Topics > 0 {
		p.Description += fmt.Sprintf("; %s extra topics of 8 queues", thousands(float64(res.Topics)))
	}
	if res.Polls > 0 {
		p.Description += fmt.Sprintf("; %s long polls parked", thousands(float64(res.Parked)))
	}
	c.phases[len(c.phases)-1] = p
	return p
}

// createTopics creates n topics of 8 queues each on e's broker, 16 at a
// time.
func (c *suite) createTopics(ctx context.Context, e *costEnv, n int) error {
	return parallel(ctx, n, 16, func(ctx context.Context, i int) error {
		return e.admin.PutTopic(ctx, fmt.Sprintf("cost-topic-%05d", i), 8, 0)
	})
}

// restartPhase stops e's broker with SIGTERM and starts it on the same
// data dir, timing it until GET /readyz answers 200. It records the
// broker's RSS and peak RSS before the stop.
func (c *suite) restartPhase(ctx context.Context, name string, e *costEnv) (phase, error) {
	c.logf("== %s (round %d): restart of the broker with %s topics", name, c.round+1, thousands(float64(e.res.Topics)))
	res := e.res
	res.RSS, res.HWM, _ = e.proc.memory()
	stop, err := e.proc.terminate(time.Minute)
	if err != nil {
		return phase{}, fmt.Errorf("%s: %w", name, err)
	}
	proc, ready, err := startBrokerProc(ctx, e.bin, e.data, e.logPath, 2*time.Minute, e.args...)
	if err != nil {
		e.proc = nil
		return phase{}, fmt.Errorf("%s: %w", name, err)
	}
	e.proc = proc
	e.admin.URL = proc.URL
	res.StopTook, res.Ready = loadtest.Seconds(stop), loadtest.Seconds(ready)
	res.RSSAtReady, _, _ = proc.memory()
	// The topics are all back.
	st, err := e.admin.Topic(ctx, fmt.Sprintf("cost-topic-%05d", e.res.Topics-1))
	if err != nil {
		return phase{}, fmt.Errorf("%s: after the restart: %w", name, err)
	}
	p := phase{Name: name, Round: c.round + 1, Kind: "restart", Cost: &res,
		Description: fmt.Sprintf("SIGTERM, then start on the same data dir until /readyz answers 200; %s topics of %d queues", thousands(float64(e.res.Topics)), st.Queues),
		Latency:     loadtest.Latency{Count: 1, Min: ready, Mean: ready, P50: ready, P90: ready, P99: ready, P999: ready, Max: ready}}
	c.logf("   stop %s, ready %s; RSS before the stop %s (peak %s), at ready %s", dur(stop), dur(ready), mib(res.RSS), mib(res.HWM), mib(res.RSSAtReady))
	c.phases = append(c.phases, p)
	return p, nil
}

// subsPhase measures batch send on a topic with subs subscriptions
// (distinct groups, from the earliest message), on a fresh in-process
// broker (or c.url), then pulls once from every group: each must get
// messages of its own.
func (c *suite) subsPhase(ctx context.Context, name, kind string, subs int) (p phase, err error) {
	err = c.withBroker(ctx, name, func(url string) error {
		client := loadtest.NewClient(64, c.gzip)
		defer client.CloseIdleConnections()
		admin := loadtest.Admin{URL: url, Token: c.token, Client: client}
		topic := fmt.Sprintf("cost-subs-%08x", rand.Uint32())
		if err := admin.PutTopic(ctx, topic, 0, 0); err != nil {
			return err
		}
		defer func() {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
			defer cancel()
			err = errors.Join(err, admin.DeleteTopic(cctx, topic))
		}()
		began := time.Now()
		if err := parallel(ctx, subs, 16, func(ctx context.Context, i int) error {
			return admin.PutSubscription(ctx, topic, fmt.Sprintf("g%05d", i), "earliest")
		}); err != nil {
			return err
		}
		res := costResult{Subscriptions: subs, Setup: loadtest.Seconds(time.Since(began))}
		sc := sends(16, 100, 1024)
		sc.ClientKind, sc.Topic, sc.SkipSetup = kind, topic, true
		if p, err = c.httpPhase(ctx, name, "broker", url, sc); err != nil {
			return err
		}
		// One pull per group: every group has its copy of what was sent.
		var with, pulled atomic.Int64
		if err := parallel(ctx, subs, 16, func(ctx context.Context, i int) error {
			n, err := pullCount(ctx, client, url, c.token, topic, fmt.Sprintf("g%05d", i), 100)
			if n > 0 {
				with.Add(1)
				pulled.Add(int64(n))
			}
			return err
		}); err != nil {
			return fmt.Errorf("%s: pulling each group's copy: %w", name, err)
		}
		res.GroupsWithCopy, res.Pulled = int(with.Load()), pulled.Load()
		p.Cost = &res
		p.Description += fmt.Sprintf("; %s subscriptions on the topic", thousands(float64(subs)))
		c.phases[len(c.phases)-1] = p
		c.logf("   %d of %d groups pulled their copy (%s messages)", res.GroupsWithCopy, subs, thousands(float64(res.Pulled)))
		return nil
	})
	return p, err
}

// pullCount pulls up to max messages at once from group on topic and
// acks them; it returns how many came.
func pullCount(ctx context.Context, client *http.Client, url, token, topic, group string, max int) (int, error) {
	var out struct {
		Messages []struct {
			ReceiptHandle string `json:"receiptHandle"`
		} `json:"messages"`
	}
	base := url + "/v1/topics/" + topic + "/subscriptions/" + group
	body := fmt.Sprintf(`{"maxMessages":%d,"waitSeconds":0}`, max)
	if err := postJSON(ctx, client, base+"/pull", token, body, &out); err != nil {
		return 0, err
	}
	if len(out.Messages) == 0 {
		return 0, nil
	}
	var b bytes.Buffer
	b.WriteString(`{"receiptHandles":[`)
	for i, m := range out.Messages {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Quote(m.ReceiptHandle))
	}
	b.WriteString("]}")
	return len(out.Messages), postJSON(ctx, client, base+"/ack", token, b.String(), nil)
}

// idlePolls is how many of polls the cost-polls broker parks on its idle
// subscription: the rest is room for the wake-up phase's poll and the pull
// phase's 4 consumers, should they park at the end of the backlog, within
// the broker's bound of parked pulls (core's MaxParkedPulls, 10,000).
func idlePolls(polls int) int { return max(polls-5, 1) }

// parkPolls has a poll holder (pollholder.go) start n long polls (30 s,
// re-issued as each answers) on one idle subscription of e's broker, and
// returns once all were written; they run until e closes. One group: the
// polls are n consumers of one service scaled out, each waiting for work;
// n groups would be n copies of every message, what the subscriptions'
// phase measures. It also creates the topic the wake-up phase sends to.
func (c *suite) parkPolls(ctx context.Context, e *costEnv, n int) error {
	for _, t := range []struct{ topic, group string }{{"cost-idle", "idle"}, {"cost-wake", "wake"}} {
		if err := e.admin.PutTopic(ctx, t.topic, 0, 0); err != nil {
			return err
		}
		if err := e.admin.PutSubscription(ctx, t.topic, t.group, "latest"); err != nil {
			return err
		}
	}
	h, err := startPollHolder(e.proc.URL+"/v1/topics/cost-idle/subscriptions/idle/pull", n)
	if err != nil {
		return err
	}
	e.polls = h
	if err := h.waitWritten(ctx, n, 2*time.Minute); err != nil {
		return err
	}
	// A moment for the broker to take in the last wave before its RSS is
	// read.
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(time.Second):
	}
	c.logf("   %d polls written (%d parked, %d errors) by a poll holder, pid %d", h.counts.written.Load(), e.parked(), h.counts.errs.Load(), h.cmd.Process.Pid)
	return nil
}

// wakePhase measures how soon a send wakes a poll parked on its topic,
// with e's polls parked beside: up to 200 samples (at most 10 s), each a
// pull of 5 s on the wake topic, given 5 ms to park after its request was
// written, then one single send. The latency that counts is from the
// send's reply to the poll's, 0 when the poll answered first: the send's
// own synced commit is the single-send targets' business.
func (c *suite) wakePhase(ctx context.Context, name string, e *costEnv) (phase, error) {
	desc := fmt.Sprintf("a send to a topic where one poll is parked, %s other polls parked on another topic; time from the send's reply to the poll's", thousands(float64(e.parked())))
	c.logf("== %s (round %d): %s", name, c.round+1, desc)
	fromReply, fromSend := loadtest.NewHistogram(), loadtest.NewHistogram()
	base := e.proc.URL + "/v1/topics/cost-wake"
	res := e.res
	end := time.Now().Add(10 * time.Second)
	for i := 0; i < 200 && time.Now().Before(end); i++ {
		wrote := make(chan struct{})
		type reply struct {
			at  time.Time
			n   int
			err error
		}
		got := make(chan reply, 1)
		go func() {
			var out struct {
				Messages []struct {
					ReceiptHandle string `json:"receiptHandle"`
				} `json:"messages"`
			}
			var once sync.Once
			tctx := httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{WroteRequest: func(httptrace.WroteRequestInfo) { once.Do(func() { close(wrote) }) }})
			err := postJSON(tctx, e.client, base+"/subscriptions/wake/pull", "", `{"maxMessages":1,"waitSeconds":5}`, &out)
			at := time.Now()
			if err == nil && len(out.Messages) == 1 {
				err = postJSON(ctx, e.client, base+"/subscriptions/wake/ack", "", `{"receiptHandles":[`+strconv.Quote(out.Messages[0].ReceiptHandle)+`]}`, nil)
			}
			got <- reply{at, len(out.Messages), err}
		}()
		select {
		case <-wrote:
		case r := <-got:
			return phase{}, fmt.Errorf("%s: the pull failed before it was written: %v", name, r.err)
		}
		time.Sleep(5 * time.Millisecond) // the broker parks the poll
		sendAt := time.Now()
		if err := postJSON(ctx, e.client, base+"/messages", "", `{"body":"wake"}`, nil); err != nil {
			<-got // the pull ends within its wait
			return phase{}, fmt.Errorf("%s: send: %w", name, err)
		}
		replyAt := time.Now()
		r := <-got
		if r.err != nil {
			return phase{}, fmt.Errorf("%s: pull: %w", name, r.err)
		}
		if r.n != 1 {
			res.Missed++
			continue
		}
		loadtest.RecordLatency(fromReply, max(r.at.Sub(replyAt), 0))
		loadtest.RecordLatency(fromSend, r.at.Sub(sendAt))
	}
	res.WakeFromReply, res.WakeFromSend = loadtest.LatencyOf(fromReply), loadtest.LatencyOf(fromSend)
	res.RSS, res.HWM, _ = e.proc.memory()
	res.Parked = e.parked()
	p := phase{Name: name, Round: c.round + 1, Kind: "wake", Description: desc, Latency: res.WakeFromReply, Cost: &res}
	if res.Missed > 0 {
		p.Errors = map[string]int64{"missed": int64(res.Missed)}
	}
	c.logf("   %d wake-ups: from the send's reply %s, from its start %s; %d missed; %d parked, RSS %s (%s before parking)",
		res.WakeFromReply.Count, res.WakeFromReply, res.WakeFromSend, res.Missed, res.Parked, mib(res.RSS), mib(res.RSSBefore))
	c.phases = append(c.phases, p)
	return p, nil
}

// postJSON posts body to url and decodes a 2xx reply into out (nil:
// discarded).
func postJSON(ctx context.Context, client *http.Client, url, token, body string, out any) error {
	req, err := http.NewRequestWithContext(ctx, "POST", url, bytes.NewReader([]byte(body)))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("POST %s: %s: %s", url, resp.Status, bytes.TrimSpace(raw))
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(raw, out)
}

// bodySteps are the large-body phases: batch and single sends of 64 KiB
// and 1 MiB, each after raw Pebble synced appends of the same size, batch
// and writers. Batches and producers keep the bytes in flight within the
// broker's body budget (48 MiB): 16 × 32 × 64 KiB and 4 × 8 × 1 MiB are
// 32 MiB.
func (c *suite) bodySteps(ctx context.Context) []costStep {
	kind := loadtest.ClientLean
	if len(c.clients) > 0 {
		kind = c.clients[0]
	}
	var steps []costStep
	for _, b := range bodyPhases {
		steps = append(steps,
			costStep{b.pebble(), func(name string) (phase, error) {
				return c.pebblePhase(ctx, name, b.size, max(b.batch, 1), b.writers, 0)
			}},
			costStep{b.broker(), func(name string) (phase, error) {
				sc := sends(b.writers, b.batch, b.size)
				sc.ClientKind = kind
				return c.brokerPhase(ctx, name, sc)
			}})
	}
	return steps
}

// bodyPhase is one large-body send and its Pebble baseline.
type bodyPhase struct {
	size, batch, writers int
	label                string
}

var bodyPhases = []bodyPhase{
	{64 << 10, 32, 16, "64KiB"},
	{64 << 10, 1, 16, "64KiB"},
	{1 << 20, 8, 4, "1MiB"},
	{1 << 20, 1, 16, "1MiB"},
}

func (b bodyPhase) pebble() string {
	return fmt.Sprintf("pebble-b%d-w%d-%s", b.batch, b.writers, b.label)
}

func (b bodyPhase) broker() string {
	if b.batch <= 1 {
		return fmt.Sprintf("single-p%d-%s", b.writers, b.label)
	}
	return fmt.Sprintf("batch%d-p%d-%s", b.batch, b.writers, b.label)
}

// costTargets adds the cost-growth and large-body targets of the phases
// that ran.
func (c *suite) costTargets(add addFunc) {
	o := c.cost
	ratio := func(name, want string, min float64, measured, baseline string, unit func(phase) (float64, string)) {
		add(name, want, []string{measured, baseline}, func(r float64) bool { return r >= min }, func(g map[string]phase) (float64, string, string, bool) {
			m, b := g[measured], g[baseline]
			mv, ms := unit(m)
			bv, bs := unit(b)
			return mv / bv, ms, fmt.Sprintf("%s (%s)", bs, b.Name), len(m.Errors) > 0 || len(b.Errors) > 0
		})
	}
	msgs := func(p phase) (float64, string) { return p.MsgsPerSec, thousands(p.MsgsPerSec) + " msg/s" }
	for _, h := range []struct{ key, what string }{
		{fmt.Sprintf("cost-topics%d", o.topics), fmt.Sprintf("%s topics × 8 queues", thousands(float64(o.topics)))},
		{fmt.Sprintf("cost-polls%d", o.polls), fmt.Sprintf("%s parked long polls", thousands(float64(o.polls)))},
	} {
		for _, ph := range []struct{ phase, what string }{
			{"single-p16-1KiB", "hot topic single send, 16 producers, 1 KiB"},
			{"batch100-p16-1KiB", "hot topic batch send, 100 msgs/request, 16 producers, 1 KiB"},
			{"pull256-c4-1KiB", "hot topic pull 256 + ack, 4 consumers, 1 KiB"},
		} {
			ratio(fmt.Sprintf("cost: %s: %s, against a fresh broker", h.what, ph.what), "≥ 90%", 0.9, h.key+"-"+ph.phase, "cost-fresh-"+ph.phase, msgs)
		}
	}
	tr := fmt.Sprintf("cost-topics%d-restart", o.topics)
	costOf := func(g map[string]phase, name string) costResult {
		if p := g[name]; p.Cost != nil {
			return *p.Cost
		}
		return costResult{}
	}
	add(fmt.Sprintf("cost: %s topics × 8 queues: broker peak RSS", thousands(float64(o.topics))), "≤ 1 GiB", []string{tr}, func(r float64) bool { return r <= 1 },
		func(g map[string]phase) (float64, string, string, bool) {
			x := costOf(g, tr)
			return float64(x.HWM) / (1 << 30), fmt.Sprintf("peak %s (%s after creating the topics, %s empty)", mib(x.HWM), mib(x.RSSLoaded), mib(x.RSSBefore)), "bound 1 GiB", x.HWM == 0
		})
	add(fmt.Sprintf("cost: %s topics × 8 queues: restart to ready", thousands(float64(o.topics))), "≤ 10 s", []string{tr}, func(r float64) bool { return r <= 1 },
		func(g map[string]phase) (float64, string, string, bool) {
			x := costOf(g, tr)
			ready := time.Duration(x.Ready)
			return ready.Seconds() / 10, fmt.Sprintf("%s (stop %s)", dur(ready), dur(time.Duration(x.StopTook))), "bound 10 s", ready == 0
		})
	s1, sn := "cost-subs1-batch100-p16-1KiB", fmt.Sprintf("cost-subs%d-batch100-p16-1KiB", o.subs)
	ratio(fmt.Sprintf("cost: %s subscriptions on one topic: batch send, 100 msgs/request, 16 producers, 1 KiB, against one subscription", thousands(float64(o.subs))), "≥ 80%", 0.8, sn, s1, msgs)
	add(fmt.Sprintf("cost: %s subscriptions on one topic: each group pulls its copy", thousands(float64(o.subs))), "100%", []string{sn}, func(r float64) bool { return r >= 1 },
		func(g map[string]phase) (float64, string, string, bool) {
			x := costOf(g, sn)
			return float64(x.GroupsWithCopy) / float64(max(o.subs, 1)), fmt.Sprintf("%d groups of %d (%s messages pulled)", x.GroupsWithCopy, o.subs, thousands(float64(x.Pulled))), "every group", false
		})
	wk := fmt.Sprintf("cost-polls%d-wake", o.polls)
	add(fmt.Sprintf("cost: %s parked long polls: a send wakes a parked poll: p99", thousands(float64(o.polls))), "≤ 5 ms", []string{wk}, func(r float64) bool { return r <= 1 },
		func(g map[string]phase) (float64, string, string, bool) {
			x := costOf(g, wk)
			l := x.WakeFromReply
			return float64(l.P99) / float64(5*time.Millisecond), fmt.Sprintf("p99 %s, p50 %s from the send's reply (from its start p99 %s); %d samples, %d missed, %d parked",
				dur(l.P99), dur(l.P50), dur(x.WakeFromSend.P99), l.Count, x.Missed, x.Parked), "bound 5 ms", l.Count == 0 || x.Missed > 0
		})
	add(fmt.Sprintf("cost: %s parked long polls: broker RSS growth", thousands(float64(o.polls))), "≤ 200 MiB", []string{wk}, func(r float64) bool { return r <= 1 },
		func(g map[string]phase) (float64, string, string, bool) {
			x := costOf(g, wk)
			grow := x.RSSLoaded - x.RSSBefore
			return float64(grow) / (200 << 20), fmt.Sprintf("%s (%s once parked, %s before; %s after the hot-topic phases; %d parked at the end)",
				mib(grow), mib(x.RSSLoaded), mib(x.RSSBefore), mib(x.RSS), x.Parked), "bound 200 MiB", x.RSSLoaded == 0
		})
	for _, b := range bodyPhases {
		mbs := func(p phase) (float64, string) {
			v := p.MsgsPerSec * float64(b.size) / 1e6
			return v, fmt.Sprintf("%.0f MB/s", v)
		}
		what := "batch send, " + strconv.Itoa(b.batch) + " msgs/request"
		if b.batch <= 1 {
			what = "single send"
		}
		ratio(fmt.Sprintf("large bodies: %s, %d producers, %s, MB/s", what, b.writers, b.label), "≥ 50%", 0.5, b.broker(), b.pebble(), mbs)
	}
}

// parallel calls f for 0 … n-1, at most width at a time, and returns the
// first error (after which the rest are not started and ctx is canceled).
func parallel(ctx context.Context, n, width int, f func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	sem := make(chan struct{}, width)
	for i := 0; i < n && ctx.Err() == nil; i++ {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := f(ctx, i); err != nil {
				cancel(err)
			}
		})
	}
	wg.Wait()
	return context.Cause(ctx)
}
