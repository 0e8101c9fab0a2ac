// Command tidemq runs the broker: a single node on its embedded default
// (data in ./data, listening on 127.0.0.1:8080) with no other setup.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/tidemq/tidemq/internal/gctune"
	"github.com/tidemq/tidemq/internal/listenlog"
	"github.com/tidemq/tidemq/internal/node"
)

// config is the binary's: the node's settings and the log level.
type config struct {
	node     node.Config
	logLevel string
}

// usage is the head of --help, before the flags.
const usage = `Usage:
  tidemq [flags]          run the broker
  tidemq token [flags]    mint a client token (tidemq token -h)
  tidemq local-cluster    run a cluster of 3 nodes on this machine (tidemq local-cluster -h)

Flags:
`

// parseConfig reads flags, each defaulting to its environment variable.
func parseConfig(args []string, getenv func(string) string, output io.Writer) (config, error) {
	n, err := node.FromEnv(getenv)
	c := config{node: n}
	if err != nil {
		return c, err
	}
	env := func(name, def string) string {
		if v := getenv(name); v != "" {
			return v
		}
		return def
	}
	fs := flag.NewFlagSet("tidemq", flag.ContinueOnError)
	fs.SetOutput(output)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		fs.PrintDefaults()
	}
	nc := &c.node
	fs.StringVar(&nc.Addr, "addr", nc.Addr, "listen address (TIDEMQ_ADDR)")
	fs.StringVar(&nc.Data, "data", nc.Data, "data directory (TIDEMQ_DATA)")
	fs.BoolVar(&nc.AutoCreate, "auto-create", nc.AutoCreate, "create missing topics on send and subscriptions on pull (TIDEMQ_AUTO_CREATE)")
	fs.StringVar(&nc.Fsync, "fsync", nc.Fsync, "always: a send is answered after its batch is fsynced; never: leave it to the OS (TIDEMQ_FSYNC)")
	fs.BoolVar(&nc.SyncSpin, "sync-spin", nc.SyncSpin, "while nothing else wants the CPU, poll for an fsync's completion instead of sleeping: lower latency for a lone producer on a VM, for CPU that is otherwise idle; false where idle CPU is billed or quota'd (TIDEMQ_SYNC_SPIN)")
	fs.BoolVar(&nc.FsyncRing, "fsync-ring", nc.FsyncRing, "fsync the WAL through io_uring where the kernel has it; false: the plain fsync syscall (TIDEMQ_FSYNC_RING)")
	fs.BoolVar(&nc.WALSpares, "wal-spares", nc.WALSpares, "keep pre-allocated WAL files ready for rotation; false: Pebble's own WAL recycling only (TIDEMQ_WAL_SPARES)")
	fs.StringVar(&nc.SpanPipeline, "span-pipeline", nc.SpanPipeline, "lean: spans encoded as they end by tidemq's own OTLP/HTTP exporter; sdk: the stock OpenTelemetry SDK's batch processor and exporter (TIDEMQ_SPAN_PIPELINE)")
	fs.StringVar(&nc.Tokens, "tokens", nc.Tokens, "tokens file, YAML or JSON (TIDEMQ_TOKENS)")
	fs.IntVar(&nc.MaxMessageBytes, "max-message-bytes", nc.MaxMessageBytes, "largest message body in bytes (TIDEMQ_MAX_MESSAGE_BYTES)")
	fs.StringVar(&c.logLevel, "log-level", env("TIDEMQ_LOG_LEVEL", "info"), "debug, info, warn or error (TIDEMQ_LOG_LEVEL)")
	fs.DurationVar(&nc.ShutdownTimeout, "shutdown-timeout", nc.ShutdownTimeout, "how long SIGTERM waits for in-flight requests")
	fs.BoolVar(&nc.Insecure, "insecure", nc.Insecure, "allow listening beyond loopback without --tokens (TIDEMQ_INSECURE)")
	fs.DurationVar(&nc.ConsumerExpiry, "consumer-expiry", nc.ConsumerExpiry, "how long a consumer that stopped pulling stays in subscription stats")
	fs.Int64Var(&nc.MinFreeBytes, "min-free-bytes", nc.MinFreeBytes, "disk space kept free: below it sends get 507 insufficient_storage until space returns")
	fs.IntVar(&nc.MaxConnections, "max-connections", nc.MaxConnections, "most client connections served at once; more wait in the listen backlog")
	fs.Int64Var(&nc.BodyBudgetBytes, "body-budget-bytes", nc.BodyBudgetBytes, "request-body bytes held by all requests in flight together: a request whose body does not fit gets 429 too_many_requests before it is read, unless it is alone (TIDEMQ_BODY_BUDGET_BYTES)")
	fs.StringVar(&nc.JaegerUI, "jaeger-ui", nc.JaegerUI, "Jaeger UI base URL, for trace links in the console (TIDEMQ_JAEGER_UI)")
	fs.StringVar(&nc.Region, "region", nc.Region, "this broker's region, answered by GET /healthz and recorded in the path of every mirrored copy (TIDEMQ_REGION)")
	fs.DurationVar(&nc.DedupWindow, "dedup-window", nc.DedupWindow, "how long a send's dedupKey is remembered (TIDEMQ_DEDUP_WINDOW)")
	fs.StringVar(&nc.NodeID, "node-id", nc.NodeID, "cluster: this node's name; with it the node is a member of a raft group (TIDEMQ_NODE_ID)")
	fs.StringVar(&nc.ClusterAddr, "cluster-addr", nc.ClusterAddr, "cluster: host:port to listen on for node-to-node traffic (TIDEMQ_CLUSTER_ADDR)")
	fs.StringVar(&nc.ClusterAdvertise, "cluster-advertise", nc.ClusterAdvertise, "cluster: host:port the other nodes dial to reach this one; default --cluster-addr (TIDEMQ_CLUSTER_ADVERTISE)")
	fs.StringVar(&nc.AdvertiseAddr, "advertise-addr", nc.AdvertiseAddr, "cluster: HTTP host:port other nodes forward requests to; default --addr (TIDEMQ_ADVERTISE_ADDR)")
	fs.StringVar(&nc.Peers, "peers", nc.Peers, "cluster: id=host:port,... the first members and their cluster addresses, the same on every node of a new cluster; ignored once the data directory belongs to one (TIDEMQ_PEERS)")
	fs.StringVar(&nc.ClusterSecret, "cluster-secret", nc.ClusterSecret, "cluster: file holding the shared secret nodes authenticate each other with (TIDEMQ_CLUSTER_SECRET)")
	fs.StringVar(&nc.ClusterTLSCert, "cluster-tls-cert", nc.ClusterTLSCert, "cluster: mutual TLS certificate file (PEM) (TIDEMQ_CLUSTER_TLS_CERT)")
	fs.StringVar(&nc.ClusterTLSKey, "cluster-tls-key", nc.ClusterTLSKey, "cluster: mutual TLS key file (PEM) (TIDEMQ_CLUSTER_TLS_KEY)")
	fs.StringVar(&nc.ClusterTLSCA, "cluster-tls-ca", nc.ClusterTLSCA, "cluster: CA file (PEM) the other nodes' certificates are checked against (TIDEMQ_CLUSTER_TLS_CA)")
	fs.DurationVar(&nc.RaftHeartbeat, "raft-heartbeat", nc.RaftHeartbeat, "cluster: raft's heartbeat and election timeout; 0 is 500ms (TIDEMQ_RAFT_HEARTBEAT)")
	fs.Uint64Var(&nc.RaftSnapshotThreshold, "raft-snapshot-threshold", nc.RaftSnapshotThreshold, "cluster: raft entries past the last snapshot that make the next one; 0 is 1024 (TIDEMQ_RAFT_SNAPSHOT_THRESHOLD)")
	fs.Uint64Var(&nc.RaftTrailingLogs, "raft-trailing-logs", nc.RaftTrailingLogs, "cluster: raft entries kept behind a snapshot for followers a little behind; 0 is 512 (TIDEMQ_RAFT_TRAILING_LOGS)")
	fs.DurationVar(&nc.RaftSnapshotInterval, "raft-snapshot-interval", nc.RaftSnapshotInterval, "cluster: how often raft checks whether a snapshot is due; 0 is 5s (TIDEMQ_RAFT_SNAPSHOT_INTERVAL)")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	// A cluster node's fsync is one part of a commit that waits on others,
	// and its nodes often share a machine (local-cluster, tests): a spin
	// would take the CPU another node's raft needs. Off unless asked.
	if nc.NodeID != "" && getenv("TIDEMQ_SYNC_SPIN") == "" {
		spinSet := false
		fs.Visit(func(f *flag.Flag) { spinSet = spinSet || f.Name == "sync-spin" })
		nc.SyncSpin = spinSet && nc.SyncSpin
	}
	// flag stops at the first argument that is not a flag: everything after
	// it would be dropped without a word.
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected argument %q: tidemq takes only flags (the subcommands are token and local-cluster, first); see tidemq --help", fs.Arg(0))
	}
	return c, c.node.Check()
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "token" {
		os.Exit(tokenCommand(os.Args[2:], os.Stdout, os.Stderr))
	}
	if len(os.Args) > 1 && os.Args[1] == "local-cluster" {
		os.Exit(localClusterCommand(os.Args[2:], os.Stdout, os.Stderr))
	}
	cfg, err := parseConfig(os.Args[1:], os.Getenv, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "tidemq:", err)
		os.Exit(2)
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(cfg.logLevel)); err != nil {
		fmt.Fprintln(os.Stderr, "tidemq: --log-level:", err)
		os.Exit(2)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	gctune.Apply(os.Getenv)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, cfg, log); err != nil {
		log.Error("tidemq stopped", "err", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, cfg config, log *slog.Logger) error {
	n, err := node.Start(ctx, cfg.node, log)
	if err != nil {
		return err
	}
	// SIGHUP re-reads the tokens file; a broken file keeps the old tokens.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	hupDone := make(chan struct{})
	defer func() { <-hupDone }()
	hupCtx, stopHup := context.WithCancel(ctx)
	defer stopHup()
	go func() {
		defer close(hupDone)
		for {
			select {
			case <-hupCtx.Done():
				return
			case <-hup:
			}
			if cfg.node.Tokens == "" {
				continue
			}
			if err := n.ReloadTokens(); err != nil {
				log.Error("tokens file not reloaded; the previous tokens stay in force", "err", err)
				continue
			}
			log.Info("tokens file reloaded", "path", cfg.node.Tokens)
		}
	}()
	addr := n.Addr()
	log.Info(listenlog.Msg, listenlog.AddrKey, addr, "data", cfg.node.Data, "fsync", cfg.node.Fsync,
		"auto_create", cfg.node.AutoCreate, "tracing", n.Tracing(), "console", "http://"+addr+"/")
	if openToAll(addr, cfg.node.Tokens) {
		log.Warn("listening beyond loopback without tokens (--insecure): anyone who can reach this port can use the broker")
	}

	var serveErr error
	select {
	case serveErr = <-n.ServeErr():
	case <-ctx.Done():
		log.Info("shutting down: answering parked pulls, draining requests")
	}
	sctx, cancel := context.WithTimeout(context.Background(), cfg.node.ShutdownTimeout)
	defer cancel()
	if err := errors.Join(serveErr, n.Shutdown(sctx)); err != nil {
		return err
	}
	log.Info("tidemq stopped cleanly")
	return nil
}

// openToAll reports whether the broker serves beyond loopback with no
// tokens file (only --insecure lets it start so), which deserves a warning.
func openToAll(addr, tokens string) bool {
	return tokens == "" && !node.Loopback(addr)
}
