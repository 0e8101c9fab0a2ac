package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tidemq/tidemq/loadtest"
)

// The producer flood (phase flood-c48-15MB of -suite targets, run only
// when -phases names it): connections post large batches as fast as they
// are answered, without backing off on 429, against the real broker run as
// a child process, so that the RSS read is the broker's alone. The broker
// admits request bodies against its body budget (--body-budget-bytes) and
// refuses the rest with 429 and Retry-After before reading them; the
// targets are its peak RSS, that no request outlasts the client's timeout,
// that every answer is a 201 or such a 429, and that some batches are
// stored.

const (
	floodPhaseName = "flood-c48-15MB"
	floodRSSLimit  = 512 << 20
	// floodMaxRequestBytes is the API's largest request body (SPEC.md,
	// openapi.yaml: 16 MiB, else 413 request_too_large unread).
	floodMaxRequestBytes = 16 << 20
	floodMaxMessages     = 1000 // per batch (SPEC.md)
)

// floodSpec is the shape of one flood.
type floodSpec struct {
	Connections   int           `json:"connections"`
	BatchBytes    int           `json:"batchBytes"` // each request's body, at most: the batch is filled to just under it
	BatchMessages int           `json:"batchMessages"`
	Duration      time.Duration `json:"durationNs"`      // new requests start until then; those in flight are answered
	Timeout       time.Duration `json:"clientTimeoutNs"` // each request's, headers to the end of the reply
	// BrokerArgs are flags the broker gets beyond startBrokerProc's.
	BrokerArgs []string `json:"brokerArgs,omitempty"`
}

// floodSuiteSpec is the suite's flood: 48 connections, batches of 15 MB
// (1000 messages of about 15 kB), under the 16 MiB request limit.
func floodSuiteSpec(d time.Duration) floodSpec {
	return floodSpec{Connections: 48, BatchBytes: 15_000_000, BatchMessages: floodMaxMessages, Duration: d, Timeout: 30 * time.Second}
}

// floodResult is what one flood measured.
type floodResult struct {
	Spec           floodSpec `json:"spec"`
	RequestBytes   int       `json:"requestBytes"` // the body actually sent
	BrokerPid      int       `json:"brokerPid"`
	BrokerLog      string    `json:"brokerLog,omitempty"` // kept when the flood failed
	BudgetLimit    int64     `json:"bodyBudgetLimitBytes"`
	BudgetUsedPeak int64     `json:"bodyBudgetUsedPeakBytes"` // the largest tidemq_http_body_budget_used_bytes sampled
	Requests       int64     `json:"requests"`
	// Statuses counts the answers by status code; requests without one
	// count as "timeout" (the client's) or "error".
	Statuses map[string]int64 `json:"statuses"`
	// Errors holds a few of the transport errors, for diagnosis.
	Errors              []string         `json:"errors,omitempty"`
	TooManyNoRetryAfter int64            `json:"tooManyWithoutRetryAfter"` // 429s without a valid Retry-After
	Stored              int64            `json:"messagesStored"`           // messages of the 201 batches
	TopicMessages       int64            `json:"topicMessages"`            // the topic's message count after the flood, from the broker
	Elapsed             loadtest.Seconds `json:"elapsedSeconds"`           // until the last request was answered
	MaxRequest          time.Duration    `json:"maxRequestNs"`
	Latency             loadtest.Latency `json:"latency"`        // every request that was answered
	CreatedLatency      loadtest.Latency `json:"createdLatency"` // the 201s
	RefusedLatency      loadtest.Latency `json:"refusedLatency"` // the 429s
	RSSReady            int64            `json:"rssReadyBytes"`  // VmRSS when ready, before the flood
	PeakRSS             int64            `json:"peakRssBytes"`   // VmHWM after the flood: the process's peak
	SampledPeakRSS      int64            `json:"sampledPeakRssBytes"`
	RSSAfter            int64            `json:"rssAfterBytes"` // VmRSS when the last request was answered
	BrokerCPU           time.Duration    `json:"brokerCpuNs"`
	StopTook            time.Duration    `json:"stopTookNs"` // SIGTERM to exit
}

func (f *floodResult) count(status string) int64 { return f.Statuses[status] }

// failures is how many requests had no acceptable answer: anything but a
// 201 or a 429 with Retry-After.
func (f *floodResult) failures() int64 {
	var n int64
	for s, c := range f.Statuses {
		if s != "201" && s != "429" {
			n += c
		}
	}
	return n + f.TooManyNoRetryAfter
}

// serverErrors is how many answers were 5xx.
func (f *floodResult) serverErrors() int64 {
	var n int64
	for s, c := range f.Statuses {
		if strings.HasPrefix(s, "5") {
			n += c
		}
	}
	return n
}

// floodBatch is a messages:batch body of n messages of random lowercase
// letters (each its own: bodies above 4 KiB are stored compressed, and
// repeated bytes would compress to nothing), as large as fits in max
// bytes.
func floodBatch(n, max int) ([]byte, error) {
	const head, tail, perMsg = `{"messages":[`, `]}`, len(`{"body":""},`)
	size := (max - len(head) - len(tail) + 1 - n*perMsg) / n
	if n < 1 || size < 1 {
		return nil, fmt.Errorf("a batch of %d messages does not fit in %d bytes", n, max)
	}
	b := make([]byte, 0, max)
	b = append(b, head...)
	for i := range n {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"body":"`...)
		for range size {
			b = append(b, byte('a'+rand.N(26)))
		}
		b = append(b, `"}`...)
	}
	return append(b, tail...), nil
}

// runFlood starts bin on a fresh data dir under work, floods it as spec
// says, stops it, and returns what it measured (as far as it went, also
// with an error). The broker is stopped on every way out.
func runFlood(ctx context.Context, spec floodSpec, bin, work string, logf func(string, ...any)) (res floodResult, err error) {
	res.Spec = spec
	if spec.Connections < 1 || spec.Duration <= 0 || spec.Timeout <= 0 {
		return res, errors.New("flood: connections, duration and timeout must be above 0")
	}
	if spec.BatchMessages > floodMaxMessages || spec.BatchBytes > floodMaxRequestBytes {
		return res, fmt.Errorf("flood: a batch is at most %d messages and %d bytes", floodMaxMessages, floodMaxRequestBytes)
	}
	payload, err := floodBatch(spec.BatchMessages, spec.BatchBytes)
	if err != nil {
		return res, err
	}
	res.RequestBytes = len(payload)
	dir, err := os.MkdirTemp(work, "flood-")
	if err != nil {
		return res, err
	}
	logPath := filepath.Join(dir, "broker.log")
	defer func() {
		// The data goes; the log stays when something failed.
		rm := os.RemoveAll(filepath.Join(dir, "data"))
		if err == nil && rm == nil {
			rm = os.RemoveAll(dir)
		} else {
			res.BrokerLog = logPath
		}
		err = errors.Join(err, rm)
	}()
	p, _, err := startBrokerProc(ctx, bin, filepath.Join(dir, "data"), logPath, 2*time.Minute, spec.BrokerArgs...)
	if err != nil {
		return res, err
	}
	defer func() { err = errors.Join(err, p.kill()) }()
	res.BrokerPid = p.Pid()
	res.RSSReady, _, _ = p.memory()
	admin := loadtest.Admin{URL: p.URL, Client: loadtest.NewClient(2, false)}
	defer admin.Client.CloseIdleConnections()
	const topic = "flood"
	if err := admin.PutTopic(ctx, topic, 0, 0); err != nil {
		return res, err
	}
	logf("   broker pid %d on %s; %d connections posting %d-byte batches of %d messages for %s (client timeout %s)",
		p.Pid(), p.URL, spec.Connections, len(payload), spec.BatchMessages, spec.Duration, spec.Timeout)

	// Sampling: the broker's RSS and the budget's use, until the flood ends.
	sctx, stopSampling := context.WithCancel(ctx)
	var sampling sync.WaitGroup
	var sampledRSS, budgetUsed, budgetLimit atomic.Int64
	sampling.Go(func() {
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			if rss, _, err := p.memory(); err == nil && rss > sampledRSS.Load() {
				sampledRSS.Store(rss)
			}
			select {
			case <-sctx.Done():
				return
			case <-tick.C:
			}
		}
	})
	mc := &http.Client{Timeout: 2 * time.Second}
	defer mc.CloseIdleConnections()
	sampling.Go(func() {
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			if used, limit, err := budgetGauges(sctx, mc, p.URL); err == nil {
				budgetLimit.Store(limit)
				if used > budgetUsed.Load() {
					budgetUsed.Store(used)
				}
			}
			select {
			case <-sctx.Done():
				return
			case <-tick.C:
			}
		}
	})

	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost, tr.MaxConnsPerHost, tr.DisableCompression = spec.Connections, spec.Connections, true
	hc := &http.Client{Transport: tr, Timeout: spec.Timeout}
	defer tr.CloseIdleConnections()
	var (
		mu                 sync.Mutex
		statuses           = map[string]int64{}
		errs               []string
		noRetry, stored    int64
		maxReq             time.Duration
		all, created, refd = loadtest.NewHistogram(), loadtest.NewHistogram(), loadtest.NewHistogram()
	)
	cpu0 := p.cpu()
	began := time.Now()
	deadline := began.Add(spec.Duration)
	url := p.URL + "/v1/topics/" + topic + "/messages:batch"
	var wg sync.WaitGroup
	for range spec.Connections {
		wg.Go(func() {
			for time.Now().Before(deadline) && ctx.Err() == nil {
				select {
				case <-p.done:
					return // the broker is gone: the caller reports it
				default:
				}
				status, retryOK, d, rerr := floodRequest(ctx, hc, url, payload)
				mu.Lock()
				maxReq = max(maxReq, d)
				switch {
				case rerr != nil:
					kind := "error"
					if ne, ok := errors.AsType[net.Error](rerr); ok && ne.Timeout() {
						kind = "timeout"
					}
					statuses[kind]++
					if len(errs) < 5 && !slices.Contains(errs, rerr.Error()) {
						errs = append(errs, rerr.Error())
					}
				default:
					statuses[strconv.Itoa(status)]++
					loadtest.RecordLatency(all, d)
					switch status {
					case http.StatusCreated:
						stored += int64(spec.BatchMessages)
						loadtest.RecordLatency(created, d)
					case http.StatusTooManyRequests:
						loadtest.RecordLatency(refd, d)
						if !retryOK {
							noRetry++
						}
					}
				}
				failed := rerr != nil
				mu.Unlock()
				if failed {
					// Not spinning on a refused connection.
					select {
					case <-ctx.Done():
					case <-time.After(10 * time.Millisecond):
					}
				}
			}
		})
	}
	wg.Wait()
	res.Elapsed = loadtest.Seconds(time.Since(began))
	res.RSSAfter, res.PeakRSS, _ = p.memory()
	res.BrokerCPU = p.cpu() - cpu0
	stopSampling()
	sampling.Wait()
	res.SampledPeakRSS, res.BudgetUsedPeak, res.BudgetLimit = max(sampledRSS.Load(), res.RSSAfter), budgetUsed.Load(), budgetLimit.Load()
	res.Statuses, res.Errors, res.TooManyNoRetryAfter, res.Stored, res.MaxRequest = statuses, errs, noRetry, stored, maxReq
	for _, n := range statuses {
		res.Requests += n
	}
	res.Latency, res.CreatedLatency, res.RefusedLatency = loadtest.LatencyOf(all), loadtest.LatencyOf(created), loadtest.LatencyOf(refd)
	if err := ctx.Err(); err != nil {
		return res, err
	}
	select {
	case <-p.done:
		return res, fmt.Errorf("flood: the broker exited during the flood: %v; its log (%s) ends:\n%s", p.waitErr, logPath, logTail(logPath))
	default:
	}
	ts, err := admin.Topic(ctx, topic)
	if err != nil {
		return res, fmt.Errorf("flood: reading the topic after the flood: %w", err)
	}
	res.TopicMessages = ts.Messages
	res.StopTook, err = p.terminate(time.Minute)
	return res, err
}

// floodRequest posts one batch and reads the reply: its status, whether
// a 429 carried a valid Retry-After, and how long it took.
func floodRequest(ctx context.Context, hc *http.Client, url string, payload []byte) (status int, retryOK bool, d time.Duration, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(payload))
	if err != nil {
		return 0, false, 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	began := time.Now()
	resp, err := hc.Do(req)
	if err != nil {
		return 0, false, time.Since(began), err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	d = time.Since(began)
	if err != nil {
		return 0, false, d, err
	}
	secs, perr := strconv.Atoi(resp.Header.Get("Retry-After"))
	return resp.StatusCode, perr == nil && secs >= 1, d, nil
}

// budgetGauges reads the body budget's gauges from the broker's /metrics.
func budgetGauges(ctx context.Context, hc *http.Client, base string) (used, limit int64, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	if err != nil {
		return 0, 0, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, 0, fmt.Errorf("/metrics: %s", resp.Status)
	}
	found := 0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		for _, g := range []struct {
			name string
			v    *int64
		}{{"tidemq_http_body_budget_used_bytes", &used}, {"tidemq_http_body_budget_limit_bytes", &limit}} {
			rest, ok := strings.CutPrefix(line, g.name)
			if !ok || (rest != "" && rest[0] != ' ' && rest[0] != '{') {
				continue
			}
			f := strings.Fields(rest[strings.LastIndexByte(rest, '}')+1:])
			if len(f) == 0 {
				continue
			}
			x, perr := strconv.ParseFloat(f[0], 64)
			if perr != nil {
				continue
			}
			*g.v = int64(x)
			found++
		}
	}
	if err := sc.Err(); err != nil {
		return 0, 0, err
	}
	if found < 2 {
		return 0, 0, errors.New("/metrics has no body budget gauges")
	}
	return used, limit, nil
}

// floodPhase runs the suite's flood on a broker built for it (or
// -broker-bin) and records it as a phase.
func (c *suite) floodPhase(ctx context.Context, name string) (phase, error) {
	spec := floodSuiteSpec(c.floodDuration)
	desc := fmt.Sprintf("broker process, producer flood: %d connections posting %g MB batches of %d messages for %s, no back-off on 429, client timeout %s",
		spec.Connections, float64(spec.BatchBytes)/1e6, spec.BatchMessages, spec.Duration, spec.Timeout)
	c.logf("== %s (round %d): %s", name, c.round+1, desc)
	work, err := os.MkdirTemp(c.dir, "tidemq-load-flood-")
	if err != nil {
		return phase{}, err
	}
	bin, err := c.brokerBinary(ctx)
	if err != nil {
		return phase{}, errors.Join(err, os.Remove(work))
	}
	res, err := runFlood(ctx, spec, bin, work, c.logf)
	_ = os.Remove(work) // empty unless the flood kept the broker's log
	if err != nil {
		return phase{}, fmt.Errorf("%s: %w", name, err)
	}
	p := phase{Name: name, Round: c.round + 1, Kind: "broker", Description: desc, Latency: res.Latency, Flood: &res}
	if e := time.Duration(res.Elapsed).Seconds(); e > 0 {
		p.MsgsPerSec = float64(res.Stored) / e
	}
	for s, n := range res.Statuses {
		if s != "201" {
			if p.Errors == nil {
				p.Errors = map[string]int64{}
			}
			p.Errors[s] = n
		}
	}
	p.setCPU(usage{cpu: res.BrokerCPU}, res.Stored, time.Duration(res.Elapsed))
	c.logf("   %s: peak RSS %s (sampled %s, after %s), longest request %s of %s, %s msg/s stored",
		res.answers(), bytesIEC(res.PeakRSS), bytesIEC(res.SampledPeakRSS), bytesIEC(res.RSSAfter), dur(res.MaxRequest), spec.Timeout, thousands(p.MsgsPerSec))
	c.phases = append(c.phases, p)
	return p, nil
}

// answers is the status counts in a line.
func (f *floodResult) answers() string {
	keys := slices.Sorted(func(yield func(string) bool) {
		for k := range f.Statuses {
			if !yield(k) {
				return
			}
		}
	})
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s × %d", k, f.Statuses[k]))
	}
	if f.TooManyNoRetryAfter > 0 {
		parts = append(parts, fmt.Sprintf("(%d 429s without Retry-After)", f.TooManyNoRetryAfter))
	}
	if len(parts) == 0 {
		return "no requests"
	}
	return strings.Join(parts, ", ")
}

// floodTargets adds the flood's targets when its phase ran: absolute
// bounds, so each ratio is the measurement over its bound.
func floodTargets(add addFunc) {
	name := floodPhaseName
	get := func(g map[string]phase) *floodResult {
		if f := g[name].Flood; f != nil {
			return f
		}
		return &floodResult{}
	}
	label := "producer flood, 48 connections, 15 MB batches"
	add(label+": broker peak RSS", "≤ 512 MiB", []string{name}, func(r float64) bool { return r <= 1 }, func(g map[string]phase) (float64, string, string, bool) {
		f := get(g)
		return float64(f.PeakRSS) / floodRSSLimit, fmt.Sprintf("VmHWM %s (VmRSS after %s)", bytesIEC(f.PeakRSS), bytesIEC(f.RSSAfter)),
			fmt.Sprintf("512 MiB; body budget %s", bytesIEC(f.BudgetLimit)), f.PeakRSS == 0
	})
	add(label+": longest request", "≤ the client's timeout", []string{name}, func(r float64) bool { return r <= 1 }, func(g map[string]phase) (float64, string, string, bool) {
		f := get(g)
		ratio := 0.0
		if f.Spec.Timeout > 0 {
			ratio = float64(f.MaxRequest) / float64(f.Spec.Timeout)
		}
		return ratio, fmt.Sprintf("%s (201 p99 %s, 429 p99 %s)", dur(f.MaxRequest), dur(f.CreatedLatency.P99), dur(f.RefusedLatency.P99)),
			fmt.Sprintf("timeout %s", f.Spec.Timeout), f.count("timeout") > 0 || f.Requests == 0
	})
	add(label+": answers", "all 201 or 429 with Retry-After; some 201, no 5xx", []string{name}, func(r float64) bool { return r >= 1 }, func(g map[string]phase) (float64, string, string, bool) {
		f := get(g)
		ratio := 0.0
		if f.Requests > 0 {
			ratio = float64(f.Requests-f.failures()) / float64(f.Requests)
		}
		bad := f.count("201") == 0 || f.serverErrors() > 0 || f.failures() > 0 || f.TopicMessages != f.Stored
		return ratio, f.answers(), fmt.Sprintf("%d requests; %s messages stored, the topic holds %s", f.Requests,
			thousands(float64(f.Stored)), thousands(float64(f.TopicMessages))), bad
	})
}

// writeMarkdown is the flood's section of the suite's report.
func (f *floodResult) writeMarkdown(b *strings.Builder, name string, round int) {
	fmt.Fprintf(b, "\n### Phase %s, round %d (producer flood)\n\n", name, round)
	fmt.Fprintf(b, "- %d connections, each posting a %s-byte batch of %d messages as soon as the last was answered, for %s (%.1f s until the last answer); client timeout %s\n",
		f.Spec.Connections, thousands(float64(f.RequestBytes)), f.Spec.BatchMessages, f.Spec.Duration, time.Duration(f.Elapsed).Seconds(), f.Spec.Timeout)
	fmt.Fprintf(b, "- answers: %s; %d requests in all\n", f.answers(), f.Requests)
	fmt.Fprintf(b, "- latency: all %s; 201 %s; 429 %s; longest %s\n", f.Latency, f.CreatedLatency, f.RefusedLatency, dur(f.MaxRequest))
	fmt.Fprintf(b, "- broker RSS: %s when ready, peak (VmHWM) %s, largest sampled %s, %s after the flood; broker CPU %s\n",
		bytesIEC(f.RSSReady), bytesIEC(f.PeakRSS), bytesIEC(f.SampledPeakRSS), bytesIEC(f.RSSAfter), dur(f.BrokerCPU))
	fmt.Fprintf(b, "- body budget %s, the most sampled in use %s\n", bytesIEC(f.BudgetLimit), bytesIEC(f.BudgetUsedPeak))
	fmt.Fprintf(b, "- %s messages stored in 201 batches; the topic holds %s\n", thousands(float64(f.Stored)), thousands(float64(f.TopicMessages)))
	for _, e := range f.Errors {
		fmt.Fprintf(b, "- transport error: %s\n", e)
	}
	if f.BrokerLog != "" {
		fmt.Fprintf(b, "- the broker's log: %s\n", f.BrokerLog)
	}
}

// optInPhase reports whether the targets suite runs phase name only when
// -phases names it: the flood takes a build, a broker process and 20 s of
// gigabytes written and synced, more than a suite run should spend on one
// target without being asked; the transactional phases (suite_tx.go) are
// a comparison asked for when working on transactions.
func optInPhase(name string) bool { return name == floodPhaseName || isTxPhase(name) }
