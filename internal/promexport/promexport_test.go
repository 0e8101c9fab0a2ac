package promexport_test

import (
	"context"
	"os"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
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
