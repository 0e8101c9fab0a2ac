package pebblestore

import (
	"context"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// storeGauges collects reader's gauges of the store by name.
func storeGauges(t *testing.T, reader *sdkmetric.ManualReader) map[string]metricdata.Metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]metricdata.Metrics{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			got[m.Name] = m
		}
	}
	return got
}

// gaugeValue is the one point of the named gauge; ok is false when the
// gauge was not reported.
func gaugeValue(t *testing.T, gauges map[string]metricdata.Metrics, name string) (v int64, ok bool) {
	t.Helper()
	m, ok := gauges[name]
	if !ok {
		return 0, false
	}
	g, isGauge := m.Data.(metricdata.Gauge[int64])
	if !isGauge || len(g.DataPoints) != 1 {
		t.Fatalf("%s = %+v, want one int64 gauge point", name, m.Data)
	}
	return g.DataPoints[0].Value, true
}

// The store's gauges go to the MeterProvider of its options, under the
// names and units /metrics has always shown, and stop at Close.
func TestStoreGaugesThroughMeterProvider(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	s, err := Open("db", Options{FS: vfs.NewMem(), MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))})
	if err != nil {
		t.Fatal(err)
	}
	units := map[string]string{
		"tidemq.store.l0.sublevels":       "{sublevel}",
		"tidemq.store.write_stalls":       "{stall}",
		"tidemq.store.wal.uring_syncs":    "{sync}",
		"tidemq.store.wal.spares_used":    "{file}",
		"tidemq.store.wal.polled_commits": "{commit}",
	}
	gauges := storeGauges(t, reader)
	for name, unit := range units {
		if _, ok := gaugeValue(t, gauges, name); !ok {
			t.Errorf("no %s gauge", name)
			continue
		}
		if m := gauges[name]; m.Unit != unit || m.Description == "" {
			t.Errorf("%s: unit %q, description %q; want unit %q and a description", name, m.Unit, m.Description, unit)
		}
	}
	if len(gauges) != len(units) {
		t.Errorf("gauges %v, want exactly %d", gauges, len(units))
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if gauges := storeGauges(t, reader); len(gauges) != 0 {
		t.Errorf("a closed store still reports %v", gauges)
	}

	// Without a MeterProvider the store opens and registers nothing.
	s, err = Open("db", Options{FS: vfs.NewMem()})
	if err != nil {
		t.Fatal(err)
	}
	if s.metrics != nil {
		t.Error("metrics registered without a MeterProvider")
	}
	_ = s.Close()
}
