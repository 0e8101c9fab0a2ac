package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime/pprof"
	"sync"
	"time"

	"golang.org/x/net/netutil"

	"github.com/tidemq/tidemq/internal/node"
)

// The in-process broker is cmd/tidemq's, started through internal/node
// with the configuration the binary reads from its TIDEMQ_* variables
// (the switches TIDEMQ_SYNC_SPIN, TIDEMQ_FSYNC_RING, TIDEMQ_WAL_SPARES and
// TIDEMQ_SPAN_PIPELINE included, for A/B runs), except what a load run
// fixes: a fresh data dir, a free loopback port, fsync always, auto-create
// on, no tokens. Its OTEL_* variables are the process's, with the OTLP
// endpoint pointed at the stand-in collector (see otlpsink.go), or tracing
// off with -tracing=false.

// profileLabels mark the goroutines of each side, so that a CPU profile of
// this process (client and server share it) can be cut with
// `go tool pprof -tagfocus side=server`: goroutines inherit the labels of
// the goroutine that starts them, and the broker's (appender, Pebble,
// every connection's) all start inside startBroker.
func serverLabels() pprof.LabelSet { return pprof.Labels("side", "server") }
func clientLabels() pprof.LabelSet { return pprof.Labels("side", "client") }

// server is an HTTP server on 127.0.0.1:0 and how to stop it.
type server struct {
	URL      string
	shutdown func(context.Context) error // drains the HTTP server, then closes the rest
	dir      string                      // removed last, when not empty
}

// Close stops the server and removes its data.
func (s *server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := s.shutdown(ctx)
	if s.dir != "" {
		err = errors.Join(err, os.RemoveAll(s.dir))
	}
	return err
}

// serve serves h on a fresh loopback port, inside the server labels, with
// the broker's HTTP server limits.
func serve(h http.Handler) (*server, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	ln = netutil.LimitListener(ln, 10000)
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       2 * time.Minute,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
	}
	pprof.Do(context.Background(), serverLabels(), func(context.Context) {
		go func() { _ = srv.Serve(ln) }() // ends with Shutdown
	})
	return &server{URL: "http://" + ln.Addr().String(), shutdown: srv.Shutdown}, nil
}

// brokerConfig is the in-process broker's configuration, read from getenv
// as the binary reads it, in the data directory dir.
func brokerConfig(getenv func(string) string, dir string) (node.Config, error) {
	cfg, err := node.FromEnv(getenv)
	if err != nil {
		return cfg, err
	}
	cfg.Addr, cfg.Data, cfg.Fsync, cfg.AutoCreate, cfg.Tokens = "127.0.0.1:0", dir, "always", true, ""
	endpoint := tracesEndpoint
	cfg.Getenv = func(name string) string {
		switch name {
		case "OTEL_EXPORTER_OTLP_ENDPOINT":
			return endpoint
		case "OTEL_EXPORTER_OTLP_PROTOCOL":
			return "http/protobuf"
		case "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL":
			return "" // the generic ones above apply
		case "OTEL_TRACES_EXPORTER":
			if endpoint == "" {
				return "none"
			}
		}
		return getenv(name)
	}
	return cfg, nil
}

// startBroker starts the broker in a fresh directory under baseDir (""
// is the system's temp dir), inside the server labels.
func startBroker(baseDir string, log *slog.Logger) (*server, error) {
	dir, err := os.MkdirTemp(baseDir, "tidemq-load-broker-")
	if err != nil {
		return nil, fmt.Errorf("broker data dir: %w", err)
	}
	cfg, err := brokerConfig(os.Getenv, dir)
	if err != nil {
		return nil, errors.Join(err, os.RemoveAll(dir))
	}
	var n *node.Node
	pprof.Do(context.Background(), serverLabels(), func(ctx context.Context) {
		n, err = node.Start(ctx, cfg, log)
	})
	if err != nil {
		return nil, errors.Join(err, os.RemoveAll(dir))
	}
	nodes.add(n)
	shutdown := func(ctx context.Context) error {
		err := n.Shutdown(ctx)
		nodes.remove(n)
		return err
	}
	return &server{URL: "http://" + n.Addr(), shutdown: shutdown, dir: dir}, nil
}

// nodes are the running in-process brokers and the spans dropped by those
// closed, so that a phase can count the spans dropped while it ran.
var nodes nodeList

type nodeList struct {
	mu     sync.Mutex
	live   map[*node.Node]struct{}
	closed uint64 // spans dropped by closed nodes
}

func (l *nodeList) add(n *node.Node) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.live == nil {
		l.live = make(map[*node.Node]struct{})
	}
	l.live[n] = struct{}{}
}

// remove keeps n's count and lets the node go.
func (l *nodeList) remove(n *node.Node) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed += n.SpansDropped()
	delete(l.live, n)
}

// spansDroppedSoFar is how many spans every in-process broker has dropped
// because its export queue was full (counted on the lean span pipeline
// only).
func spansDroppedSoFar() uint64 {
	nodes.mu.Lock()
	defer nodes.mu.Unlock()
	n := nodes.closed
	for nd := range nodes.live {
		n += nd.SpansDropped()
	}
	return n
}
