package main

import (
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tidemq/tidemq/loadtest"
)

// The backlog suite (-suite backlog): does the broker hold up with a large
// backlog of stored, unconsumed messages? One broker process, started from
// the real binary on a fresh data dir:
//
//  1. empty: send (16 producers, batches of 100) then pull (4 consumers,
//     256 per pull, ack) what was just sent, on a topic of its own: the
//     reference rates;
//  2. fill: a subscription from the earliest message is created on the
//     backlog topic, then -messages messages are sent to it (16 producers,
//     batches of 100) and never consumed, sampled every second;
//  3. at the backlog: the same send and pull phases as 1, the pull reading
//     the backlog's subscription from its start (the oldest data);
//  4. restart: SIGTERM, start again on the same data, time to /readyz 200;
//     then sends under way, SIGKILL, start again, time to /readyz 200
//     (crash recovery), and check no acknowledged message was lost;
//  5. report the ratios against their targets, peak RSS, restart times,
//     and the time series (CSV, JSON, PNG plot).

// backlogSuite is the configuration and state of one -suite backlog run.
type backlogSuite struct {
	dir          string // base of the work dir ("" is the system's temp dir)
	brokerBin    string // "" builds ./cmd/tidemq
	messages     int64
	size         int
	warmup       time.Duration
	duration     time.Duration
	gzip         bool          // clients ask for gzip replies
	fillTimeout  time.Duration // 0: 1 min + 1 ms per message
	readyTimeout time.Duration
	progress     io.Writer // nil: quiet
	log          *slog.Logger

	work, data, logPath string
	proc                *brokerProc
	client              *http.Client
	admin               loadtest.Admin
	t0                  time.Time
	res                 *backlogResult

	mu      sync.Mutex // guards what OnInterval callbacks write
	series  []sample
	backlog int64 // messages of the backlog topic not acked, as counted by the runs
	sentAll int64 // messages accepted by the broker in all
	peakRSS int64 // the largest VmHWM or VmRSS read
}

// Memory and restart targets of the backlog suite (docs/BENCHMARKS.md).
const (
	rssLimit     = 1 << 30
	restartLimit = 10 * time.Second
)

// sample is one second of the run, for the plot and the CSV.
type sample struct {
	T         float64 `json:"t"`       // seconds from the suite's start to the end of the interval
	Seconds   float64 `json:"seconds"` // the interval's length
	Phase     string  `json:"phase"`
	Producing bool    `json:"producing"`
	Consuming bool    `json:"consuming"`
	Sent      int64   `json:"sent"`
	Acked     int64   `json:"acked"`
	SentRate  float64 `json:"sentPerSec"`
	AckedRate float64 `json:"ackedPerSec"`
	SendP99   float64 `json:"sendP99Ms"` // 0: no send answered in the interval
	PullP99   float64 `json:"pullP99Ms"` // 0: no pull returned messages
	Errors    int64   `json:"errors"`
	RSS       int64   `json:"rssBytes"` // the broker's VmRSS at the end of the interval (0: not read)
	Backlog   int64   `json:"backlog"`  // backlog topic messages not acked
}

// merge folds s, the interval right after x, into x: counts add up, rates
// are over both, p99 is the larger (the histograms are gone by now).
func (x *sample) merge(s sample) {
	x.T, x.Seconds = s.T, x.Seconds+s.Seconds
	x.Sent, x.Acked, x.Errors = x.Sent+s.Sent, x.Acked+s.Acked, x.Errors+s.Errors
	x.SentRate, x.AckedRate = float64(x.Sent)/x.Seconds, float64(x.Acked)/x.Seconds
	x.SendP99, x.PullP99 = max(x.SendP99, s.SendP99), max(x.PullP99, s.PullP99)
	if s.RSS > 0 {
		x.RSS = s.RSS
	}
	x.Backlog = s.Backlog
}

// restart is one stop and start of the broker.
type restart struct {
	Kind        string        `json:"kind"`       // SIGTERM or SIGKILL
	StopTook    time.Duration `json:"stopTookNs"` // SIGTERM to exit (SIGKILL: 0)
	Ready       time.Duration `json:"readyNs"`    // exec to the first /readyz 200
	LagBefore   int64         `json:"lagBefore"`
	LagAfter    int64         `json:"lagAfter"`
	Accepted    int64         `json:"accepted"`    // sends answered 2xx between the two lag readings
	RSSAtReady  int64         `json:"rssAtReady"`  // VmRSS of the new process when ready
	HWMBefore   int64         `json:"hwmBefore"`   // VmHWM of the old process before the stop
	Lost        int64         `json:"lost"`        // accepted − (lagAfter − lagBefore), when positive
	Description string        `json:"description"` // what was going on
}

// fillResult is step 2.
type fillResult struct {
	Messages    int64            `json:"messages"` // asked for
	Sent        int64            `json:"sent"`     // answered 2xx
	Elapsed     loadtest.Seconds `json:"elapsedSeconds"`
	MsgsPerSec  float64          `json:"msgsPerSec"`
	FirstTenth  float64          `json:"firstTenthMsgsPerSec"` // mean rate over the first and last tenth of the fill
	LastTenth   float64          `json:"lastTenthMsgsPerSec"`
	Send        loadtest.OpStats `json:"send"`
	Lag         int64            `json:"lag"`           // the backlog subscription's lag after the fill, from the broker
	Topic       int64            `json:"topicMessages"` // the topic's message count, from the broker
	DiskBytes   int64            `json:"diskBytes"`     // the data dir's size after the fill
	AcceptedAll int64            `json:"acceptedAll"`   // messages accepted since the broker started, the empty phase's too
	RSSAfter    int64            `json:"rssAfter"`
	BrokerCores float64          `json:"brokerCores"`
	// Settled is how long the idle broker took, after the fill, to finish
	// the work the fill left (Pebble's flushes and compactions): until its
	// CPU stayed below settleIdleCores for a second, at most settleMax.
	Settled    loadtest.Seconds `json:"settledSeconds"`
	SettleCPU  time.Duration    `json:"settleCpuNs"` // the broker's CPU time meanwhile
	SettledOut bool             `json:"settledOut"`  // settleMax passed first
}

// backlogResult is the JSON output of -suite backlog.
type backlogResult struct {
	Command      string     `json:"command"`
	Machine      machine    `json:"machine"`
	Messages     int64      `json:"messages"`
	MessageBytes int        `json:"messageBytes"`
	BrokerBinary string     `json:"brokerBinary"`
	BrokerLog    string     `json:"brokerLog"`
	BrokerPids   []int      `json:"brokerPids"` // every broker process, in order
	Fill         fillResult `json:"fill"`
	Phases       []phase    `json:"phases"`
	Restarts     []restart  `json:"restarts"`
	PeakRSS      int64      `json:"peakRssBytes"`
	Targets      []target   `json:"targets"`
	Plot         string     `json:"plot,omitempty"`
	SeriesFile   string     `json:"seriesFile,omitempty"`
	Series       []sample   `json:"series"`
}

func (b *backlogSuite) logf(format string, args ...any) {
	if b.progress != nil {
		fmt.Fprintf(b.progress, format+"\n", args...)
	}
}

// run runs the suite. The result holds what was measured even when err is
// not nil. The broker process is stopped on every way out.
func (b *backlogSuite) run(ctx context.Context, res *backlogResult) (err error) {
	b.res = res
	res.Messages, res.MessageBytes = b.messages, b.size
	if b.messages < 1000 {
		return fmt.Errorf("-messages %d: the backlog needs at least 1000", b.messages)
	}
	if b.brokerBin != "" {
		if st, err := os.Stat(b.brokerBin); err != nil || !st.Mode().IsRegular() || st.Mode().Perm()&0o111 == 0 {
			return fmt.Errorf("-broker-bin %s is not an executable file (%v)", b.brokerBin, err)
		}
	}
	if b.readyTimeout == 0 {
		b.readyTimeout = 5 * time.Minute
	}
	if b.fillTimeout == 0 {
		b.fillTimeout = time.Minute + time.Duration(b.messages)*time.Millisecond
	}
	b.work, err = os.MkdirTemp(b.dir, "tidemq-load-backlog-")
	if err != nil {
		return err
	}
	b.data, b.logPath = filepath.Join(b.work, "data"), filepath.Join(b.work, "broker.log")
	res.BrokerLog = b.logPath
	defer func() {
		// The data (and a built binary) go; the broker's log stays when
		// something failed, for diagnosis.
		rmErr := os.RemoveAll(b.data)
		if _, serr := os.Stat(b.logPath); (err == nil || serr != nil) && rmErr == nil {
			rmErr = os.RemoveAll(b.work)
			res.BrokerLog = ""
		} else {
			if b.brokerBin == "" {
				_ = os.RemoveAll(filepath.Join(b.work, "bin"))
			}
			b.logf("== the broker's log is kept: %s", b.logPath)
		}
		err = errors.Join(err, rmErr)
	}()
	if err := b.checkSpace(); err != nil {
		return err
	}
	bin := b.brokerBin
	if bin == "" {
		b.logf("== building ./cmd/tidemq")
		binDir := filepath.Join(b.work, "bin")
		if err := os.Mkdir(binDir, 0o755); err != nil {
			return err
		}
		if bin, err = buildBroker(ctx, binDir); err != nil {
			return err
		}
	}
	res.BrokerBinary = bin

	b.client = loadtest.NewClient(16+2*4+4, b.gzip)
	defer b.client.CloseIdleConnections()
	b.t0 = time.Now()
	proc, ready, err := startBrokerProc(ctx, bin, b.data, b.logPath, b.readyTimeout)
	if err != nil {
		return err
	}
	b.proc = proc
	res.BrokerPids = append(res.BrokerPids, proc.Pid())
	defer func() { err = errors.Join(err, b.proc.kill()) }()
	b.admin = loadtest.Admin{URL: proc.URL, Client: b.client}
	b.logf("== broker pid %d on %s, ready in %s; log %s", proc.Pid(), proc.URL, dur(ready), b.logPath)

	if err := b.steps(ctx, bin); err != nil {
		return err
	}
	b.noteMemory()
	took, err := b.proc.terminate(time.Minute)
	if err != nil {
		return fmt.Errorf("final stop: %w", err)
	}
	b.logf("== broker stopped (SIGTERM) in %s", dur(took))
	res.PeakRSS = b.peakRSS
	b.targets()
	return nil
}

// checkSpace fails when the disk cannot hold the bodies alone, and warns
// when it has less than twice that.
func (b *backlogSuite) checkSpace() error {
	free, err := freeBytes(b.work)
	if err != nil {
		return nil // not knowable here: let the broker's 507 say it
	}
	need := b.messages * int64(b.size+200)
	if free < need {
		return fmt.Errorf("%s has %s free; %d messages of %d B need about %s: use -dir elsewhere or fewer -messages",
			b.work, bytesIEC(free), b.messages, b.size, bytesIEC(need))
	}
	if free < 2*need {
		b.log.Warn("little disk space for the backlog", "free", bytesIEC(free), "estimate", bytesIEC(need))
		b.logf("warning: %s free at %s, the backlog needs about %s", bytesIEC(free), b.work, bytesIEC(need))
	}
	return nil
}

// steps are 1 to 4 of the suite.
func (b *backlogSuite) steps(ctx context.Context, bin string) error {
	id := fmt.Sprintf("%08x", rand.Uint32())
	sender := func(topic, runID string) loadtest.Scenario {
		return loadtest.Scenario{Topic: topic, SkipSetup: true, RunID: runID,
			Producers: loadtest.Producers{Count: 16, Batch: 100, MessageBytes: b.size}}
	}
	puller := func(topic, group, runID string) loadtest.Scenario {
		return loadtest.Scenario{Topic: topic, Group: group, SkipSetup: true, RunID: runID,
			Consumers: loadtest.Consumers{Count: 4, MaxMessages: 256, WaitSeconds: 1}}
	}

	// 1. The empty broker: send, then pull what was sent.
	const emptyTopic, emptyGroup = "backlog-empty", "empty"
	if err := b.admin.PutTopic(ctx, emptyTopic, 0, 0); err != nil {
		return err
	}
	if err := b.admin.PutSubscription(ctx, emptyTopic, emptyGroup, "earliest"); err != nil {
		return err
	}
	_, sentEmpty, err := b.phase(ctx, "empty-send", "send, batch 100, 16 producers, empty broker", sender(emptyTopic, "empty-"+id), 0)
	if err != nil {
		return err
	}
	if _, _, err := b.phase(ctx, "empty-pull", "pull 256 + ack, 4 consumers, what empty-send sent", puller(emptyTopic, emptyGroup, "empty-"+id), sentEmpty); err != nil {
		return err
	}
	if err := b.admin.DeleteTopic(ctx, emptyTopic); err != nil {
		return err
	}

	// 2. The fill.
	const topic, group = "backlog", "backlog"
	if err := b.admin.PutTopic(ctx, topic, 0, 24*7); err != nil {
		return err
	}
	if err := b.admin.PutSubscription(ctx, topic, group, "earliest"); err != nil {
		return err
	}
	fillID := "fill-" + id
	if err := b.fill(ctx, sender(topic, fillID)); err != nil {
		return err
	}

	// 3. At the backlog: the pull starts at the backlog's oldest message.
	if _, _, err := b.phase(ctx, "backlog-send", "send, batch 100, 16 producers, at the backlog", sender(topic, "bsend-"+id), 0); err != nil {
		return err
	}
	b.mu.Lock()
	left := b.backlog
	b.mu.Unlock()
	if _, _, err := b.phase(ctx, "backlog-pull", "pull 256 + ack, 4 consumers, the backlog from its start", puller(topic, group, fillID), left); err != nil {
		return err
	}

	// 4. Restarts.
	if err := b.restart(ctx, bin, "SIGTERM", topic, group, loadtest.Scenario{}); err != nil {
		return err
	}
	return b.restart(ctx, bin, "SIGKILL", topic, group, sender(topic, "kill-"+id))
}

// runSampled runs sc against the broker with its intervals recorded as
// phase name; sent messages add to the backlog count when they go to the
// backlog topic, acked ones subtract from it when they come from it.
func (b *backlogSuite) runSampled(ctx context.Context, name string, sc loadtest.Scenario, onInterval func(loadtest.Interval)) (loadtest.Report, error) {
	sc.URL, sc.Client = b.proc.URL, b.client
	backlogTopic := sc.Topic == "backlog"
	producing, consuming := sc.Producers.Count > 0, sc.Consumers.Count > 0
	sc.OnInterval = func(iv loadtest.Interval) {
		rss := b.noteMemory()
		b.mu.Lock()
		if backlogTopic {
			b.backlog += iv.Sent - iv.Acked
		}
		b.sentAll += iv.Sent
		s := sample{T: time.Since(b.t0).Seconds(), Seconds: iv.Seconds, Phase: name, Producing: producing, Consuming: consuming,
			Sent: iv.Sent, Acked: iv.Acked, SentRate: iv.SendRate, AckedRate: iv.AckRate, Errors: iv.Errors, RSS: rss, Backlog: b.backlog}
		if iv.Send.Count > 0 {
			s.SendP99 = ms(iv.Send.P99)
		}
		if iv.Pull.Count > 0 {
			s.PullP99 = ms(iv.Pull.P99)
		}
		// The last interval of a run is shorter: under half a second, its
		// rate is noise, so it joins the one before.
		if n := len(b.series); n > 0 && s.Seconds < 0.5 && b.series[n-1].Phase == name {
			b.series[n-1].merge(s)
		} else {
			b.series = append(b.series, s)
		}
		b.mu.Unlock()
		if onInterval != nil {
			onInterval(iv)
		}
	}
	return runLabeled(ctx, sc)
}

// phase runs a warm-up (-warmup, sampled as "<name> warm-up") and the
// measured run of -duration of sc. For consumers alone, avail is how many
// messages of sc's RunID there are to consume: the runs stop when they are
// all consumed. It returns the measured phase and the messages the warm-up
// and the measured run sent.
func (b *backlogSuite) phase(ctx context.Context, name, desc string, sc loadtest.Scenario, avail int64) (phase, int64, error) {
	b.logf("== %s: %s", name, desc)
	var sent int64
	if b.warmup > 0 {
		w := sc
		w.Duration, w.Messages = b.warmup, avail
		rep, err := b.runSampled(ctx, name+" warm-up", w, nil)
		if err != nil {
			return phase{}, 0, fmt.Errorf("%s warm-up: %w", name, err)
		}
		sent += rep.Sent
		avail -= rep.Delivered
		if sc.Producers.Count == 0 && avail <= 0 {
			return phase{}, 0, fmt.Errorf("%s: the warm-up consumed all there was: raise -messages or shorten -warmup", name)
		}
	}
	sc.Duration, sc.Messages, sc.Progress = b.duration, max(avail, 0), b.progress
	cpu0 := b.proc.cpu()
	rep, err := b.runSampled(ctx, name, sc, nil)
	cpu := b.proc.cpu() - cpu0
	if err != nil {
		return phase{}, 0, fmt.Errorf("%s: %w", name, err)
	}
	sent += rep.Sent
	var p phase
	if sc.Producers.Count > 0 {
		p = phase{Name: name, Round: 1, Kind: "broker", Description: desc, MsgsPerSec: rep.SendRate, Latency: rep.Send.Latency, Errors: rep.Send.Errors, Report: &rep}
		p.setCPU(usage{cpu: cpu}, rep.Sent, time.Duration(rep.Elapsed))
	} else {
		p = pullPhaseOf(name, 1, desc, rep, usage{cpu: cpu})
	}
	b.logf("   %s msg/s, %s, errors %s, broker CPU %s/msg on %.2f cores", thousands(p.MsgsPerSec), p.Latency, errorsCell(p.Errors), dur(p.CPUPerMsg), p.Cores)
	b.res.Phases = append(b.res.Phases, p)
	return p, sent, nil
}

// fill sends b.messages messages with sc, sampled every second, a line
// every 10 s; it gives up at the fill timeout, or when the broker accepted
// nothing for a minute.
func (b *backlogSuite) fill(ctx context.Context, sc loadtest.Scenario) error {
	b.logf("== fill: %s messages of %d B, batch 100, 16 producers, into a subscription nobody consumes", thousands(float64(b.messages)), b.size)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	sc.Messages, sc.Duration = b.messages, b.fillTimeout
	var stalled float64
	lastLine := time.Now()
	var total int64
	cpu0 := b.proc.cpu()
	rep, err := b.runSampled(ctx, "fill", sc, func(iv loadtest.Interval) {
		total += iv.Sent
		if iv.Sent == 0 {
			stalled += iv.Seconds
		} else {
			stalled = 0
		}
		if stalled >= 60 {
			cancel(fmt.Errorf("fill: the broker accepted no message for %.0f s (%d errors in the last second); its log: %s", stalled, iv.Errors, b.logPath))
		}
		if time.Since(lastLine) >= 10*time.Second {
			lastLine = time.Now()
			rss, _, _ := b.proc.memory()
			b.logf("   fill %5.1f%%: %s sent, %s msg/s, send %s, RSS %s", 100*float64(total)/float64(b.messages),
				thousands(float64(total)), thousands(iv.SendRate), iv.Send, bytesIEC(rss))
		}
	})
	cpu := b.proc.cpu() - cpu0
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		err = cause
	}
	f := &b.res.Fill
	*f = fillResult{Messages: b.messages, Sent: rep.Sent, Elapsed: rep.Elapsed, MsgsPerSec: rep.SendRate, Send: rep.Send}
	if e := time.Duration(rep.Elapsed).Seconds(); e > 0 {
		f.BrokerCores = cpu.Seconds() / e
	}
	f.FirstTenth, f.LastTenth = b.tenths("fill")
	if err != nil {
		return fmt.Errorf("fill: %w", err)
	}
	if rep.Sent < b.messages {
		return fmt.Errorf("fill: %d of %d messages sent in %v (errors %v): the fill timeout is -fill-timeout", rep.Sent, b.messages, b.fillTimeout, rep.Send.Errors)
	}
	st, err := b.admin.Subscription(ctx, "backlog", "backlog")
	if err != nil {
		return err
	}
	tp, err := b.admin.Topic(ctx, "backlog")
	if err != nil {
		return err
	}
	f.Lag, f.Topic, f.DiskBytes = st.Lag, tp.Messages, dirBytes(b.data)
	b.mu.Lock()
	f.AcceptedAll = b.sentAll
	b.mu.Unlock()
	f.RSSAfter, _, _ = b.proc.memory()
	b.logf("   filled: %s sent in %.1f s (%s msg/s; first tenth %s, last tenth %s); lag %s, topic %s messages, %s on disk, RSS %s",
		thousands(float64(rep.Sent)), time.Duration(rep.Elapsed).Seconds(), thousands(rep.SendRate), thousands(f.FirstTenth), thousands(f.LastTenth),
		thousands(float64(st.Lag)), thousands(float64(tp.Messages)), bytesIEC(f.DiskBytes), bytesIEC(f.RSSAfter))
	if st.Lag < rep.Sent {
		return fmt.Errorf("fill: the backlog subscription's lag is %d after %d messages were accepted", st.Lag, rep.Sent)
	}
	return b.settle(ctx)
}

// The backlog phases compare a broker holding the backlog with the empty
// broker, which had no earlier writes to compact. So they start once the
// broker has done the flushes and compactions the fill left behind (2 s
// after a 10-million fill on the development machine; longer on a slower
// disk), not while it pays for them: the fill's own first and last tenth
// show what sustained sending costs.
const (
	settleIdleCores = 0.05
	settleMax       = 5 * time.Minute
)

// settle waits until the broker's CPU stays below settleIdleCores for a
// second, at most settleMax.
func (b *backlogSuite) settle(ctx context.Context) error {
	f := &b.res.Fill
	start, cpu0 := time.Now(), b.proc.cpu()
	last := cpu0
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
		now := b.proc.cpu()
		idle := (now - last).Seconds() < settleIdleCores
		last = now
		f.Settled, f.SettleCPU = loadtest.Seconds(time.Since(start)), now-cpu0
		if idle {
			b.logf("   settled: the broker was idle %.0f s after the fill (%s of CPU meanwhile)", time.Since(start).Seconds(), dur(f.SettleCPU))
			return nil
		}
		if time.Since(start) >= settleMax {
			f.SettledOut = true
			b.logf("   not settled: the broker was still busy %.0f s after the fill; measuring anyway", time.Since(start).Seconds())
			return nil
		}
	}
}

// tenths is the mean sent rate over the first and the last tenth (by
// time) of phase's samples.
func (b *backlogSuite) tenths(phaseName string) (first, last float64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var ss []sample
	for _, s := range b.series {
		if s.Phase == phaseName {
			ss = append(ss, s)
		}
	}
	if len(ss) == 0 {
		return 0, 0
	}
	n := max(len(ss)/10, 1)
	mean := func(xs []sample) float64 {
		var sum float64
		for _, s := range xs {
			sum += s.SentRate
		}
		return sum / float64(len(xs))
	}
	return mean(ss[:n]), mean(ss[len(ss)-n:])
}

// restart stops the broker (SIGTERM: cleanly, after the lag is read;
// SIGKILL: while load, sent with load, is under way for -duration) and
// starts it again on the same data, timing exec to ready, and checks the
// subscription's lag kept every message accepted.
func (b *backlogSuite) restart(ctx context.Context, bin, kind, topic, group string, load loadtest.Scenario) error {
	r := restart{Kind: kind}
	st, err := b.admin.Subscription(ctx, topic, group)
	if err != nil {
		return err
	}
	r.LagBefore = st.Lag
	b.logf("== restart after %s (lag %s)", kind, thousands(float64(r.LagBefore)))
	switch kind {
	case "SIGTERM":
		r.Description = "idle broker, SIGTERM, wait for exit, start"
		_, r.HWMBefore, _ = b.proc.memory()
		b.noteMemory()
		if r.StopTook, err = b.proc.terminate(time.Minute); err != nil {
			return err
		}
		b.logf("   stopped in %s", dur(r.StopTook))
	case "SIGKILL":
		r.Description = fmt.Sprintf("SIGKILL %v into sends (batch 100, 16 producers), start", b.duration)
		loadCtx, cancel := context.WithCancel(ctx)
		defer cancel()
		load.Duration = b.duration + 10*time.Second // the kill comes first
		var rep loadtest.Report
		var runErr error
		var wg sync.WaitGroup
		wg.Go(func() { rep, runErr = b.runSampled(loadCtx, "load, SIGKILL", load, nil) })
		timer := time.NewTimer(b.duration)
		select {
		case <-timer.C:
		case <-ctx.Done():
		}
		timer.Stop()
		_, r.HWMBefore, _ = b.proc.memory()
		b.noteMemory()
		killErr := b.proc.kill()
		cancel()
		wg.Wait()
		if killErr != nil {
			return killErr
		}
		if runErr != nil && ctx.Err() == nil && !errors.Is(runErr, context.Canceled) {
			return fmt.Errorf("load before SIGKILL: %w", runErr)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		r.Accepted = rep.Sent
		b.logf("   killed after %s messages were accepted under way (%d send requests failed as it died)", thousands(float64(rep.Sent)), rep.Send.ErrorCount())
	}
	proc, ready, err := startBrokerProc(ctx, bin, b.data, b.logPath, b.readyTimeout)
	if err != nil {
		return fmt.Errorf("restart after %s: %w", kind, err)
	}
	b.proc, r.Ready = proc, ready
	b.res.BrokerPids = append(b.res.BrokerPids, proc.Pid())
	b.client.CloseIdleConnections()
	b.admin.URL = proc.URL
	r.RSSAtReady, _, _ = proc.memory()
	b.noteMemory()
	if st, err = b.admin.Subscription(ctx, topic, group); err != nil {
		return err
	}
	r.LagAfter = st.Lag
	r.Lost = max(r.Accepted-(r.LagAfter-r.LagBefore), 0)
	b.res.Restarts = append(b.res.Restarts, r)
	b.logf("   ready in %s (pid %d); lag %s (before %s, %s accepted in between); RSS %s",
		dur(ready), proc.Pid(), thousands(float64(r.LagAfter)), thousands(float64(r.LagBefore)), thousands(float64(r.Accepted)), bytesIEC(r.RSSAtReady))
	b.mu.Lock()
	b.series = append(b.series, sample{T: time.Since(b.t0).Seconds(), Phase: kind + " restart", RSS: r.RSSAtReady, Backlog: b.backlog})
	b.mu.Unlock()
	return nil
}

// noteMemory reads the broker's memory, keeps the peak, and returns VmRSS
// (0 when it cannot be read: the process just died).
func (b *backlogSuite) noteMemory() int64 {
	rss, hwm, err := b.proc.memory()
	if err != nil {
		return 0
	}
	b.mu.Lock()
	b.peakRSS = max(b.peakRSS, rss, hwm)
	b.mu.Unlock()
	return rss
}

// targets fills res.Targets from the phases and restarts.
func (b *backlogSuite) targets() {
	res := b.res
	byName := map[string]phase{}
	for _, p := range res.Phases {
		byName[p.Name] = p
	}
	n := thousands(float64(b.messages))
	ratio := func(name, measured, reference string) {
		m, r := byName[measured], byName[reference]
		t := target{Name: name, Want: "≥ 80%", Measured: thousands(m.MsgsPerSec) + " msg/s",
			Baseline: fmt.Sprintf("%s msg/s (%s)", thousands(r.MsgsPerSec), r.Name)}
		if r.MsgsPerSec > 0 {
			t.Ratio = m.MsgsPerSec / r.MsgsPerSec
		}
		t.Rounds = []float64{t.Ratio}
		t.Pass = t.Ratio >= 0.8 && len(m.Errors) == 0 && len(r.Errors) == 0
		res.Targets = append(res.Targets, t)
	}
	ratio("send at a backlog of "+n+", batch 100, 16 producers", "backlog-send", "empty-send")
	ratio("pull 256 + ack, 4 consumers, from the start of a backlog of "+n, "backlog-pull", "empty-pull")
	rss := target{Name: "peak broker RSS (VmHWM of every broker process)", Measured: bytesIEC(res.PeakRSS), Baseline: "1 GiB",
		Ratio: float64(res.PeakRSS) / rssLimit, Want: "≤ 1 GiB"}
	rss.Rounds, rss.Pass = []float64{rss.Ratio}, res.PeakRSS > 0 && res.PeakRSS <= rssLimit
	res.Targets = append(res.Targets, rss)
	var lost, accepted int64
	for _, r := range res.Restarts {
		t := target{Name: "restart to ready after " + r.Kind + " at a backlog of " + n, Measured: dur(r.Ready), Baseline: "10 s",
			Ratio: float64(r.Ready) / float64(restartLimit), Want: "≤ 10 s"}
		t.Rounds, t.Pass = []float64{t.Ratio}, r.Ready <= restartLimit
		res.Targets = append(res.Targets, t)
		lost += r.Lost
		accepted += r.Accepted
	}
	res.Targets = append(res.Targets, target{Name: "no accepted message lost across the restarts (subscription lag)",
		Measured: fmt.Sprintf("%d lost of %s accepted under way", lost, thousands(float64(accepted))), Baseline: "-",
		Ratio: 0, Rounds: []float64{0}, Want: "0 lost", Pass: lost == 0 && len(res.Restarts) == 2})
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// bytesIEC is n in KiB, MiB or GiB with three significant digits or so.
func bytesIEC(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.0f KiB", float64(n)/(1<<10))
	default:
		return fmt.Sprintf("%d B", n)
	}
}

// writeSeriesCSV writes the samples as CSV.
func writeSeriesCSV(path string, series []sample) (err error) {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, f.Close()) }()
	w := csv.NewWriter(f)
	_ = w.Write([]string{"t_seconds", "interval_seconds", "phase", "sent_per_sec", "acked_per_sec", "send_p99_ms", "pull_p99_ms", "errors", "rss_bytes", "backlog"})
	ff := func(v float64) string { return strconv.FormatFloat(v, 'f', 3, 64) }
	for _, s := range series {
		_ = w.Write([]string{ff(s.T), ff(s.Seconds), s.Phase, ff(s.SentRate), ff(s.AckedRate), ff(s.SendP99), ff(s.PullP99),
			strconv.FormatInt(s.Errors, 10), strconv.FormatInt(s.RSS, 10), strconv.FormatInt(s.Backlog, 10)})
	}
	w.Flush()
	return w.Error()
}

// writeMarkdown renders the backlog suite's result.
func (r backlogResult) writeMarkdown(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "## tidemq load test: backlog of %s messages of %d B\n\n`%s`\n\n", thousands(float64(r.Messages)), r.MessageBytes, r.Command)
	m := r.Machine
	fmt.Fprintf(&b, "- machine: %s, %d CPUs, %s; load average before: %s; after: %s\n", m.CPU, m.NumCPU, m.GoVersion, m.LoadBefore, m.LoadAfter)
	fmt.Fprintf(&b, "- broker: %s as a separate process, fsync always, data under %s\n", r.BrokerBinary, m.DataDir)
	fmt.Fprintf(&b, "- started %s, took %s\n\n", m.Start.Format(time.RFC3339), m.Took.Round(time.Second))
	b.WriteString("| target | measured | reference | ratio | want | result |\n|---|---:|---|---:|---|---|\n")
	for _, t := range r.Targets {
		ratio := fmt.Sprintf("%.0f%%", t.Ratio*100)
		if t.Baseline == "-" {
			ratio = "-"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | **%s** |\n", t.Name, t.Measured, t.Baseline, ratio, t.Want, t.result())
	}
	f := r.Fill
	fmt.Fprintf(&b, "\n### Fill\n\n%s of %s messages accepted in %.1f s: %s msg/s (first tenth of the fill %s msg/s, last tenth %s msg/s), send per batch %s, errors %s; broker on %.2f cores.\n",
		thousands(float64(f.Sent)), thousands(float64(f.Messages)), time.Duration(f.Elapsed).Seconds(), thousands(f.MsgsPerSec),
		thousands(f.FirstTenth), thousands(f.LastTenth), f.Send.Latency, errorsCell(f.Send.Errors), f.BrokerCores)
	if f.AcceptedAll > 0 {
		fmt.Fprintf(&b, "Stored afterwards: subscription lag %s, topic messages %s; data dir %s, %.0f B per message accepted so far (%s, with the empty phases'), broker RSS %s.\n",
			thousands(float64(f.Lag)), thousands(float64(f.Topic)), bytesIEC(f.DiskBytes), float64(f.DiskBytes)/float64(f.AcceptedAll),
			thousands(float64(f.AcceptedAll)), bytesIEC(f.RSSAfter))
		if f.SettledOut {
			fmt.Fprintf(&b, "The broker was still busy with the fill's flushes and compactions %.0f s after it; the backlog phases ran anyway.\n", time.Duration(f.Settled).Seconds())
		} else {
			fmt.Fprintf(&b, "Then the idle broker finished the fill's flushes and compactions (%.0f s, %s of CPU) before the backlog phases started.\n", time.Duration(f.Settled).Seconds(), dur(f.SettleCPU))
		}
	}
	b.WriteString("\n### Phases\n\n| phase | what | msg/s | p50 | p99 | p99.9 | max | broker CPU/msg | broker cores | errors |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---|\n")
	for _, p := range r.Phases {
		l := p.Latency
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s | %.2f | %s |\n", p.Name, p.Description, thousands(p.MsgsPerSec),
			dur(l.P50), dur(l.P99), dur(l.P999), dur(l.Max), dur(p.CPUPerMsg), p.Cores, errorsCell(p.Errors))
	}
	b.WriteString("\nEach phase: a warm-up of -warmup (not counted), then -duration measured (a pull phase ends early when it has consumed all there was). " +
		"Send latency is per batch request; pull latency is per pull that returned messages, and its msg/s is messages acked. " +
		"CPU is the broker process's (user + system, from /proc).\n")
	b.WriteString("\n### Restarts\n\n| restart | what | stop took | exec → ready | lag before | accepted in between | lag after | lost | RSS at ready |\n|---|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, x := range r.Restarts {
		stop := "-"
		if x.StopTook > 0 {
			stop = dur(x.StopTook)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %d | %s |\n", x.Kind, x.Description, stop, dur(x.Ready),
			thousands(float64(x.LagBefore)), thousands(float64(x.Accepted)), thousands(float64(x.LagAfter)), x.Lost, bytesIEC(x.RSSAtReady))
	}
	fmt.Fprintf(&b, "\nPeak broker RSS: %s (the largest VmHWM of the broker processes, read before each stop, and of the VmRSS samples).\n", bytesIEC(r.PeakRSS))
	if r.Plot != "" {
		fmt.Fprintf(&b, "\nPlot: `%s`.", r.Plot)
	}
	if r.SeriesFile != "" {
		fmt.Fprintf(&b, " Time series (one row a second): `%s`.", r.SeriesFile)
	}
	if r.BrokerLog != "" {
		fmt.Fprintf(&b, " Broker log kept: `%s`.", r.BrokerLog)
	}
	b.WriteString("\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func errorsCell(errs map[string]int64) string {
	if len(errs) == 0 {
		return "0"
	}
	return fmt.Sprint(errs)
}
