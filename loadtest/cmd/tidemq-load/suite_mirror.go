package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/tidemq/tidemq/loadtest"
)

// The mirror suite (-suite mirror): two broker processes on this machine,
// region hz (the source) and region sg (the destination), each a child
// process of the same binary on a data dir of its own, fsync always. The
// source takes the batch-send load (16 producers, batches of 100, 1 KiB
// bodies) on a topic that a mirror on the destination copies from its
// earliest message (SPEC §8). The suite reports the source's send rate,
// the mirror's copy rate, and the copy delay of every message: from its
// storedAt at the source to its copy's storedAt at the destination, both
// read back through the query API once the mirror has caught up. Both
// brokers' clocks are the machine's, so the two storedAts compare.

const (
	mirrorPhaseName = "mirror-batch100-p16-1KiB"
	mirrorName      = "loadtest"
	// After the sends the suite waits for the mirror while it makes
	// progress: it gives up once the destination gained nothing for
	// mirrorStall (or -drain, when longer), or after mirrorCatchUp in all.
	mirrorStall   = 30 * time.Second
	mirrorCatchUp = 10 * time.Minute
)

// mirrorReport is what the mirror did in the measured run.
type mirrorReport struct {
	// Acked is the sends the source answered 2xx; SourceStored the
	// messages its topic holds after the run; Copies the destination
	// topic's messages that name one of them (mirror.sourceMessageId),
	// Duplicates those beyond the first for one source message, Missing
	// the source's messages with no copy when the wait ended.
	Acked        int64 `json:"acked"`
	SourceStored int64 `json:"sourceStored"`
	Copies       int64 `json:"copies"`
	Duplicates   int64 `json:"duplicates"`
	Missing      int64 `json:"missing"`
	// LoadSeconds is the measured send run's length; CopiedUnderLoad the
	// copies stored at the destination within it; MsgsPerSec their rate
	// over it (the mirror's throughput while the source is loaded).
	LoadSeconds     float64 `json:"loadSeconds"`
	CopiedUnderLoad int64   `json:"copiedUnderLoad"`
	MsgsPerSec      float64 `json:"msgsPerSec"`
	// OverallMsgsPerSec is every copy over the time from the first source
	// message's storedAt to the last copy's; CaughtUp the time from the
	// end of the sends to the last copy's storedAt.
	OverallMsgsPerSec float64       `json:"overallMsgsPerSec"`
	CaughtUp          time.Duration `json:"caughtUpNs"`
	// Delay is per message, source storedAt → copy storedAt (millisecond
	// timestamps: below 1 ms reads as 0).
	Delay loadtest.Latency `json:"delay"`
	// The mirror's GET once caught up.
	Status loadtest.MirrorStats `json:"status"`
	// SourceCPUPerMsg and DestCPUPerMsg are each broker process's CPU
	// time from the start of the sends to the end of the catch-up, per
	// message acknowledged.
	SourceCPUPerMsg time.Duration `json:"sourceCpuPerMsgNs"`
	DestCPUPerMsg   time.Duration `json:"destCpuPerMsgNs"`
}

// mirrorResult is the JSON output of -suite mirror.
type mirrorResult struct {
	Command string        `json:"command"`
	Machine machine       `json:"machine"`
	Source  *phase        `json:"source,omitempty"`
	Mirror  *mirrorReport `json:"mirror,omitempty"`
}

// runMirrorSuite runs -suite mirror and writes its report (as far as it
// went when it failed).
func runMirrorSuite(ctx context.Context, c config, log *slog.Logger, progress, stdout io.Writer) error {
	bin, work, err := childBrokers(ctx, c.dir, c.brokerBin)
	if work != "" {
		defer os.RemoveAll(work)
	}
	if err != nil {
		return err
	}
	s := &suite{token: c.token, dir: c.dir, log: log, warmup: c.warmup, duration: c.sc.Duration, progress: progress,
		gzip: c.gzip, clients: c.clients, childBin: bin, brokerBin: bin, brokerWork: work}
	res := mirrorResult{Command: strings.Join(append([]string{"tidemq-load"}, os.Args[1:]...), " ")}
	res.Machine = describeMachine(c.dir)
	err = s.runMirror(ctx, c.sc.Messages, c.sc.Producers.Rate, max(c.sc.DrainTimeout, mirrorStall), &res)
	res.Machine.LoadAfter = loadAverage()
	res.Machine.Took = time.Since(res.Machine.Start)
	return errors.Join(err, writeReports(stdout, c, res, res.writeMarkdown))
}

// runMirror starts the two regions, runs the load on the source (messages
// of them, or for the suite's duration when 0; open loop at rate msg/s
// when above 0), waits for the mirror to catch up (see mirrorStall) and
// measures it into res.
func (c *suite) runMirror(ctx context.Context, messages int64, rate float64, stall time.Duration, res *mirrorResult) (err error) {
	procs := map[string]*brokerProc{}
	defer func() {
		for r, p := range procs {
			if _, serr := p.terminate(30 * time.Second); serr != nil {
				err = errors.Join(err, fmt.Errorf("stopping %s: %w", r, serr))
			}
		}
	}()
	for _, r := range []string{"hz", "sg"} {
		p, _, err := startBrokerProc(ctx, c.childBin, filepath.Join(c.brokerWork, r), filepath.Join(c.brokerWork, r+".log"), time.Minute, "--region", r)
		if err != nil {
			return fmt.Errorf("starting region %s: %w", r, err)
		}
		procs[r] = p
	}
	src, dst := procs["hz"], procs["sg"]
	c.logf("   regions: hz %s (source), sg %s (mirror %s)", src.URL, dst.URL, mirrorName)
	hc := loadtest.NewClient(20, c.gzip)
	defer hc.CloseIdleConnections()
	srcAdmin := loadtest.Admin{URL: src.URL, Token: c.token, Client: hc}
	dstAdmin := loadtest.Admin{URL: dst.URL, Token: c.token, Client: hc}

	kind := loadtest.ClientLean
	if len(c.clients) > 0 {
		kind = c.clients[0]
	}
	sc := sends(16, 100, 1024)
	sc.ClientKind = kind
	// The warm-up goes to a topic the mirror does not copy: the brokers
	// are warm, and the mirror starts on an empty topic.
	if c.warmup > 0 {
		w := sc
		w.URL, w.Token, w.Client, w.Duration = src.URL, c.token, hc, c.warmup
		if _, err := runLabeled(ctx, w); err != nil {
			return fmt.Errorf("warm-up: %w", err)
		}
	}
	topic := fmt.Sprintf("loadtest-mirror-%08x", rand.Uint32())
	for _, a := range []loadtest.Admin{srcAdmin, dstAdmin} {
		if err := a.PutTopic(ctx, topic, 8, 0); err != nil {
			return err
		}
	}
	if err := dstAdmin.PutMirror(ctx, mirrorName, loadtest.MirrorSource{URL: src.URL, Topic: topic, Token: c.token}, topic, "earliest"); err != nil {
		return err
	}
	// The copy delay is measured from a running mirror: the sends start
	// once its subscription is at the source, not while the destination
	// is still starting its copier (up to a reconcile period).
	if err := waitMirrorSubscribed(ctx, srcAdmin, topic, "mirror.sg."+mirrorName); err != nil {
		return err
	}

	sc.Topic, sc.Messages, sc.Producers.Rate = topic, messages, rate
	if messages > 0 {
		sc.Duration = 0
	}
	c.brokerUsage = func() []procUsage { return []procUsage{src.usage(), dst.usage()} }
	defer func() { c.brokerUsage = nil }()
	cpu0 := c.brokerUsage()
	warmup := c.warmup
	c.warmup = 0 // done above, on another topic
	p, err := c.httpPhase(ctx, mirrorPhaseName, "broker hz, mirrored to sg", src.URL, sc)
	c.warmup = warmup
	if err != nil {
		return err
	}
	res.Source = &p
	m := &mirrorReport{Acked: p.Report.Sent}
	res.Mirror = m
	loadStart := p.Report.Start
	loadEnd := loadStart.Add(time.Duration(p.Report.Elapsed))
	m.LoadSeconds = loadEnd.Sub(loadStart).Seconds()

	// Caught up: the mirror without lag and the destination holding at
	// least what the source does.
	deadline := time.Now().Add(mirrorCatchUp)
	var gained int64
	gainedAt := time.Now()
	for {
		st, err := dstAdmin.Mirror(ctx, mirrorName)
		if err != nil {
			return err
		}
		sTop, err1 := srcAdmin.Topic(ctx, topic)
		dTop, err2 := dstAdmin.Topic(ctx, topic)
		if err := errors.Join(err1, err2); err != nil {
			return err
		}
		m.Status, m.SourceStored = st, sTop.Messages
		if st.Lag == 0 && dTop.Messages >= sTop.Messages {
			break
		}
		if dTop.Messages > gained {
			gained, gainedAt = dTop.Messages, time.Now()
		}
		if time.Since(gainedAt) > stall || time.Now().After(deadline) {
			c.logf("   the mirror has not caught up (nothing copied for %v, or %v in all): %d of %d copied, state %s, lag %d, last error %q",
				stall, mirrorCatchUp, dTop.Messages, sTop.Messages, st.State, st.Lag, st.LastError)
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	cpu1 := c.brokerUsage()
	if m.Acked > 0 {
		m.SourceCPUPerMsg = (cpu1[0].cpu - cpu0[0].cpu) / time.Duration(m.Acked)
		m.DestCPUPerMsg = (cpu1[1].cpu - cpu0[1].cpu) / time.Duration(m.Acked)
	}

	// Read both topics back: each source message's storedAt, each copy's.
	stored := map[string]time.Time{}
	var first time.Time
	if err := srcAdmin.StoredMessages(ctx, topic, func(ms []loadtest.StoredMessage) {
		for _, sm := range ms {
			stored[sm.ID] = sm.StoredAt
			if first.IsZero() || sm.StoredAt.Before(first) {
				first = sm.StoredAt
			}
		}
	}); err != nil {
		return err
	}
	m.SourceStored = int64(len(stored))
	copied := map[string]bool{}
	delay := loadtest.NewHistogram()
	var last time.Time
	if err := dstAdmin.StoredMessages(ctx, topic, func(ms []loadtest.StoredMessage) {
		for _, cp := range ms {
			at, ok := stored[cp.SourceID]
			if !ok {
				continue
			}
			if copied[cp.SourceID] {
				m.Duplicates++
				continue
			}
			copied[cp.SourceID] = true
			m.Copies++
			loadtest.RecordLatency(delay, cp.StoredAt.Sub(at))
			if cp.StoredAt.After(last) {
				last = cp.StoredAt
			}
			if !cp.StoredAt.Before(loadStart.Truncate(time.Millisecond)) && !cp.StoredAt.After(loadEnd) {
				m.CopiedUnderLoad++
			}
		}
	}); err != nil {
		return err
	}
	m.Missing = m.SourceStored - m.Copies
	m.Delay = loadtest.LatencyOf(delay)
	if m.LoadSeconds > 0 {
		m.MsgsPerSec = float64(m.CopiedUnderLoad) / m.LoadSeconds
	}
	if d := last.Sub(first); d > 0 {
		m.OverallMsgsPerSec = float64(m.Copies) / d.Seconds()
	}
	if !last.IsZero() {
		m.CaughtUp = max(last.Sub(loadEnd), 0)
	}
	c.logf("   mirror: %d copies of %d stored at the source (%d acknowledged), %d duplicates, %d missing; %.0f msg/s under load, %.0f msg/s overall, caught up %v after the sends; delay %s",
		m.Copies, m.SourceStored, m.Acked, m.Duplicates, m.Missing, m.MsgsPerSec, m.OverallMsgsPerSec, m.CaughtUp.Round(time.Millisecond), m.Delay)
	var errs []error
	if m.Missing > 0 || m.Duplicates > 0 {
		errs = append(errs, fmt.Errorf("the mirror stored %d copies of the source's %d messages: %d missing, %d twice", m.Copies, m.SourceStored, m.Missing, m.Duplicates))
	}
	if m.SourceStored < m.Acked {
		errs = append(errs, fmt.Errorf("the source holds %d messages of %d acknowledged", m.SourceStored, m.Acked))
	}
	errs = append(errs, dstAdmin.DeleteMirror(ctx, mirrorName))
	return errors.Join(errs...)
}

// waitMirrorSubscribed waits, up to a minute, for the mirror's subscription
// to exist at the source.
func waitMirrorSubscribed(ctx context.Context, src loadtest.Admin, topic, group string) error {
	deadline := time.Now().Add(time.Minute)
	for {
		_, err := src.Subscription(ctx, topic, group)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the mirror did not subscribe at the source within a minute: %w", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// writeMarkdown renders the mirror suite's result.
func (r mirrorResult) writeMarkdown(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "## tidemq load test: a mirror between two regions on this machine\n\n`%s`\n\n", r.Command)
	m := r.Machine
	b.WriteString(m.header())
	fmt.Fprintf(&b, "- data: %s, fsync always; region hz (source) and region sg (destination, the mirror) each a child process of the same binary on 127.0.0.1\n", m.DataDir)
	fmt.Fprintf(&b, "- started %s, took %s\n\n", m.Start.Format(time.RFC3339), m.Took.Round(time.Second))
	if r.Source == nil || r.Mirror == nil {
		b.WriteString("The suite did not get to measure (see the error).\n")
		_, err := io.WriteString(w, b.String())
		return err
	}
	p, x := r.Source, r.Mirror
	b.WriteString("| | msg/s | p50 | p99 | p99.9 | max | notes |\n|---|---:|---:|---:|---:|---:|---|\n")
	fmt.Fprintf(&b, "| source sends (%s) | %s | %s | %s | %s | %s | per batch request; %d acknowledged, errors %s |\n", p.Name, thousands(p.MsgsPerSec),
		dur(p.Latency.P50), dur(p.Latency.P99), dur(p.Latency.P999), dur(p.Latency.Max), x.Acked, errorsCell(p.Errors))
	fmt.Fprintf(&b, "| mirror copies while the source is loaded | %s | | | | | %d copies stored at sg during the %.1f s of sends |\n", thousands(x.MsgsPerSec), x.CopiedUnderLoad, x.LoadSeconds)
	fmt.Fprintf(&b, "| mirror copies overall | %s | | | | | first source storedAt → last copy storedAt; caught up %s after the sends ended |\n", thousands(x.OverallMsgsPerSec), dur(x.CaughtUp))
	fmt.Fprintf(&b, "| copy delay (source storedAt → copy storedAt) | | %s | %s | %s | %s | per message, n=%d; millisecond timestamps |\n", dur(x.Delay.P50), dur(x.Delay.P99), dur(x.Delay.P999), dur(x.Delay.Max), x.Delay.Count)
	fmt.Fprintf(&b, "\n- stored: the source holds %d messages, sg %d copies of them; %d missing, %d stored twice\n", x.SourceStored, x.Copies, x.Missing, x.Duplicates)
	fmt.Fprintf(&b, "- the mirror's GET once caught up: state %s, lag %d, copied %d, lastCopiedAt %s, lastError %q\n", x.Status.State, x.Status.Lag, x.Status.Copied, x.Status.LastCopiedAt, x.Status.LastError)
	fmt.Fprintf(&b, "- CPU per message acknowledged, from the start of the sends to the catch-up: source broker %s, destination broker %s (load tester: %s during the sends)\n",
		dur(x.SourceCPUPerMsg), dur(x.DestCPUPerMsg), dur(p.ClientCPUPerMsg))
	_, err := io.WriteString(w, b.String())
	return err
}
