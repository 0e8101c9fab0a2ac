package loadtest

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// Report is what a run measured. Counts are messages unless named requests.
type Report struct {
	RunID    string    `json:"runId"`
	Scenario Scenario  `json:"scenario"`
	Start    time.Time `json:"start"`
	// Elapsed is the producing time: from the first send to the last reply
	// (or, without producers, the consuming time).
	Elapsed Seconds `json:"elapsedSeconds"`
	// Drain is how long consumers went on after producers stopped.
	Drain Seconds `json:"drainSeconds"`

	// Sent is messages the broker answered 2xx for.
	Sent int64 `json:"sent"`
	// Delivered is first deliveries (deliveryAttempt 1) of this run's
	// messages; Redelivered counts the later attempts.
	Delivered   int64 `json:"delivered"`
	Redelivered int64 `json:"redelivered"`
	// Acked is what ack replies counted as acked.
	Acked int64 `json:"acked"`
	// Stale is messages of other runs that consumers met (and acked).
	Stale int64 `json:"stale"`
	// Missed is, in open loop, the sends scheduled before the end that no
	// producer got to start: the broker could not keep up with Rate.
	Missed int64 `json:"missed"`

	// SendRate and DeliverRate are Sent and Delivered per second of
	// Elapsed (DeliverRate over Elapsed plus Drain).
	SendRate    float64 `json:"sendRate"`
	DeliverRate float64 `json:"deliverRate"`

	// Send is per request (one message, or a batch); Pull counts only the
	// pulls that returned messages in its latency (Empty counts the
	// others); Ack is per ack request.
	Send OpStats `json:"send"`
	Pull OpStats `json:"pull"`
	Ack  OpStats `json:"ack"`
	// EndToEnd is from a message's send request to its first delivery.
	EndToEnd Latency `json:"endToEnd"`
}

// Interval is what a run did during one progress interval (see
// Scenario.OnInterval): counts of that interval alone, and the latencies of
// the requests (and first deliveries) completed in it.
type Interval struct {
	// Start is when the interval began; Elapsed is the time from the
	// run's start to its end; Seconds is its length.
	Start   time.Time `json:"start"`
	Elapsed Seconds   `json:"elapsedSeconds"`
	Seconds float64   `json:"seconds"`

	Sent      int64 `json:"sent"`
	Delivered int64 `json:"delivered"`
	// Acked counts every message acked, stale ones too.
	Acked int64 `json:"acked"`
	// Errors is failed requests (and ack handles) of any kind.
	Errors int64 `json:"errors"`

	SendRate    float64 `json:"sendRate"`
	DeliverRate float64 `json:"deliverRate"`
	AckRate     float64 `json:"ackRate"`

	Send     Latency `json:"send"`
	Pull     Latency `json:"pull"` // pulls that returned messages
	EndToEnd Latency `json:"endToEnd"`
}

// OpStats are one kind of request's numbers.
type OpStats struct {
	Requests int64 `json:"requests"`
	Messages int64 `json:"messages"`
	// Empty is pulls that returned no message.
	Empty int64 `json:"empty,omitempty"`
	// Errors counts failed requests (and, for ack, failed handles) by
	// problem code: the `code` of a problem+json reply, "http_<status>"
	// for an error reply without one, "timeout" or "transport" when no
	// reply came.
	Errors  map[string]int64 `json:"errors,omitempty"`
	Latency Latency          `json:"latency"`
}

// ErrorCount is the sum of Errors.
func (o OpStats) ErrorCount() int64 {
	var n int64
	for _, c := range o.Errors {
		n += c
	}
	return n
}

// Seconds is a duration that marshals to JSON as fractional seconds.
type Seconds time.Duration

func (s Seconds) MarshalJSON() ([]byte, error) {
	return json.Marshal(time.Duration(s).Seconds())
}

func (s *Seconds) UnmarshalJSON(b []byte) error {
	var f float64
	if err := json.Unmarshal(b, &f); err != nil {
		return err
	}
	*s = Seconds(f * float64(time.Second))
	return nil
}

// Latency summarizes a latency distribution. In JSON the durations are
// microseconds.
type Latency struct {
	Count                               int64
	Min, Mean, P50, P90, P99, P999, Max time.Duration
}

type latencyJSON struct {
	Count int64   `json:"count"`
	Min   float64 `json:"minUs"`
	Mean  float64 `json:"meanUs"`
	P50   float64 `json:"p50Us"`
	P90   float64 `json:"p90Us"`
	P99   float64 `json:"p99Us"`
	P999  float64 `json:"p999Us"`
	Max   float64 `json:"maxUs"`
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

func (l Latency) MarshalJSON() ([]byte, error) {
	return json.Marshal(latencyJSON{l.Count, us(l.Min), us(l.Mean), us(l.P50), us(l.P90), us(l.P99), us(l.P999), us(l.Max)})
}

func (l *Latency) UnmarshalJSON(b []byte) error {
	var j latencyJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	d := func(v float64) time.Duration { return time.Duration(v * float64(time.Microsecond)) }
	*l = Latency{j.Count, d(j.Min), d(j.Mean), d(j.P50), d(j.P90), d(j.P99), d(j.P999), d(j.Max)}
	return nil
}

// String is "p50 1.2ms p99 3.4ms p99.9 5ms max 9ms (n=…)".
func (l Latency) String() string {
	if l.Count == 0 {
		return "-"
	}
	return fmt.Sprintf("p50 %s p99 %s p99.9 %s max %s (n=%d)", round(l.P50), round(l.P99), round(l.P999), round(l.Max), l.Count)
}

// round keeps three significant digits or so.
func round(d time.Duration) time.Duration {
	switch {
	case d >= 100*time.Millisecond:
		return d.Round(time.Millisecond)
	case d >= 10*time.Millisecond:
		return d.Round(100 * time.Microsecond)
	case d >= time.Millisecond:
		return d.Round(10 * time.Microsecond)
	default:
		return d.Round(time.Microsecond)
	}
}

// Histogram bounds: microseconds from 1 µs to 5 minutes, 3 significant
// digits. Longer values are recorded as the maximum.
const (
	histLowestUs  = 1
	histHighestUs = int64(5 * time.Minute / time.Microsecond)
	histSigFigs   = 3
)

// NewHistogram returns a histogram of latencies in microseconds with the
// bounds this package uses; see [RecordLatency] and [LatencyOf].
func NewHistogram() *hdrhistogram.Histogram {
	return hdrhistogram.New(histLowestUs, histHighestUs, histSigFigs)
}

// RecordLatency records d into a histogram from [NewHistogram], clamped to
// its bounds. Histograms are not safe for concurrent use.
func RecordLatency(h *hdrhistogram.Histogram, d time.Duration) {
	v := int64(d / time.Microsecond)
	v = min(max(v, histLowestUs), histHighestUs)
	_ = h.RecordValue(v) // in range by construction
}

// LatencyOf summarizes a histogram from [NewHistogram].
func LatencyOf(h *hdrhistogram.Histogram) Latency {
	if h.TotalCount() == 0 {
		return Latency{}
	}
	d := func(v int64) time.Duration { return time.Duration(v) * time.Microsecond }
	return Latency{
		Count: h.TotalCount(),
		Min:   d(h.Min()),
		Mean:  time.Duration(h.Mean() * float64(time.Microsecond)),
		P50:   d(h.ValueAtQuantile(50)),
		P90:   d(h.ValueAtQuantile(90)),
		P99:   d(h.ValueAtQuantile(99)),
		P999:  d(h.ValueAtQuantile(99.9)),
		Max:   d(h.Max()),
	}
}

// recorder is one worker's histogram of one operation: the whole run's and
// the current progress interval's. The worker records; the progress line
// and the report read under mu.
type recorder struct {
	mu       sync.Mutex
	total    *hdrhistogram.Histogram
	interval *hdrhistogram.Histogram
}

func newRecorder() *recorder {
	return &recorder{total: NewHistogram(), interval: NewHistogram()}
}

func (r *recorder) record(ds ...time.Duration) {
	r.mu.Lock()
	for _, d := range ds {
		RecordLatency(r.total, d)
		RecordLatency(r.interval, d)
	}
	r.mu.Unlock()
}

// mergeTotal merges the whole-run histograms of rs.
func mergeTotal(rs []*recorder) *hdrhistogram.Histogram {
	h := NewHistogram()
	for _, r := range rs {
		r.mu.Lock()
		h.Merge(r.total)
		r.mu.Unlock()
	}
	return h
}

// takeInterval merges the interval histograms of rs and resets them.
func takeInterval(rs []*recorder) *hdrhistogram.Histogram {
	h := NewHistogram()
	for _, r := range rs {
		r.mu.Lock()
		h.Merge(r.interval)
		r.interval.Reset()
		r.mu.Unlock()
	}
	return h
}

// errorCounts counts errors by code; safe for concurrent use.
type errorCounts struct {
	mu sync.Mutex
	m  map[string]int64
}

func (e *errorCounts) add(code string, n int64) {
	e.mu.Lock()
	if e.m == nil {
		e.m = map[string]int64{}
	}
	e.m[code] += n
	e.mu.Unlock()
}

func (e *errorCounts) snapshot() map[string]int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.m) == 0 {
		return nil
	}
	return maps.Clone(e.m)
}

func (e *errorCounts) total() int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	var n int64
	for _, c := range e.m {
		n += c
	}
	return n
}

// WriteMarkdown writes the report as a markdown section.
func (r Report) WriteMarkdown(w io.Writer) error {
	var b strings.Builder
	s := r.Scenario
	p, c := s.Producers, s.Consumers
	fmt.Fprintf(&b, "### loadtest run %s\n\n", r.RunID)
	mode := "closed loop"
	if p.Rate > 0 {
		mode = fmt.Sprintf("open loop at %g msg/s", p.Rate)
	}
	fmt.Fprintf(&b, "- target: %s, topic %s, group %s\n", s.URL, s.Topic, s.Group)
	if p.Count > 0 {
		fmt.Fprintf(&b, "- producers: %d, %s, batch %d, %d B bodies\n", p.Count, mode, p.Batch, p.MessageBytes)
	}
	if c.Count > 0 {
		ack := "ack"
		if c.NoAck {
			ack = "no ack"
		}
		fmt.Fprintf(&b, "- consumers: %d, pull %d, wait %ds, %s\n", c.Count, c.MaxMessages, c.WaitSeconds, ack)
	}
	fmt.Fprintf(&b, "- elapsed %.2fs (+ drain %.2fs); sent %d (%.0f msg/s), delivered %d (%.0f msg/s), redelivered %d, acked %d, stale %d, missed %d\n\n",
		time.Duration(r.Elapsed).Seconds(), time.Duration(r.Drain).Seconds(), r.Sent, r.SendRate, r.Delivered, r.DeliverRate, r.Redelivered, r.Acked, r.Stale, r.Missed)
	b.WriteString("| operation | requests | messages | p50 | p90 | p99 | p99.9 | max | errors |\n|---|---:|---:|---:|---:|---:|---:|---:|---|\n")
	row := func(name string, o OpStats, l Latency) {
		reqs := "-"
		if name != "end to end" {
			reqs = fmt.Sprint(o.Requests)
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %s | %s | %s | %s | %s | %s |\n", name, reqs, o.Messages,
			cell(l, l.P50), cell(l, l.P90), cell(l, l.P99), cell(l, l.P999), cell(l, l.Max), errorsCell(o.Errors))
	}
	if p.Count > 0 {
		row("send", r.Send, r.Send.Latency)
	}
	if c.Count > 0 {
		row("pull", r.Pull, r.Pull.Latency)
		if !c.NoAck {
			row("ack", r.Ack, r.Ack.Latency)
		}
		if p.Count > 0 {
			row("end to end", OpStats{Messages: r.EndToEnd.Count}, r.EndToEnd)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func cell(l Latency, d time.Duration) string {
	if l.Count == 0 {
		return "-"
	}
	return round(d).String()
}

func errorsCell(errs map[string]int64) string {
	if len(errs) == 0 {
		return "0"
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(errs)) {
		parts = append(parts, fmt.Sprintf("%s %d", k, errs[k]))
	}
	return strings.Join(parts, ", ")
}
