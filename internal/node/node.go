// Package node wires one tidemq broker process together: the Pebble store,
// the broker, the HTTP gateway with its tokens, telemetry (spans, metrics
// for Prometheus), webhook alerts and push delivery, and the HTTP server
// with its limits, and takes them down in order. cmd/tidemq runs it, and
// so does the load tester's in-process broker, so that a benchmark
// measures what the binary runs.
package node

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"golang.org/x/net/netutil"

	"github.com/tidemq/tidemq/core"
	"github.com/tidemq/tidemq/gateway"
	"github.com/tidemq/tidemq/internal/cluster"
	"github.com/tidemq/tidemq/mirror"
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
	broker   *core.Broker // nil on a cluster node: the cluster's leader state holds it
	cluster  *cluster.Cluster
	gw       *gateway.Server
	pusher   *webhook.Pusher // nil on a cluster node
	mirrors  *mirror.Runner  // nil on a cluster node
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
	receiptKey, err := loadReceiptKey(cfg.Data)
	if err != nil {
		return nil, err
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
	n.tel, err = setupTelemetry(ctx, cfg.SpanPipeline, cfg.NodeID, cfg.Getenv)
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
	brokerOpts := core.Options{
		Logger: log, AutoCreate: cfg.AutoCreate, NoSync: cfg.Fsync == "never",
		MaxMessageBytes: cfg.MaxMessageBytes, TracerProvider: n.tel.tracerProvider,
		MeterProvider: n.tel.meterProvider, Notifier: n.notifier, MinFreeBytes: cfg.MinFreeBytes,
		ConsumerExpiry: cfg.ConsumerExpiry, ReceiptKey: receiptKey, DedupWindow: cfg.DedupWindow,
		// Only a broker that serves runs its checks: the single node's, a
		// cluster's leader's (Lead starts it, stepping down closes it).
		TransactionChecker: webhook.NewChecker(webhook.CheckerOptions{Logger: log}),
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, err
	}
	closers = append(closers, ln.Close)
	var served gateway.Broker
	if cfg.Clustered() {
		n.cluster, err = n.startCluster(cfg, ln.Addr().String(), brokerOpts)
		if err != nil {
			return nil, err
		}
		closers = append(closers, n.cluster.Close)
		served = n.cluster.Gateway()
	} else {
		n.broker, err = core.New(n.store, brokerOpts)
		if err != nil {
			return nil, err
		}
		closers = append(closers, n.broker.Close)
		served = n.broker
	}
	gwOpts := gateway.Options{Logger: log, MaxMessageBytes: cfg.MaxMessageBytes,
		BodyBudgetBytes: cfg.BodyBudgetBytes, MeterProvider: n.tel.meterProvider, Metrics: n.tel.metrics, JaegerUI: cfg.JaegerUI,
		Region: cfg.Region}
	if n.cluster != nil {
		gwOpts.Cluster, gwOpts.NodeID = n.cluster, cfg.NodeID
	}
	n.gw, err = gateway.New(served, gwOpts)
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
	if n.broker != nil {
		n.pusher, err = webhook.NewPusher(n.broker, webhook.PusherOptions{Logger: log, MeterProvider: n.tel.meterProvider})
		if err != nil {
			return nil, err
		}
		closers = append(closers, n.pusher.Close)
		n.mirrors, err = mirror.New(n.broker, n.mirrorOptions())
		if err != nil {
			return nil, err
		}
		closers = append(closers, n.mirrors.Close)
	}
	n.ln = netutil.LimitListener(ln, cfg.MaxConnections)
	n.srv = &http.Server{
		Handler: n.handler(),
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
func (n *Node) Handler() http.Handler { return n.handler() }

func (n *Node) handler() http.Handler {
	if n.cluster != nil {
		return n.cluster.Handler(n.gw)
	}
	return n.gw
}

// startCluster joins the node's raft group. While the node leads it, the
// group's broker and push workers run on it; they stop when it does not.
func (n *Node) startCluster(cfg Config, httpAddr string, opts core.Options) (*cluster.Cluster, error) {
	peers, err := cluster.ParsePeers(cfg.Peers)
	if err != nil {
		return nil, err
	}
	if cfg.AdvertiseAddr != "" {
		httpAddr = cfg.AdvertiseAddr
	}
	return cluster.Start(cluster.Config{
		NodeID: cfg.NodeID, ClusterAddr: cfg.ClusterAddr, ClusterAdvertise: cfg.ClusterAdvertise,
		HTTPAdvertise: httpAddr, Peers: peers, Security: cfg.clusterSecurity(), Dir: cfg.Data,
		Store: n.store, Logger: n.log, HeartbeatTimeout: cfg.RaftHeartbeat, MeterProvider: n.tel.meterProvider,
		SnapshotThreshold: cfg.RaftSnapshotThreshold, TrailingLogs: cfg.RaftTrailingLogs, SnapshotInterval: cfg.RaftSnapshotInterval,
		// The followers' polls take at most a quarter of a 3-node leader's
		// connections (half of a 5-node one's), if it has as many as this
		// node: the rest stay for its clients and the other forwarded requests.
		MaxForwardedPolls: max(1, cfg.MaxConnections/8),
		Lead: func(p core.Proposer, receiptKey []byte) (*core.Broker, func() error, error) {
			o := opts
			o.Proposer, o.ReceiptKey = p, receiptKey
			b, err := core.New(n.store, o)
			if err != nil {
				return nil, nil, err
			}
			pusher, err := webhook.NewPusher(b, webhook.PusherOptions{Logger: n.log, MeterProvider: n.tel.meterProvider})
			if err != nil {
				return nil, nil, errors.Join(err, b.Close())
			}
			mirrors, err := mirror.New(b, n.mirrorOptions())
			if err != nil {
				return nil, nil, errors.Join(err, pusher.Close(), b.Close())
			}
			return b, func() error { return errors.Join(mirrors.Close(), pusher.Close(), b.Close()) }, nil
		},
	})
}

// mirrorOptions configure the mirror runner that runs with the broker
// (on a cluster, on the leader only).
func (n *Node) mirrorOptions() mirror.Options {
	return mirror.Options{Logger: n.log, Region: n.cfg.Region, MeterProvider: n.tel.meterProvider}
}

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
// ends (then closes the connections left), and closes the mirror runner,
// pusher, broker, notifier, store and telemetry, in that order. Later calls return the
// first call's result.
func (n *Node) Shutdown(ctx context.Context) error {
	n.shutdownOnce.Do(func() {
		if n.broker != nil {
			n.broker.StopPolling()
		} else if b := n.cluster.Broker(); b != nil {
			b.StopPolling()
		}
		err := n.srv.Shutdown(ctx)
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
			err = errors.Join(err, n.srv.Close())
		}
		var stopBroker error
		if n.cluster != nil {
			stopBroker = n.cluster.Close()
		} else {
			stopBroker = errors.Join(n.mirrors.Close(), n.pusher.Close(), n.broker.Close())
		}
		n.shutdownErr = errors.Join(err, stopBroker, n.notifier.Close(), n.store.Close(), n.tel.close(ctx))
	})
	return n.shutdownErr
}

// receiptKeyFile holds the key that signs receipt handles, in the data
// directory so that handles outlive a restart. The nodes of a cluster will
// have to share one key, so that any leader can judge any member's handles.
const receiptKeyFile = "receipt.key"

// loadReceiptKey reads the receipt key in dir, making it on first start:
// written whole or not at all (temp file, fsync, rename, directory fsync),
// so a crash never leaves a short key that would void every handle.
func loadReceiptKey(dir string) ([]byte, error) {
	path := filepath.Join(dir, receiptKeyFile)
	key, err := os.ReadFile(path)
	if err == nil {
		if len(key) != core.ReceiptKeyLen {
			return nil, fmt.Errorf("receipt key %s: %d bytes, want %d", path, len(key), core.ReceiptKeyLen)
		}
		return key, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("receipt key: %w", err)
	}
	key = make([]byte, core.ReceiptKeyLen)
	_, _ = rand.Read(key) // crypto/rand.Read never fails
	if err := writeFileAtomic(dir, receiptKeyFile, key); err != nil {
		return nil, fmt.Errorf("receipt key: %w", err)
	}
	return key, nil
}

func writeFileAtomic(dir, name string, data []byte) (err error) {
	tmp, err := os.CreateTemp(dir, name+".tmp*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = os.Remove(tmp.Name())
		}
	}()
	// CreateTemp makes the file 0600; say so rather than rely on it.
	if err := tmp.Chmod(0o600); err != nil {
		return errors.Join(err, tmp.Close())
	}
	if _, err := tmp.Write(data); err != nil {
		return errors.Join(err, tmp.Close())
	}
	if err := tmp.Sync(); err != nil {
		return errors.Join(err, tmp.Close())
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), filepath.Join(dir, name)); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	return errors.Join(d.Sync(), d.Close())
}
