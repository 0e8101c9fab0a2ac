package node

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/tidemq/tidemq/internal/otlpspans"
	"github.com/tidemq/tidemq/internal/promexport"
)

// telemetry is what a node exports: spans over OTLP when the standard
// OTEL_* variables ask for it, and metrics for Prometheus at /metrics.
type telemetry struct {
	tracerProvider trace.TracerProvider
	lean           *otlpspans.Provider // the tracer provider on the lean pipeline, for its drop count
	meterProvider  *sdkmetric.MeterProvider
	metrics        http.Handler
	shutdown       []func(context.Context) error
}

// TracingEnabled reads the standard variables: an OTLP endpoint turns
// export on; OTEL_TRACES_EXPORTER=none or OTEL_SDK_DISABLED=true turn it off.
func TracingEnabled(getenv func(string) string) bool {
	if strings.EqualFold(getenv("OTEL_SDK_DISABLED"), "true") || getenv("OTEL_TRACES_EXPORTER") == "none" {
		return false
	}
	return getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// setupTelemetry makes the node's span and metric pipelines; a cluster
// node's spans carry its id (service.instance.id), so a trace shows which
// node handled each part of a forwarded request.
func setupTelemetry(ctx context.Context, pipeline, nodeID string, getenv func(string) string) (t *telemetry, err error) {
	t = &telemetry{tracerProvider: tracenoop.NewTracerProvider()}
	defer func() {
		if err != nil {
			err = errors.Join(err, t.close(ctx))
		}
	}()
	service := getenv("OTEL_SERVICE_NAME")
	if service == "" {
		service = "tidemq"
	}
	attrs := []attribute.KeyValue{semconv.ServiceName(service)}
	if nodeID != "" {
		attrs = append(attrs, semconv.ServiceInstanceID(nodeID))
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(attrs...))
	if err != nil {
		return t, fmt.Errorf("telemetry resource: %w", err)
	}
	if TracingEnabled(getenv) {
		protocol := getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
		if protocol == "" {
			protocol = getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
		}
		switch {
		case protocol == "grpc":
			// The lean pipeline speaks OTLP/HTTP only: gRPC is the SDK's
			// on either setting, its exporter configured by the process
			// environment.
			exp, err := otlptracegrpc.New(ctx)
			if err != nil {
				return t, fmt.Errorf("otlp exporter: %w", err)
			}
			// The sampler comes from OTEL_TRACES_SAMPLER / _ARG.
			tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
			t.tracerProvider = tp
			t.shutdown = append(t.shutdown, tp.Shutdown)
		case protocol != "" && protocol != "http/protobuf":
			return t, fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL %q: want grpc or http/protobuf", protocol)
		case pipeline == SpanPipelineSDK:
			tp, err := newSDKSpanProvider(ctx, getenv, res)
			if err != nil {
				return t, err
			}
			t.tracerProvider = tp
			t.shutdown = append(t.shutdown, tp.Shutdown)
		default:
			// The SDK's spans and the stock exporter cost more per message
			// than the broker's own work (internal/otlpspans).
			tp, err := newLeanSpanProvider(getenv, res)
			if err != nil {
				return t, err
			}
			t.tracerProvider, t.lean = tp, tp
			t.shutdown = append(t.shutdown, tp.Shutdown)
		}
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	mp, err := promexport.MeterProvider(getenv, reg, res)
	if err != nil {
		return t, err
	}
	t.meterProvider = mp
	t.shutdown = append(t.shutdown, t.meterProvider.Shutdown)
	t.metrics = promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	return t, nil
}

func newLeanSpanProvider(getenv func(string) string, res *resource.Resource) (*otlpspans.Provider, error) {
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

// newSDKSpanProvider is the stock pipeline: sdktrace's provider and batch
// span processor, and otlptracehttp. The OTEL_* variables are read through
// the same parsers as the lean pipeline's and handed over as options, so
// both honour the same settings from the same getenv (and refuse the same
// malformed values); what neither parser reads the SDK takes from the
// process environment.
func newSDKSpanProvider(ctx context.Context, getenv func(string) string, res *resource.Resource) (*sdktrace.TracerProvider, error) {
	cfg, err := otlpspans.ConfigFromEnv(getenv)
	if err != nil {
		return nil, fmt.Errorf("otlp exporter: %w", err)
	}
	opts := []otlptracehttp.Option{otlptracehttp.WithEndpointURL(cfg.Endpoint), otlptracehttp.WithTimeout(cfg.Timeout)}
	if len(cfg.Headers) > 0 {
		opts = append(opts, otlptracehttp.WithHeaders(cfg.Headers))
	}
	if cfg.Compression == "gzip" {
		opts = append(opts, otlptracehttp.WithCompression(otlptracehttp.GzipCompression))
	}
	if cfg.TLS != nil {
		opts = append(opts, otlptracehttp.WithTLSClientConfig(cfg.TLS))
	}
	exp, err := otlptracehttp.New(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("otlp exporter: %w", err)
	}
	pcfg, err := otlpspans.ProviderConfigFromEnv(getenv)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("tracing: %w", err), exp.Shutdown(ctx))
	}
	var bsp []sdktrace.BatchSpanProcessorOption
	if pcfg.QueueSize > 0 {
		bsp = append(bsp, sdktrace.WithMaxQueueSize(pcfg.QueueSize))
	}
	if pcfg.BatchSize > 0 {
		bsp = append(bsp, sdktrace.WithMaxExportBatchSize(pcfg.BatchSize))
	}
	if pcfg.ScheduleDelay > 0 {
		bsp = append(bsp, sdktrace.WithBatchTimeout(pcfg.ScheduleDelay))
	}
	if pcfg.ExportTimeout > 0 {
		bsp = append(bsp, sdktrace.WithExportTimeout(pcfg.ExportTimeout))
	}
	tpOpts := []sdktrace.TracerProviderOption{sdktrace.WithBatcher(exp, bsp...), sdktrace.WithResource(res)}
	if pcfg.Sampler != nil {
		tpOpts = append(tpOpts, sdktrace.WithSampler(pcfg.Sampler))
	}
	if pcfg.AttributeCountLimit != 0 {
		limits := sdktrace.NewSpanLimits()
		limits.AttributeCountLimit = pcfg.AttributeCountLimit
		tpOpts = append(tpOpts, sdktrace.WithRawSpanLimits(limits))
	}
	return sdktrace.NewTracerProvider(tpOpts...), nil
}

// close flushes spans still buffered and stops the providers.
func (t *telemetry) close(ctx context.Context) error {
	var errs []error
	for _, f := range t.shutdown {
		errs = append(errs, f(ctx))
	}
	t.shutdown = nil
	return errors.Join(errs...)
}
