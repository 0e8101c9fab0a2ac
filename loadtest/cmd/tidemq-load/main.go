// Command tidemq-load drives a tidemq broker over HTTP and reports
// throughput, latency percentiles and errors by problem code (package
// loadtest does the work; this is flags and wiring).
//
// One scenario against a running broker, or an in-process one (a fresh
// temp data dir, fsync on):
//
//	go run ./loadtest/cmd/tidemq-load -url http://127.0.0.1:8080 -producers 16 -batch 100 -duration 10s
//	go run ./loadtest/cmd/tidemq-load -inprocess -producers 64 -consumers 8 -format json
//
// The target suite: raw Pebble synced appends and a no-op chi handler
// measured in the same run, each ratio printed next to its target:
//
//	go run ./loadtest/cmd/tidemq-load -suite targets -inprocess -cpuprofile cpu.pprof
//	go tool pprof -top -cum -tagfocus side=server cpu.pprof
//
// Client and in-process broker share the process: the CPU profile labels
// every goroutine side=server or side=client. Where CPU sits idle instead,
// an execution trace of the phase shows why (goroutines runnable while a
// P sleeps, a commit's wait):
//
//	go run ./loadtest/cmd/tidemq-load -suite targets -inprocess -phases single-p64 -trace c64.trace
//	go tool trace c64.trace
//
// The single-send curve's plot (rate and p50 against producers, with the
// no-op and raw Pebble ceilings), from the run or from saved JSON reports
// (several on the same axes):
//
//	go run ./loadtest/cmd/tidemq-load -suite targets -inprocess -client lean,plain -phases 'single-p|noop-c|pebble-b1-w' -curve-plot curve.png -json curve.json
//	go run ./loadtest/cmd/tidemq-load -plot-curve before.json,after.json -o curve.png
//
// The producer flood, a phase the suite runs only when -phases names it:
// 48 connections posting 15 MB batches for -flood-duration at the broker
// built from ./cmd/tidemq, run as a separate process (its peak RSS):
//
//	go run ./loadtest/cmd/tidemq-load -suite targets -inprocess -phases '^flood-c48-15MB$'
//
// The cost-growth phases (suite_cost.go) run with -phases only: the
// hot-topic phases on brokers holding 10,000 topics or 10,000 parked long
// polls (child processes, for their RSS and a real restart) beside a
// fresh one, and send with 1,000 subscriptions beside one:
//
//	go run ./loadtest/cmd/tidemq-load -suite targets -inprocess -phases '^cost-'
//
// The cluster suite: batch send, single send, pull + ack and end-to-end
// latency on a fresh 3-node cluster of broker processes (node i on
// 127.0.0.i, clients round-robin over the nodes) beside a single broker
// process, each node's CPU and the load generator's apart:
//
//	go run ./loadtest/cmd/tidemq-load -suite cluster -rounds 3 -duration 15s -json cluster.json -o cluster.md
//
// The mirror suite: two broker processes, region hz under the batch-send
// load and region sg mirroring its topic; the mirror's copy rate and the
// delay from a message's storedAt at hz to its copy's at sg:
//
//	go run ./loadtest/cmd/tidemq-load -suite mirror -duration 15s -json mirror.json
//
// The backlog suite: the broker built from ./cmd/tidemq and run as a
// separate process; send and pull rates on the empty broker and at a
// backlog of -messages unconsumed messages, peak RSS, restart times after
// SIGTERM and SIGKILL, and a plot of the run:
//
//	go run ./loadtest/cmd/tidemq-load -suite backlog -messages 10000000 -plot backlog.png -json backlog.json
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/tidemq/tidemq/internal/gctune"
	"github.com/tidemq/tidemq/loadtest"
)

type config struct {
	url, token, dir, suite, format, cpuProfile, execTrace, profilePhase, logLevel, phases string
	jsonFile, brokerBin, plotFile, seriesFile, client                                     string
	curvePlot, plotCurve, plotOut                                                         string
	clients                                                                               []string
	inprocess, quiet, noAck, tracing, gzip, brokerProcess                                 bool
	warmup, fillTimeout, curveDuration, floodDuration                                     time.Duration
	rounds                                                                                int
	cost                                                                                  costOptions
	sc                                                                                    loadtest.Scenario
}

func parseFlags(args []string) (config, error) {
	var c config
	fs := flag.NewFlagSet("tidemq-load", flag.ContinueOnError)
	fs.StringVar(&c.url, "url", "", "base URL of a running broker (e.g. http://127.0.0.1:8080); for one scenario, several comma-separated (a cluster's nodes) spread the producers and consumers over them round-robin")
	fs.BoolVar(&c.inprocess, "inprocess", false, "start a broker in this process (fresh temp data dir, fsync on) instead of -url")
	fs.BoolVar(&c.brokerProcess, "broker-process", false, "with -suite targets, instead of -inprocess: run each broker phase's broker as a child process (-broker-bin, or built from ./cmd/tidemq), and report its CPU and this process's apart")
	fs.StringVar(&c.token, "token", os.Getenv("TIDEMQ_TOKEN"), "bearer token (TIDEMQ_TOKEN)")
	fs.StringVar(&c.dir, "dir", "", "base directory for temp data dirs (default: the system's temp dir)")
	fs.StringVar(&c.suite, "suite", "", "run a suite instead of one scenario: targets, backlog, cluster (a 3-node cluster beside the single node, broker processes of its own) or mirror (two regions, broker processes of their own, a mirror from one to the other)")
	fs.StringVar(&c.format, "format", "markdown", "output on stdout: markdown or json")
	fs.StringVar(&c.jsonFile, "json", "", "also write the JSON report to this file")
	fs.StringVar(&c.brokerBin, "broker-bin", "", "with -suite backlog, cluster or mirror, -broker-process, or the flood and cost-growth phases of -suite targets: the tidemq binary to run (default: go build ./cmd/tidemq into the work dir)")
	fs.DurationVar(&c.floodDuration, "flood-duration", 20*time.Second, "with -suite targets: how long the flood phase ("+floodPhaseName+", run only when -phases names it) sends")
	fs.StringVar(&c.curvePlot, "curve-plot", "", "with -suite targets: write a PNG plot of the single-send curve (rate and p50 against producers, with the no-op and raw Pebble ceilings) to this file")
	fs.StringVar(&c.plotCurve, "plot-curve", "", "instead of a run: plot the single-send curve of these saved -suite targets JSON reports (comma-separated; several are drawn on the same axes, each named by its file) into -o")
	fs.StringVar(&c.plotOut, "o", "", "with -plot-curve: the PNG file to write; with -suite cluster: also write the markdown report to this file")
	fs.IntVar(&c.cost.topics, "cost-topics", 10_000, "with -suite targets: the extra topics (8 queues each) of the cost-topics phases (run with -phases only)")
	fs.IntVar(&c.cost.subs, "cost-subs", 1000, "with -suite targets: the subscriptions on one topic of the cost-subs phases (run with -phases only)")
	fs.IntVar(&c.cost.polls, "cost-polls", 10_000, "with -suite targets: the parked long polls of the cost-polls phases (run with -phases only)")
	fs.StringVar(&c.plotFile, "plot", "", "with -suite backlog: write a PNG plot of throughput, p99 and RSS over the run to this file")
	fs.StringVar(&c.seriesFile, "series", "", "with -suite backlog: write the per-second time series as CSV to this file (default: -plot's name with .csv)")
	fs.DurationVar(&c.fillTimeout, "fill-timeout", 0, "with -suite backlog: give up filling after this long (default: 1 min + 1 ms per message)")
	fs.StringVar(&c.cpuProfile, "cpuprofile", "", "write a CPU profile of the measured run (with -suite, of -profile-phase) to this file")
	fs.StringVar(&c.execTrace, "trace", "", "with -suite: write a runtime execution trace (go tool trace) of -profile-phase to this file")
	fs.StringVar(&c.profilePhase, "profile-phase", "single-p64-1KiB", "suite phases to CPU-profile and trace, comma-separated (with several, -cpuprofile X.pprof becomes X-<phase>.pprof, -trace X.trace X-<phase>.trace)")
	fs.StringVar(&c.phases, "phases", "", "with -suite targets: run only the phases whose names match this regular expression (targets lacking a phase are left out; a pull phase without the batch phase fills as for 100,000 msg/s)")
	fs.StringVar(&c.logLevel, "log-level", "error", "in-process broker log level")
	fs.BoolVar(&c.quiet, "quiet", false, "no progress lines on stderr")
	fs.BoolVar(&c.gzip, "gzip", false, "ask the broker for gzip replies (off by default, like the SDK's client)")
	fs.BoolVar(&c.tracing, "tracing", true, "brokers this command starts export every message's spans over OTLP to a stand-in collector (the targets are measured with tracing on)")
	fs.IntVar(&c.rounds, "rounds", 1, "with -suite targets or cluster: run the target phases this many times; each target's median ratio decides")
	fs.DurationVar(&c.warmup, "warmup", time.Second, "warm-up before each measured run (not counted); with -suite cluster 10s unless given")
	fs.StringVar(&c.client, "client", loadtest.ClientLean, "how requests are written and replies read: lean (hand-written JSON, fastjson) or plain (encoding/json, base64 bodies); with -suite targets a comma-separated list runs each HTTP phase once per client, the phases of all but the first named <phase>@<client>")
	fs.DurationVar(&c.curveDuration, "curve-duration", 0, "with -suite targets: each measured run of the single-send curve's points other than 1 and 64 producers (default: 2s, or -duration if shorter)")

	sc := &c.sc
	fs.StringVar(&sc.Topic, "topic", "", "topic (default: a fresh loadtest-<id>, deleted at the end)")
	fs.IntVar(&sc.Queues, "queues", 0, "queues of the topic, when created (0: broker default)")
	fs.StringVar(&sc.Group, "group", "", "consumer group (default loadtest)")
	fs.IntVar(&sc.Producers.Count, "producers", 16, "concurrent producers")
	fs.IntVar(&sc.Producers.Batch, "batch", 1, "messages per send request (1: single send; more: batch send)")
	fs.IntVar(&sc.Producers.MessageBytes, "size", 1024, "message body bytes")
	fs.Float64Var(&sc.Producers.Rate, "rate", 0, "open loop: messages per second in all (0: closed loop); with -suite mirror the source's sends")
	fs.BoolVar(&sc.Producers.Transactional, "transactional", false, "send every request's messages as the half messages of one transaction, then commit it (one scenario; the suite's tx- phases do it themselves)")
	fs.IntVar(&sc.Consumers.Count, "consumers", 0, "concurrent consumers")
	fs.IntVar(&sc.Consumers.MaxMessages, "pull", 32, "messages per pull")
	fs.IntVar(&sc.Consumers.WaitSeconds, "wait", 1, "long-poll seconds of each pull")
	fs.BoolVar(&c.noAck, "noack", false, "consumers do not ack")
	fs.DurationVar(&sc.Duration, "duration", 10*time.Second, "how long to send (with -suite: each phase, default 5s)")
	fs.Int64Var(&sc.Messages, "messages", 0, "how many messages to send (0: for -duration); with -suite backlog the backlog (default 10,000,000); with -suite mirror the source's measured sends (0: for -duration)")
	fs.DurationVar(&sc.DrainTimeout, "drain", 10*time.Second, "how long consumers may drain after producers stop")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if c.suite != "" && !set["duration"] {
		sc.Duration = 5 * time.Second
	}
	if c.suite == "cluster" && !set["warmup"] {
		c.warmup = clusterWarmup
	}
	if c.suite == "backlog" && !set["messages"] {
		sc.Messages = 10_000_000
	}
	if !set["curve-duration"] {
		c.curveDuration = min(2*time.Second, sc.Duration)
	}
	sc.Consumers.NoAck = c.noAck
	sc.Token = c.token
	if sc.Consumers.WaitSeconds == 0 {
		sc.Consumers.WaitSeconds = -1 // the flag's 0 means "answer at once"
	}
	if c.plotCurve != "" {
		if c.plotOut == "" || c.suite != "" || c.url != "" || c.inprocess {
			return c, errors.New("-plot-curve takes -o and no -suite, -url or -inprocess")
		}
		return c, nil
	}
	if c.plotOut != "" && c.suite != "cluster" {
		return c, errors.New("-o goes with -plot-curve or -suite cluster")
	}
	var errs []error
	for k := range strings.SplitSeq(c.client, ",") {
		switch {
		case k != loadtest.ClientLean && k != loadtest.ClientPlain:
			errs = append(errs, fmt.Errorf("-client %q: %s or %s", k, loadtest.ClientLean, loadtest.ClientPlain))
		case slices.Contains(c.clients, k):
			errs = append(errs, fmt.Errorf("-client: %s twice", k))
		default:
			c.clients = append(c.clients, k)
		}
	}
	if len(c.clients) > 0 {
		sc.ClientKind = c.clients[0]
	}
	if len(c.clients) > 1 && c.suite != "targets" {
		errs = append(errs, errors.New("-client with several clients goes with -suite targets"))
	}
	if c.suite == "backlog" && c.client != loadtest.ClientLean {
		errs = append(errs, errors.New("-suite backlog runs the lean client only"))
	}
	if c.curveDuration <= 0 && c.suite == "targets" {
		errs = append(errs, errors.New("-curve-duration must be above 0"))
	}
	switch {
	case c.suite == "backlog":
		if c.inprocess || c.url != "" {
			errs = append(errs, errors.New("-suite backlog starts its own broker process: no -url or -inprocess"))
		}
		if sc.Producers.MessageBytes < 1 {
			errs = append(errs, fmt.Errorf("-size %d: at least 1", sc.Producers.MessageBytes))
		}
		if sc.Messages < 1000 {
			errs = append(errs, fmt.Errorf("-messages %d: the backlog needs at least 1000", sc.Messages))
		}
		if sc.Duration <= 0 || c.warmup < 0 {
			errs = append(errs, errors.New("-duration must be above 0 and -warmup not negative"))
		}
	case c.suite == "cluster" || c.suite == "mirror":
		if c.inprocess || c.url != "" || c.brokerProcess {
			errs = append(errs, fmt.Errorf("-suite %s starts its own broker processes: no -url, -inprocess or -broker-process", c.suite))
		}
		if c.phases != "" {
			errs = append(errs, fmt.Errorf("-phases goes with -suite targets: the %s suite runs all its phases", c.suite))
		}
		if sc.Duration <= 0 || c.warmup < 0 {
			errs = append(errs, errors.New("-duration must be above 0 and -warmup not negative"))
		}
	case c.brokerProcess:
		if c.suite != "targets" || c.inprocess || c.url != "" {
			errs = append(errs, errors.New("-broker-process goes with -suite targets, without -url or -inprocess"))
		}
	case c.inprocess == (c.url != ""):
		errs = append(errs, errors.New("give exactly one of -url and -inprocess"))
	}
	if c.suite != "" && strings.Contains(c.url, ",") {
		errs = append(errs, errors.New("-suite takes one -url: several, comma-separated, go with one scenario"))
	}
	if c.suite != "" && c.suite != "targets" && c.suite != "backlog" && c.suite != "cluster" && c.suite != "mirror" {
		errs = append(errs, fmt.Errorf("-suite %q: targets, backlog, cluster or mirror", c.suite))
	}
	if c.suite != "backlog" && (c.plotFile != "" || c.seriesFile != "" || c.fillTimeout != 0) {
		errs = append(errs, errors.New("-plot, -series and -fill-timeout go with -suite backlog"))
	}
	if c.cost.topics < 1 || c.cost.subs < 1 || c.cost.polls < 1 {
		errs = append(errs, errors.New("-cost-topics, -cost-subs and -cost-polls must be at least 1"))
	}
	if c.suite == "" && c.brokerBin != "" {
		errs = append(errs, errors.New("-broker-bin goes with -suite backlog, targets, cluster or mirror"))
	}
	if c.suite != "targets" && (c.curvePlot != "" || set["flood-duration"]) {
		errs = append(errs, errors.New("-curve-plot and -flood-duration go with -suite targets"))
	}
	if c.floodDuration <= 0 {
		errs = append(errs, errors.New("-flood-duration must be above 0"))
	}
	if c.format != "markdown" && c.format != "json" {
		errs = append(errs, fmt.Errorf("-format %q: markdown or json", c.format))
	}
	if c.suite == "" {
		v := *sc
		v.URL = "http://placeholder"
		if err := v.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	return c, errors.Join(errs...)
}

func main() {
	if child, err := pollHolderChild(); child {
		if err != nil {
			fmt.Fprintln(os.Stderr, "tidemq-load poll holder:", err)
			os.Exit(1)
		}
		return
	}
	c, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "tidemq-load:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, c, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "tidemq-load:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, c config, stdout, stderr io.Writer) error {
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.logLevel)); err != nil {
		return fmt.Errorf("-log-level: %w", err)
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	var progress io.Writer = stderr
	if c.quiet {
		progress = nil
	}
	if c.inprocess || c.suite == "targets" {
		gctune.Apply(os.Getenv)
	}
	if c.tracing && (c.inprocess || c.brokerProcess || c.suite == "backlog" || c.suite == "cluster" || c.suite == "mirror") {
		sink, err := startOTLPSink()
		if err != nil {
			return err
		}
		tracesEndpoint = sink.URL
		defer func() {
			tracesEndpoint = ""
			_ = sink.Close()
			fmt.Fprintln(stderr, sink)
		}()
	}
	if c.plotCurve != "" {
		return plotCurveFiles(strings.Split(c.plotCurve, ","), c.plotOut)
	}
	switch c.suite {
	case "targets":
		return runSuite(ctx, c, log, progress, stdout)
	case "backlog":
		return runBacklog(ctx, c, log, progress, stdout)
	case "cluster":
		return runClusterSuite(ctx, c, log, progress, stdout)
	case "mirror":
		return runMirrorSuite(ctx, c, log, progress, stdout)
	}
	return runScenario(ctx, c, log, progress, stdout)
}

// runBacklog runs -suite backlog and writes its report, plot and series,
// also (as far as they go) when the suite failed.
func runBacklog(ctx context.Context, c config, log *slog.Logger, progress, stdout io.Writer) error {
	b := &backlogSuite{dir: c.dir, brokerBin: c.brokerBin, messages: c.sc.Messages, size: c.sc.Producers.MessageBytes,
		warmup: c.warmup, duration: c.sc.Duration, fillTimeout: c.fillTimeout, progress: progress, log: log, gzip: c.gzip}
	res := backlogResult{Command: strings.Join(append([]string{"tidemq-load"}, os.Args[1:]...), " ")}
	res.Machine = describeMachine(c.dir)
	err := b.run(ctx, &res)
	res.Machine.LoadAfter = loadAverage()
	res.Machine.Took = time.Since(res.Machine.Start)
	b.mu.Lock()
	res.Series = slices.Clone(b.series)
	b.mu.Unlock()
	series := c.seriesFile
	if series == "" && c.plotFile != "" {
		series = strings.TrimSuffix(c.plotFile, filepath.Ext(c.plotFile)) + ".csv"
	}
	if series != "" && len(res.Series) > 0 {
		if werr := writeSeriesCSV(series, res.Series); werr != nil {
			err = errors.Join(err, fmt.Errorf("-series: %w", werr))
		} else {
			res.SeriesFile = series
		}
	}
	if c.plotFile != "" && len(res.Series) > 0 {
		if werr := writePlot(c.plotFile, res); werr != nil {
			err = errors.Join(err, fmt.Errorf("-plot: %w", werr))
		} else {
			res.Plot = c.plotFile
		}
	}
	return errors.Join(err, writeReports(stdout, c, res, res.writeMarkdown))
}

// writeReports writes the report on stdout in -format, and as JSON to
// -json when given.
func writeReports(stdout io.Writer, c config, v any, markdown func(io.Writer) error) error {
	err := writeOutput(stdout, c.format, v, markdown)
	if c.jsonFile != "" {
		f, ferr := os.Create(c.jsonFile)
		if ferr != nil {
			return errors.Join(err, ferr)
		}
		err = errors.Join(err, writeOutput(f, "json", v, nil), f.Close())
	}
	return err
}

// runScenario runs the one scenario of the flags: a warm-up, then the
// measured run, whose report goes to stdout.
func runScenario(ctx context.Context, c config, log *slog.Logger, progress, stdout io.Writer) (err error) {
	url := c.url
	if c.inprocess {
		b, err := startBroker(c.dir, log)
		if err != nil {
			return err
		}
		defer func() { err = errors.Join(err, b.Close()) }()
		url = b.URL
	}
	sc := c.sc
	sc.URL = url
	if urls := strings.Split(url, ","); len(urls) > 1 {
		sc.URL, sc.URLs = urls[0], urls
	}
	sc.Client = loadtest.NewClient(sc.Producers.Count+2*sc.Consumers.Count+4, c.gzip)
	if c.warmup > 0 {
		w := sc
		w.Duration, w.Messages = c.warmup, 0
		if _, err := runLabeled(ctx, w); err != nil {
			return fmt.Errorf("warm-up: %w", err)
		}
	}
	sc.Progress = progress
	if c.cpuProfile != "" {
		f, err := os.Create(c.cpuProfile)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer func() {
			pprof.StopCPUProfile()
			err = errors.Join(err, f.Close())
		}()
	}
	rep, err := runLabeled(ctx, sc)
	if rep.RunID != "" {
		if werr := writeReports(stdout, c, rep, rep.WriteMarkdown); werr != nil {
			err = errors.Join(err, werr)
		}
	}
	return err
}

// runSuite runs -suite targets and writes its table.
func runSuite(ctx context.Context, c config, log *slog.Logger, progress, stdout io.Writer) error {
	var only *regexp.Regexp
	if c.phases != "" {
		var err error
		if only, err = regexp.Compile(c.phases); err != nil {
			return fmt.Errorf("-phases: %w", err)
		}
	}
	s := &suite{only: only, url: c.url, token: c.token, dir: c.dir, log: log, warmup: c.warmup, duration: c.sc.Duration,
		progress: progress, cpuProfile: c.cpuProfile, execTrace: c.execTrace, profilePhases: strings.Split(c.profilePhase, ","), rounds: c.rounds, gzip: c.gzip,
		clients: c.clients, curveDuration: c.curveDuration, cost: c.cost, brokerBin: c.brokerBin, floodDuration: c.floodDuration}
	if c.brokerProcess {
		bin, work, err := childBrokers(ctx, c.dir, c.brokerBin)
		if work != "" {
			defer os.RemoveAll(work)
		}
		if err != nil {
			return err
		}
		s.childBin, s.brokerBin, s.brokerWork = bin, bin, work
	}
	res := suiteResult{Command: strings.Join(append([]string{"tidemq-load"}, os.Args[1:]...), " ")}
	res.Machine = describeMachine(c.dir)
	targets, err := s.runTargets(ctx)
	err = errors.Join(err, s.closeCost())
	res.Machine.LoadAfter = loadAverage()
	res.Machine.Took = time.Since(res.Machine.Start)
	res.Phases, res.Targets = s.phases, targets
	if c.curvePlot != "" {
		if perr := writeCurvePlot(c.curvePlot, []curveRun{{res: res}}); perr != nil {
			err = errors.Join(err, fmt.Errorf("-curve-plot: %w", perr))
		}
	}
	if werr := writeReports(stdout, c, res, res.writeMarkdown); werr != nil {
		err = errors.Join(err, werr)
	}
	return err
}

func writeOutput(w io.Writer, format string, v any, markdown func(io.Writer) error) error {
	if format == "json" {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	return markdown(w)
}

// machine describes where the numbers come from.
type machine struct {
	CPU        string `json:"cpu"`
	NumCPU     int    `json:"numCPU"`
	GOMAXPROCS int    `json:"gomaxprocs"`
	GoVersion  string `json:"goVersion"`
	DataDir    string `json:"dataDir"`
	LoadBefore string `json:"loadAverageBefore"`
	LoadAfter  string `json:"loadAverageAfter"`
	// PageFault is a first touch of fresh memory's cost a page, measured
	// before the run (0: not measured).
	PageFault time.Duration `json:"pageFaultNs,omitempty"`
	Start     time.Time     `json:"start"`
	Took      time.Duration `json:"tookNs"`
}

func describeMachine(dir string) machine {
	if dir == "" {
		dir = os.TempDir()
	}
	return machine{CPU: cpuModel(), NumCPU: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0),
		GoVersion: runtime.Version(), DataDir: dir, LoadBefore: loadAverage(), PageFault: pageFaultCost(), Start: time.Now()}
}

// header is the markdown lines that say which machine ran a suite and
// how busy it was.
func (m machine) header() string {
	fault := "not measured"
	if m.PageFault > 0 {
		fault = m.PageFault.Round(100*time.Nanosecond).String() + " (first touch of fresh memory; fresh brokers pay it for all they grow into)"
	}
	return fmt.Sprintf("- machine: %s, %d CPUs (GOMAXPROCS %d), %s, %s/%s; a page fault %s\n- load average before: %s; after: %s\n",
		m.CPU, m.NumCPU, m.GOMAXPROCS, m.GoVersion, runtime.GOOS, runtime.GOARCH, fault, m.LoadBefore, m.LoadAfter)
}

// loadAverage is the 1, 5 and 15 minute load averages ("" off Linux).
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return runtime.GOARCH
}
