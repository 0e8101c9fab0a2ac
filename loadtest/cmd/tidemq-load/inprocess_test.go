package main

import (
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestInProcessBrokerReadsTheBinarysSwitches: the switches come from the
// binary's variables, and what a load run fixes (port, data, fsync,
// tokens) is not taken from them.
func TestInProcessBrokerReadsTheBinarysSwitches(t *testing.T) {
	env := map[string]string{
		"TIDEMQ_SYNC_SPIN": "false", "TIDEMQ_FSYNC_RING": "false", "TIDEMQ_WAL_SPARES": "false",
		"TIDEMQ_SPAN_PIPELINE": "sdk", "TIDEMQ_FSYNC": "never", "TIDEMQ_ADDR": "127.0.0.1:8080",
		"TIDEMQ_TOKENS": "/etc/tidemq/tokens.yaml", "TIDEMQ_AUTO_CREATE": "false",
		"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://elsewhere:4318/v1/traces", "OTEL_SERVICE_NAME": "bench",
	}
	getenv := func(k string) string { return env[k] }
	tracesEndpoint = "http://127.0.0.1:1"
	t.Cleanup(func() { tracesEndpoint = "" })
	cfg, err := brokerConfig(getenv, "/tmp/d")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.SyncSpin || cfg.FsyncRing || cfg.WALSpares || cfg.SpanPipeline != "sdk" {
		t.Errorf("switches not read from the environment: %+v", cfg)
	}
	if cfg.Addr != "127.0.0.1:0" || cfg.Data != "/tmp/d" || cfg.Fsync != "always" || cfg.Tokens != "" || !cfg.AutoCreate {
		t.Errorf("a load run's fixed settings taken from the environment: %+v", cfg)
	}
	if got := cfg.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT"); got != tracesEndpoint {
		t.Errorf("OTLP endpoint %q, want the stand-in collector's %q", got, tracesEndpoint)
	}
	if got := cfg.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"); got != "" {
		t.Errorf("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT %q would send spans past the collector", got)
	}
	if got := cfg.Getenv("OTEL_SERVICE_NAME"); got != "bench" {
		t.Errorf("OTEL_SERVICE_NAME %q, want the process's", got)
	}

	env["TIDEMQ_WAL_SPARES"] = "spare"
	if _, err := brokerConfig(getenv, "/tmp/d"); err == nil || !strings.Contains(err.Error(), "TIDEMQ_WAL_SPARES") {
		t.Errorf("TIDEMQ_WAL_SPARES=spare: err = %v", err)
	}
}

// TestInProcessBrokerExportsSpansOnEitherPipeline starts the real
// in-process broker on each span pipeline, sends a message, and finds its
// spans at the stand-in collector once the broker has closed (which
// flushes them).
func TestInProcessBrokerExportsSpansOnEitherPipeline(t *testing.T) {
	for _, pipeline := range []string{"lean", "sdk"} {
		t.Run(pipeline, func(t *testing.T) {
			t.Setenv("TIDEMQ_SPAN_PIPELINE", pipeline)
			sink, err := startOTLPSink()
			if err != nil {
				t.Fatal(err)
			}
			defer sink.Close()
			tracesEndpoint = sink.URL
			defer func() { tracesEndpoint = "" }()
			b, err := startBroker(t.TempDir(), slog.New(slog.NewTextHandler(io.Discard, nil)))
			if err != nil {
				t.Fatal(err)
			}
			hc := &http.Client{Timeout: 10 * time.Second}
			resp, err := hc.Post(b.URL+"/v1/topics/orders/messages", "application/json", strings.NewReader(`{"body":"hello"}`))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusCreated {
				t.Fatalf("send answered %d", resp.StatusCode)
			}
			if err := b.Close(); err != nil {
				t.Fatal(err)
			}
			if n := sink.spans.Load(); n == 0 || sink.bad.Load() != 0 {
				t.Errorf("the collector received %d spans (%d malformed exports), want some and none", n, sink.bad.Load())
			}
		})
	}
}
