package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"github.com/tidemq/tidemq/loadtest"
)

// The target suite (issue 10): every throughput target is a ratio of the
// broker to a baseline measured in the same run, on the same machine and
// disk, with the same client; each baseline runs right before the broker
// phase it is compared with, so that a change of load on a shared machine
// hits both sides alike.

// suite runs phases and keeps their results.
type suite struct {
	url           string // a running broker; "" starts a fresh in-process one per phase
	dir           string // base of temp dirs ("" is the system's)
	log           *slog.Logger
	warmup        time.Duration
	duration      time.Duration
	progress      io.Writer // nil: quiet
	cpuProfile    string    // file for the CPU profile of profilePhases
	profilePhases []string  // with more than one, each goes to cpuProfile-<phase>.pprof
	rounds        int       // times the target phases run; the median ratio decides
	round         int       // the round running (0-based); only round 0 is profiled
	phases        []phase
}

// phase is one measurement.
type phase struct {
	Name        string  `json:"name"`
	Round       int     `json:"round"` // 1-based
	Kind        string  `json:"kind"`  // broker, noop or pebble
	Description string  `json:"description"`
	MsgsPerSec  float64 `json:"msgsPerSec"`
	// Latency is per send request (HTTP phases) or per synced commit
	// (pebble phases).
	Latency loadtest.Latency `json:"latency"`
	// CPUPerMsg is the process's CPU time (client and server, or Pebble)
	// per message while measuring; Cores is that CPU time over the
	// elapsed time: below the machine's CPUs when others take them.
	CPUPerMsg time.Duration    `json:"cpuPerMsgNs"`
	Cores     float64          `json:"cores"`
	Errors    map[string]int64 `json:"errors,omitempty"`
	Report    *loadtest.Report `json:"report,omitempty"`
	Pebble    *pebbleResult    `json:"pebble,omitempty"`
}

// target is one line of the table.
type target struct {
	Name     string    `json:"name"`
	Measured string    `json:"measured"`
	Baseline string    `json:"baseline"`
	Ratio    float64   `json:"ratio"`  // measured / baseline (throughput) or measured / bound (latency); the median round's
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

func (c *suite) logf(format string, args ...any) {
	if c.progress != nil {
		fmt.Fprintf(c.progress, format+"\n", args...)
	}
}

// pebblePhase measures raw Pebble synced appends.
func (c *suite) pebblePhase(ctx context.Context, name string, size, batch, writers int) (phase, error) {
	desc := fmt.Sprintf("raw Pebble, %d B values, batch %d, %d writers, pebble.Sync", size, batch, writers)
	c.logf("== %s (round %d): %s", name, c.round+1, desc)
	res, err := pebbleBaseline{BaseDir: c.dir, MessageBytes: size, Batch: batch, Writers: writers,
		Warmup: c.warmup, Duration: c.duration}.run(ctx)
	if err != nil {
		return phase{}, fmt.Errorf("%s: %w", name, err)
	}
	p := phase{Name: name, Round: c.round + 1, Kind: "pebble", Description: desc, MsgsPerSec: res.MsgsPerSec, Latency: res.Commit, Pebble: &res}
	p.setCPU(res.CPU, res.Messages, time.Duration(res.Elapsed))
	c.logf("   %.0f msg/s, commit %s, CPU %s/msg on %.2f cores", p.MsgsPerSec, p.Latency, dur(p.CPUPerMsg), p.Cores)
	c.phases = append(c.phases, p)
	return p, nil
}

// httpPhase runs sc against url (a warm-up run first, on the same client)
// and, when name is the profiled phase, CPU-profiles the measured run.
func (c *suite) httpPhase(ctx context.Context, name, kind, url string, sc loadtest.Scenario) (phase, error) {
	p := sc.Producers
	desc := fmt.Sprintf("%s, %d B bodies, batch %d, %d producers", kind, p.MessageBytes, max(p.Batch, 1), p.Count)
	if sc.Consumers.Count > 0 {
		desc += fmt.Sprintf(", %d consumers pulling %d", sc.Consumers.Count, sc.Consumers.MaxMessages)
	}
	c.logf("== %s (round %d): %s", name, c.round+1, desc)
	client := loadtest.NewClient(p.Count + 2*sc.Consumers.Count + 4)
	defer client.CloseIdleConnections()
	sc.URL, sc.Client = url, client
	if c.warmup > 0 {
		w := sc
		w.Duration, w.Messages = c.warmup, 0
		if _, err := runLabeled(ctx, w); err != nil {
			return phase{}, fmt.Errorf("%s warm-up: %w", name, err)
		}
	}
	sc.Duration, sc.Progress = c.duration, c.progress
	var profile *os.File
	if path := c.profileFile(name); path != "" {
		f, err := os.Create(path)
		if err != nil {
			return phase{}, err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return phase{}, err
		}
		profile = f
	}
	cpu0 := cpuTime()
	rep, err := runLabeled(ctx, sc)
	cpu := cpuTime() - cpu0
	if profile != nil {
		pprof.StopCPUProfile()
		if cerr := profile.Close(); err == nil {
			err = cerr
		}
		c.logf("   CPU profile in %s (go tool pprof -tagfocus side=server …)", profile.Name())
	}
	if err != nil {
		return phase{}, fmt.Errorf("%s: %w", name, err)
	}
	ph := phase{Name: name, Round: c.round + 1, Kind: kind, Description: desc, MsgsPerSec: rep.SendRate, Latency: rep.Send.Latency,
		Errors: rep.Send.Errors, Report: &rep}
	ph.setCPU(cpu, rep.Sent, time.Duration(rep.Elapsed+rep.Drain))
	c.logf("   %.0f msg/s, send %s, errors %d, CPU %s/msg on %.2f cores", ph.MsgsPerSec, ph.Latency, rep.Send.ErrorCount(), dur(ph.CPUPerMsg), ph.Cores)
	c.phases = append(c.phases, ph)
	return ph, nil
}

func (p *phase) setCPU(cpu time.Duration, msgs int64, elapsed time.Duration) {
	if msgs > 0 {
		p.CPUPerMsg = cpu / time.Duration(msgs)
	}
	if elapsed > 0 {
		p.Cores = cpu.Seconds() / elapsed.Seconds()
	}
}

// profileFile is where the CPU profile of phase name goes, or "".
func (c *suite) profileFile(name string) string {
	if c.cpuProfile == "" || c.round > 0 || !slices.Contains(c.profilePhases, name) {
		return ""
	}
	if len(c.profilePhases) == 1 {
		return c.cpuProfile
	}
	return strings.TrimSuffix(c.cpuProfile, ".pprof") + "-" + name + ".pprof"
}

// runLabeled runs sc with its goroutines labelled side=client.
func runLabeled(ctx context.Context, sc loadtest.Scenario) (rep loadtest.Report, err error) {
	pprof.Do(ctx, clientLabels(), func(ctx context.Context) { rep, err = sc.Run(ctx) })
	return rep, err
}

// brokerPhase is httpPhase against the broker: a fresh in-process one
// (closed after the phase), or the running one at c.url.
func (c *suite) brokerPhase(ctx context.Context, name string, sc loadtest.Scenario) (p phase, err error) {
	url := c.url
	if url == "" {
		b, err := startBroker(c.dir, c.log)
		if err != nil {
			return phase{}, err
		}
		defer func() {
			if cerr := b.Close(); cerr != nil && err == nil {
				err = fmt.Errorf("%s: closing the broker: %w", name, cerr)
			}
		}()
		url = b.URL
	}
	return c.httpPhase(ctx, name, "broker", url, sc)
}

func sends(count, batch, size int) loadtest.Scenario {
	return loadtest.Scenario{Producers: loadtest.Producers{Count: count, Batch: batch, MessageBytes: size}}
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
	pebbleStep := func(name string, size, batch, writers int) step {
		return step{name, func(name string) (phase, error) { return c.pebblePhase(ctx, name, size, batch, writers) }}
	}
	brokerStep := func(name string, sc loadtest.Scenario) step {
		return step{name, func(name string) (phase, error) { return c.brokerPhase(ctx, name, sc) }}
	}
	noopStep := func(name string, sc loadtest.Scenario) step {
		return step{name, func(name string) (phase, error) { return c.httpPhase(ctx, name, "noop", noop.URL, sc) }}
	}
	steps := []step{
		// Batch send, 1 KiB, against raw Pebble at batch 256 (and the other
		// batch sizes of the baseline, for the record).
		pebbleStep("pebble-b1-w16-1KiB", 1024, 1, 16),
		pebbleStep("pebble-b32-w16-1KiB", 1024, 32, 16),
		pebbleStep("pebble-b256-w16-1KiB", 1024, 256, 16),
		brokerStep("batch100-p16-1KiB", sends(16, 100, 1024)),
		// Batch send at 256 B and 16 KiB against raw Pebble batch 32.
		pebbleStep("pebble-b32-w16-256B", 256, 32, 16),
		brokerStep("batch100-p16-256B", sends(16, 100, 256)),
		pebbleStep("pebble-b32-w16-16KiB", 16<<10, 32, 16),
		brokerStep("batch100-p16-16KiB", sends(16, 100, 16<<10)),
		// Single sends at 64 against the no-op handler at 64.
		noopStep("noop-c64-1KiB", sends(64, 1, 1024)),
		brokerStep("single-p64-1KiB", sends(64, 1, 1024)),
		// One producer: latency against no-op p50 + one synced commit p50.
		pebbleStep("pebble-b1-w1-1KiB", 1024, 1, 1),
		noopStep("noop-c1-1KiB", sends(1, 1, 1024)),
		brokerStep("single-p1-1KiB", sends(1, 1, 1024)),
	}
	rounds := max(c.rounds, 1)
	got := make([]map[string]phase, rounds)
	for r := range rounds {
		c.round = r
		got[r] = map[string]phase{}
		for _, s := range steps {
			p, err := s.run(s.name)
			if err != nil {
				return nil, err
			}
			got[r][s.name] = p
		}
	}

	// Each target's ratio per round; the median round decides.
	var targets []target
	add := func(name, want string, pass func(ratio float64) bool, one func(g map[string]phase) (ratio float64, measured, baseline string, errs bool)) {
		t := target{Name: name, Want: want}
		type result struct {
			ratio              float64
			measured, baseline string
			errs               bool
		}
		var rs []result
		for _, g := range got {
			var x result
			x.ratio, x.measured, x.baseline, x.errs = one(g)
			rs = append(rs, x)
			t.Rounds = append(t.Rounds, x.ratio)
		}
		slices.SortFunc(rs, func(a, b result) int { return cmp.Compare(a.ratio, b.ratio) })
		med := rs[len(rs)/2]
		t.Ratio, t.Measured, t.Baseline = med.ratio, med.measured, med.baseline
		t.Pass = pass(med.ratio) && !slices.ContainsFunc(rs, func(x result) bool { return x.errs })
		targets = append(targets, t)
	}
	throughput := func(name, measured, baseline string) {
		add(name, "≥ 50%", func(r float64) bool { return r >= 0.5 }, func(g map[string]phase) (float64, string, string, bool) {
			m, b := g[measured], g[baseline]
			return m.MsgsPerSec / b.MsgsPerSec, fmt.Sprintf("%s msg/s", thousands(m.MsgsPerSec)),
				fmt.Sprintf("%s msg/s (%s)", thousands(b.MsgsPerSec), b.Name), len(m.Errors) > 0
		})
	}
	throughput("batch send, 100 msgs/request, 16 producers, 1 KiB", "batch100-p16-1KiB", "pebble-b256-w16-1KiB")
	throughput("batch send, 100 msgs/request, 16 producers, 256 B", "batch100-p16-256B", "pebble-b32-w16-256B")
	throughput("batch send, 100 msgs/request, 16 producers, 16 KiB", "batch100-p16-16KiB", "pebble-b32-w16-16KiB")
	throughput("single send, 64 producers, 1 KiB", "single-p64-1KiB", "noop-c64-1KiB")
	add("single send, 1 producer, 1 KiB: p50", "≤ bound", func(r float64) bool { return r <= 1 }, func(g map[string]phase) (float64, string, string, bool) {
		n1, pb1w1, s1 := g["noop-c1-1KiB"], g["pebble-b1-w1-1KiB"], g["single-p1-1KiB"]
		bound := n1.Latency.P50 + pb1w1.Latency.P50 + 150*time.Microsecond
		return float64(s1.Latency.P50) / float64(bound), fmt.Sprintf("p50 %s", micros(s1.Latency.P50)),
			fmt.Sprintf("no-op p50 %s + Pebble b1 w1 commit p50 %s + 150µs = %s", micros(n1.Latency.P50), micros(pb1w1.Latency.P50), micros(bound)),
			len(s1.Errors) > 0
	})
	return targets, nil
}

// runE2E is an extra phase with no target: sends and consumers together,
// for the end-to-end latency.
func (c *suite) runE2E(ctx context.Context) error {
	sc := sends(16, 1, 1024)
	sc.Consumers = loadtest.Consumers{Count: 4, MaxMessages: 32}
	_, err := c.brokerPhase(ctx, "pubsub-p16-c4-1KiB", sc)
	return err
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
	fmt.Fprintf(&b, "- machine: %s, %d CPUs (GOMAXPROCS %d), %s, %s/%s\n", m.CPU, m.NumCPU, m.GOMAXPROCS, m.GoVersion, runtime.GOOS, runtime.GOARCH)
	fmt.Fprintf(&b, "- load average before: %s; after: %s\n", m.LoadBefore, m.LoadAfter)
	fmt.Fprintf(&b, "- data: %s (broker and raw Pebble on the same disk), fsync always\n", m.DataDir)
	fmt.Fprintf(&b, "- started %s, took %s\n\n", m.Start.Format(time.RFC3339), m.Took.Round(time.Second))
	b.WriteString("| target | measured | baseline | ratio | want | result | ratio per round |\n|---|---:|---|---:|---|---|---|\n")
	for _, t := range r.Targets {
		res := "FAIL"
		if t.Pass {
			res = "PASS"
		}
		var rounds []string
		for _, x := range t.Rounds {
			rounds = append(rounds, fmt.Sprintf("%.0f%%", x*100))
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %.0f%% | %s | **%s** | %s |\n", t.Name, t.Measured, t.Baseline, t.Ratio*100, t.Want, res, strings.Join(rounds, ", "))
	}
	if len(r.Targets) > 0 && len(r.Targets[0].Rounds) > 1 {
		b.WriteString("\nWith several rounds, measured, baseline and ratio are the median round's (per target), and every round's phases are below.\n")
	}
	b.WriteString("\n### Phases\n\n| phase | round | what | msg/s | p50 | p99 | p99.9 | max | CPU/msg | cores used | errors |\n|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---|\n")
	for _, p := range r.Phases {
		l := p.Latency
		errs := "0"
		if len(p.Errors) > 0 {
			errs = fmt.Sprint(p.Errors)
		}
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %s | %s | %s | %s | %s | %.2f | %s |\n", p.Name, p.Round, p.Description, thousands(p.MsgsPerSec),
			dur(l.P50), dur(l.P99), dur(l.P999), dur(l.Max), dur(p.CPUPerMsg), p.Cores, errs)
	}
	b.WriteString("\nLatency is per send request for HTTP phases (per batch for batch sends) and per synced commit for Pebble phases. " +
		"CPU/msg is this process's CPU time (user+system: load generator and in-process server together, or Pebble) per message while measuring; " +
		"cores used is that CPU time over wall time, out of the machine's CPUs — well below them means other processes took the rest.\n")
	for _, p := range r.Phases {
		if p.Report != nil && p.Report.Scenario.Consumers.Count > 0 {
			fmt.Fprintf(&b, "\n### Phase %s (sends and consumers together)\n\n", p.Name)
			_ = p.Report.WriteMarkdown(&b)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}
