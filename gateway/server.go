package gateway

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"
	"github.com/go-chi/chi/v5"
	jsonv2 "github.com/go-json-experiment/json"
	"github.com/klauspost/compress/gzhttp"
	"github.com/klauspost/compress/zstd"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"

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
}

// Server is the HTTP front of a broker.
type Server struct {
	b        *core.Broker
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
	gzip     func(http.Handler) http.HandlerFunc
}

// compress gzips replies for clients that accept it. A request that names
// no encoding at all (the SDK's, curl's, the load tester's) skips gzhttp's
// per-request writer: its reply is what gzhttp would send, Vary included.
func (s *Server) compress(next http.Handler) http.Handler {
	gzipped := s.gzip(next)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, named := r.Header["Accept-Encoding"]; named {
			gzipped.ServeHTTP(w, r)
			return
		}
		w.Header().Add("Vary", "Accept-Encoding")
		next.ServeHTTP(w, r)
	})
}

// New builds the HTTP handler over a broker.
func New(b *core.Broker, opts Options) (*Server, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.MaxRequestBytes <= 0 {
		opts.MaxRequestBytes = DefaultMaxRequestBytes
	}
	if opts.MaxMessageBytes <= 0 {
		opts.MaxMessageBytes = core.DefaultMaxMessageBytes
	}
	doc, err := LoadSpec()
	if err != nil {
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
	s.opts.JaegerUI = checkJaegerUI(opts.JaegerUI, s.log)
	meter := opts.MeterProvider.Meter("github.com/tidemq/tidemq/gateway")
	seconds := func(name, desc string) (metric.Float64Histogram, error) {
		h, err := meter.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc),
			metric.WithExplicitBucketBoundaries(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30))
		if err != nil {
			return nil, fmt.Errorf("gateway: metrics: %w", err)
		}
		return h, nil
	}
	if s.latency, err = seconds("tidemq.operation.duration", "Time to answer a send, batch send, pull or ack, per operation and topic."); err != nil {
		return nil, err
	}
	if s.httpDur, err = seconds("http.server.request.duration", "Duration of HTTP server requests, per method, route and status."); err != nil {
		return nil, err
	}
	// Replies are gzipped when the client asks, from 256 bytes up: gzip
	// would only grow a send's ~120-byte reply, and compressing every tiny
	// reply cost more CPU than storing the message (profiled). BestSpeed:
	// a pull reply of 256 KiB at level 5 cost ~4 µs per message.
	if s.gzip, err = gzhttp.NewWrapper(gzhttp.MinSize(256), gzhttp.CompressionLevel(gzip.BestSpeed), gzhttp.ContentTypes([]string{
		"application/json", "application/problem+json", "application/yaml", "text/html",
		"text/plain", "text/css", "application/javascript", "image/svg+xml",
	})); err != nil {
		return nil, fmt.Errorf("gateway: gzip: %w", err)
	}
	if s.hotOps, err = hotOperations(doc,
		"POST /v1/topics/{topic}/messages", "POST /v1/topics/{topic}/messages:batch",
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

// LoadSpec parses the embedded openapi.yaml. Servers are dropped so that
// routing matches on paths alone, whatever host the server listens on.
func LoadSpec() (*openapi3.T, error) {
	doc, err := openapi3.NewLoader().LoadFromData(tidemq.OpenAPI)
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

// handlerFunc handles a validated request whose body has been read.
type handlerFunc func(w http.ResponseWriter, r *http.Request, body []byte) error

func (s *Server) routes() *chi.Mux {
	m := chi.NewRouter()
	m.Use(s.requestLog, s.recoverer)
	m.Use(s.compress)
	m.NotFound(func(w http.ResponseWriter, r *http.Request) {
		writeProblem(w, problemOf(problemKind{404, "not_found", "Not found"}, "no such path: "+r.URL.Path))
	})
	m.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
		writeProblem(w, problemOf(problemKind{405, "method_not_allowed", "Method not allowed"}, r.Method+" is not served on "+r.URL.Path))
	})
	m.Get("/healthz", s.healthz)
	m.Get("/readyz", s.readyz)
	m.Get("/openapi.yaml", s.openapiYAML)
	m.Get("/", s.console)
	m.Get("/docs", s.docs)
	m.Get("/console/*", s.consoleAssets)
	m.Get("/metrics", func(w http.ResponseWriter, r *http.Request) {
		if err := s.authorize(r, ActionAdmin, "", ""); err != nil {
			s.writeError(w, r, err)
			return
		}
		s.opts.Metrics.ServeHTTP(w, r)
	})

	m.Get("/v1/topics", s.api(ActionAdmin, s.listTopics))
	m.Put("/v1/topics/{topic}", s.api(ActionAdmin, s.putTopic))
	m.Get("/v1/topics/{topic}", s.api(ActionAdmin, s.getTopic))
	m.Delete("/v1/topics/{topic}", s.api(ActionAdmin, s.deleteTopic))
	m.Post("/v1/topics/{topic}/messages", s.apiOwnBody(ActionPublish, s.timed("send", s.send)))
	m.Post("/v1/topics/{topic}/messages:batch", s.apiOwnBody(ActionPublish, s.timed("batch_send", s.sendBatch)))
	m.Get("/v1/topics/{topic}/messages", s.api(ActionAdmin, s.queryMessages))
	m.Get("/v1/topics/{topic}/messages/{messageId}", s.api(ActionAdmin, s.getMessage))

	m.Get("/v1/topics/{topic}/subscriptions", s.api(ActionAdmin, s.listSubscriptions))
	m.Put("/v1/topics/{topic}/subscriptions/{group}", s.api(ActionAdmin, s.putSubscription))
	m.Get("/v1/topics/{topic}/subscriptions/{group}", s.api(ActionAdmin, s.getSubscription))
	m.Delete("/v1/topics/{topic}/subscriptions/{group}", s.api(ActionAdmin, s.deleteSubscription))
	m.Post("/v1/topics/{topic}/subscriptions/{group}/pull", s.apiOwnBody(ActionSubscribe, s.timed("pull", s.pull)))
	m.Post("/v1/topics/{topic}/subscriptions/{group}/ack", s.apiOwnBody(ActionSubscribe, s.timed("ack", s.handlesEndpoint("acked", decodeAck, s.ack))))
	m.Post("/v1/topics/{topic}/subscriptions/{group}/nack", s.api(ActionSubscribe, s.handlesEndpoint("nacked", decodeHandles, s.nack)))
	m.Post("/v1/topics/{topic}/subscriptions/{group}/extend", s.api(ActionSubscribe, s.handlesEndpoint("extended", decodeHandles, s.extend)))
	m.Post("/v1/topics/{topic}/subscriptions/{group}/deadletter", s.api(ActionSubscribe, s.handlesEndpoint("deadLettered", decodeHandles, s.deadLetter)))
	m.Post("/v1/topics/{topic}/subscriptions/{group}/seek", s.api(ActionAdmin, s.seek))
	m.Get("/v1/topics/{topic}/subscriptions/{group}/dlq", s.api(ActionAdmin, s.listDeadLetters))
	m.Post("/v1/topics/{topic}/subscriptions/{group}/dlq:redrive", s.api(ActionAdmin, s.redrive))
	return m
}

// api wraps a handler: path names checked, body read (decompressed and
// capped), request validated against openapi.yaml, errors written as problems.
func (s *Server) api(action string, h handlerFunc) http.HandlerFunc {
	return s.endpoint(action, true, h)
}

// apiOwnBody is api for the hot routes, whose handlers check their JSON
// bodies against the spec as they decode them (decode.go); kin-openapi
// still checks everything else about the request.
func (s *Server) apiOwnBody(action string, h handlerFunc) http.HandlerFunc {
	return s.endpoint(action, false, h)
}

func (s *Server) endpoint(action string, checkBody bool, h handlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if err := s.prepare(w, r, action, h, checkBody); err != nil {
			s.writeError(w, r, err)
		}
	}
}

// timed records how long an operation took to answer.
func (s *Server) timed(op string, h handlerFunc) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request, body []byte) error {
		start := time.Now()
		err := h(w, r, body)
		s.latency.Record(r.Context(), time.Since(start).Seconds(),
			s.attrs(attrKey{op: op, topic: chi.URLParam(r, "topic")})...)
		return err
	}
}

func (s *Server) prepare(w http.ResponseWriter, r *http.Request, action string, h handlerFunc, checkBody bool) error {
	topic, group := chi.URLParam(r, "topic"), chi.URLParam(r, "group")
	// Permission first, before the body is read or any name looked up.
	if err := s.authorize(r, action, topic, group); err != nil {
		return err
	}
	for _, p := range []struct{ param, kind string }{{"topic", "topic"}, {"group", "group"}} {
		if v := chi.URLParam(r, p.param); v != "" {
			if err := core.ValidateName(p.kind, v); err != nil {
				return err
			}
		}
	}
	body, err := s.readBody(w, r)
	if err != nil {
		return err
	}
	if err := s.validate(r, body, checkBody); err != nil {
		return err
	}
	// A producer's or consumer's traceparent joins its trace.
	if r.Header.Get("traceparent") != "" {
		r = r.WithContext(propagation.TraceContext{}.Extract(r.Context(), propagation.HeaderCarrier(r.Header)))
	}
	return h(w, r, body)
}

// readBody reads the whole request body, decoding gzip or zstd, and refuses
// anything over MaxRequestBytes (after decompression, so a small bomb is
// refused too).
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	limit := s.opts.MaxRequestBytes
	var src io.Reader = http.MaxBytesReader(w, r.Body, limit+1)
	switch enc := strings.ToLower(strings.TrimSpace(r.Header.Get("Content-Encoding"))); enc {
	case "", "identity":
	case "gzip":
		zr, err := gzip.NewReader(src)
		if err != nil {
			return nil, badRequest("", "Content-Encoding gzip: %v", err)
		}
		defer zr.Close()
		src = zr
	case "zstd":
		zr, err := zstd.NewReader(src, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(uint64(limit)+1))
		if err != nil {
			return nil, badRequest("", "Content-Encoding zstd: %v", err)
		}
		defer zr.Close()
		src = zr
	default:
		return nil, newHTTPError(415, "unsupported_media_type", "Unsupported media type", "Content-Encoding %q is not supported (gzip, zstd)", enc)
	}
	var buf bytes.Buffer
	if r.ContentLength > 0 && r.ContentLength <= limit {
		buf.Grow(int(r.ContentLength))
	}
	n, err := buf.ReadFrom(io.LimitReader(src, limit+1))
	if _, tooLarge := errors.AsType[*http.MaxBytesError](err); tooLarge || n > limit {
		return nil, newHTTPError(413, "request_too_large", "Request too large", "the request body is over %d bytes", limit)
	}
	if err != nil {
		return nil, badRequest("", "reading the request body: %v", err)
	}
	return buf.Bytes(), nil
}

// validate checks the request against openapi.yaml; the body's content
// only when checkBody (its media type always).
func (s *Server) validate(r *http.Request, body []byte, checkBody bool) error {
	if !checkBody {
		if op := s.onlyNames(r); op != nil {
			return checkMediaType(op, r.Header.Get("Content-Type"), body)
		}
	}
	// A shallow copy carries the already decoded body; the headers are
	// copied only in the rare case they must change.
	vr := new(http.Request)
	*vr = *r
	vr.Body = io.NopCloser(bytes.NewReader(body))
	vr.ContentLength = int64(len(body))
	if !checkBody {
		// kin-openapi's security check reads (copies) any body it is given,
		// even with ExcludeRequestBody.
		vr.Body, vr.ContentLength = http.NoBody, 0
	}
	if noType := vr.Header.Get("Content-Type") == "" && len(body) > 0; noType || vr.Header.Get("Content-Encoding") != "" {
		vr.Header = vr.Header.Clone()
		vr.Header.Del("Content-Encoding")
		if noType {
			vr.Header.Set("Content-Type", "application/json")
		}
	}
	route, params, err := s.oaRouter.FindRoute(vr)
	if err != nil {
		return badRequest("", "%v", err)
	}
	if err := checkMediaType(route.Operation, vr.Header.Get("Content-Type"), body); err != nil {
		return err
	}
	err = openapi3filter.ValidateRequest(r.Context(), &openapi3filter.RequestValidationInput{
		Request: vr, PathParams: params, Route: route,
		Options: &openapi3filter.Options{
			AuthenticationFunc:  openapi3filter.NoopAuthenticationFunc,
			SkipSettingDefaults: true,
			ExcludeRequestBody:  !checkBody,
		},
	})
	if err == nil {
		return nil
	}
	return validationProblem(err)
}

// checkMediaType refuses a body whose Content-Type op does not take.
func checkMediaType(op *openapi3.Operation, contentType string, body []byte) error {
	rb := op.RequestBody
	if rb == nil || rb.Value == nil || len(body) == 0 {
		return nil
	}
	if contentType == "" {
		contentType = "application/json"
	}
	mt, err := mediaType(contentType)
	if err != nil || rb.Value.Content.Get(mt) == nil {
		return newHTTPError(415, "unsupported_media_type", "Unsupported media type",
			"Content-Type %q is not accepted here (accepted: %s)", contentType, strings.Join(mediaTypes(rb.Value.Content), ", "))
	}
	return nil
}

// mediaType is mime.ParseMediaType's media type, without its parameter
// map (an allocation on every send) when a client sends one of the two
// types the API takes, as they are written.
func mediaType(contentType string) (string, error) {
	switch contentType {
	case "application/json", "application/octet-stream":
		return contentType, nil
	}
	mt, _, err := mime.ParseMediaType(contentType)
	return mt, err
}

// hotOp is what validate needs of a hot route's operation without asking
// kin-openapi: the operation, and the names of its header parameters.
type hotOp struct {
	op      *openapi3.Operation
	headers []string
}

// opKey names an operation by method and chi route pattern.
type opKey struct{ method, pattern string }

// onlyNames returns the operation of a request to a hot route whose only
// parameters are its path names, which prepare has checked with
// core.ValidateName (the Name schema's rule; TestValidateNameIsTheNameSchema);
// nil otherwise. Then kin-openapi has nothing left to check (the body is
// the handler's) and is skipped: routing and parameter checks were ~5 µs
// of a send.
func (s *Server) onlyNames(r *http.Request) *openapi3.Operation {
	rc := chi.RouteContext(r.Context())
	if rc == nil || r.URL.RawQuery != "" {
		return nil // kin-openapi checks (or words the refusal of) a query
	}
	h, ok := s.hotOps[opKey{r.Method, rc.RoutePattern()}]
	if !ok {
		return nil
	}
	for _, name := range h.headers {
		if _, present := r.Header[name]; present {
			return nil
		}
	}
	return h.op
}

// hotOperations indexes the operations of the routes given by method and
// chi pattern (which writes path templates as OpenAPI does).
func hotOperations(doc *openapi3.T, routes ...string) (map[opKey]hotOp, error) {
	out := map[opKey]hotOp{}
	for _, route := range routes {
		method, pattern, _ := strings.Cut(route, " ")
		item := doc.Paths.Find(pattern)
		if item == nil || item.GetOperation(method) == nil {
			return nil, fmt.Errorf("gateway: %s is not in openapi.yaml", route)
		}
		h := hotOp{op: item.GetOperation(method)}
		for _, p := range append(item.Parameters, h.op.Parameters...) {
			if p.Value.In == openapi3.ParameterInHeader {
				h.headers = append(h.headers, http.CanonicalHeaderKey(p.Value.Name))
			}
		}
		out[opKey{method, pattern}] = h
	}
	return out, nil
}

func mediaTypes(c openapi3.Content) []string {
	out := make([]string, 0, len(c))
	for mt := range c {
		out = append(out, mt)
	}
	slices.Sort(out)
	return out
}

// validationProblem turns a kin-openapi error into invalid_request with the
// JSON pointer of the bad field.
func validationProblem(err error) error {
	var re *openapi3filter.RequestError
	if !errors.As(err, &re) {
		return badRequest("", "%v", err)
	}
	var se *openapi3.SchemaError
	if errors.As(re.Err, &se) {
		if re.Parameter != nil {
			return badRequest("", "parameter %q: %s", re.Parameter.Name, se.Reason)
		}
		path := se.JSONPointer()
		// kin-openapi reports an unknown field at its parent object.
		if m := unsupportedProperty.FindStringSubmatch(se.Reason); m != nil {
			path = append(path, m[1])
		}
		pointer := jsonPointer(path)
		where := pointer
		if where == "" {
			where = "the body"
		}
		return badRequest(pointer, "%s: %s", where, se.Reason)
	}
	if re.Parameter != nil {
		return badRequest("", "parameter %q: %v", re.Parameter.Name, re.Err)
	}
	var syn *json.SyntaxError
	if errors.As(err, &syn) {
		return badRequest("", "malformed JSON at byte %d: %v", syn.Offset, syn)
	}
	return badRequest("", "%s", strings.TrimPrefix(re.Error(), "request body has an error: "))
}

var unsupportedProperty = regexp.MustCompile(`^property "(.*)" is unsupported$`)

// jsonPointer builds an RFC 6901 pointer; the whole document is "".
func jsonPointer(path []string) string {
	var b strings.Builder
	for _, seg := range path {
		b.WriteByte('/')
		b.WriteString(strings.NewReplacer("~", "~0", "/", "~1").Replace(seg))
	}
	return b.String()
}

func (s *Server) recoverer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				s.log.Error("panic in handler", "panic", v, "request_id", requestID(r), "path", r.URL.Path)
				writeProblem(w, problemOf(kindInternal, "internal error; see the server log for request "+requestID(r)))
			}
		}()
		next.ServeHTTP(w, r)
	})
}

type ctxKey int

const requestIDKey ctxKey = 0

func requestID(r *http.Request) string {
	id, _ := r.Context().Value(requestIDKey).(string)
	return id
}

// statusWriter remembers the status for the request log.
type statusWriter struct {
	http.ResponseWriter
	status int
	bytes  int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(b)
	w.bytes += n
	return n, err
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// requestLog gives each request an id and logs one line per request at
// debug level (errors at warn): nothing per message at info.
func (s *Server) requestLog(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		id := r.Header.Get("X-Request-Id")
		if id == "" || len(id) > 128 {
			id = strconv.FormatUint(s.reqIDs.Add(1), 36)
		}
		w.Header().Set("X-Request-Id", id)
		r = r.WithContext(context.WithValue(r.Context(), requestIDKey, id))
		sw := &statusWriter{ResponseWriter: w}
		next.ServeHTTP(sw, r)
		level := slog.LevelDebug
		if sw.status >= 500 {
			level = slog.LevelWarn
		}
		took := time.Since(start)
		route := "unmatched"
		if rc := chi.RouteContext(r.Context()); rc != nil && rc.RoutePattern() != "" {
			route = rc.RoutePattern()
		}
		s.httpDur.Record(r.Context(), took.Seconds(), s.attrs(attrKey{method: r.Method, route: route, status: sw.status})...)
		if s.log.Enabled(r.Context(), level) {
			s.log.Log(r.Context(), level, "http request", "method", r.Method, "path", r.URL.Path,
				"status", sw.status, "bytes", sw.bytes, "duration", took, "request_id", id)
		}
	})
}

// attrKey names a metric attribute set: an operation and topic, or an
// HTTP method, route and status.
type attrKey struct {
	op, topic     string
	method, route string
	status        int
}

const maxCachedAttrSets = 10_000

func (s *Server) attrs(k attrKey) []metric.RecordOption {
	if o, ok := s.attrSets.Load(k); ok {
		return o.([]metric.RecordOption)
	}
	var set attribute.Set
	if k.op != "" {
		set = attribute.NewSet(attribute.String("operation", k.op), attribute.String("topic", k.topic))
	} else {
		set = attribute.NewSet(attribute.String("http.request.method", k.method),
			attribute.String("http.route", k.route), attribute.Int("http.response.status_code", k.status))
	}
	// A slice, passed on as it is: an option given alone is put in a new
	// one by every Record.
	o := []metric.RecordOption{metric.WithAttributeSet(set)}
	// Topic names come from requests (a 404 is timed too): the cache stops
	// growing at a bound no real broker reaches.
	if s.attrN.Add(1) <= maxCachedAttrSets {
		if prev, loaded := s.attrSets.LoadOrStore(k, o); loaded {
			return prev.([]metric.RecordOption)
		}
	}
	return o
}

func writeJSON(w http.ResponseWriter, status int, v any) error {
	body, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return writeBody(w, status, body)
}

// writeBody writes a JSON document.
func writeBody(w http.ResponseWriter, status int, body []byte) error {
	body = append(body, '\n') // curl users read it on a line of its own
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, err := w.Write(body)
	return err
}

// decodeJSON decodes a validated body; an empty body leaves v as it is.
// json v2, as on the hot routes: a member named twice or invalid UTF-8 is
// refused everywhere alike (openapi.yaml, Conventions).
func decodeJSON(body []byte, v any) error {
	if len(bytes.TrimSpace(body)) == 0 {
		return nil
	}
	if err := jsonv2.Unmarshal(body, v, jsonv2.RejectUnknownMembers(true)); err != nil {
		return badRequest("", "malformed JSON: %v", err)
	}
	return nil
}

func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	_ = writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	if err := s.b.Ready(); err != nil {
		s.writeError(w, r, err)
		return
	}
	_ = writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func (s *Server) openapiYAML(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/yaml")
	_, _ = w.Write(tidemq.OpenAPI)
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
