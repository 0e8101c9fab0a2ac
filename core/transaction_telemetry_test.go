package core_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/tidemq/tidemq/core"
	"github.com/tidemq/tidemq/pebblestore"
)

// A half message's life is in its trace: prepare, then commit or
// rollback, with a check between when the broker asked; and the
// transactions metric counts outcomes.
func TestTransactionSpansAndMetrics(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	store, err := pebblestore.Open("db", pebblestore.Options{FS: vfs.NewMem()})
	if err != nil {
		t.Fatal(err)
	}
	checker := &scriptedChecker{answers: []string{core.CheckCommit}}
	b, err := core.New(store, core.Options{Logger: quiet, TracerProvider: tp, MeterProvider: mp, TransactionChecker: checker})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Error(err)
		}
		if err := store.Close(); err != nil {
			t.Error(err)
		}
	})
	ctx := t.Context()
	url := "http://producer.invalid/check"
	if _, _, err := b.PutTopic(ctx, "orders", core.TopicConfig{Queues: 1, TransactionCheckURL: &url}); err != nil {
		t.Fatal(err)
	}
	type half struct{ MessageID, TransactionID string }
	prepare := func(body string, after time.Duration) half {
		res, txID, err := b.SendTransaction(ctx, "orders", []*core.Message{{Body: []byte(body)}}, after)
		if err != nil {
			t.Fatal(err)
		}
		return half{res[0].MessageID, txID}
	}
	committed, rolledBack, checked := prepare("c", time.Hour), prepare("r", time.Hour), prepare("k", time.Second)
	if _, err := b.CommitTransaction(ctx, "orders", committed.TransactionID); err != nil {
		t.Fatal(err)
	}
	if _, err := b.RollbackTransaction(ctx, "orders", rolledBack.TransactionID); err != nil {
		t.Fatal(err)
	}
	within(t, 5*time.Second, func() error {
		if txs, _ := b.ListTransactions("orders"); len(txs) != 0 {
			return fmt.Errorf("%d open transactions", len(txs))
		}
		// The check loop's commit leaves the open list when its batch is
		// committed, and records its spans and then its count after that.
		if collectTxCounts(t, reader)["tidemq.transactions committed check"] == 0 {
			return fmt.Errorf("the check's commit is not counted yet")
		}
		return nil
	})

	// Each message's spans, by name, in its send span's trace.
	lives := map[string][]string{}
	traces := map[string]string{}
	for _, s := range rec.Ended() {
		id, _ := spanAttr(s, "messaging.message.id")
		if s.Name() == core.SpanSend {
			traces[id] = s.SpanContext().TraceID().String()
		}
	}
	for _, s := range rec.Ended() {
		id, _ := spanAttr(s, "messaging.message.id")
		if traces[id] != s.SpanContext().TraceID().String() {
			t.Errorf("span %s of %s is not in its send's trace", s.Name(), id)
		}
		lives[id] = append(lives[id], s.Name())
	}
	want := map[string][]string{
		committed.MessageID:  {core.SpanSend, core.SpanTxPrepare, core.SpanTxCommit},
		rolledBack.MessageID: {core.SpanSend, core.SpanTxPrepare, core.SpanTxRollback},
		checked.MessageID:    {core.SpanSend, core.SpanTxPrepare, core.SpanTxCheck, core.SpanTxCommit},
	}
	for id, names := range want {
		if fmt.Sprint(lives[id]) != fmt.Sprint(names) {
			t.Errorf("spans of %s: %v, want %v", id, lives[id], names)
		}
	}

	counts := collectTxCounts(t, reader)
	wantCounts := map[string]int64{
		"tidemq.transactions prepared":            3,
		"tidemq.transactions committed request":   1,
		"tidemq.transactions rolled_back request": 1,
		"tidemq.transactions committed check":     1,
		"tidemq.transaction.checks commit":        1,
	}
	if fmt.Sprint(counts) != fmt.Sprint(wantCounts) {
		t.Errorf("metrics %v, want %v", counts, wantCounts)
	}
}

// collectTxCounts is the transaction counters collected so far, keyed by
// name and their outcome, decided_by and status attributes.
func collectTxCounts(t *testing.T, reader *sdkmetric.ManualReader) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	counts := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			sum, ok := m.Data.(metricdata.Sum[int64])
			if !ok || (m.Name != "tidemq.transactions" && m.Name != "tidemq.transaction.checks") {
				continue
			}
			for _, p := range sum.DataPoints {
				key := m.Name
				for _, k := range []attribute.Key{"outcome", "decided_by", "status"} {
					if v, ok := p.Attributes.Value(k); ok {
						key += " " + v.AsString()
					}
				}
				counts[key] += p.Value
			}
		}
	}
	return counts
}
