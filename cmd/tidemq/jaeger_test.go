package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// jaegerVersion is the module version pinned in tools/jaeger/go.mod.
const jaegerVersion = "v1.76.0"

// jaegerBinary builds Jaeger v2 (all-in-one) from the tools module, kept
// apart from the main go.mod, into the user cache so that later runs reuse
// it. The first build takes minutes; later ones are a stat.
func jaegerBinary(t *testing.T) string {
	t.Helper()
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	bin := filepath.Join(cache, "tidemq-test", "jaeger-"+jaegerVersion)
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin+".tmp", "github.com/jaegertracing/jaeger/cmd/jaeger")
	cmd.Dir = filepath.Join("..", "..", "tools", "jaeger")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building jaeger: %v\n%s", err, out)
	}
	if err := os.Rename(bin+".tmp", bin); err != nil {
		t.Fatal(err)
	}
	return bin
}

const jaegerConfig = `
service:
  extensions: [jaeger_storage, jaeger_query, healthcheckv2]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
extensions:
  jaeger_query:
    storage:
      traces: memstore
    http:
      endpoint: %s
    grpc:
      endpoint: %s
  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: 10000
  healthcheckv2:
    use_v2: true
    http:
      endpoint: %s
receivers:
  otlp:
    protocols:
      http:
        endpoint: %s
processors:
  batch:
    timeout: 100ms
exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
`

// startJaeger runs Jaeger on free loopback ports; it returns the OTLP/HTTP
// endpoint and the query API base URL. Jaeger takes its four ports from
// its config, so they are picked before it starts, and another test's
// server may take one in between (it failed .ci/run once: "bind: address
// already in use"): then it starts again on fresh ports.
func startJaeger(t *testing.T) (otlp, query string) {
	t.Helper()
	bin := jaegerBinary(t)
	for attempt := 1; ; attempt++ {
		otlp, query, log, ok := tryJaeger(t, bin)
		if ok {
			return otlp, query
		}
		if attempt == 3 || !strings.Contains(log, "address already in use") {
			t.Fatalf("jaeger exited:\n%s", truncateLog(log))
		}
		t.Logf("jaeger could not bind a port it was given (attempt %d); starting again on fresh ones", attempt)
	}
}

// tryJaeger starts Jaeger once and waits until its query API answers; ok
// is false, with its log, when it exited first.
func tryJaeger(t *testing.T, bin string) (otlp, query, log string, ok bool) {
	t.Helper()
	queryAddr, otlpAddr, health := freeAddr(t), freeAddr(t), freeAddr(t)
	cfg := filepath.Join(t.TempDir(), "jaeger.yaml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, jaegerConfig, queryAddr, freeAddr(t), health, otlpAddr), 0o644); err != nil {
		t.Fatal(err)
	}
	out := &syncBuffer{}
	cmd := exec.Command(bin, "--config", "file:"+cfg)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
		if t.Failed() {
			t.Logf("jaeger log:\n%s", truncateLog(out.String()))
		}
	})
	hc := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := hc.Get("http://" + queryAddr + "/api/services")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return "http://" + otlpAddr, "http://" + queryAddr, "", true
			}
		}
		select {
		case <-done:
			return "", "", out.String(), false
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("jaeger not ready: %v\n%s", err, truncateLog(out.String()))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

type jaegerTraces struct {
	Data []struct {
		TraceID string `json:"traceID"`
		Spans   []struct {
			OperationName string `json:"operationName"`
			StartTime     int64  `json:"startTime"`
			TraceID       string `json:"traceID"`
		} `json:"spans"`
	} `json:"data"`
}

// TestJaegerShowsTheLifeOfAMessage sends a message with a traceparent,
// pulls it, nacks it, pulls it again and acks it, then finds it in a real
// Jaeger by the tag messaging.message.id: one trace, in order. Both span
// pipelines (--span-pipeline) show the same.
func TestJaegerShowsTheLifeOfAMessage(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs Jaeger")
	}
	otlp, query := startJaeger(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp)
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
	t.Setenv("OTEL_SERVICE_NAME", "tidemq")
	for _, pipeline := range []string{"lean", "sdk"} {
		t.Run(pipeline, func(t *testing.T) { lifeOfAMessage(t, query, pipeline) })
	}
}

func lifeOfAMessage(t *testing.T, query, pipeline string) {
	p := startTidemq(t, t.TempDir(), "--span-pipeline", pipeline)
	ctx := context.Background()
	hc := &http.Client{Timeout: 40 * time.Second}

	// A trace of its own per pipeline: Jaeger would show one trace ID's
	// spans from both runs together.
	traceID := map[string]string{"lean": "4bf92f3577b34da6a3ce929d0e0e4736", "sdk": "4bf92f3577b34da6a3ce929d0e0e4737"}[pipeline]
	if code, err := call(ctx, hc, "PUT", p.base+"/v1/topics/orders/subscriptions/billing", map[string]any{"retryDelays": []string{"0s"}}, nil); err != nil || code != 201 {
		t.Fatalf("subscription: %d %v", code, err)
	}
	req, _ := http.NewRequest("POST", p.base+"/v1/topics/orders/messages", strings.NewReader(`{"body":"hello","tag":"TagA"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("traceparent", "00-"+traceID+"-00f067aa0ba902b7-01")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var sent struct{ MessageID string }
	if err := json.NewDecoder(resp.Body).Decode(&sent); err != nil || resp.StatusCode != 201 {
		t.Fatalf("send: %d %v", resp.StatusCode, err)
	}
	resp.Body.Close()

	type pulled struct {
		Messages []struct{ ReceiptHandle, Traceparent string }
	}
	pull := func() string {
		var out pulled
		code, err := call(ctx, hc, "POST", p.base+"/v1/topics/orders/subscriptions/billing/pull", map[string]any{"waitSeconds": 10, "maxMessages": 1}, &out)
		if err != nil || code != 200 || len(out.Messages) != 1 {
			t.Fatalf("pull: %d %v %+v", code, err, out)
		}
		if !strings.Contains(out.Messages[0].Traceparent, traceID) {
			t.Fatalf("pulled traceparent %q is not in the producer's trace", out.Messages[0].Traceparent)
		}
		return out.Messages[0].ReceiptHandle
	}
	h := pull()
	if code, err := call(ctx, hc, "POST", p.base+"/v1/topics/orders/subscriptions/billing/nack", map[string]any{"receiptHandles": []string{h}, "delaySeconds": 0, "reason": "try again"}, nil); err != nil || code != 200 {
		t.Fatalf("nack: %d %v", code, err)
	}
	h = pull()
	if code, err := call(ctx, hc, "POST", p.base+"/v1/topics/orders/subscriptions/billing/ack", map[string]any{"receiptHandles": []string{h}}, nil); err != nil || code != 200 {
		t.Fatalf("ack: %d %v", code, err)
	}

	want := []string{"tidemq.send", "tidemq.deliver", "tidemq.nack", "tidemq.deliver", "tidemq.ack"}
	tags, _ := json.Marshal(map[string]string{"messaging.message.id": sent.MessageID})
	q := query + "/api/traces?service=tidemq&tags=" + url.QueryEscape(string(tags))
	var got []string
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		var tr jaegerTraces
		if code, err := call(ctx, hc, "GET", q, nil, &tr); err == nil && code == 200 && len(tr.Data) > 0 {
			if len(tr.Data) != 1 {
				t.Fatalf("the message is in %d traces, want 1", len(tr.Data))
			}
			if tr.Data[0].TraceID != traceID {
				t.Fatalf("trace %s, want the producer's %s", tr.Data[0].TraceID, traceID)
			}
			spans := tr.Data[0].Spans
			slices.SortStableFunc(spans, func(a, b struct {
				OperationName string `json:"operationName"`
				StartTime     int64  `json:"startTime"`
				TraceID       string `json:"traceID"`
			}) int {
				return int(a.StartTime - b.StartTime)
			})
			got = got[:0]
			for _, s := range spans {
				if s.OperationName != "tidemq.retry" {
					got = append(got, s.OperationName)
				}
			}
			if slices.Equal(got, want) {
				return
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("Jaeger shows %v for message %s, want %v", got, sent.MessageID, want)
}
