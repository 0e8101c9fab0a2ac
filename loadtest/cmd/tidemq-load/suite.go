package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"runtime/pprof"
	"runtime/trace"
	"slices"
	"strings"
	"time"

	"github.com/tidemq/tidemq/loadtest"
)

// The target suite: every throughput target is a ratio of the
// broker to a baseline measured in the same run, on the same machine and
// disk, with the same client; each baseline runs right before the broker
// phase it is compared with, so that a change of load on a shared machine
// hits both sides alike.

// suite runs phases and keeps their results.
type suite struct {
	url           string // a running broker; "" starts a fresh in-process one per phase
	token         string // bearer token for url
	dir           string // base of temp dirs ("" is the system's)
	log           *slog.Logger
	warmup        time.Duration
	duration      time.Duration
	progress      io.Writer      // nil: quiet
	cpuProfile    string         // file for the CPU profile of profilePhases
	execTrace     string         // file for the runtime execution trace of profilePhases
	profilePhases []string       // with more than one, each goes to cpuProfile-<phase>.pprof
	rounds        int            // times the target phases run; the median ratio decides
	only          *regexp.Regexp // nil: every phase; else the phases whose names match (targets lacking one are left out)
	round         int            // the round running (0-based); only round 0 is profiled
	gzip          bool           // clients ask for gzip replies
	clients       []string       // the client kinds each HTTP phase runs with; the first's phases keep their names, the others' get @kind
	curveDuration time.Duration  // each measured run of the single-send curve's points but the suite's own (1 and 64 producers)
	brokerBin     string         // the broker binary the flood and cost-growth phases run ("": brokerBinary builds ./cmd/tidemq)
	builtBinDir   string         // where brokerBinary built it, removed at the end
	floodDuration time.Duration  // the flood phase's
	cost          costOptions    // scales of the cost-growth phases (suite_cost.go)
	costs         costState
	phases        []phase

	// With -broker-process: the binary each broker phase runs as a child
	// process ("" runs brokers in this process), where their data dirs
	// and log go, and the running child's CPU time so far (nil when none).
	childBin, brokerWork string
	brokerCPU            func() time.Duration

	// With a cluster of child brokers (suite_cluster.go): the base URLs
	// a phase's clients are spread over (nil: the phase's one URL), and
	// what each node used so far, in node order (nil when none).
	spread      []string
	brokerUsage func() []procUsage
}

// phase is one measurement.
type phase struct {
	Name  string `json:"name"`
	Round int    `json:"round"` // 1-based
	Kind  string `json:"kind"`  // broker, noop or pebble
	// Client is the client kind of an HTTP phase (loadtest.ClientLean or
	// ClientPlain).
	Client      string  `json:"client,omitempty"`
	Description string  `json:"description"`
	MsgsPerSec  float64 `json:"msgsPerSec"`
	// Latency is per send request (HTTP phases) or per synced commit
	// (pebble phases).
	Latency loadtest.Latency `json:"latency"`
	// CPUPerMsg is the process's CPU time (client and server, or Pebble)
	// per message while measuring; Cores is that CPU time over the
	// elapsed time; IdlePs is the time the Go scheduler's Ps sat parked,
	// over the elapsed time (idlePsTime; not for the backlog suite, whose
	// broker is another process). What the two leave of the CPUs went to
	// other processes or to kernel work nobody is charged for.
	CPUPerMsg time.Duration    `json:"cpuPerMsgNs"`
	Cores     float64          `json:"cores"`
	IdlePs    float64          `json:"idlePs,omitempty"`
	Errors    map[string]int64 `json:"errors,omitempty"`
	// ServerCPUPerMsg and ClientCPUPerMsg split CPUPerMsg when the broker
	// was a child process (-broker-process): its CPU time and this
	// process's, per message.
	ServerCPUPerMsg time.Duration `json:"serverCpuPerMsgNs,omitempty"`
	ClientCPUPerMsg time.Duration `json:"clientCpuPerMsgNs,omitempty"`
	// NodeCPUPerMsg splits ServerCPUPerMsg by node when the broker was a
	// cluster of child processes, in node order.
	NodeCPUPerMsg []time.Duration `json:"nodeCpuPerMsgNs,omitempty"`
	// NodeFaultsPerSec is each of those processes' minor page faults a
	// second over the measured run, in node order.
	NodeFaultsPerSec []float64 `json:"nodeFaultsPerSec,omitempty"`
	// SpansDropped is how many spans the in-process broker dropped while
	// measuring because its export queue was full: that much tracing went
	// unpaid (its export), so a phase with many is less traced than asked.
	SpansDropped uint64           `json:"spansDropped,omitempty"`
	Report       *loadtest.Report `json:"report,omitempty"`
	Pebble       *pebbleResult    `json:"pebble,omitempty"`
	Flood        *floodResult     `json:"flood,omitempty"`
	Cost         *costResult      `json:"cost,omitempty"`
	Brokers      *brokersResult   `json:"brokers,omitempty"`
}

// target is one line of the table.
type target struct {
	Name     string    `json:"name"`
	Measured string    `json:"measured"`
	Baseline string    `json:"baseline"`
	Ratio    float64   `json:"ratio"`  // measured / baseline (throughput) or measured / bound (latency); the median of the rounds'
	Rounds   []float64 `json:"rounds"` // the ratio of each round
	Want     string    `json:"want"`
	Pass     bool      `json:"pass"`
}

// suiteResult is the JSON output of -suite targets.
type suiteResult struct {
	Command string   `json:"command"`
	Machine machine  `json:"machine"`
	Phases  []phase  `json:"phases"`
	Targets []target `json:"targets"`
}

// result is the target's verdict as the tables print it.
func (t target) result() string {
	if t.Pass {
		return "PASS"
	}
	return "FAIL"
}

func (c *suite) logf(format string, args ...any) {
	if c.progress != nil {
		fmt.Fprintf(c.progress, format+"\n", args...)
	}
}

// pebblePhase measures raw Pebble synced appends.
// It measures for d (0: the suite's duration).
func (c *suite) pebblePhase(ctx context.Context, name string, size, batch, writers int, d time.Duration) (phase, error) {
	desc := fmt.Sprintf("raw Pebble, %d B values, batch %d, %d writers, pebble.Sync", size, batch, writers)
	c.logf("== %s (round %d): %s", name, c.round+1, desc)
	res, err := pebbleBaseline{BaseDir: c.dir, MessageBytes: size, Batch: batch, Writers: writers,
		Warmup: c.warmup, Duration: cmp.Or(d, c.duration)}.run(ctx)
	if err != nil {
		return phase{}, fmt.Errorf("%s: %w", name, err)
	}
	p := phase{Name: name, Round: c.round + 1, Kind: "pebble", Description: desc, MsgsPerSec: res.MsgsPerSec, Latency: res.Commit, Pebble: &res}
	p.setCPU(usage{cpu: res.CPU, idlePs: res.IdlePs}, res.Messages, time.Duration(res.Elapsed))
	c.logf("   %.0f msg/s, commit %s, CPU %s/msg on %.2f cores", p.MsgsPerSec, p.Latency, dur(p.CPUPerMsg), p.Cores)
	c.phases = append(c.phases, p)
	return p, nil
}

// httpPhase runs sc against url (a warm-up run first, on the same client)
// for sc.Duration (0: the suite's duration) and, when name is the profiled
// phase, CPU-profiles the measured run.
func (c *suite) httpPhase(ctx context.Context, name, kind, url string, sc loadtest.Scenario) (phase, error) {
	p := sc.Producers
	client := cmp.Or(sc.ClientKind, loadtest.ClientLean)
	desc := fmt.Sprintf("%s, %s client, %d B bodies, batch %d, %d producers", kind, client, p.MessageBytes, max(p.Batch, 1), p.Count)
	if p.Rate > 0 {
		desc += fmt.Sprintf(" open loop at %s msg/s", thousands(p.Rate))
	}
	if p.Transactional {
		desc += ", each request a transaction (half messages, then commit)"
	}
	if sc.Consumers.Count > 0 {
		desc += fmt.Sprintf(", %d consumers pulling %d (wait %ds)", sc.Consumers.Count, sc.Consumers.MaxMessages, max(sc.Consumers.WaitSeconds, 0))
	}
	c.logf("== %s (round %d): %s", name, c.round+1, desc)
	hc := loadtest.NewClient(p.Count+2*sc.Consumers.Count+4, c.gzip)
	defer hc.CloseIdleConnections()
	sc.URL, sc.Client, sc.Token = url, hc, c.token
	if sc.URLs == nil {
		sc.URLs = c.spread
	}
	if c.warmup > 0 {
		w := sc
		w.Duration, w.Messages = c.warmup, 0
		if _, err := runLabeled(ctx, w); err != nil {
			return phase{}, fmt.Errorf("%s warm-up: %w", name, err)
		}
	}
	sc.Duration = cmp.Or(sc.Duration, c.duration)
	rep, use, err := c.measure(ctx, name, sc)
	if err != nil {
		return phase{}, fmt.Errorf("%s: %w", name, err)
	}
	ph := phase{Name: name, Round: c.round + 1, Kind: kind, Client: client, Description: desc, MsgsPerSec: rep.SendRate, Latency: rep.Send.Latency,
		Errors: rep.Send.Errors, Report: &rep, SpansDropped: use.spansDropped}
	ph.setCPU(use, rep.Sent, time.Duration(rep.Elapsed+rep.Drain))
	c.logf("   %.0f msg/s, send %s, errors %d, CPU %s/msg on %.2f cores", ph.MsgsPerSec, ph.Latency, rep.Send.ErrorCount(), dur(ph.CPUPerMsg), ph.Cores)
	if sc.Consumers.Count > 0 {
		c.logf("   delivered %d of %d sent, end to end %s", rep.Delivered, rep.Sent, rep.EndToEnd)
	}
	c.phases = append(c.phases, ph)
	return ph, nil
}

// measure runs sc with progress lines, CPU-profiled and traced when name
// is one of the profiled phases, and returns its report and what it cost.
func (c *suite) measure(ctx context.Context, name string, sc loadtest.Scenario) (rep loadtest.Report, use usage, err error) {
	sc.Progress = c.progress
	for _, r := range []struct {
		path, what string
		start      func(io.Writer) error
		stop       func()
	}{
		{c.phaseFile(c.execTrace, name), "execution trace (go tool trace)", trace.Start, trace.Stop},
		{c.phaseFile(c.cpuProfile, name), "CPU profile (go tool pprof -tagfocus side=server …)", pprof.StartCPUProfile, pprof.StopCPUProfile},
	} {
		if r.path == "" {
			continue
		}
		f, err := os.Create(r.path)
		if err != nil {
			return rep, use, err
		}
		if err := r.start(f); err != nil {
			return rep, use, errors.Join(err, f.Close())
		}
		defer func() {
			r.stop()
			err = errors.Join(err, f.Close())
			c.logf("   %s: %s", r.what, r.path)
		}()
	}
	var server0 time.Duration
	var nodes0 []procUsage
	if c.brokerCPU != nil {
		server0 = c.brokerCPU()
	}
	if c.brokerUsage != nil {
		nodes0 = c.brokerUsage()
	}
	mark, dropped0 := markUsage(), spansDroppedSoFar()
	rep, err = runLabeled(ctx, sc)
	use = mark.since()
	if c.brokerCPU != nil {
		use.server, use.child = c.brokerCPU()-server0, true
	}
	if c.brokerUsage != nil {
		use.child = true
		for i, u := range c.brokerUsage() {
			use.nodes = append(use.nodes, u.cpu-nodes0[i].cpu)
			use.nodeFaults = append(use.nodeFaults, u.faults-nodes0[i].faults)
			use.server += u.cpu - nodes0[i].cpu
		}
	}
	use.spansDropped = spansDroppedSoFar() - dropped0
	return rep, use, err
}

// usage is what a measured run cost beyond its report.
type usage struct {
	cpu          time.Duration   // the process's
	idlePs       time.Duration   // the Go scheduler's, summed over Ps
	spansDropped uint64          // by in-process brokers' span exporters
	server       time.Duration   // the child broker's (a cluster's nodes together), when child is set
	nodes        []time.Duration // each cluster node's, in node order
	nodeFaults   []uint64        // each cluster node's minor page faults, in node order
	child        bool            // the broker was a child process
}

func (p *phase) setCPU(use usage, msgs int64, elapsed time.Duration) {
	if msgs > 0 {
		p.CPUPerMsg = use.cpu / time.Duration(msgs)
	}
	if elapsed > 0 {
		p.Cores = use.cpu.Seconds() / elapsed.Seconds()
		p.IdlePs = use.idlePs.Seconds() / elapsed.Seconds()
	}
	p.splitCPU(use, msgs, elapsed)
}

// phaseFile is where phase name's CPU profile or execution trace goes,
// given the -cpuprofile or -trace path, or "": with several profiled
// phases, X.ext becomes X-<phase>.ext.
func (c *suite) phaseFile(path, name string) string {
	if path == "" || c.round > 0 || !slices.Contains(c.profilePhases, name) {
		return ""
	}
	if len(c.profilePhases) == 1 {
		return path
	}
	ext := filepath.Ext(path)
	return strings.TrimSuffix(path, ext) + "-" + name + ext
}

// runLabeled runs sc with its goroutines labelled side=client.
func runLabeled(ctx context.Context, sc loadtest.Scenario) (rep loadtest.Report, err error) {
	pprof.Do(ctx, clientLabels(), func(ctx context.Context) { rep, err = sc.Run(ctx) })
	return rep, err
}

// brokerPhase is httpPhase against the broker: a fresh in-process one
// (closed after the phase), or the running one at c.url.
func (c *suite) brokerPhase(ctx context.Context, name string, sc loadtest.Scenario) (p phase, err error) {
	err = c.withBroker(ctx, name, func(url string) error {
		p, err = c.httpPhase(ctx, name, "broker", url, sc)
		return err
	})
	return p, err
}

// withBroker calls f with the URL of a fresh in-process broker, closed
// after f returns, or of the running one at c.url.
func (c *suite) withBroker(ctx context.Context, name string, f func(url string) error) (err error) {
	if c.url != "" {
		return f(c.url)
	}
	if c.childBin != "" {
		return c.withChildBroker(ctx, name, f)
	}
	b, err := startBroker(c.dir, c.log)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := b.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("%s: closing the broker: %w", name, cerr)
		}
	}()
	return f(b.URL)
}

// pullPhase measures consumers alone against a backlog, on a fresh
// in-process broker (or c.url): a topic and a subscription from its
// earliest message are created, then fill messages of size bytes are sent
// (16 producers, batches of 100; not measured), then consumers pull and ack
// with nothing sent: a warm-up, and the measured run of c.duration or until
// the backlog is drained, whichever comes first. The phase's rate is
// messages acked per second.
// The backlog is sent and pulled by a client of kind client.
func (c *suite) pullPhase(ctx context.Context, name, client string, fill int64, size int, cons loadtest.Consumers) (p phase, err error) {
	err = c.withBroker(ctx, name, func(url string) error {
		p, err = c.pullFrom(ctx, name, client, url, fill, size, cons)
		return err
	})
	return p, err
}

func (c *suite) pullFrom(ctx context.Context, name, kind, url string, fill int64, size int, cons loadtest.Consumers) (p phase, err error) {
	desc := fmt.Sprintf("broker, %s client, %d B bodies, %d consumers pulling %d + ack, backlog of %s, no producers", kind, size, cons.Count, cons.MaxMessages, thousands(float64(fill)))
	c.logf("== %s (round %d): %s", name, c.round+1, desc)
	client := loadtest.NewClient(16+2*cons.Count+4, c.gzip)
	defer client.CloseIdleConnections()
	admin := loadtest.Admin{URL: url, Token: c.token, Client: client}
	id := fmt.Sprintf("%08x", rand.Uint32())
	topic, group := "loadtest-pull-"+id, "loadtest-pull"
	if err := admin.PutTopic(ctx, topic, 0, 0); err != nil {
		return p, err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		err = errors.Join(err, admin.DeleteTopic(cctx, topic))
	}()
	if err := admin.PutSubscription(ctx, topic, group, "earliest"); err != nil {
		return p, err
	}
	// The backlog: sent by one run (bounded in time too, should the broker
	// crawl), whose id the consumers take as theirs.
	filled, err := runLabeled(ctx, loadtest.Scenario{URL: url, URLs: c.spread, Token: c.token, Client: client, ClientKind: kind, Topic: topic, SkipSetup: true, RunID: "fill-" + id,
		Producers: loadtest.Producers{Count: 16, Batch: 100, MessageBytes: size}, Messages: fill, Duration: 10*(c.warmup+c.duration) + time.Minute})
	if err != nil {
		return p, fmt.Errorf("%s: filling the backlog: %w", name, err)
	}
	if filled.Sent == 0 {
		return p, fmt.Errorf("%s: filling the backlog: nothing sent (errors %v)", name, filled.Send.Errors)
	}
	c.logf("   backlog: %s messages sent in %.1fs (%s msg/s), errors %s", thousands(float64(filled.Sent)), time.Duration(filled.Elapsed).Seconds(),
		thousands(filled.SendRate), errorsCell(filled.Send.Errors))
	sc := loadtest.Scenario{URL: url, URLs: c.spread, Token: c.token, Client: client, ClientKind: kind, Topic: topic, Group: group, SkipSetup: true, RunID: filled.RunID, Consumers: cons}
	left := filled.Sent
	if c.warmup > 0 {
		w := sc
		w.Duration, w.Messages = c.warmup, left
		wrep, err := runLabeled(ctx, w)
		if err != nil {
			return p, fmt.Errorf("%s warm-up: %w", name, err)
		}
		left -= wrep.Delivered
	}
	if left <= 0 {
		return p, fmt.Errorf("%s: the warm-up drained the whole backlog of %d: fill more", name, filled.Sent)
	}
	sc.Duration, sc.Messages = c.duration, left
	rep, use, err := c.measure(ctx, name, sc)
	if err != nil {
		return p, fmt.Errorf("%s: %w", name, err)
	}
	p = pullPhaseOf(name, c.round+1, desc, rep, use)
	p.Client = kind
	p.SpansDropped = use.spansDropped
	c.logf("   %s msg/s acked (%s in %.2fs, of %s left after the warm-up), pull %s, errors %s, CPU %s/msg on %.2f cores",
		thousands(p.MsgsPerSec), thousands(float64(rep.Acked)), time.Duration(rep.Elapsed).Seconds(), thousands(float64(left)), p.Latency,
		errorsCell(p.Errors), dur(p.CPUPerMsg), p.Cores)
	c.phases = append(c.phases, p)
	return p, nil
}

// pullPhaseOf is the phase of a consumers-only report: messages acked per
// second, pull latency, pull and ack errors.
func pullPhaseOf(name string, round int, desc string, rep loadtest.Report, use usage) phase {
	p := phase{Name: name, Round: round, Kind: "broker", Description: desc, Latency: rep.Pull.Latency, Report: &rep}
	if e := time.Duration(rep.Elapsed).Seconds(); e > 0 {
		p.MsgsPerSec = float64(rep.Acked) / e
	}
	for op, errs := range map[string]map[string]int64{"pull": rep.Pull.Errors, "ack": rep.Ack.Errors} {
		for code, n := range errs {
			if p.Errors == nil {
				p.Errors = map[string]int64{}
			}
			p.Errors[op+" "+code] += n
		}
	}
	p.setCPU(use, rep.Acked, time.Duration(rep.Elapsed))
	return p
}

func sends(count, batch, size int) loadtest.Scenario {
	return loadtest.Scenario{Producers: loadtest.Producers{Count: count, Batch: batch, MessageBytes: size}}
}

// curvePoints are the producer counts of the single-send curve: each
// beside the no-op handler at the same concurrency and raw Pebble synced
// single puts from as many writers.
var curvePoints = []int{1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 128, 256}

// suitePoint reports whether the curve point at n producers is one the
// suite measured before the curve (its targets are measured for the
// suite's duration, the other points for the curve's).
func suitePoint(n int) bool { return n == 1 || n == 64 }

// clientSuffix is what the names of kind's HTTP phases end with: nothing
// for the first of the suite's clients, @kind for the others.
func (c *suite) clientSuffix(kind string) string {
	if len(c.clients) == 0 || kind == c.clients[0] {
		return ""
	}
	return "@" + kind
}

// runTargets runs every phase of the target table c.rounds times and
// checks each target on the median of its rounds' ratios.
func (c *suite) runTargets(ctx context.Context) ([]target, error) {
	noop, err := startNoop()
	if err != nil {
		return nil, err
	}
	defer noop.Close()
	type step struct {
		name string
		run  func(name string) (phase, error)
	}
	kinds := c.clients
	if len(kinds) == 0 {
		kinds = []string{loadtest.ClientLean}
	}
	pebbleStep := func(name string, size, batch, writers int, d time.Duration) step {
		return step{name, func(name string) (phase, error) { return c.pebblePhase(ctx, name, size, batch, writers, d) }}
	}
	brokerStep := func(name, kind string, sc loadtest.Scenario) step {
		sc.ClientKind = kind
		return step{name + c.clientSuffix(kind), func(name string) (phase, error) { return c.brokerPhase(ctx, name, sc) }}
	}
	noopStep := func(name, kind string, sc loadtest.Scenario) step {
		sc.ClientKind = kind
		return step{name + c.clientSuffix(kind), func(name string) (phase, error) { return c.httpPhase(ctx, name, "noop", noop.URL, sc) }}
	}
	rounds := max(c.rounds, 1)
	got := make([]map[string]phase, rounds)
	// Pulling a backlog: 1.5 times what the batch phase of the round sent
	// (with the same client) in its warm-up and measured run, so that
	// consumers up to 1.5 times faster than the batch send still have work
	// for the whole phase (faster ones drain it early, which ends the
	// measured run).
	pullStep := func(kind string) step {
		sfx := c.clientSuffix(kind)
		return step{"pull256-c4-1KiB" + sfx, func(name string) (phase, error) {
			rate := got[c.round]["batch100-p16-1KiB"+sfx].MsgsPerSec
			if rate == 0 { // the batch phase was left out (-phases)
				rate = 100_000
			}
			fill := int64(1.5*rate*(c.warmup+c.duration).Seconds()/100+1) * 100
			fill = min(max(fill, 10_000), 5_000_000)
			return c.pullPhase(ctx, name, kind, fill, 1024, loadtest.Consumers{Count: 4, MaxMessages: 256, WaitSeconds: 1})
		}}
	}
	// End to end at 1,000 msg/s open loop: single sends from 8 producers,
	// 4 consumers long-polling (5 s) and acking.
	e2e := sends(8, 1, 1024)
	e2e.Producers.Rate = 1000
	e2e.Consumers = loadtest.Consumers{Count: 4, MaxMessages: 32, WaitSeconds: 5}

	// Baselines without a client run once; the HTTP phases after them once
	// per client, each client's right after the baselines it is compared
	// with.
	var steps []step
	group := func(baselines []step, perClient func(kind string) []step) {
		steps = append(steps, baselines...)
		for _, k := range kinds {
			steps = append(steps, perClient(k)...)
		}
	}
	// Batch send, 1 KiB, against raw Pebble at batch 256 (and batch 32,
	// for the record); then pull 256 + ack, 4 consumers, against a
	// backlog: against the batch send just measured.
	group([]step{pebbleStep("pebble-b32-w16-1KiB", 1024, 32, 16, 0), pebbleStep("pebble-b256-w16-1KiB", 1024, 256, 16, 0)},
		func(k string) []step {
			return []step{brokerStep("batch100-p16-1KiB", k, sends(16, 100, 1024)),
				brokerStep(txPhase("batch100-p16-1KiB"), k, txSends(16, 100, 1024)), pullStep(k)}
		})
	// Batch send at 256 B and 16 KiB against raw Pebble batch 32.
	group([]step{pebbleStep("pebble-b32-w16-256B", 256, 32, 16, 0)},
		func(k string) []step { return []step{brokerStep("batch100-p16-256B", k, sends(16, 100, 256))} })
	group([]step{pebbleStep("pebble-b32-w16-16KiB", 16<<10, 32, 16, 0)},
		func(k string) []step { return []step{brokerStep("batch100-p16-16KiB", k, sends(16, 100, 16<<10))} })
	// The single-send curve: at each point raw Pebble single synced puts
	// from as many writers, the no-op handler at the same concurrency,
	// then the broker.
	for _, n := range curvePoints {
		d := c.curveDuration
		if suitePoint(n) {
			d = 0
		}
		sc := sends(n, 1, 1024)
		sc.Duration = d
		group([]step{pebbleStep(fmt.Sprintf("pebble-b1-w%d-1KiB", n), 1024, 1, n, d)}, func(k string) []step {
			steps := []step{noopStep(fmt.Sprintf("noop-c%d-1KiB", n), k, sc), brokerStep(fmt.Sprintf("single-p%d-1KiB", n), k, sc)}
			if n == txSingleProducers {
				// Half message + commit, right after the plain sends.
				tx := sc
				tx.Producers.Transactional = true
				steps = append(steps, brokerStep(txPhase(fmt.Sprintf("single-p%d-1KiB", n)), k, tx))
			}
			return steps
		})
	}
	// End-to-end latency, absolute bounds.
	group(nil, func(k string) []step { return []step{brokerStep("e2e-r1000-p8-c4-1KiB", k, e2e)} })
	// Large bodies, and the cost-growth phases (with -phases only).
	for _, s := range c.bodySteps(ctx) {
		steps = append(steps, step(s))
	}
	if c.only != nil {
		for _, s := range c.costSteps(ctx) {
			steps = append(steps, step(s))
		}
	}
	// The producer flood, against a broker process of its own.
	steps = append(steps, step{floodPhaseName, func(name string) (phase, error) { return c.floodPhase(ctx, name) }})

	for r := range rounds {
		c.round = r
		got[r] = map[string]phase{}
		for _, s := range steps {
			if (c.only == nil && optInPhase(s.name)) || (c.only != nil && !c.only.MatchString(s.name)) {
				continue
			}
			p, err := s.run(s.name)
			if err != nil {
				return nil, err
			}
			got[r][s.name] = p
		}
		if err := c.closeCostEnv(); err != nil {
			return nil, err
		}
	}

	// Each target's ratio per round; their median decides.
	var targets []target
	add := func(name, want string, needs []string, pass func(ratio float64) bool, one func(g map[string]phase) (ratio float64, measured, baseline string, errs bool)) {
		for _, n := range needs {
			if _, ran := got[0][n]; !ran {
				return
			}
		}
		targets = append(targets, medianTarget(name, want, got, pass, one))
	}
	for _, kind := range kinds {
		sfx := c.clientSuffix(kind)
		label := "" // the first client's targets keep their names
		if sfx != "" {
			label = ", " + kind + " client"
		}
		throughput := func(name, measured, baseline string) {
			add(name+label, "≥ 50%", []string{measured, baseline}, func(r float64) bool { return r >= 0.5 }, func(g map[string]phase) (float64, string, string, bool) {
				m, b := g[measured], g[baseline]
				return m.MsgsPerSec / b.MsgsPerSec, fmt.Sprintf("%s msg/s", thousands(m.MsgsPerSec)),
					fmt.Sprintf("%s msg/s (%s)", thousands(b.MsgsPerSec), b.Name), len(m.Errors) > 0
			})
		}
		throughput("batch send, 100 msgs/request, 16 producers, 1 KiB", "batch100-p16-1KiB"+sfx, "pebble-b256-w16-1KiB")
		throughput("batch send, 100 msgs/request, 16 producers, 256 B", "batch100-p16-256B"+sfx, "pebble-b32-w16-256B")
		throughput("batch send, 100 msgs/request, 16 producers, 16 KiB", "batch100-p16-16KiB"+sfx, "pebble-b32-w16-16KiB")
		throughput("single send, 64 producers, 1 KiB", "single-p64-1KiB"+sfx, "noop-c64-1KiB"+sfx)
		n1, pb1w1, s1 := "noop-c1-1KiB"+sfx, "pebble-b1-w1-1KiB", "single-p1-1KiB"+sfx
		add("single send, 1 producer, 1 KiB: p50"+label, "≤ bound", []string{n1, pb1w1, s1}, func(r float64) bool { return r <= 1 }, func(g map[string]phase) (float64, string, string, bool) {
			n1, pb1w1, s1 := g[n1], g[pb1w1], g[s1]
			bound := n1.Latency.P50 + pb1w1.Latency.P50 + 150*time.Microsecond
			return float64(s1.Latency.P50) / float64(bound), fmt.Sprintf("p50 %s", micros(s1.Latency.P50)),
				fmt.Sprintf("no-op p50 %s + Pebble b1 w1 commit p50 %s + 150µs = %s", micros(n1.Latency.P50), micros(pb1w1.Latency.P50), micros(bound)),
				len(s1.Errors) > 0
		})
		pull, batch := "pull256-c4-1KiB"+sfx, "batch100-p16-1KiB"+sfx
		add("pull 256 + ack, 4 consumers, against a backlog, 1 KiB"+label, "≥ 80%", []string{pull, batch}, func(r float64) bool { return r >= 0.8 }, func(g map[string]phase) (float64, string, string, bool) {
			m, b := g[pull], g[batch]
			return m.MsgsPerSec / b.MsgsPerSec, fmt.Sprintf("%s msg/s acked", thousands(m.MsgsPerSec)),
				fmt.Sprintf("%s msg/s (%s)", thousands(b.MsgsPerSec), b.Name), len(m.Errors) > 0
		})
		// End to end against one synced put and two no-op round trips (the
		// send's and the delivery's), 20% over; and a tail within 4 times
		// the median. The ratio is the larger of p50/bound and p99/(4·p50),
		// so ≤ 100% passes.
		e2eName := "e2e-r1000-p8-c4-1KiB" + sfx
		add("end to end (send → long-poll delivery), 1,000 msg/s open loop, 1 KiB: p50, p99"+label, "p50 ≤ 1.2 × (put p50 + 2 × no-op p50), p99 ≤ 4 × p50", []string{e2eName, n1, pb1w1}, func(r float64) bool { return r <= 1 }, func(g map[string]phase) (float64, string, string, bool) {
			p, n1, pb1w1 := g[e2eName], g[n1], g[pb1w1]
			var rep loadtest.Report
			if p.Report != nil {
				rep = *p.Report
			}
			l := rep.EndToEnd
			bound := 1.2 * float64(pb1w1.Latency.P50+2*n1.Latency.P50)
			ratio := max(float64(l.P50)/bound, float64(l.P99)/(4*float64(max(l.P50, 1))))
			bad := len(p.Errors) > 0 || rep.Pull.ErrorCount()+rep.Ack.ErrorCount() > 0 || rep.Missed > 0 || rep.Delivered < rep.Sent || rep.Sent == 0
			measured := fmt.Sprintf("p50 %s, p99 %s (p99.9 %s; %d delivered of %d sent, %d missed)", dur(l.P50), dur(l.P99), dur(l.P999), rep.Delivered, rep.Sent, rep.Missed)
			return ratio, measured, fmt.Sprintf("p50 bound 1.2 × (Pebble b1 w1 p50 %s + 2 × no-op p50 %s) = %s; p99 bound 4 × p50 = %s",
				micros(pb1w1.Latency.P50), micros(n1.Latency.P50), micros(time.Duration(bound)), micros(4*l.P50)), bad
		})
		curveTargets(add, func(name string) bool { _, ok := got[0][name]; return ok }, sfx, label)
		txTargets(add, sfx, label)
	}
	floodTargets(add)
	c.costTargets(add)
	return targets, nil
}

// addFunc adds a target (runTargets' add).
type addFunc func(name, want string, needs []string, pass func(ratio float64) bool, one func(g map[string]phase) (ratio float64, measured, baseline string, errs bool))

// curveTargets adds the single-send curve's targets for the client whose
// phases end with sfx: from 4 producers on, every point at least half the
// lower of its two baselines; no point below 90% of the best at a lower
// concurrency (of the points that ran); from 2 producers on, every
// point's p50 within the no-op's p50 plus one synced put's p50 (as many
// writers) plus 300 µs.
func curveTargets(add addFunc, ran func(phase string) bool, sfx, label string) {
	single := func(n int) string { return fmt.Sprintf("single-p%d-1KiB", n) + sfx }
	for i, n := range curvePoints {
		s, no, pb := single(n), fmt.Sprintf("noop-c%d-1KiB", n)+sfx, fmt.Sprintf("pebble-b1-w%d-1KiB", n)
		if n >= 4 {
			add(fmt.Sprintf("curve: single send, %d producers, 1 KiB%s", n, label), "≥ 50% of the lower baseline", []string{s, no, pb},
				func(r float64) bool { return r >= 0.5 }, func(g map[string]phase) (float64, string, string, bool) {
					m, b := g[s], g[no]
					if p := g[pb]; p.MsgsPerSec < b.MsgsPerSec {
						b = p
					}
					return m.MsgsPerSec / b.MsgsPerSec, fmt.Sprintf("%s msg/s", thousands(m.MsgsPerSec)),
						fmt.Sprintf("%s msg/s (%s)", thousands(b.MsgsPerSec), b.Name), len(m.Errors) > 0
				})
		}
		// Against the best of the lower points that ran: the table shows
		// a dip wherever it is, for any selection of points.
		var lower []string
		for _, m := range curvePoints[:i] {
			if ran(single(m)) {
				lower = append(lower, single(m))
			}
		}
		if len(lower) > 0 {
			add(fmt.Sprintf("curve: single send, %d producers, 1 KiB, against the best lower point%s", n, label), "≥ 90%", append([]string{s}, lower...),
				func(r float64) bool { return r >= 0.9 }, func(g map[string]phase) (float64, string, string, bool) {
					m := g[s]
					var best phase
					for _, l := range lower {
						if p := g[l]; p.MsgsPerSec > best.MsgsPerSec {
							best = p
						}
					}
					return m.MsgsPerSec / best.MsgsPerSec, fmt.Sprintf("%s msg/s", thousands(m.MsgsPerSec)),
						fmt.Sprintf("%s msg/s (%s)", thousands(best.MsgsPerSec), best.Name), len(m.Errors) > 0
				})
		}
		if n == 1 {
			continue // the suite's own one-producer p50 target is tighter
		}
		add(fmt.Sprintf("curve: single send, %d producers, 1 KiB: p50%s", n, label), "≤ bound", []string{s, no, pb},
			func(r float64) bool { return r <= 1 }, func(g map[string]phase) (float64, string, string, bool) {
				m, nop, peb := g[s], g[no], g[pb]
				bound := nop.Latency.P50 + peb.Latency.P50 + 300*time.Microsecond
				return float64(m.Latency.P50) / float64(bound), fmt.Sprintf("p50 %s", micros(m.Latency.P50)),
					fmt.Sprintf("no-op p50 %s + Pebble b1 w%d commit p50 %s + 300µs = %s", micros(nop.Latency.P50), n, micros(peb.Latency.P50), micros(bound)),
					len(m.Errors) > 0
			})
	}
}

// dur keeps about three significant digits.
func dur(d time.Duration) string {
	switch {
	case d >= 100*time.Millisecond:
		d = d.Round(time.Millisecond)
	case d >= 10*time.Millisecond:
		d = d.Round(100 * time.Microsecond)
	case d >= time.Millisecond:
		d = d.Round(10 * time.Microsecond)
	case d >= 100*time.Microsecond:
		d = d.Round(time.Microsecond)
	default:
		d = d.Round(100 * time.Nanosecond)
	}
	return d.String()
}

func micros(d time.Duration) string {
	return fmt.Sprintf("%.0fµs", float64(d)/float64(time.Microsecond))
}

// thousands formats n with thin separators: 123,456.
func thousands(f float64) string {
	s := fmt.Sprintf("%.0f", f)
	var b strings.Builder
	for i, r := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// writeMarkdown renders the suite's result.
func (r suiteResult) writeMarkdown(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "## tidemq load test: targets\n\n`%s`\n\n", r.Command)
	m := r.Machine
	b.WriteString(m.header())
	fmt.Fprintf(&b, "- data: %s (broker and raw Pebble on the same disk), fsync always\n", m.DataDir)
	fmt.Fprintf(&b, "- started %s, took %s\n\n", m.Start.Format(time.RFC3339), m.Took.Round(time.Second))
	b.WriteString("| target | measured | baseline | ratio | want | result | ratio per round |\n|---|---:|---|---:|---|---|---|\n")
	for _, t := range r.Targets {
		var rounds []string
		for _, x := range t.Rounds {
			rounds = append(rounds, fmt.Sprintf("%.0f%%", x*100))
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %.0f%% | %s | **%s** | %s |\n", t.Name, t.Measured, t.Baseline, t.Ratio*100, t.Want, t.result(), strings.Join(rounds, ", "))
	}
	if len(r.Targets) > 0 && len(r.Targets[0].Rounds) > 1 {
		b.WriteString("\nWith several rounds, the ratio is the median of the rounds' (with an even number, the mean of the middle two), measured and baseline are the median round's (the lower middle one), and every round's phases are below.\n")
	}
	b.WriteString("\n### Phases\n\n| phase | round | what | msg/s | p50 | p99 | p99.9 | max | CPU/msg | cores used | Ps idle | spans dropped | errors |\n|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
	for _, p := range r.Phases {
		l := p.Latency
		errs := "0"
		if len(p.Errors) > 0 {
			errs = fmt.Sprint(p.Errors)
		}
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %s | %s | %s | %s | %s | %.2f | %.2f | %s | %s |\n", p.Name, p.Round, p.Description, thousands(p.MsgsPerSec),
			dur(l.P50), dur(l.P99), dur(l.P999), dur(l.Max), dur(p.CPUPerMsg), p.Cores, p.IdlePs, thousands(float64(p.SpansDropped)), errs)
	}
	b.WriteString("\nLatency is per send request for HTTP phases (per batch for batch sends), per pull that returned messages for the pull phase (whose msg/s is messages acked), and per synced commit for Pebble phases. " +
		"CPU/msg is this process's CPU time (user+system: load generator and in-process server together, or Pebble) per message while measuring; " +
		"cores used is that CPU time over wall time, out of the machine's CPUs. " +
		"Ps idle is the time the Go scheduler's Ps sat parked with nothing to run, over wall time: CPU this process left unused for want of work. " +
		"The two need not add up to the CPUs: the process is not charged for loopback's receive path (softirq) or its io_uring workers, and other processes take their share. " +
		"Spans dropped are the in-process broker's, while measuring, because its export queue (OTEL_BSP_MAX_QUEUE_SIZE) was full: spans made and encoded but not exported.\n")
	writeCPUSplit(&b, r.Phases)
	for _, p := range r.Phases {
		if p.Report != nil && p.Report.Scenario.Consumers.Count > 0 {
			fmt.Fprintf(&b, "\n### Phase %s, round %d (with consumers)\n\n", p.Name, p.Round)
			_ = p.Report.WriteMarkdown(&b)
		}
		if p.Flood != nil {
			p.Flood.writeMarkdown(&b, p.Name, p.Round)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// medianOf is the median of xs: the middle value, or with an even count
// the mean of the two middle ones. (Taking the upper middle of two rounds
// passed a throughput target that held in one round of two and failed a
// latency target likewise.)
func medianOf(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// medianTarget judges a target on every round: one gives a round's ratio,
// what was measured against what, and whether the round went wrong (errors,
// a loss); the median ratio must pass and no round may have gone wrong.
func medianTarget(name, want string, got []map[string]phase, pass func(ratio float64) bool,
	one func(g map[string]phase) (ratio float64, measured, baseline string, bad bool)) target {
	t := target{Name: name, Want: want}
	type result struct {
		ratio              float64
		measured, baseline string
		bad                bool
	}
	var rs []result
	for _, g := range got {
		var x result
		x.ratio, x.measured, x.baseline, x.bad = one(g)
		rs = append(rs, x)
		t.Rounds = append(t.Rounds, x.ratio)
	}
	slices.SortFunc(rs, func(a, b result) int { return cmp.Compare(a.ratio, b.ratio) })
	med := rs[(len(rs)-1)/2]
	t.Ratio, t.Measured, t.Baseline = medianOf(t.Rounds), med.measured, med.baseline
	t.Pass = pass(t.Ratio) && !slices.ContainsFunc(rs, func(x result) bool { return x.bad })
	return t
}
