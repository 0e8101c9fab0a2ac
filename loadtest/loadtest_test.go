package loadtest_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidemq/tidemq/core"
	"github.com/tidemq/tidemq/gateway"
	"github.com/tidemq/tidemq/loadtest"
	"github.com/tidemq/tidemq/pebblestore"
)

// startBroker serves the real wiring (Pebble in t.TempDir(), fsync on) on
// 127.0.0.1:0; everything is closed when the test ends.
func startBroker(t *testing.T, maxMessageBytes int) string {
	t.Helper()
	gw, stopPolling := startGateway(t, maxMessageBytes)
	srv := httptest.NewServer(gw)
	t.Cleanup(func() {
		stopPolling()
		srv.Close()
	})
	return srv.URL
}

// startGateway is startBroker's handler, unserved, and what ends its
// parked polls (to call before closing the servers that serve it).
func startGateway(t *testing.T, maxMessageBytes int) (http.Handler, func()) {
	t.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	store, err := pebblestore.Open(t.TempDir(), pebblestore.Options{Logger: log})
	if err != nil {
		t.Fatalf("pebblestore.Open: %v", err)
	}
	t.Cleanup(func() {
		if err := store.Close(); err != nil {
			t.Errorf("store Close: %v", err)
		}
	})
	br, err := core.New(store, core.Options{Logger: log, MaxMessageBytes: maxMessageBytes})
	if err != nil {
		t.Fatalf("core.New: %v", err)
	}
	t.Cleanup(func() {
		if err := br.Close(); err != nil {
			t.Errorf("broker Close: %v", err)
		}
	})
	gw, err := gateway.New(br, gateway.Options{Logger: log, MaxMessageBytes: maxMessageBytes})
	if err != nil {
		t.Fatalf("gateway.New: %v", err)
	}
	return gw, br.StopPolling
}

// checkLatency checks a summary is internally consistent and counts want
// values.
func checkLatency(t *testing.T, name string, l loadtest.Latency, want int64) {
	t.Helper()
	if l.Count != want {
		t.Errorf("%s latency count = %d, want %d", name, l.Count, want)
	}
	if want == 0 {
		return
	}
	steps := []time.Duration{l.Min, l.P50, l.P90, l.P99, l.P999, l.Max}
	for i := 1; i < len(steps); i++ {
		if steps[i] < steps[i-1] {
			t.Errorf("%s percentiles not monotonic: min/p50/p90/p99/p99.9/max = %v", name, steps)
			break
		}
	}
	if l.Min <= 0 || l.Mean < l.Min || l.Mean > l.Max {
		t.Errorf("%s: min %v mean %v max %v", name, l.Min, l.Mean, l.Max)
	}
}

// checkDrained checks a run whose consumers acked everything it sent.
func checkDrained(t *testing.T, r loadtest.Report) {
	t.Helper()
	for name, o := range map[string]loadtest.OpStats{"send": r.Send, "pull": r.Pull, "ack": r.Ack} {
		if len(o.Errors) != 0 {
			t.Errorf("%s errors: %v", name, o.Errors)
		}
	}
	if r.Sent == 0 || r.Delivered != r.Sent || r.Acked != r.Sent {
		t.Errorf("sent %d, delivered %d, acked %d: want all equal and > 0", r.Sent, r.Delivered, r.Acked)
	}
	if r.Redelivered != 0 || r.Stale != 0 {
		t.Errorf("redelivered %d, stale %d: want 0", r.Redelivered, r.Stale)
	}
	if r.Send.Messages != r.Sent || r.Pull.Messages != r.Delivered || r.Ack.Messages != r.Acked {
		t.Errorf("op messages send %d pull %d ack %d, want %d", r.Send.Messages, r.Pull.Messages, r.Ack.Messages, r.Sent)
	}
	checkLatency(t, "send", r.Send.Latency, r.Send.Requests)
	checkLatency(t, "pull", r.Pull.Latency, r.Pull.Requests-r.Pull.Empty)
	checkLatency(t, "ack", r.Ack.Latency, r.Ack.Requests)
	checkLatency(t, "end to end", r.EndToEnd, r.Delivered)
	if r.Ack.Requests != r.Pull.Requests-r.Pull.Empty {
		t.Errorf("%d ack requests for %d non-empty pulls", r.Ack.Requests, r.Pull.Requests-r.Pull.Empty)
	}
	if r.SendRate <= 0 || r.DeliverRate <= 0 || r.Elapsed <= 0 {
		t.Errorf("rates %g/%g over %v", r.SendRate, r.DeliverRate, time.Duration(r.Elapsed))
	}
}

func TestRun(t *testing.T) {
	url := startBroker(t, 0)
	cases := []struct {
		name string
		s    loadtest.Scenario
		// check beyond checkDrained
		check func(t *testing.T, r loadtest.Report)
	}{
		{
			name: "single send, message count",
			s: loadtest.Scenario{
				Producers: loadtest.Producers{Count: 3, MessageBytes: 256},
				Consumers: loadtest.Consumers{Count: 2, MaxMessages: 16},
				Messages:  151,
			},
			check: func(t *testing.T, r loadtest.Report) {
				if r.Sent != 151 || r.Send.Requests != 151 {
					t.Errorf("sent %d in %d requests, want 151 in 151", r.Sent, r.Send.Requests)
				}
			},
		},
		{
			name: "batch send, duration",
			s: loadtest.Scenario{
				Queues:    4,
				Producers: loadtest.Producers{Count: 2, Batch: 10, MessageBytes: 100},
				Consumers: loadtest.Consumers{Count: 2, MaxMessages: 64},
				Duration:  time.Second,
			},
			check: func(t *testing.T, r loadtest.Report) {
				if r.Sent != 10*r.Send.Requests {
					t.Errorf("sent %d in %d batch requests of 10", r.Sent, r.Send.Requests)
				}
				if e := time.Duration(r.Elapsed); e < time.Second || e > 5*time.Second {
					t.Errorf("elapsed %v for a 1s run", e)
				}
			},
		},
		{
			name: "plain client, single send",
			s: loadtest.Scenario{
				ClientKind: loadtest.ClientPlain,
				Producers:  loadtest.Producers{Count: 3, MessageBytes: 300},
				Consumers:  loadtest.Consumers{Count: 2, MaxMessages: 16},
				Messages:   60,
			},
			check: func(t *testing.T, r loadtest.Report) {
				if r.Sent != 60 || r.Scenario.ClientKind != loadtest.ClientPlain {
					t.Errorf("sent %d with client %q, want 60 with plain", r.Sent, r.Scenario.ClientKind)
				}
			},
		},
		{
			name: "plain client, batch send",
			s: loadtest.Scenario{
				ClientKind: loadtest.ClientPlain,
				Producers:  loadtest.Producers{Count: 2, Batch: 10, MessageBytes: 100},
				Consumers:  loadtest.Consumers{Count: 2, MaxMessages: 64},
				Messages:   200,
			},
			check: func(t *testing.T, r loadtest.Report) {
				if r.Sent != 200 || r.Send.Requests != 20 {
					t.Errorf("sent %d in %d requests, want 200 in 20", r.Sent, r.Send.Requests)
				}
			},
		},
		{
			name: "transactional single send",
			s: loadtest.Scenario{
				Producers: loadtest.Producers{Count: 3, MessageBytes: 256, Transactional: true},
				Consumers: loadtest.Consumers{Count: 2, MaxMessages: 16},
				Messages:  90,
			},
			check: func(t *testing.T, r loadtest.Report) {
				// Delivered (checkDrained) means committed: half messages
				// reach nobody.
				if r.Sent != 90 || r.Send.Requests != 90 {
					t.Errorf("sent %d in %d transactions, want 90 in 90", r.Sent, r.Send.Requests)
				}
			},
		},
		{
			name: "transactional batch send, plain client",
			s: loadtest.Scenario{
				ClientKind: loadtest.ClientPlain,
				Producers:  loadtest.Producers{Count: 2, Batch: 10, MessageBytes: 100, Transactional: true},
				Consumers:  loadtest.Consumers{Count: 2, MaxMessages: 64},
				Messages:   200,
			},
			check: func(t *testing.T, r loadtest.Report) {
				if r.Sent != 200 || r.Send.Requests != 20 {
					t.Errorf("sent %d in %d transactions, want 200 in 20", r.Sent, r.Send.Requests)
				}
			},
		},
		{
			name: "open loop",
			s: loadtest.Scenario{
				Producers: loadtest.Producers{Count: 8, Batch: 2, Rate: 200},
				Consumers: loadtest.Consumers{Count: 1},
				Duration:  time.Second,
			},
			check: func(t *testing.T, r loadtest.Report) {
				// 200 msg/s in requests of 2 for 1s: 100 requests scheduled,
				// most of them sent even on a slow machine (-race).
				if r.Sent+r.Missed != 200 || r.Send.Requests != r.Sent/2 || r.Sent < 100 {
					t.Errorf("sent %d + missed %d in %d requests, want 200 in 100", r.Sent, r.Missed, r.Send.Requests)
				}
			},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.s.URL = url
			var progress bytes.Buffer
			c.s.Progress = &progress
			c.s.ProgressInterval = 200 * time.Millisecond
			r, err := c.s.Run(t.Context())
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			var md bytes.Buffer
			if err := r.WriteMarkdown(&md); err != nil || !strings.Contains(md.String(), "| send |") {
				t.Errorf("markdown: %v\n%s", err, md.String())
			}
			t.Logf("report:\n%s", md.String())
			checkDrained(t, r)
			c.check(t, r)
			if !strings.Contains(progress.String(), "msg/s") {
				t.Errorf("no progress line: %q", progress.String())
			}
			raw, err := json.Marshal(r)
			if err != nil {
				t.Fatalf("json: %v", err)
			}
			var back loadtest.Report
			if err := json.Unmarshal(raw, &back); err != nil || back.Sent != r.Sent || back.Send.Latency.Count != r.Send.Latency.Count {
				t.Errorf("JSON round trip: %v\n%s", err, raw)
			}
		})
	}
}

// TestRunSpreadsOverURLs serves one broker on two listeners, as two nodes
// of a cluster serve one API, and runs with both as Scenario.URLs: every
// producer and consumer sends to its own listener (i modulo 2), so both
// carry sends, pulls and acks, and the run still drains.
func TestRunSpreadsOverURLs(t *testing.T) {
	gw, stopPolling := startGateway(t, 0)
	type counts struct{ send, pull, ack atomic.Int64 }
	var hits [2]counts
	var urls []string
	for i := range hits {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch p := r.URL.Path; {
			case strings.HasSuffix(p, "/messages") || strings.HasSuffix(p, "/messages:batch"):
				hits[i].send.Add(1)
			case strings.HasSuffix(p, "/pull"):
				hits[i].pull.Add(1)
			case strings.HasSuffix(p, "/ack"):
				hits[i].ack.Add(1)
			}
			gw.ServeHTTP(w, r)
		}))
		t.Cleanup(srv.Close)
		urls = append(urls, srv.URL)
	}
	t.Cleanup(stopPolling) // runs before the servers close
	r, err := loadtest.Scenario{URL: urls[1], URLs: urls,
		Producers: loadtest.Producers{Count: 4, MessageBytes: 64},
		Consumers: loadtest.Consumers{Count: 2, MaxMessages: 16},
		Messages:  200}.Run(t.Context())
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	checkDrained(t, r)
	for i := range hits {
		h := &hits[i]
		if h.send.Load() == 0 || h.pull.Load() == 0 || h.ack.Load() == 0 {
			t.Errorf("listener %d served %d sends, %d pulls, %d acks: want some of each", i, h.send.Load(), h.pull.Load(), h.ack.Load())
		}
	}
	if got := hits[0].send.Load() + hits[1].send.Load(); got != r.Send.Requests {
		t.Errorf("%d send requests served, the report counts %d", got, r.Send.Requests)
	}
	bad := loadtest.Scenario{URL: urls[0], URLs: []string{"nope"}, Producers: loadtest.Producers{Count: 1}, Messages: 1}
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "URLs") {
		t.Errorf("Validate with a bad URLs entry: %v", err)
	}
}

// TestPlainClientSendsBase64 sends with the plain client to a named topic
// and reads the messages back with a pull of its own: each body is
// base64 of MessageBytes random bytes, no two alike.
func TestPlainClientSendsBase64(t *testing.T) {
	url := startBroker(t, 0)
	admin := loadtest.Admin{URL: url}
	if err := admin.PutTopic(t.Context(), "plain", 0, 0); err != nil {
		t.Fatal(err)
	}
	if err := admin.PutSubscription(t.Context(), "plain", "g", "earliest"); err != nil {
		t.Fatal(err)
	}
	r, err := loadtest.Scenario{URL: url, Topic: "plain", ClientKind: loadtest.ClientPlain,
		Producers: loadtest.Producers{Count: 2, MessageBytes: 200}, Messages: 10}.Run(t.Context())
	if err != nil || r.Sent != 10 {
		t.Fatalf("Run: %v, sent %d of 10 (errors %v)", err, r.Sent, r.Send.Errors)
	}
	resp, err := http.Post(url+"/v1/topics/plain/subscriptions/g/pull", "application/json", strings.NewReader(`{"maxMessages":100,"waitSeconds":0}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var res struct {
		Messages []struct {
			Body, BodyEncoding string
		}
	}
	if err := json.NewDecoder(resp.Body).Decode(&res); err != nil {
		t.Fatal(err)
	}
	if len(res.Messages) != 10 {
		t.Fatalf("pulled %d messages, want 10", len(res.Messages))
	}
	seen := map[string]bool{}
	for _, m := range res.Messages {
		b, err := base64.StdEncoding.DecodeString(m.Body)
		if m.BodyEncoding != "base64" || err != nil || len(b) != 200 {
			t.Errorf("body encoding %q, %d bytes decoded (%v): want base64 of 200", m.BodyEncoding, len(b), err)
		}
		seen[m.Body] = true
	}
	if len(seen) != len(res.Messages) {
		t.Errorf("%d distinct bodies of %d: want fresh random bytes each", len(seen), len(res.Messages))
	}
}

// TestRunCountsProblems checks failed sends are counted under their problem
// code: bodies above the broker's limit are 413 message_too_large.
func TestRunCountsProblems(t *testing.T) {
	url := startBroker(t, 100)
	r, err := loadtest.Scenario{
		URL:       url,
		Producers: loadtest.Producers{Count: 2, MessageBytes: 200},
		Messages:  20,
	}.Run(t.Context())
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if r.Sent != 0 || r.Send.Requests != 20 || r.Send.Errors["message_too_large"] != 20 || len(r.Send.Errors) != 1 {
		t.Errorf("sent %d, requests %d, errors %v; want 0, 20, message_too_large 20", r.Sent, r.Send.Requests, r.Send.Errors)
	}
	checkLatency(t, "send", r.Send.Latency, 20)

	// No broker at all: transport errors, and Run still ends.
	r, err = loadtest.Scenario{
		URL: "http://127.0.0.1:1", SkipSetup: true,
		Producers: loadtest.Producers{Count: 1}, Messages: 3,
	}.Run(t.Context())
	if err != nil || r.Send.Errors["transport"] != 3 {
		t.Errorf("Run against nothing: %v, errors %v", err, r.Send.Errors)
	}
}

func TestValidate(t *testing.T) {
	err := loadtest.Scenario{
		URL: "ftp://x", Topic: "bad name", RunID: "bad id",
		ClientKind: "fancy",
		Producers:  loadtest.Producers{Batch: 5000, Rate: -1},
		Consumers:  loadtest.Consumers{MaxMessages: 2000, StartFrom: "middle"},
	}.Validate()
	if err == nil {
		t.Fatal("Validate passed a broken scenario")
	}
	for _, want := range []string{"URL", "Topic", "RunID", "StartFrom", "ClientKind", "no producers", "Batch", "Rate", "MaxMessages", "never end"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Validate error does not mention %s:\n%v", want, err)
		}
	}
	if err := (loadtest.Scenario{URL: "http://127.0.0.1:8080", Producers: loadtest.Producers{Count: 1}, Duration: time.Second}).Validate(); err != nil {
		t.Errorf("Validate of a good scenario: %v", err)
	}
}

// TestRunBacklog fills a backlog with one run and drains it with another
// of the same RunID, as the suites do: a subscription from the earliest
// message made first with Admin, producers alone, then consumers alone.
// OnInterval's counts add up to the report's.
func TestRunBacklog(t *testing.T) {
	url := startBroker(t, 0)
	admin := loadtest.Admin{URL: url}
	ctx := t.Context()
	const topic, group, id = "backlog-test", "drain", "fill-1"
	if err := admin.PutTopic(ctx, topic, 4, 48); err != nil {
		t.Fatal(err)
	}
	if err := admin.PutSubscription(ctx, topic, group, "earliest"); err != nil {
		t.Fatal(err)
	}
	var intervals []loadtest.Interval
	fill, err := loadtest.Scenario{URL: url, Topic: topic, SkipSetup: true, RunID: id,
		Producers:  loadtest.Producers{Count: 4, Batch: 50, MessageBytes: 200},
		Messages:   3000,
		OnInterval: func(iv loadtest.Interval) { intervals = append(intervals, iv) },
	}.Run(ctx)
	if err != nil || fill.Sent != 3000 || fill.RunID != id {
		t.Fatalf("fill: %v, sent %d, run %s", err, fill.Sent, fill.RunID)
	}
	var sent int64
	for _, iv := range intervals {
		sent += iv.Sent
		if iv.Seconds <= 0 || iv.Acked != 0 {
			t.Errorf("fill interval %+v", iv)
		}
	}
	if len(intervals) == 0 || sent != fill.Sent {
		t.Errorf("%d intervals counted %d sent of %d", len(intervals), sent, fill.Sent)
	}
	st, err := admin.Subscription(ctx, topic, group)
	if err != nil || st.Lag != 3000 {
		t.Errorf("lag before the drain %d (%v), want 3000", st.Lag, err)
	}
	if tp, err := admin.Topic(ctx, topic); err != nil || tp.Messages != 3000 || tp.Queues != 4 {
		t.Errorf("topic %+v (%v)", tp, err)
	}

	intervals = nil
	drain, err := loadtest.Scenario{URL: url, Topic: topic, Group: group, SkipSetup: true, RunID: id,
		Consumers:  loadtest.Consumers{Count: 2, MaxMessages: 256},
		Messages:   fill.Sent,
		Duration:   20 * time.Second,
		OnInterval: func(iv loadtest.Interval) { intervals = append(intervals, iv) },
	}.Run(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if drain.Delivered != 3000 || drain.Acked != 3000 || drain.Stale != 0 || drain.Redelivered != 0 {
		t.Errorf("drain: delivered %d, acked %d, stale %d, redelivered %d; want 3000, 3000, 0, 0", drain.Delivered, drain.Acked, drain.Stale, drain.Redelivered)
	}
	var acked int64
	for _, iv := range intervals {
		acked += iv.Acked
	}
	if acked != drain.Acked {
		t.Errorf("intervals counted %d acked of %d", acked, drain.Acked)
	}
	if st, err := admin.Subscription(ctx, topic, group); err != nil || st.Lag != 0 {
		t.Errorf("lag after the drain %d (%v), want 0", st.Lag, err)
	}
	if err := admin.DeleteTopic(ctx, topic); err != nil {
		t.Error(err)
	}
	if _, err := admin.Topic(ctx, topic); errorCode(err) != "topic_not_found" {
		t.Errorf("topic after delete: %v", err)
	}
}

// errorCode digs the problem code out of an error's text.
func errorCode(err error) string {
	if err == nil {
		return ""
	}
	if strings.Contains(err.Error(), "topic_not_found") {
		return "topic_not_found"
	}
	return err.Error()
}
