package main

import (
	"bytes"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
)

// TestScenarioSpreadsOverCommaSeparatedURLs runs one scenario with -url
// naming two front doors of one in-process broker (as a cluster's nodes
// are): both carry sends, and the run's report counts every message.
func TestScenarioSpreadsOverCommaSeparatedURLs(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	b, err := startBroker(t.TempDir(), log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	target, err := url.Parse(b.URL)
	if err != nil {
		t.Fatal(err)
	}
	var sends [2]atomic.Int64
	var urls []string
	for i := range sends {
		proxy := httputil.NewSingleHostReverseProxy(target)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if strings.HasSuffix(r.URL.Path, "/messages") {
				sends[i].Add(1)
			}
			proxy.ServeHTTP(w, r)
		}))
		t.Cleanup(srv.Close)
		urls = append(urls, srv.URL)
	}
	c, err := parseFlags([]string{"-url", strings.Join(urls, ","), "-producers", "4", "-messages", "200", "-size", "64", "-warmup", "0", "-quiet"})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := runScenario(t.Context(), c, log, io.Discard, &out); err != nil {
		t.Fatalf("runScenario: %v\n%s", err, out.String())
	}
	for i := range sends {
		if sends[i].Load() == 0 {
			t.Errorf("front door %d served no sends: %d, %d", i, sends[0].Load(), sends[1].Load())
		}
	}
	if got := sends[0].Load() + sends[1].Load(); got != 200 {
		t.Errorf("%d single sends served, want 200", got)
	}
	if _, err := parseFlags([]string{"-suite", "targets", "-url", strings.Join(urls, ",")}); err == nil {
		t.Error("-suite with two URLs: accepted")
	}
}
