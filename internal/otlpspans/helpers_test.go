package otlpspans

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/klauspost/compress/gzip"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
)

type capturedRequest struct {
	header http.Header
	body   []byte // gunzipped when Content-Encoding says gzip
}

// collector is a loopback OTLP/HTTP endpoint that records what it receives
// and answers with respond (200 and an empty body by default).
type collector struct {
	*httptest.Server
	mu       sync.Mutex
	requests []capturedRequest
	respond  func(w http.ResponseWriter, r *http.Request, n int)
}

func newCollector(t testing.TB) *collector {
	c := &collector{}
	c.Server = httptest.NewServer(http.HandlerFunc(c.serve))
	t.Cleanup(c.Close)
	return c
}

func (c *collector) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err == nil && r.Header.Get("Content-Encoding") == "gzip" {
		var zr *gzip.Reader
		if zr, err = gzip.NewReader(bytes.NewReader(body)); err == nil {
			body, err = io.ReadAll(zr)
		}
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	c.mu.Lock()
	c.requests = append(c.requests, capturedRequest{header: r.Header.Clone(), body: body})
	n := len(c.requests)
	respond := c.respond
	c.mu.Unlock()
	if respond != nil {
		respond(w, r, n)
	}
}

func (c *collector) tracesURL() string { return c.URL + "/v1/traces" }

// take returns and forgets the recorded requests.
func (c *collector) take() []capturedRequest {
	c.mu.Lock()
	defer c.mu.Unlock()
	reqs := c.requests
	c.requests = nil
	return reqs
}

func (c *collector) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.requests)
}

// stockEncoder yields the bytes the stock otlptracehttp exporter puts on the
// wire, by exporting through it to a capture collector.
type stockEncoder struct {
	exp *otlptrace.Exporter
	col *collector
}

func newStockEncoder(t testing.TB, opts ...otlptracehttp.Option) *stockEncoder {
	col := newCollector(t)
	exp, err := otlptracehttp.New(context.Background(),
		append([]otlptracehttp.Option{otlptracehttp.WithEndpointURL(col.tracesURL())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = exp.Shutdown(context.Background()) })
	return &stockEncoder{exp: exp, col: col}
}

// encode returns the stock request body, or nil when stock sent nothing.
func (s *stockEncoder) encode(t testing.TB, spans []sdktrace.ReadOnlySpan) []byte {
	t.Helper()
	if err := s.exp.ExportSpans(context.Background(), spans); err != nil {
		t.Fatalf("stock export: %v", err)
	}
	reqs := s.col.take()
	switch len(reqs) {
	case 0:
		return nil
	case 1:
		return reqs[0].body
	default:
		t.Fatalf("stock sent %d requests for one export", len(reqs))
		return nil
	}
}

func unmarshalRequest(t testing.TB, body []byte) *coltracepb.ExportTraceServiceRequest {
	t.Helper()
	var req coltracepb.ExportTraceServiceRequest
	if err := proto.Unmarshal(body, &req); err != nil {
		t.Fatalf("unmarshal request: %v", err)
	}
	return &req
}

// requireSameAsStock checks that ours decodes to the same request as stock.
// Stock emits ResourceSpans in Go map order, which is random, so its
// ResourceSpans are first put in our (first-seen) order; everything below
// that level is deterministic in stock and compared as is. With that one
// reordering the bytes must be identical too.
func requireSameAsStock(t testing.TB, ours, stock []byte) {
	t.Helper()
	got, want := unmarshalRequest(t, ours), unmarshalRequest(t, stock)
	if len(got.ResourceSpans) == len(want.ResourceSpans) {
		reordered := make([]int, len(got.ResourceSpans))
		for i, rs := range got.ResourceSpans {
			reordered[i] = slices.IndexFunc(want.ResourceSpans, func(w *tracepb.ResourceSpans) bool {
				return proto.Equal(w.Resource, rs.Resource)
			})
		}
		if !slices.Contains(reordered, -1) {
			sorted := make([]*tracepb.ResourceSpans, len(reordered))
			for i, j := range reordered {
				sorted[i] = want.ResourceSpans[j]
			}
			want.ResourceSpans = sorted
		}
	}
	if !proto.Equal(got, want) {
		t.Fatalf("request differs from stock:\n%s", textDiff(prototext.Format(want), prototext.Format(got)))
	}
	wantBytes, err := proto.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(ours, wantBytes) {
		t.Fatalf("same message but different bytes:\nours  %x\nstock %x", ours, wantBytes)
	}
}

// textDiff shows the first differing line with a little context.
func textDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	for i := 0; i < max(len(w), len(g)); i++ {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			from := max(0, i-5)
			return "context:\n  " + strings.Join(w[from:i], "\n  ") + "\nstock: " + wl + "\nours:  " + gl
		}
	}
	return "(texts equal)"
}
