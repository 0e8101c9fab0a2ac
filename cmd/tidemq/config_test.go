package main

import (
	"errors"
	"flag"
	"strings"
	"testing"
	"time"

	"github.com/tidemq/tidemq/core"
	"github.com/tidemq/tidemq/gateway"
)

func envOf(kv map[string]string) func(string) string {
	return func(k string) string { return kv[k] }
}

func TestParseConfigDefaults(t *testing.T) {
	c, err := parseConfig(nil, envOf(nil))
	if err != nil {
		t.Fatal(err)
	}
	want := config{
		addr: "127.0.0.1:8080", data: "./data", autoCreate: true, fsync: "always", syncSpin: true,
		maxMessageBytes: core.DefaultMaxMessageBytes, logLevel: "info", shutdownTimeout: 30 * time.Second,
		maxConnections: 10000, minFreeBytes: 128 << 20, consumerExpiry: 2 * time.Minute,
	}
	if c != want {
		t.Errorf("defaults = %+v, want %+v (SPEC §6)", c, want)
	}
}

func TestParseConfigFlags(t *testing.T) {
	c, err := parseConfig([]string{
		"--addr", "127.0.0.1:9999", "--data", "/var/lib/tidemq", "--auto-create=false", "--fsync", "never", "--sync-spin=false",
		"--max-message-bytes", "1024", "--log-level", "debug", "--shutdown-timeout", "5s",
	}, envOf(nil))
	if err != nil {
		t.Fatal(err)
	}
	want := config{
		addr: "127.0.0.1:9999", data: "/var/lib/tidemq", autoCreate: false, fsync: "never",
		maxMessageBytes: 1024, logLevel: "debug", shutdownTimeout: 5 * time.Second,
		maxConnections: 10000, minFreeBytes: 128 << 20, consumerExpiry: 2 * time.Minute,
	}
	if c != want {
		t.Errorf("flags = %+v, want %+v", c, want)
	}
}

func TestParseConfigEnvFallback(t *testing.T) {
	env := map[string]string{
		"TIDEMQ_ADDR": "127.0.0.1:7000", "TIDEMQ_DATA": "/data", "TIDEMQ_AUTO_CREATE": "false",
		"TIDEMQ_FSYNC": "never", "TIDEMQ_MAX_MESSAGE_BYTES": "2048", "TIDEMQ_LOG_LEVEL": "warn",
		"TIDEMQ_SYNC_SPIN": "false",
	}
	c, err := parseConfig(nil, envOf(env))
	if err != nil {
		t.Fatal(err)
	}
	want := config{
		addr: "127.0.0.1:7000", data: "/data", autoCreate: false, fsync: "never",
		maxMessageBytes: 2048, logLevel: "warn", shutdownTimeout: 30 * time.Second,
		maxConnections: 10000, minFreeBytes: 128 << 20, consumerExpiry: 2 * time.Minute,
	}
	if c != want {
		t.Errorf("from the environment = %+v, want %+v", c, want)
	}

	// A flag wins over its variable.
	c, err = parseConfig([]string{"--addr", "127.0.0.1:7001", "--fsync=always", "--auto-create"}, envOf(env))
	if err != nil {
		t.Fatal(err)
	}
	if c.addr != "127.0.0.1:7001" || c.fsync != "always" || !c.autoCreate || c.data != "/data" {
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
		{"non-numeric --max-message-bytes", []string{"--max-message-bytes", "x"}, nil, []string{"max-message-bytes"}},
		// Every problem is reported at once.
		{"all problems", []string{"--fsync", "bad", "--max-message-bytes", "-1"}, nil, []string{"--fsync", "--max-message-bytes"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseConfig(tc.args, envOf(tc.env))
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
	if _, err := parseConfig([]string{"-h"}, envOf(nil)); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: err = %v, want flag.ErrHelp", err)
	}
}

func TestParseConfigMaxMessageBytesBound(t *testing.T) {
	// The largest message body allowed is one whole request.
	c, err := parseConfig([]string{"--max-message-bytes", "16777216"}, envOf(nil))
	if err != nil || c.maxMessageBytes != gateway.DefaultMaxRequestBytes {
		t.Errorf("--max-message-bytes 16777216: %+v, %v", c, err)
	}
}

// SPEC §5: --insecure lets a server without tokens listen beyond loopback.
func TestRegressionInsecureFlag(t *testing.T) {
	if _, err := parseConfig([]string{"--addr", "0.0.0.0:8080", "--insecure"}, envOf(nil)); err != nil {
		t.Errorf("--insecure: %v", err)
	}
}
