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
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
	"golang.org/x/net/netutil"

	"github.com/tidemq/tidemq/core"
	"github.com/tidemq/tidemq/gateway"
	"github.com/tidemq/tidemq/internal/otlpspans"
	"github.com/tidemq/tidemq/internal/promexport"
	"github.com/tidemq/tidemq/pebblestore"
)

// The in-process broker is wired like cmd/tidemq with its defaults and
// OTEL_EXPORTER_OTLP_ENDPOINT pointing at the stand-in collector (see
// otlpsink.go; no tracer with -tracing=false): fsync always, auto-create
// on, spans through a batch processor and the OTLP/HTTP exporter, OTel
// metrics through the Prometheus exporter, the same http.Server limits. It leaves
// out the webhook notifier and pusher (no alerts, no push subscriptions in
// a load test).

// profileLabels mark the goroutines of each side, so that a CPU profile of
// this process (client and server share it) can be cut with
// `go tool pprof -tagfocus side=server`: goroutines inherit the labels of
// the goroutine that starts them, and the broker's (appender, Pebble,
// every connection's) all start inside startBroker.
func serverLabels() pprof.LabelSet { return pprof.Labels("side", "server") }
func clientLabels() pprof.LabelSet { return pprof.Labels("side", "client") }

// server is an HTTP server on 127.0.0.1:0 and what it needs closed.
type server struct {
	URL   string
	srv   *http.Server
	close []func() error // in order, after the HTTP server
	dir   string         // removed last, when not empty
}

// Close stops the HTTP server, then the rest, and removes the data.
func (s *server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	errs := []error{s.srv.Shutdown(ctx)}
	for _, f := range s.close {
		errs = append(errs, f())
	}
	if s.dir != "" {
		errs = append(errs, os.RemoveAll(s.dir))
	}
	return errors.Join(errs...)
}

// serve serves h on a fresh loopback port, inside the server labels.
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
	return &server{URL: "http://" + ln.Addr().String(), srv: srv}, nil
}

// startBroker opens a store in a fresh directory under baseDir ("" is the
// system's temp dir), with fsync on, and serves the broker.
func startBroker(baseDir string, log *slog.Logger) (s *server, err error) {
	dir, err := os.MkdirTemp(baseDir, "tidemq-load-broker-")
	if err != nil {
		return nil, fmt.Errorf("broker data dir: %w", err)
	}
	var closers []func() error
	defer func() {
		if err != nil {
			for i := len(closers) - 1; i >= 0; i-- {
				err = errors.Join(err, closers[i]())
			}
			err = errors.Join(err, os.RemoveAll(dir))
		}
	}()
	pprof.Do(context.Background(), serverLabels(), func(context.Context) {
		var store *pebblestore.Store
		// As the binary reads it, so the two fsync waits can be compared.
		spin := true
		if v := os.Getenv("TIDEMQ_SYNC_SPIN"); v != "" {
			if spin, err = strconv.ParseBool(v); err != nil {
				err = fmt.Errorf("TIDEMQ_SYNC_SPIN: %w", err)
				return
			}
		}
		store, err = pebblestore.Open(dir, pebblestore.Options{NoSyncSpin: !spin, Logger: log})
		if err != nil {
			return
		}
		closers = append(closers, store.Close)
		reg := prometheus.NewRegistry()
		var mp *sdkmetric.MeterProvider
		mp, err = promexport.MeterProvider(os.Getenv, reg, nil)
		if err != nil {
			return
		}
		closers = append(closers, func() error { return mp.Shutdown(context.Background()) })
		var tp trace.TracerProvider = tracenoop.NewTracerProvider()
		if tracesEndpoint != "" {
			var exp *otlpspans.Exporter
			exp, err = otlpspans.New(otlpspans.Config{Endpoint: tracesEndpoint + "/v1/traces"})
			if err != nil {
				return
			}
			// As the binary exports over OTLP/HTTP, with the OTEL_BSP defaults.
			stp := otlpspans.NewProvider(exp, otlpspans.ProviderConfig{})
			spanProviders.add(stp)
			closers = append(closers, func() error { return stp.Shutdown(context.Background()) })
			tp = stp
		}
		var br *core.Broker
		br, err = core.New(store, core.Options{Logger: log, AutoCreate: true, MeterProvider: mp, TracerProvider: tp})
		if err != nil {
			return
		}
		closers = append(closers, br.Close)
		var gw *gateway.Server
		gw, err = gateway.New(br, gateway.Options{Logger: log, MeterProvider: mp,
			Metrics: promhttp.HandlerFor(reg, promhttp.HandlerOpts{})})
		if err != nil {
			return
		}
		s, err = serve(gw)
		if err != nil {
			return
		}
		// Parked long polls are answered before the HTTP server drains.
		closers = append(closers, func() error { br.StopPolling(); return nil })
	})
	if err != nil {
		return nil, err
	}
	// Close order: HTTP server, then broker, metrics, store (reverse of
	// opening); StopPolling must run before Shutdown, so it goes first via
	// the shutdown hook below.
	stop := closers[len(closers)-1]
	s.srv.RegisterOnShutdown(func() { _ = stop() })
	for i := len(closers) - 2; i >= 0; i-- {
		s.close = append(s.close, closers[i])
	}
	s.dir = dir
	return s, nil
}

// spanProviders are the in-process brokers' span providers, closed ones
// included, so that a phase can count the spans dropped while it ran.
var spanProviders providerList

type providerList struct {
	mu  sync.Mutex
	all []*otlpspans.Provider
}

func (l *providerList) add(p *otlpspans.Provider) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.all = append(l.all, p)
}

// spansDroppedSoFar is how many spans every in-process broker has dropped
// because its export queue was full.
func spansDroppedSoFar() uint64 {
	spanProviders.mu.Lock()
	defer spanProviders.mu.Unlock()
	var n uint64
	for _, p := range spanProviders.all {
		n += p.Dropped()
	}
	return n
}
