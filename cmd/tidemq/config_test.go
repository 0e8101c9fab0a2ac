package main

import (
	"errors"
	"flag"
	"io"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/tidemq/tidemq/core"
	"github.com/tidemq/tidemq/gateway"
	"github.com/tidemq/tidemq/internal/node"
)

func envOf(kv map[string]string) func(string) string {
	return func(k string) string { return kv[k] }
}

func TestParseConfigDefaults(t *testing.T) {
	c, err := parseConfig(nil, envOf(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := config{logLevel: "info", node: node.Config{
		Addr: "127.0.0.1:8080", Data: "./data", AutoCreate: true, Fsync: "always",
		SyncSpin: true, FsyncRing: true, WALSpares: true, SpanPipeline: "lean",
		MaxMessageBytes: core.DefaultMaxMessageBytes, ShutdownTimeout: 30 * time.Second,
		MaxConnections: 10000, MinFreeBytes: 128 << 20, ConsumerExpiry: 2 * time.Minute,
		BodyBudgetBytes: gateway.DefaultBodyBudgetBytes, Region: "local", DedupWindow: 5 * time.Minute,
	}}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("defaults = %+v, want %+v (SPEC §6)", c, want)
	}
}

func TestParseConfigFlags(t *testing.T) {
	c, err := parseConfig([]string{
		"--addr", "127.0.0.1:9999", "--data", "/var/lib/tidemq", "--auto-create=false", "--fsync", "never", "--sync-spin=false",
		"--max-message-bytes", "1024", "--log-level", "debug", "--shutdown-timeout", "5s",
		"--fsync-ring=false", "--wal-spares=false", "--span-pipeline", "sdk", "--body-budget-bytes", "1048576",
		"--region", "hz", "--dedup-window", "2s",
	}, envOf(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := config{logLevel: "debug", node: node.Config{
		Addr: "127.0.0.1:9999", Data: "/var/lib/tidemq", AutoCreate: false, Fsync: "never",
		SpanPipeline:    "sdk",
		MaxMessageBytes: 1024, ShutdownTimeout: 5 * time.Second,
		MaxConnections: 10000, MinFreeBytes: 128 << 20, ConsumerExpiry: 2 * time.Minute,
		BodyBudgetBytes: 1 << 20, Region: "hz", DedupWindow: 2 * time.Second,
	}}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("flags = %+v, want %+v", c, want)
	}
}

func TestParseConfigEnvFallback(t *testing.T) {
	env := map[string]string{
		"TIDEMQ_ADDR": "127.0.0.1:7000", "TIDEMQ_DATA": "/data", "TIDEMQ_AUTO_CREATE": "false",
		"TIDEMQ_FSYNC": "never", "TIDEMQ_MAX_MESSAGE_BYTES": "2048", "TIDEMQ_LOG_LEVEL": "warn",
		"TIDEMQ_SYNC_SPIN": "false", "TIDEMQ_FSYNC_RING": "false", "TIDEMQ_WAL_SPARES": "false",
		"TIDEMQ_SPAN_PIPELINE": "sdk", "TIDEMQ_BODY_BUDGET_BYTES": "2097152",
		"TIDEMQ_REGION": "sg", "TIDEMQ_DEDUP_WINDOW": "1m",
	}
	c, err := parseConfig(nil, envOf(env), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := config{logLevel: "warn", node: node.Config{
		Addr: "127.0.0.1:7000", Data: "/data", AutoCreate: false, Fsync: "never",
		SpanPipeline:    "sdk",
		MaxMessageBytes: 2048, ShutdownTimeout: 30 * time.Second,
		MaxConnections: 10000, MinFreeBytes: 128 << 20, ConsumerExpiry: 2 * time.Minute,
		BodyBudgetBytes: 2 << 20, Region: "sg", DedupWindow: time.Minute,
	}}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("from the environment = %+v, want %+v", c, want)
	}

	// A flag wins over its variable.
	c, err = parseConfig([]string{"--addr", "127.0.0.1:7001", "--fsync=always", "--auto-create", "--sync-spin", "--fsync-ring", "--wal-spares", "--span-pipeline=lean"}, envOf(env), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if n := c.node; n.Addr != "127.0.0.1:7001" || n.Fsync != "always" || !n.AutoCreate || n.Data != "/data" ||
		!n.SyncSpin || !n.FsyncRing || !n.WALSpares || n.SpanPipeline != "lean" {
		t.Errorf("flags over environment = %+v", c)
	}
}

func TestParseConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want []string // each must appear in the error
	}{
		{"bad --fsync", []string{"--fsync", "sometimes"}, nil, []string{"--fsync", "sometimes"}},
		{"bad TIDEMQ_FSYNC", nil, map[string]string{"TIDEMQ_FSYNC": "maybe"}, []string{"--fsync", "maybe"}},
		{"empty --fsync", []string{"--fsync="}, nil, []string{"--fsync"}},
		{"bad TIDEMQ_AUTO_CREATE", nil, map[string]string{"TIDEMQ_AUTO_CREATE": "perhaps"}, []string{"TIDEMQ_AUTO_CREATE"}},
		{"bad TIDEMQ_MAX_MESSAGE_BYTES", nil, map[string]string{"TIDEMQ_MAX_MESSAGE_BYTES": "4MiB"}, []string{"TIDEMQ_MAX_MESSAGE_BYTES"}},
		{"zero --max-message-bytes", []string{"--max-message-bytes", "0"}, nil, []string{"--max-message-bytes"}},
		{"--max-message-bytes over a request", []string{"--max-message-bytes", "16777217"}, nil, []string{"--max-message-bytes"}},
		{"bad --auto-create", []string{"--auto-create=maybe"}, nil, []string{"auto-create"}},
		{"unknown flag", []string{"--no-such-flag"}, nil, []string{"no-such-flag"}},
		{"bad TIDEMQ_FSYNC_RING", nil, map[string]string{"TIDEMQ_FSYNC_RING": "yes please"}, []string{"TIDEMQ_FSYNC_RING"}},
		{"bad TIDEMQ_WAL_SPARES", nil, map[string]string{"TIDEMQ_WAL_SPARES": "2"}, []string{"TIDEMQ_WAL_SPARES"}},
		{"bad TIDEMQ_SYNC_SPIN", nil, map[string]string{"TIDEMQ_SYNC_SPIN": "spin"}, []string{"TIDEMQ_SYNC_SPIN"}},
		{"bad --region", []string{"--region", "hang zhou"}, nil, []string{"--region", "hang zhou"}},
		{"bad TIDEMQ_DEDUP_WINDOW", nil, map[string]string{"TIDEMQ_DEDUP_WINDOW": "5 minutes"}, []string{"TIDEMQ_DEDUP_WINDOW"}},
		{"negative --dedup-window", []string{"--dedup-window", "-1s"}, nil, []string{"--dedup-window"}},
		{"bad --span-pipeline", []string{"--span-pipeline", "fast"}, nil, []string{"--span-pipeline", "fast"}},
		{"bad TIDEMQ_SPAN_PIPELINE", nil, map[string]string{"TIDEMQ_SPAN_PIPELINE": "otel"}, []string{"--span-pipeline", "otel"}},
		{"bad --fsync-ring", []string{"--fsync-ring=often"}, nil, []string{"fsync-ring"}},
		{"zero --body-budget-bytes", []string{"--body-budget-bytes", "0"}, nil, []string{"--body-budget-bytes"}},
		{"bad TIDEMQ_BODY_BUDGET_BYTES", nil, map[string]string{"TIDEMQ_BODY_BUDGET_BYTES": "128MiB"}, []string{"TIDEMQ_BODY_BUDGET_BYTES"}},
		// flag stops at the first non-flag: the flags after it would be lost.
		{"stray argument", []string{"bogus", "--addr", "127.0.0.1:1"}, nil, []string{`"bogus"`, "only flags"}},
		{"stray argument after flags", []string{"--addr", "127.0.0.1:1", "run"}, nil, []string{`"run"`}},
		{"non-numeric --max-message-bytes", []string{"--max-message-bytes", "x"}, nil, []string{"max-message-bytes"}},
		// Every problem is reported at once.
		{"all problems", []string{"--fsync", "bad", "--max-message-bytes", "-1"}, nil, []string{"--fsync", "--max-message-bytes"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseConfig(tc.args, envOf(tc.env), io.Discard)
			if err == nil {
				t.Fatalf("parseConfig(%q, %v) = nil error", tc.args, tc.env)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestParseConfigHelp(t *testing.T) {
	if _, err := parseConfig([]string{"-h"}, envOf(nil), io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: err = %v, want flag.ErrHelp", err)
	}
}

func TestParseConfigMaxMessageBytesBound(t *testing.T) {
	// The largest message body allowed is one whole request.
	c, err := parseConfig([]string{"--max-message-bytes", "16777216"}, envOf(nil), io.Discard)
	if err != nil || c.node.MaxMessageBytes != gateway.DefaultMaxRequestBytes {
		t.Errorf("--max-message-bytes 16777216: %+v, %v", c, err)
	}
}

// SPEC §5: --insecure lets a server without tokens listen beyond loopback.
func TestRegressionInsecureFlag(t *testing.T) {
	if _, err := parseConfig([]string{"--addr", "0.0.0.0:8080", "--insecure"}, envOf(nil), io.Discard); err != nil {
		t.Errorf("--insecure: %v", err)
	}
}

// A cluster node does not spin on fsyncs unless asked: its nodes often
// share a machine, where one node's spin takes another's CPU.
func TestClusterNodeSyncSpinOffUnlessAsked(t *testing.T) {
	cluster := []string{"--node-id", "n1", "--cluster-addr", "127.0.0.1:7001", "--peers", "n1=127.0.0.1:7001"}
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want bool
	}{
		{"single node", nil, nil, true},
		{"cluster node", cluster, nil, false},
		{"cluster node, flag", append([]string{"--sync-spin=true"}, cluster...), nil, true},
		{"cluster node, env", cluster, map[string]string{"TIDEMQ_SYNC_SPIN": "true"}, true},
	} {
		c, err := parseConfig(tc.args, envOf(tc.env), io.Discard)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if c.node.SyncSpin != tc.want {
			t.Errorf("%s: SyncSpin %v, want %v", tc.name, c.node.SyncSpin, tc.want)
		}
	}
}
