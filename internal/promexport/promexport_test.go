package promexport_test

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/tidemq/tidemq/internal/promexport"
)

// exemplars records a counter add in a sampled span's context and reports
// how many exemplars the registry then gathers.
func exemplars(t *testing.T) int {
	t.Helper()
	reg := prometheus.NewRegistry()
	mp, err := promexport.MeterProvider(os.Getenv, reg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer mp.Shutdown(context.Background())
	counter, err := mp.Meter("test").Int64Counter("sends")
	if err != nil {
		t.Fatal(err)
	}
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: [16]byte{1}, SpanID: [8]byte{2}, TraceFlags: trace.FlagsSampled})
	counter.Add(trace.ContextWithSpanContext(context.Background(), sc), 3)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n, found := 0, false
	for _, f := range families {
		if f.GetName() != "sends_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			found = found || m.GetCounter().GetValue() == 3
			if m.GetCounter().GetExemplar() != nil {
				n++
			}
		}
	}
	if !found {
		t.Fatalf("sends_total = 3 not gathered: %v", families)
	}
	return n
}

func TestNoExemplarsUnlessAsked(t *testing.T) {
	t.Setenv("OTEL_METRICS_EXEMPLAR_FILTER", "")
	if n := exemplars(t); n != 0 {
		t.Errorf("%d exemplars by default, want none", n)
	}
	t.Setenv("OTEL_METRICS_EXEMPLAR_FILTER", "always_on")
	if n := exemplars(t); n != 1 {
		t.Errorf("%d exemplars with OTEL_METRICS_EXEMPLAR_FILTER=always_on, want 1", n)
	}
}

// TestNoScopeLabels: series carry their own attributes only, none of the
// otel_scope_* labels (empty version and schema URL on every series), and
// keep their names.
func TestNoScopeLabels(t *testing.T) {
	reg := prometheus.NewRegistry()
	mp, err := promexport.MeterProvider(os.Getenv, reg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer mp.Shutdown(context.Background())
	for _, scope := range []string{"github.com/tidemq/tidemq/core", "github.com/tidemq/tidemq/gateway"} {
		c, err := mp.Meter(scope).Int64Counter(strings.ReplaceAll(scope[len("github.com/tidemq/tidemq/"):], "/", "_") + ".sends")
		if err != nil {
			t.Fatal(err)
		}
		c.Add(context.Background(), 1, metric.WithAttributes(attribute.String("topic", "orders")))
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, f := range families {
		names[f.GetName()] = true
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if strings.HasPrefix(l.GetName(), "otel_scope_") {
					t.Errorf("%s has label %s=%q", f.GetName(), l.GetName(), l.GetValue())
				}
			}
		}
	}
	for _, want := range []string{"core_sends_total", "gateway_sends_total"} {
		if !names[want] {
			t.Errorf("no %s among %v", want, names)
		}
	}
}
