package gateway

import (
	"compress/gzip"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"
	"github.com/go-chi/chi/v5"
	"github.com/klauspost/compress/gzhttp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"

	"github.com/tidemq/tidemq"
	"github.com/tidemq/tidemq/core"
)

// DefaultMaxRequestBytes caps one request body, after decompression.
const DefaultMaxRequestBytes = 16 << 20

// Options configures the gateway. The zero value works.
type Options struct {
	Logger *slog.Logger
	// MaxRequestBytes caps a request body (default 16 MiB).
	MaxRequestBytes int64
	// BodyBudgetBytes caps the request-body bytes held by all requests in
	// flight together (default 48 MiB): a request whose body does not fit
	// is refused with 429 before it is read, unless it is alone.
	BodyBudgetBytes int64
	// MaxMessageBytes caps one message body (default 4 MiB); keep it equal
	// to the broker's.
	MaxMessageBytes int
	// MeterProvider records HTTP and operation latency metrics; nil
	// records nothing.
	MeterProvider metric.MeterProvider
	// Metrics serves /metrics (the Prometheus exposition); nil serves an
	// empty one.
	Metrics http.Handler
	// JaegerUI is the base URL of a Jaeger UI (such as
	// http://127.0.0.1:16686); the console links each message to its
	// trace there. A value that is not an absolute http(s) URL is ignored.
	JaegerUI string
	// Cluster answers the cluster API (/v1/cluster); nil is a single node,
	// a cluster of one that refuses membership changes (SPEC §7.1).
	Cluster Cluster
	// NodeID names the single node in GET /v1/cluster (default "tidemq");
	// with a Cluster, the Cluster's view names the nodes.
	NodeID string
	// HTTPAddr is the single node's advertised HTTP host:port in GET
	// /v1/cluster; empty means the address the request came in on.
	HTTPAddr string
	// Region names the broker's region in GET /healthz (SPEC §8; default
	// "local").
	Region string
}

// DefaultRegion is the region a broker started without --region names.
const DefaultRegion = "local"

// Server is the HTTP front of a broker.
type Server struct {
	b        Broker
	opts     Options
	log      *slog.Logger
	mux      *chi.Mux
	handler  http.Handler
	doc      *openapi3.T
	oaRouter routers.Router
	hotOps   map[opKey]hotOp
	reqIDs   atomic.Uint64
	latency  metric.Float64Histogram
	httpDur  metric.Float64Histogram
	// attrSets caches the attribute sets metrics are recorded with: built
	// per request they were a third of the metrics' cost.
	attrSets sync.Map // attrKey → []metric.RecordOption
	attrN    atomic.Int64
	tokens   atomic.Pointer[Tokens]
	budget   bodyBudget
	gzip     func(http.Handler) http.HandlerFunc
}

// New builds the HTTP handler over a broker.
func New(b Broker, opts Options) (*Server, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.MaxRequestBytes <= 0 {
		opts.MaxRequestBytes = DefaultMaxRequestBytes
	}
	if opts.MaxMessageBytes <= 0 {
		opts.MaxMessageBytes = core.DefaultMaxMessageBytes
	}
	if opts.BodyBudgetBytes <= 0 {
		opts.BodyBudgetBytes = DefaultBodyBudgetBytes
	}
	if opts.NodeID == "" {
		opts.NodeID = DefaultNodeID
	}
	if opts.Region == "" {
		opts.Region = DefaultRegion
	}
	doc, err := LoadSpec()
	if err != nil {
		return nil, err
	}
	// The hot-body decoders read their limits from the same document.
	if _, err := specLimits(); err != nil {
		return nil, err
	}
	oaRouter, err := legacy.NewRouter(doc)
	if err != nil {
		return nil, fmt.Errorf("gateway: openapi router: %w", err)
	}
	if opts.MeterProvider == nil {
		opts.MeterProvider = metricnoop.NewMeterProvider()
	}
	if opts.Metrics == nil {
		opts.Metrics = promhttp.HandlerFor(prometheus.NewRegistry(), promhttp.HandlerOpts{})
	}
	s := &Server{b: b, opts: opts, log: opts.Logger.With("component", "gateway"), doc: doc, oaRouter: oaRouter}
	s.budget.limit = opts.BodyBudgetBytes
	s.opts.JaegerUI = checkJaegerUI(opts.JaegerUI, s.log)
	if err := s.initMetrics(opts.MeterProvider); err != nil {
		return nil, err
	}
	if s.gzip, err = newGzipWrapper(); err != nil {
		return nil, err
	}
	if s.hotOps, err = hotOperations(doc,
		"POST /v1/topics/{topic}/messages", "POST /v1/topics/{topic}/messages:raw", "POST /v1/topics/{topic}/messages:batch",
		"POST /v1/topics/{topic}/subscriptions/{group}/pull", "POST /v1/topics/{topic}/subscriptions/{group}/ack"); err != nil {
		return nil, err
	}
	s.mux = s.routes()
	// No otelhttp: message spans are made by the broker (a span per long
	// poll would bury them), and requestLog records the one HTTP duration
	// histogram; otelhttp's wrapping and three histograms per request cost
	// ~10 µs of a ~60 µs send (docs/ARCHITECTURE.md).
	s.handler = s.mux
	return s, nil
}

// initMetrics makes the two latency histograms and the body budget's
// gauges.
func (s *Server) initMetrics(mp metric.MeterProvider) error {
	meter := mp.Meter("github.com/tidemq/tidemq/gateway")
	seconds := func(name, desc string) (metric.Float64Histogram, error) {
		h, err := meter.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc),
			metric.WithExplicitBucketBoundaries(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30))
		if err != nil {
			return nil, fmt.Errorf("gateway: metrics: %w", err)
		}
		return h, nil
	}
	var err error
	if s.latency, err = seconds("tidemq.operation.duration", "Time to answer a send, batch send, pull or ack, per operation and topic."); err != nil {
		return err
	}
	if s.httpDur, err = seconds("http.server.request.duration", "Duration of HTTP server requests, per method, route and status."); err != nil {
		return err
	}
	used, err := meter.Int64ObservableGauge("tidemq.http.body_budget.used", metric.WithUnit("By"),
		metric.WithDescription("Request-body bytes reserved by requests in flight (--body-budget-bytes caps them)."))
	if err != nil {
		return fmt.Errorf("gateway: metrics: %w", err)
	}
	limit, err := meter.Int64ObservableGauge("tidemq.http.body_budget.limit", metric.WithUnit("By"),
		metric.WithDescription("The budget for request bodies in flight (--body-budget-bytes)."))
	if err != nil {
		return fmt.Errorf("gateway: metrics: %w", err)
	}
	if _, err := meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		o.ObserveInt64(used, s.budget.used.Load())
		o.ObserveInt64(limit, s.budget.limit)
		return nil
	}, used, limit); err != nil {
		return fmt.Errorf("gateway: metrics: %w", err)
	}
	return nil
}

// newGzipWrapper gzips replies when the client asks, from 256 bytes up:
// gzip would only grow a send's ~120-byte reply, and compressing every
// tiny reply cost more CPU than storing the message (profiled). BestSpeed:
// a pull reply of 256 KiB at level 5 cost ~4 µs per message.
func newGzipWrapper() (func(http.Handler) http.HandlerFunc, error) {
	w, err := gzhttp.NewWrapper(gzhttp.MinSize(256), gzhttp.CompressionLevel(gzip.BestSpeed), gzhttp.ContentTypes([]string{
		"application/json", "application/problem+json", "application/yaml", "text/html",
		"text/plain", "text/css", "application/javascript", "image/svg+xml",
	}))
	if err != nil {
		return nil, fmt.Errorf("gateway: gzip: %w", err)
	}
	return w, nil
}

// LoadSpec parses the embedded openapi.yaml. Servers are dropped so that
// routing matches on paths alone, whatever host the server listens on.
func LoadSpec() (*openapi3.T, error) { return loadSpec(tidemq.OpenAPI) }

func loadSpec(data []byte) (*openapi3.T, error) {
	doc, err := openapi3.NewLoader().LoadFromData(data)
	if err != nil {
		return nil, fmt.Errorf("gateway: load openapi.yaml: %w", err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		return nil, fmt.Errorf("gateway: openapi.yaml is invalid: %w", err)
	}
	doc.Servers = nil
	return doc, nil
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.handler.ServeHTTP(w, r) }

// Mux exposes the router, so tests can walk its routes.
func (s *Server) Mux() *chi.Mux { return s.mux }
