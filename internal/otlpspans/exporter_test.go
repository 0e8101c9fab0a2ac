package otlpspans

import (
	"context"
	"crypto/tls"
	"encoding/pem"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
)

// fastRetries keeps stock's retry logic but with millisecond backoff, so
// tests measure Retry-After rather than the 5 s initial interval.
var fastRetries = retryPolicy{initialInterval: time.Millisecond, maxInterval: 5 * time.Millisecond, maxElapsed: time.Minute}

func newTestExporter(t *testing.T, cfg Config) *Exporter {
	t.Helper()
	exp, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	exp.retry = fastRetries
	t.Cleanup(func() { _ = exp.Shutdown(context.Background()) })
	return exp
}

func oneSpan() []sdktrace.ReadOnlySpan {
	return []sdktrace.ReadOnlySpan{tracetest.SpanStub{Name: "publish"}.Snapshot()}
}

func TestExportRetriesThrottledRequests(t *testing.T) {
	col := newCollector(t)
	col.respond = func(w http.ResponseWriter, _ *http.Request, n int) {
		switch n {
		case 1:
			w.Header().Set("Retry-After", "0")
			http.Error(w, "busy", http.StatusServiceUnavailable)
		case 2:
			w.Header().Set("Retry-After", "1")
			http.Error(w, "slow down", http.StatusTooManyRequests)
		}
	}
	exp := newTestExporter(t, Config{Endpoint: col.tracesURL()})

	start := time.Now()
	if err := exp.ExportSpans(context.Background(), oneSpan()); err != nil {
		t.Fatal(err)
	}
	if n := col.count(); n != 3 {
		t.Fatalf("collector saw %d requests, want 3", n)
	}
	if elapsed := time.Since(start); elapsed < time.Second {
		t.Fatalf("finished after %v; Retry-After: 1 was not honoured", elapsed)
	}
	reqs := col.take()
	if string(reqs[0].body) != string(reqs[2].body) {
		t.Fatal("retry sent a different body")
	}
}

func TestExportDoesNotRetryClientErrors(t *testing.T) {
	col := newCollector(t)
	col.respond = func(w http.ResponseWriter, _ *http.Request, _ int) {
		http.Error(w, "malformed "+strings.Repeat("x", 4000), http.StatusBadRequest)
	}
	exp := newTestExporter(t, Config{Endpoint: col.tracesURL()})

	err := exp.ExportSpans(context.Background(), oneSpan())
	if err == nil || !strings.Contains(err.Error(), "400 Bad Request") || !strings.Contains(err.Error(), "malformed") {
		t.Fatalf("err = %v, want the status and the body", err)
	}
	if len(err.Error()) > 1000 {
		t.Fatalf("error carries %d bytes; the body should be cut short", len(err.Error()))
	}
	if n := col.count(); n != 1 {
		t.Fatalf("collector saw %d requests, want 1", n)
	}
}

func TestExportStopsRetryingWithContext(t *testing.T) {
	col := newCollector(t)
	col.respond = func(w http.ResponseWriter, _ *http.Request, _ int) {
		w.WriteHeader(http.StatusBadGateway)
	}
	exp := newTestExporter(t, Config{Endpoint: col.tracesURL()})
	exp.retry.initialInterval, exp.retry.maxInterval = time.Hour, time.Hour

	t.Run("cancelled while waiting", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(50*time.Millisecond, cancel)
		start := time.Now()
		err := exp.ExportSpans(ctx, oneSpan())
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v, want context.Canceled", err)
		}
		if elapsed := time.Since(start); elapsed > 2*time.Second {
			t.Fatalf("returned after %v", elapsed)
		}
	})
	t.Run("deadline before next attempt", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		start := time.Now()
		if err := exp.ExportSpans(ctx, oneSpan()); err == nil || !strings.Contains(err.Error(), "deadline") {
			t.Fatalf("err = %v, want a deadline error", err)
		}
		if elapsed := time.Since(start); elapsed > 2*time.Second {
			t.Fatalf("waited %v for a retry that could not happen in time", elapsed)
		}
	})
	t.Run("cancelled during request", func(t *testing.T) {
		hung := make(chan struct{})
		defer close(hung)
		col.respond = func(http.ResponseWriter, *http.Request, int) { <-hung }
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(50*time.Millisecond, cancel)
		if err := exp.ExportSpans(ctx, oneSpan()); !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v, want context.Canceled", err)
		}
	})
}

func TestExportReportsPartialSuccess(t *testing.T) {
	col := newCollector(t)
	col.respond = func(w http.ResponseWriter, _ *http.Request, _ int) {
		body, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{
			PartialSuccess: &coltracepb.ExportTracePartialSuccess{RejectedSpans: 3, ErrorMessage: "too old"},
		})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(body)
	}
	exp := newTestExporter(t, Config{Endpoint: col.tracesURL()})

	err := exp.ExportSpans(context.Background(), oneSpan())
	var partial *PartialSuccessError
	if !errors.As(err, &partial) || partial.RejectedSpans != 3 || partial.Message != "too old" {
		t.Fatalf("err = %v, want a partial success with 3 rejected spans", err)
	}
	if n := col.count(); n != 1 {
		t.Fatalf("collector saw %d requests; a partial success must not be retried", n)
	}
}

func TestShutdown(t *testing.T) {
	col := newCollector(t)
	inRequest := make(chan struct{}, 1)
	release := make(chan struct{})
	defer close(release)
	col.respond = func(http.ResponseWriter, *http.Request, int) {
		inRequest <- struct{}{}
		<-release
	}
	exp := newTestExporter(t, Config{Endpoint: col.tracesURL()})

	inFlight := make(chan error, 1)
	go func() { inFlight <- exp.ExportSpans(context.Background(), oneSpan()) }()
	<-inRequest
	if err := exp.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-inFlight:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("in-flight export: err = %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Shutdown did not abort the in-flight export")
	}

	if err := exp.ExportSpans(context.Background(), oneSpan()); !errors.Is(err, context.Canceled) ||
		!strings.Contains(err.Error(), "shut down") {
		t.Fatalf("export after shutdown: err = %v", err)
	}
	if n := col.count(); n != 1 {
		t.Fatalf("collector saw %d requests, want only the aborted one", n)
	}
	if err := exp.Shutdown(context.Background()); err != nil {
		t.Fatalf("second Shutdown: %v", err)
	}
	done, cancel := context.WithCancel(context.Background())
	cancel()
	if err := exp.Shutdown(done); !errors.Is(err, context.Canceled) {
		t.Fatalf("Shutdown with a cancelled context: err = %v", err)
	}
}

func TestExportOverTLSFromEnv(t *testing.T) {
	var got atomic.Int32
	srv := httptest.NewTLSServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { got.Add(1) }))
	defer srv.Close()
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	if err := os.WriteFile(caFile, caPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := ConfigFromEnv(mapEnv(map[string]string{
		"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": srv.URL + "/v1/traces",
		"OTEL_EXPORTER_OTLP_CERTIFICATE":     caFile,
	}))
	if err != nil {
		t.Fatal(err)
	}
	exp := newTestExporter(t, cfg)
	if err := exp.ExportSpans(context.Background(), oneSpan()); err != nil {
		t.Fatal(err)
	}
	if n := got.Load(); n != 1 {
		t.Fatalf("server saw %d requests, want 1", n)
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	for name, cfg := range map[string]Config{
		"no scheme":         {Endpoint: "localhost:4318"},
		"no host":           {Endpoint: "http:///v1/traces"},
		"compression":       {Compression: "zstd"},
		"TLS on plain http": {Endpoint: "http://localhost:4318/v1/traces", TLS: &tls.Config{}},
	} {
		if _, err := New(cfg); err == nil {
			t.Errorf("%s: New accepted %+v", name, cfg)
		}
	}
}

// TestMarshalSpansReplacesInvalidUTF8 pins a deliberate difference: stock
// fails the whole batch ("string field contains invalid UTF-8"); we send it
// with U+FFFD in place of the bad bytes.
func TestMarshalSpansReplacesInvalidUTF8(t *testing.T) {
	span := tracetest.SpanStub{
		Name:       "bad \xff name",
		Attributes: []attribute.KeyValue{attribute.String("k\xfe", "v\xff"), attribute.StringSlice("s", []string{"\xc0"})},
	}.Snapshot()
	req := unmarshalRequest(t, MarshalSpans(nil, []sdktrace.ReadOnlySpan{span}))
	got := req.ResourceSpans[0].ScopeSpans[0].Spans[0]
	if got.Name != "bad \uFFFD name" || got.Attributes[0].Key != "k\uFFFD" ||
		got.Attributes[0].Value.GetStringValue() != "v\uFFFD" ||
		got.Attributes[1].Value.GetArrayValue().Values[0].GetStringValue() != "\uFFFD" {
		t.Fatalf("got %v", got)
	}
	if !utf8.ValidString(got.Name) {
		t.Fatal("name still invalid")
	}
	if err := newStockEncoder(t).exp.ExportSpans(context.Background(), []sdktrace.ReadOnlySpan{span}); err == nil {
		t.Fatal("stock now accepts invalid UTF-8; revisit validUTF8")
	}
}

// TestExportConcurrently shares one exporter between goroutines, as a
// SpanExporter may be; each request must arrive intact despite the pooled
// encode and gzip buffers.
func TestExportConcurrently(t *testing.T) {
	spans := sdkSpans(t)
	col := newCollector(t)
	exp := newTestExporter(t, Config{Endpoint: col.tracesURL(), Compression: "gzip"})

	want := make(map[string]bool)
	for n := 1; n <= len(spans); n++ {
		want[string(MarshalSpans(nil, spans[:n]))] = true
	}
	const workers, exports = 4, 25
	errs := make(chan error, workers)
	for w := range workers {
		go func() {
			for i := range exports {
				if err := exp.ExportSpans(context.Background(), spans[:1+(w+i)%len(spans)]); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range workers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	reqs := col.take()
	if len(reqs) != workers*exports {
		t.Fatalf("collector saw %d requests, want %d", len(reqs), workers*exports)
	}
	for _, r := range reqs {
		if !want[string(r.body)] {
			t.Fatal("a request body does not match any batch that was sent")
		}
	}
}
