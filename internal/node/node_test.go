package node

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/tidemq/tidemq/core"
	"github.com/tidemq/tidemq/gateway"
	"github.com/tidemq/tidemq/internal/otlpspans"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func testConfig(t *testing.T) Config {
	cfg := Defaults()
	cfg.Addr, cfg.Data = "127.0.0.1:0", filepath.Join(t.TempDir(), "data")
	cfg.Getenv = func(string) string { return "" }
	return cfg
}

func send(t *testing.T, base, token string) int {
	t.Helper()
	req, _ := http.NewRequest("POST", base+"/v1/topics/orders/messages", strings.NewReader(`{"body":"hello"}`))
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	hc := &http.Client{Timeout: 10 * time.Second}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestStartServesAndShutsDown: a node serves on its free port, keeps what
// it acknowledged across a restart on the same directory, and a second
// Shutdown returns the first's result.
func TestStartServesAndShutsDown(t *testing.T) {
	cfg := testConfig(t)
	n, err := Start(context.Background(), cfg, quiet())
	if err != nil {
		t.Fatal(err)
	}
	if code := send(t, "http://"+n.Addr(), ""); code != http.StatusCreated {
		t.Fatalf("send answered %d", code)
	}
	if err := n.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := n.Shutdown(context.Background()); err != nil {
		t.Errorf("second Shutdown: %v", err)
	}
	if _, err := net.DialTimeout("tcp", n.Addr(), time.Second); err == nil {
		t.Error("still listening after Shutdown")
	}

	n, err = Start(context.Background(), cfg, quiet())
	if err != nil {
		t.Fatalf("restart on the same data: %v", err)
	}
	defer n.Shutdown(context.Background())
	resp, err := http.Get("http://" + n.Addr() + "/v1/topics/orders")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"orders"`) {
		t.Errorf("after restart, topic orders: %d %s", resp.StatusCode, body)
	}
}

// TestStartFailureClosesWhatItOpened: a node that cannot listen returns
// the error with its store closed, so the directory opens again.
func TestStartFailureClosesWhatItOpened(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cfg := testConfig(t)
	cfg.Addr = ln.Addr().String()
	if _, err := Start(context.Background(), cfg, quiet()); err == nil || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("Start on a taken port: err = %v", err)
	}
	cfg.Addr = "127.0.0.1:0"
	n, err := Start(context.Background(), cfg, quiet())
	if err != nil {
		t.Fatalf("the store was left open: %v", err)
	}
	if err := n.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestStartRefusesABadConfig(t *testing.T) {
	cfg := testConfig(t)
	cfg.SpanPipeline = "fast"
	if _, err := Start(context.Background(), cfg, quiet()); err == nil || !strings.Contains(err.Error(), "--span-pipeline") {
		t.Errorf("span pipeline %q: err = %v", cfg.SpanPipeline, err)
	}
	if _, err := os.Stat(cfg.Data); !os.IsNotExist(err) {
		t.Errorf("a refused config created its data directory: %v", err)
	}
}

// TestReloadTokens: a good file replaces the tokens, a broken one is an
// error and the previous tokens stay in force.
func TestReloadTokens(t *testing.T) {
	file := filepath.Join(t.TempDir(), "tokens.yaml")
	write := func(token string) {
		t.Helper()
		entry := "tokens:\n  - name: p\n    sha256: " + gateway.HashToken(token) + "\n    grants:\n      - {actions: [publish]}\n"
		if err := os.WriteFile(file, []byte(entry), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("tmq_first")
	cfg := testConfig(t)
	cfg.Tokens = file
	n, err := Start(context.Background(), cfg, quiet())
	if err != nil {
		t.Fatal(err)
	}
	defer n.Shutdown(context.Background())
	base := "http://" + n.Addr()
	if code := send(t, base, "tmq_first"); code != http.StatusCreated {
		t.Fatalf("first token: %d", code)
	}
	write("tmq_second")
	if err := n.ReloadTokens(); err != nil {
		t.Fatal(err)
	}
	if a, b := send(t, base, "tmq_first"), send(t, base, "tmq_second"); a != http.StatusUnauthorized || b != http.StatusCreated {
		t.Fatalf("after reload: first token %d, second %d; want 401, 201", a, b)
	}
	if err := os.WriteFile(file, []byte("tokens: [{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := n.ReloadTokens(); err == nil {
		t.Error("a broken tokens file reloaded without error")
	}
	if code := send(t, base, "tmq_second"); code != http.StatusCreated {
		t.Errorf("after a failed reload the previous token gets %d", code)
	}
}

// TestSpanPipelineSwitch: lean is internal/otlpspans, sdk the SDK's
// provider; gRPC is the SDK's on either; no endpoint, no tracing.
func TestSpanPipelineSwitch(t *testing.T) {
	for _, tc := range []struct {
		pipeline string
		env      map[string]string
		want     string
	}{
		{SpanPipelineLean, map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"}, "lean"},
		{SpanPipelineSDK, map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"}, "sdk"},
		{SpanPipelineLean, map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "sdk"},
		{SpanPipelineSDK, map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:1/v1/traces", "OTEL_BSP_MAX_QUEUE_SIZE": "10", "OTEL_TRACES_SAMPLER": "always_off"}, "sdk"},
		{SpanPipelineSDK, nil, "none"},
		{SpanPipelineLean, map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_TRACES_EXPORTER": "none"}, "none"},
	} {
		tel, err := setupTelemetry(context.Background(), tc.pipeline, "", func(k string) string { return tc.env[k] })
		if err != nil {
			t.Fatalf("%s %v: %v", tc.pipeline, tc.env, err)
		}
		got := "other"
		switch tel.tracerProvider.(type) {
		case *otlpspans.Provider:
			got = "lean"
		case *sdktrace.TracerProvider:
			got = "sdk"
		case tracenoop.TracerProvider:
			got = "none"
		}
		if got != tc.want {
			t.Errorf("%s %v: %s tracer provider, want %s", tc.pipeline, tc.env, got, tc.want)
		}
		if err := tel.close(context.Background()); err != nil {
			t.Errorf("close: %v", err)
		}
	}
	// Both pipelines read the variables through the same parser.
	for _, pipeline := range []string{SpanPipelineLean, SpanPipelineSDK} {
		env := map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_BSP_SCHEDULE_DELAY": "soon"}
		if _, err := setupTelemetry(context.Background(), pipeline, "", func(k string) string { return env[k] }); err == nil || !strings.Contains(err.Error(), "OTEL_BSP_SCHEDULE_DELAY") {
			t.Errorf("%s, OTEL_BSP_SCHEDULE_DELAY=soon: err = %v", pipeline, err)
		}
	}
}

func TestFromEnv(t *testing.T) {
	env := map[string]string{"TIDEMQ_FSYNC_RING": "false", "TIDEMQ_WAL_SPARES": "0", "TIDEMQ_SYNC_SPIN": "f", "TIDEMQ_SPAN_PIPELINE": "sdk"}
	c, err := FromEnv(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if c.FsyncRing || c.WALSpares || c.SyncSpin || c.SpanPipeline != SpanPipelineSDK {
		t.Errorf("switches from the environment: %+v", c)
	}
	d := Defaults()
	if !d.FsyncRing || !d.WALSpares || !d.SyncSpin || d.SpanPipeline != SpanPipelineLean {
		t.Errorf("the switches are not on by default: %+v", d)
	}
}

// TestReceiptKeyKeptInDataDir: the first start writes a 32-byte key file
// only the owner reads; the next start reads it, so a handle given before
// a restart still acks. A key file of the wrong size stops the start.
func TestReceiptKeyKeptInDataDir(t *testing.T) {
	cfg := testConfig(t)
	n, err := Start(context.Background(), cfg, quiet())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if code := send(t, "http://"+n.Addr(), ""); code != http.StatusCreated {
		t.Fatalf("send answered %d", code)
	}
	if _, _, err := n.broker.PutSubscription(ctx, "orders", "g", core.SubscriptionConfig{StartFrom: "earliest"}); err != nil {
		t.Fatal(err)
	}
	got, err := n.broker.Pull(ctx, "orders", "g", core.PullRequest{})
	if err != nil || len(got) != 1 {
		t.Fatalf("pull: %d messages, %v", len(got), err)
	}
	if err := n.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(cfg.Data, receiptKeyFile)
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() != core.ReceiptKeyLen || fi.Mode().Perm() != 0o600 {
		t.Errorf("%s: %d bytes, mode %v; want %d and 0600", path, fi.Size(), fi.Mode().Perm(), core.ReceiptKeyLen)
	}
	key, _ := os.ReadFile(path)
	if leftovers, _ := filepath.Glob(filepath.Join(cfg.Data, receiptKeyFile+".tmp*")); len(leftovers) != 0 {
		t.Errorf("temporary files left: %v", leftovers)
	}

	n, err = Start(ctx, cfg, quiet())
	if err != nil {
		t.Fatal(err)
	}
	acked, failed, err := n.broker.Ack(ctx, "orders", "g", []string{got[0].ReceiptHandle})
	if err != nil || acked != 1 || len(failed) != 0 {
		t.Errorf("ack after restart: acked=%d failed=%v err=%v, want 1", acked, failed, err)
	}
	if err := n.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if again, _ := os.ReadFile(path); string(again) != string(key) {
		t.Error("the key changed on the second start")
	}

	if err := os.WriteFile(path, key[:7], 0o600); err != nil {
		t.Fatal(err)
	}
	if n, err := Start(ctx, cfg, quiet()); err == nil {
		_ = n.Shutdown(ctx)
		t.Fatal("started with a 7-byte receipt key")
	}
}

// TestBodyBudgetOnMetrics: --body-budget-bytes reaches the gateway, and
// /metrics shows the budget and what of it is in use.
func TestBodyBudgetOnMetrics(t *testing.T) {
	cfg := testConfig(t)
	cfg.BodyBudgetBytes = 12345
	n, err := Start(context.Background(), cfg, quiet())
	if err != nil {
		t.Fatal(err)
	}
	defer n.Shutdown(context.Background())
	resp, err := http.Get("http://" + n.Addr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{"\ntidemq_http_body_budget_limit_bytes 12345\n", "\ntidemq_http_body_budget_used_bytes 0\n"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q:\n%s", strings.TrimSpace(want), grepLines(string(body), "body_budget"))
		}
	}
}

func grepLines(text, sub string) string {
	var out []string
	for line := range strings.Lines(text) {
		if strings.Contains(line, sub) {
			out = append(out, strings.TrimRight(line, "\n"))
		}
	}
	return strings.Join(out, "\n")
}
