// Package node wires one tidemq broker process together: the Pebble store,
// the broker, the HTTP gateway with its tokens, telemetry (spans, metrics
// for Prometheus), webhook alerts and push delivery, and the HTTP server
// with its limits, and takes them down in order. cmd/tidemq runs it, and
// so does the load tester's in-process broker, so that a benchmark
// measures what the binary runs.
package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"golang.org/x/net/netutil"

	"github.com/tidemq/tidemq/core"
	"github.com/tidemq/tidemq/gateway"
	"github.com/tidemq/tidemq/pebblestore"
	"github.com/tidemq/tidemq/webhook"
)

// Node is a running broker, serving HTTP from Start until Shutdown.
type Node struct {
	cfg      Config
	log      *slog.Logger
	tel      *telemetry
	tracing  bool
	store    *pebblestore.Store
	notifier *webhook.Notifier
	broker   *core.Broker
	gw       *gateway.Server
	pusher   *webhook.Pusher
	ln       net.Listener
	srv      *http.Server
	serveErr chan error

	shutdownOnce sync.Once
	shutdownErr  error
}

// Start opens the store in cfg.Data (creating it), starts the broker and
// serves it on cfg.Addr. ctx bounds the start only (the telemetry
// exporters' set-up); the node runs until Shutdown. Goroutines the node
// starts inherit the caller's pprof labels.
func Start(ctx context.Context, cfg Config, log *slog.Logger) (_ *Node, err error) {
	if err := cfg.Check(); err != nil {
		return nil, err
	}
	if cfg.Getenv == nil {
		cfg.Getenv = os.Getenv
	}
	if err := os.MkdirAll(cfg.Data, 0o755); err != nil {
		return nil, fmt.Errorf("data directory: %w", err)
	}
	n := &Node{cfg: cfg, log: log, tracing: TracingEnabled(cfg.Getenv), serveErr: make(chan error, 1)}
	// On failure, what was opened is closed again, newest first.
	var closers []func() error
	defer func() {
		if err != nil {
			for i := len(closers) - 1; i >= 0; i-- {
				err = errors.Join(err, closers[i]())
			}
		}
	}()
	n.tel, err = setupTelemetry(ctx, cfg.SpanPipeline, cfg.Getenv)
	if err != nil {
		return nil, err
	}
	closers = append(closers, func() error { return n.tel.close(context.Background()) })
	// Export failures and dropped spans are reported through OTel's global
	// handler; send them to our log rather than the standard logger.
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { log.Warn("telemetry", "err", err) }))

	n.store, err = pebblestore.Open(cfg.Data, pebblestore.Options{
		NoSyncSpin: !cfg.SyncSpin, NoFsyncRing: !cfg.FsyncRing, NoWALSpares: !cfg.WALSpares,
		MeterProvider: n.tel.meterProvider, Logger: log,
	})
	if err != nil {
		return nil, err
	}
	closers = append(closers, n.store.Close)
	n.notifier = webhook.New(webhook.Options{Logger: log})
	closers = append(closers, n.notifier.Close)
	n.broker, err = core.New(n.store, core.Options{
		Logger: log, AutoCreate: cfg.AutoCreate, NoSync: cfg.Fsync == "never",
		MaxMessageBytes: cfg.MaxMessageBytes, TracerProvider: n.tel.tracerProvider,
		MeterProvider: n.tel.meterProvider, Notifier: n.notifier, MinFreeBytes: cfg.MinFreeBytes,
		ConsumerExpiry: cfg.ConsumerExpiry,
	})
	if err != nil {
		return nil, err
	}
	closers = append(closers, n.broker.Close)
	n.gw, err = gateway.New(n.broker, gateway.Options{Logger: log, MaxMessageBytes: cfg.MaxMessageBytes,
		MeterProvider: n.tel.meterProvider, Metrics: n.tel.metrics, JaegerUI: cfg.JaegerUI})
	if err != nil {
		return nil, err
	}
	if cfg.Tokens != "" {
		tokens, err := gateway.LoadTokens(cfg.Tokens)
		if err != nil {
			return nil, err
		}
		n.gw.SetTokens(tokens)
	}
	n.pusher, err = webhook.NewPusher(n.broker, webhook.PusherOptions{Logger: log, MeterProvider: n.tel.meterProvider})
	if err != nil {
		return nil, err
	}
	closers = append(closers, n.pusher.Close)
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, err
	}
	n.ln = netutil.LimitListener(ln, cfg.MaxConnections)
	n.srv = &http.Server{
		Handler: n.gw,
		// A slow client cannot hold a connection forever: headers within
		// 10 s, the whole request within 2 min, idle keep-alives 2 min.
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       2 * time.Minute,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		// No WriteTimeout: it would cut long polls (at most 30 s of wait).
	}
	go func() {
		if err := n.srv.Serve(n.ln); !errors.Is(err, http.ErrServerClosed) {
			n.serveErr <- err
		}
	}()
	return n, nil
}

// Addr is the address the node listens on (its port when cfg.Addr had 0).
func (n *Node) Addr() string { return n.ln.Addr().String() }

// Handler is the HTTP API the node serves.
func (n *Node) Handler() http.Handler { return n.gw }

// Tracing reports whether spans are exported (the OTEL_* variables asked).
func (n *Node) Tracing() bool { return n.tracing }

// ServeErr yields the HTTP server's error if it stops serving on its own
// (the listener failed); it stays silent on Shutdown.
func (n *Node) ServeErr() <-chan error { return n.serveErr }

// ReloadTokens re-reads the tokens file (the binary's SIGHUP). A file that
// does not load is an error and the previous tokens stay in force; without
// a tokens file it does nothing.
func (n *Node) ReloadTokens() error {
	if n.cfg.Tokens == "" {
		return nil
	}
	tokens, err := gateway.LoadTokens(n.cfg.Tokens)
	if err != nil {
		return err
	}
	n.gw.SetTokens(tokens)
	return nil
}

// SpansDropped is how many spans the node dropped because its export
// queue was full. Only the lean pipeline counts them (the SDK's batch
// processor does not tell): 0 on the sdk pipeline.
func (n *Node) SpansDropped() uint64 {
	if n.tel.lean == nil {
		return 0
	}
	return n.tel.lean.Dropped()
}

// Shutdown answers parked long polls, drains in-flight requests until ctx
// ends (then closes the connections left), and closes the pusher, broker,
// notifier, store and telemetry, in that order. Later calls return the
// first call's result.
func (n *Node) Shutdown(ctx context.Context) error {
	n.shutdownOnce.Do(func() {
		n.broker.StopPolling()
		err := n.srv.Shutdown(ctx)
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
			err = errors.Join(err, n.srv.Close())
		}
		n.shutdownErr = errors.Join(err, n.pusher.Close(), n.broker.Close(), n.notifier.Close(),
			n.store.Close(), n.tel.close(ctx))
	})
	return n.shutdownErr
}
