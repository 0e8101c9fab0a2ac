package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/tidemq/tidemq/internal/otlpspans"
	"github.com/tidemq/tidemq/internal/promexport"
)

// telemetry is what the binary exports: spans over OTLP when the standard
// OTEL_* variables ask for it, and metrics for Prometheus at /metrics.
type telemetry struct {
	tracerProvider trace.TracerProvider
	meterProvider  *sdkmetric.MeterProvider
	metrics        http.Handler
	shutdown       []func(context.Context) error
}

// tracingEnabled reads the standard variables: an OTLP endpoint turns
// export on; OTEL_TRACES_EXPORTER=none or OTEL_SDK_DISABLED=true turn it off.
func tracingEnabled(getenv func(string) string) bool {
	if strings.EqualFold(getenv("OTEL_SDK_DISABLED"), "true") || getenv("OTEL_TRACES_EXPORTER") == "none" {
		return false
	}
	return getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

func setupTelemetry(ctx context.Context, getenv func(string) string) (*telemetry, error) {
	t := &telemetry{tracerProvider: tracenoop.NewTracerProvider()}
	service := getenv("OTEL_SERVICE_NAME")
	if service == "" {
		service = "tidemq"
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(semconv.ServiceName(service)))
	if err != nil {
		return nil, fmt.Errorf("telemetry resource: %w", err)
	}
	if tracingEnabled(getenv) {
		protocol := getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
		if protocol == "" {
			protocol = getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
		}
		switch protocol {
		case "grpc":
			exp, err := otlptracegrpc.New(ctx)
			if err != nil {
				return nil, fmt.Errorf("otlp exporter: %w", err)
			}
			// The batch processor exports off the hot path; the sampler
			// comes from OTEL_TRACES_SAMPLER / OTEL_TRACES_SAMPLER_ARG.
			tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
			t.tracerProvider = tp
			t.shutdown = append(t.shutdown, tp.Shutdown)
		case "", "http/protobuf":
			// Our own OTLP/HTTP path: the SDK's spans and the stock
			// exporter cost more per message than the broker's own work
			// (internal/otlpspans). Same OTEL_* variables.
			tp, err := newSpanProvider(getenv, res)
			if err != nil {
				return nil, err
			}
			t.tracerProvider = tp
			t.shutdown = append(t.shutdown, tp.Shutdown)
		default:
			return nil, fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL %q: want grpc or http/protobuf", protocol)
		}
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	mp, err := promexport.MeterProvider(getenv, reg, res)
	if err != nil {
		return nil, err
	}
	t.meterProvider = mp
	t.shutdown = append(t.shutdown, t.meterProvider.Shutdown)
	t.metrics = promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	return t, nil
}

func newSpanProvider(getenv func(string) string, res *resource.Resource) (*otlpspans.Provider, error) {
	cfg, err := otlpspans.ConfigFromEnv(getenv)
	if err != nil {
		return nil, fmt.Errorf("otlp exporter: %w", err)
	}
	exp, err := otlpspans.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("otlp exporter: %w", err)
	}
	pcfg, err := otlpspans.ProviderConfigFromEnv(getenv)
	if err != nil {
		return nil, fmt.Errorf("tracing: %w", err)
	}
	pcfg.Resource = res
	return otlpspans.NewProvider(exp, pcfg), nil
}

// close flushes spans still buffered.
func (t *telemetry) close(ctx context.Context) error {
	var errs []error
	for _, f := range t.shutdown {
		errs = append(errs, f(ctx))
	}
	return errors.Join(errs...)
}
