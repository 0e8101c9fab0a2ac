// Package promexport builds the OpenTelemetry meter provider of a broker
// process (cmd/tidemq, and the load tester's in-process broker), exposed
// for Prometheus to scrape.
package promexport

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	promexporter "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/exemplar"
	"go.opentelemetry.io/otel/sdk/resource"
)

// MeterProvider returns a meter provider whose metrics reg serves, without
// instrumentation scope labels. res may be nil (the SDK's default
// resource).
//
// Exemplars are off unless OTEL_METRICS_EXEMPLAR_FILTER (as getenv reads
// it) asks for them: the /metrics handler speaks the Prometheus text
// format, which has no exemplars, and with the SDK's default filter every
// counter add and histogram record made in a sampled span's context
// offered one (2% of a single send's CPU, docs/BENCHMARKS.md).
func MeterProvider(getenv func(string) string, reg prometheus.Registerer, res *resource.Resource) (*sdkmetric.MeterProvider, error) {
	// No otel_scope_* labels: every instrument's name is unique across the
	// broker's meters, so the scope names no series apart, and its version
	// and schema URL labels were empty on every series.
	exporter, err := promexporter.New(promexporter.WithRegisterer(reg), promexporter.WithoutScopeInfo())
	if err != nil {
		return nil, fmt.Errorf("prometheus exporter: %w", err)
	}
	opts := []sdkmetric.Option{sdkmetric.WithReader(exporter)}
	if res != nil {
		opts = append(opts, sdkmetric.WithResource(res))
	}
	if getenv("OTEL_METRICS_EXEMPLAR_FILTER") == "" {
		opts = append(opts, sdkmetric.WithExemplarFilter(exemplar.AlwaysOffFilter))
	}
	return sdkmetric.NewMeterProvider(opts...), nil
}
