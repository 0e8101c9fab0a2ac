// Command tidemq runs the broker: a single node on its embedded default
// (data in ./data, listening on 127.0.0.1:8080) with no other setup.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"go.opentelemetry.io/otel"
	"golang.org/x/net/netutil"

	"github.com/tidemq/tidemq/core"
	"github.com/tidemq/tidemq/gateway"
	"github.com/tidemq/tidemq/internal/gctune"
	"github.com/tidemq/tidemq/internal/listenlog"
	"github.com/tidemq/tidemq/pebblestore"
	"github.com/tidemq/tidemq/webhook"
)

type config struct {
	addr            string
	data            string
	autoCreate      bool
	fsync           string
	syncSpin        bool
	tokens          string
	maxMessageBytes int
	logLevel        string
	shutdownTimeout time.Duration
	insecure        bool
	jaegerUI        string
	maxConnections  int
	minFreeBytes    int64
	consumerExpiry  time.Duration
}

// parseConfig reads flags, each defaulting to its environment variable.
func parseConfig(args []string, getenv func(string) string) (config, error) {
	var c config
	fs := flag.NewFlagSet("tidemq", flag.ContinueOnError)
	env := func(name, def string) string {
		if v := getenv(name); v != "" {
			return v
		}
		return def
	}
	autoCreate, err := strconv.ParseBool(env("TIDEMQ_AUTO_CREATE", "true"))
	if err != nil {
		return c, fmt.Errorf("TIDEMQ_AUTO_CREATE: %w", err)
	}
	syncSpin, err := strconv.ParseBool(env("TIDEMQ_SYNC_SPIN", "true"))
	if err != nil {
		return c, fmt.Errorf("TIDEMQ_SYNC_SPIN: %w", err)
	}
	maxMsg, err := strconv.Atoi(env("TIDEMQ_MAX_MESSAGE_BYTES", strconv.Itoa(core.DefaultMaxMessageBytes)))
	if err != nil {
		return c, fmt.Errorf("TIDEMQ_MAX_MESSAGE_BYTES: %w", err)
	}
	fs.StringVar(&c.addr, "addr", env("TIDEMQ_ADDR", "127.0.0.1:8080"), "listen address (TIDEMQ_ADDR)")
	fs.StringVar(&c.data, "data", env("TIDEMQ_DATA", "./data"), "data directory (TIDEMQ_DATA)")
	fs.BoolVar(&c.autoCreate, "auto-create", autoCreate, "create missing topics on send and subscriptions on pull (TIDEMQ_AUTO_CREATE)")
	fs.StringVar(&c.fsync, "fsync", env("TIDEMQ_FSYNC", "always"), "always: a send is answered after its batch is fsynced; never: leave it to the OS (TIDEMQ_FSYNC)")
	fs.BoolVar(&c.syncSpin, "sync-spin", syncSpin, "while nothing else wants the CPU, poll for an fsync's completion instead of sleeping: lower latency for a lone producer on a VM, for CPU that is otherwise idle; false where idle CPU is billed or quota'd (TIDEMQ_SYNC_SPIN)")
	fs.StringVar(&c.tokens, "tokens", env("TIDEMQ_TOKENS", ""), "tokens file, YAML or JSON (TIDEMQ_TOKENS)")
	fs.IntVar(&c.maxMessageBytes, "max-message-bytes", maxMsg, "largest message body in bytes (TIDEMQ_MAX_MESSAGE_BYTES)")
	fs.StringVar(&c.logLevel, "log-level", env("TIDEMQ_LOG_LEVEL", "info"), "debug, info, warn or error (TIDEMQ_LOG_LEVEL)")
	fs.DurationVar(&c.shutdownTimeout, "shutdown-timeout", 30*time.Second, "how long SIGTERM waits for in-flight requests")
	fs.BoolVar(&c.insecure, "insecure", env("TIDEMQ_INSECURE", "") == "true", "allow listening beyond loopback without --tokens (TIDEMQ_INSECURE)")
	fs.DurationVar(&c.consumerExpiry, "consumer-expiry", 2*time.Minute, "how long a consumer that stopped pulling stays in subscription stats")
	fs.Int64Var(&c.minFreeBytes, "min-free-bytes", 128<<20, "disk space kept free: below it sends get 507 insufficient_storage until space returns")
	fs.IntVar(&c.maxConnections, "max-connections", 10000, "most client connections served at once; more wait in the listen backlog")
	fs.StringVar(&c.jaegerUI, "jaeger-ui", env("TIDEMQ_JAEGER_UI", ""), "Jaeger UI base URL, for trace links in the console (TIDEMQ_JAEGER_UI)")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	var problems []error
	if c.fsync != "always" && c.fsync != "never" {
		problems = append(problems, fmt.Errorf("--fsync must be always or never, not %q", c.fsync))
	}
	if c.maxMessageBytes < 1 || c.maxMessageBytes > gateway.DefaultMaxRequestBytes {
		problems = append(problems, fmt.Errorf("--max-message-bytes must be between 1 and %d", gateway.DefaultMaxRequestBytes))
	}
	if !c.insecure && c.tokens == "" && !loopback(c.addr) {
		problems = append(problems, fmt.Errorf("--addr %s listens beyond loopback without --tokens: anyone who can reach it could use the broker; give --insecure to do it anyway", c.addr))
	}
	return c, errors.Join(problems...)
}

// loopback reports whether addr listens on loopback only.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "token" {
		os.Exit(tokenCommand(os.Args[2:], os.Stdout, os.Stderr))
	}
	cfg, err := parseConfig(os.Args[1:], os.Getenv)
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
	if err := os.MkdirAll(cfg.data, 0o755); err != nil {
		return fmt.Errorf("data directory: %w", err)
	}
	tel, err := setupTelemetry(ctx, os.Getenv)
	if err != nil {
		return err
	}
	// Export failures and dropped spans are reported through OTel's global
	// handler; send them to our log rather than the standard logger.
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { log.Warn("telemetry", "err", err) }))
	store, err := pebblestore.Open(cfg.data, pebblestore.Options{NoSyncSpin: !cfg.syncSpin, Logger: log})
	if err != nil {
		return err
	}
	notifier := webhook.New(webhook.Options{Logger: log})
	broker, err := core.New(store, core.Options{
		Logger: log, AutoCreate: cfg.autoCreate, NoSync: cfg.fsync == "never",
		MaxMessageBytes: cfg.maxMessageBytes, TracerProvider: tel.tracerProvider,
		MeterProvider: tel.meterProvider, Notifier: notifier, MinFreeBytes: cfg.minFreeBytes,
		ConsumerExpiry: cfg.consumerExpiry,
	})
	if err != nil {
		return errors.Join(err, notifier.Close(), store.Close())
	}
	handler, err := gateway.New(broker, gateway.Options{Logger: log, MaxMessageBytes: cfg.maxMessageBytes,
		MeterProvider: tel.meterProvider, Metrics: tel.metrics, JaegerUI: cfg.jaegerUI})
	if err != nil {
		return errors.Join(err, broker.Close(), notifier.Close(), store.Close())
	}
	if cfg.tokens != "" {
		tokens, err := gateway.LoadTokens(cfg.tokens)
		if err != nil {
			return errors.Join(err, broker.Close(), notifier.Close(), store.Close())
		}
		handler.SetTokens(tokens)
	}
	pusher, err := webhook.NewPusher(broker, webhook.PusherOptions{Logger: log, MeterProvider: tel.meterProvider})
	if err != nil {
		return errors.Join(err, broker.Close(), notifier.Close(), store.Close())
	}
	// SIGHUP re-reads the tokens file; a broken file keeps the old tokens.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	go func() {
		for range hup {
			if cfg.tokens == "" {
				continue
			}
			tokens, err := gateway.LoadTokens(cfg.tokens)
			if err != nil {
				log.Error("tokens file not reloaded; the previous tokens stay in force", "err", err)
				continue
			}
			handler.SetTokens(tokens)
			log.Info("tokens file reloaded", "path", cfg.tokens)
		}
	}()
	ln, err := net.Listen("tcp", cfg.addr)
	if err != nil {
		return errors.Join(err, pusher.Close(), broker.Close(), notifier.Close(), store.Close())
	}
	ln = netutil.LimitListener(ln, cfg.maxConnections)
	srv := &http.Server{
		Handler: handler,
		// A slow client cannot hold a connection forever: headers within
		// 10 s, the whole request within 2 min, idle keep-alives 2 min.
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       2 * time.Minute,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		// No WriteTimeout: it would cut long polls (at most 30 s of wait).
	}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	log.Info(listenlog.Msg, listenlog.AddrKey, ln.Addr().String(), "data", cfg.data, "fsync", cfg.fsync,
		"auto_create", cfg.autoCreate, "tracing", tracingEnabled(os.Getenv), "console", "http://"+ln.Addr().String()+"/")
	if !loopback(ln.Addr().String()) {
		log.Warn("listening beyond loopback without tokens (--insecure): anyone who can reach this port can use the broker")
	}

	select {
	case err := <-serveErr:
		return errors.Join(err, pusher.Close(), broker.Close(), notifier.Close(), store.Close(), tel.close(context.Background()))
	case <-ctx.Done():
	}
	log.Info("shutting down: answering parked pulls, draining requests")
	broker.StopPolling()
	sctx, cancel := context.WithTimeout(context.Background(), cfg.shutdownTimeout)
	defer cancel()
	shutdownErr := srv.Shutdown(sctx)
	if errors.Is(shutdownErr, context.DeadlineExceeded) {
		shutdownErr = errors.Join(shutdownErr, srv.Close())
	}
	err = errors.Join(shutdownErr, pusher.Close(), broker.Close(), notifier.Close(), store.Close(), tel.close(sctx))
	if err == nil {
		log.Info("tidemq stopped cleanly")
	}
	return err
}
