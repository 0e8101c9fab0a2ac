package otlpspans

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/klauspost/compress/gzip"
	"google.golang.org/protobuf/proto"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
)

// Limits taken from otlptracehttp v1.45.
const (
	maxRequestSize      = 64 << 20
	maxResponseBodySize = 4 << 20
)

// errorBodyExcerpt bounds how much of a collector's error response ends up
// in an error message (stock includes the whole body).
const errorBodyExcerpt = 512

// errShutdown wraps context.Canceled because that is what stock returns
// for an export after Shutdown.
var errShutdown = fmt.Errorf("exporter is shut down: %w", context.Canceled)

var errInsecureEndpointWithTLS = errors.New("insecure HTTP endpoint cannot use TLS client configuration")

// PartialSuccessError reports spans the collector accepted the request for
// but rejected. Like otlptracehttp, ExportSpans returns it (the SDK's span
// processors pass it to otel.Handle); the request is not retried.
type PartialSuccessError struct {
	RejectedSpans int64
	Message       string
}

func (e *PartialSuccessError) Error() string {
	msg := e.Message
	if msg == "" {
		msg = "empty message"
	}
	return fmt.Sprintf("OTLP partial success: %s (%d spans rejected)", msg, e.RejectedSpans)
}

// Exporter sends spans to an OTLP/HTTP collector as protobuf. It is safe for
// concurrent use.
type Exporter struct {
	endpoint string
	header   http.Header
	gzip     bool
	client   *http.Client
	retry    retryPolicy

	stopped context.Context // done after Shutdown; cancels in-flight exports
	stop    context.CancelFunc
}

var _ sdktrace.SpanExporter = (*Exporter)(nil)

// New returns an Exporter for cfg. It does not connect.
func New(cfg Config) (*Exporter, error) {
	endpoint := cfg.Endpoint
	if endpoint == "" {
		endpoint = DefaultEndpoint
	}
	u, err := url.Parse(endpoint)
	if err != nil {
		return nil, fmt.Errorf("otlpspans: endpoint: %w", err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("otlpspans: endpoint %q: want an http or https URL", endpoint)
	}
	if u.Scheme == "http" && cfg.TLS != nil {
		return nil, fmt.Errorf("otlpspans: %w", errInsecureEndpointWithTLS)
	}

	header := http.Header{}
	header.Set("User-Agent", "OTel OTLP Exporter Go/"+otlptrace.Version())
	for k, v := range cfg.Headers {
		header.Set(k, v)
	}
	header.Set("Content-Type", "application/x-protobuf")
	switch cfg.Compression {
	case "gzip":
		header.Set("Content-Encoding", "gzip")
	case "", "none":
	default:
		return nil, fmt.Errorf("otlpspans: unknown compression %q", cfg.Compression)
	}

	timeout := cfg.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	transport := newTransport()
	transport.TLSClientConfig = cfg.TLS

	stopped, stop := context.WithCancel(context.Background())
	return &Exporter{
		endpoint: u.String(),
		header:   header,
		gzip:     cfg.Compression == "gzip",
		client:   &http.Client{Transport: transport, Timeout: timeout},
		retry:    defaultRetryPolicy,
		stopped:  stopped,
		stop:     stop,
	}, nil
}

// newTransport clones http.DefaultTransport unless something replaced it,
// in which case it rebuilds the standard one as otlptracehttp does.
func newTransport() *http.Transport {
	if t, ok := http.DefaultTransport.(*http.Transport); ok {
		return t.Clone()
	}
	return &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          100,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: 1 * time.Second,
	}
}

// Shutdown stops the exporter and aborts in-flight exports; it does not
// wait for them. Later exports fail without sending. It may be called more
// than once.
func (e *Exporter) Shutdown(ctx context.Context) error {
	e.stop()
	e.client.CloseIdleConnections()
	return ctx.Err()
}

// ExportSpans encodes spans and POSTs them, retrying throttling and
// transient failures within ctx.
func (e *Exporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	if e.stopped.Err() != nil {
		return fmt.Errorf("traces export: %w", errShutdown)
	}
	buf := bufferPool.Get().(*exportBuffer)
	defer buf.release()

	buf.raw = MarshalSpans(buf.raw[:0], spans)
	if len(buf.raw) == 0 {
		return nil
	}
	return e.exportRaw(ctx, buf)
}

// exportRaw sends an encoded ExportTraceServiceRequest.
func (e *Exporter) exportRaw(ctx context.Context, buf *exportBuffer) error {
	if e.stopped.Err() != nil {
		return fmt.Errorf("traces export: %w", errShutdown)
	}
	if len(buf.raw) > maxRequestSize {
		return fmt.Errorf("traces export: request body too large: exceeded %d bytes", maxRequestSize)
	}
	body := buf.raw
	if e.gzip {
		var err error
		if body, err = buf.compress(); err != nil {
			return fmt.Errorf("traces export: gzip: %w", err)
		}
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(e.stopped, cancel)()

	if err := e.retry.do(ctx, func(ctx context.Context) error { return e.post(ctx, buf, body) }); err != nil {
		return fmt.Errorf("traces export: %w", err)
	}
	return nil
}

func (e *Exporter) post(ctx context.Context, buf *exportBuffer, body []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.endpoint, nil)
	if err != nil {
		return err
	}
	req.Header = e.header.Clone()
	req.ContentLength = int64(len(body))
	req.Body = buf.reader(body)
	req.GetBody = func() (io.ReadCloser, error) { return buf.reader(body), nil }

	resp, err := e.client.Do(req)
	if err != nil {
		var urlErr *url.Error
		if errors.As(err, &urlErr) && urlErr.Temporary() {
			return &retryableError{err: err}
		}
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	respBody, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBodySize+1))
	if err != nil {
		return err
	}
	if len(respBody) > maxResponseBodySize {
		return fmt.Errorf("response body too large: exceeded %d bytes", maxResponseBodySize)
	}

	switch code := resp.StatusCode; {
	case code >= 200 && code <= 299:
		return partialSuccess(resp.Header, respBody)
	case code == http.StatusTooManyRequests, code == http.StatusBadGateway,
		code == http.StatusServiceUnavailable, code == http.StatusGatewayTimeout:
		return &retryableError{
			err:      fmt.Errorf("%s (body: %s)", resp.Status, excerpt(respBody)),
			throttle: retryAfter(resp.Header.Get("Retry-After")),
		}
	default:
		return fmt.Errorf("failed to send to %s: %s (body: %s)", e.endpoint, resp.Status, excerpt(respBody))
	}
}

func partialSuccess(header http.Header, body []byte) error {
	if len(body) == 0 || header.Get("Content-Type") != "application/x-protobuf" {
		return nil
	}
	var resp coltracepb.ExportTraceServiceResponse
	if err := proto.Unmarshal(body, &resp); err != nil {
		return err
	}
	ps := resp.GetPartialSuccess()
	if ps.GetRejectedSpans() == 0 && ps.GetErrorMessage() == "" {
		return nil
	}
	return &PartialSuccessError{RejectedSpans: ps.GetRejectedSpans(), Message: ps.GetErrorMessage()}
}

func excerpt(body []byte) string {
	s := strings.TrimSpace(string(body[:min(len(body), errorBodyExcerpt)]))
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "?")
	}
	switch {
	case s == "":
		return "(empty)"
	case len(body) > errorBodyExcerpt:
		return s + "…"
	default:
		return s
	}
}

// retryAfter parses delay-seconds or an HTTP date; anything else means no
// explicit throttle.
func retryAfter(v string) time.Duration {
	if v == "" {
		return 0
	}
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil && secs >= 0 {
		return time.Duration(min(secs, int64(1<<63-1)/int64(time.Second))) * time.Second
	}
	if date, err := http.ParseTime(v); err == nil {
		return max(time.Until(date), 0)
	}
	return 0
}

type retryableError struct {
	err      error
	throttle time.Duration
}

func (e *retryableError) Error() string { return "retry-able request failure: " + e.err.Error() }
func (e *retryableError) Unwrap() error { return e.err }

// retryPolicy is otlptracehttp's exponential backoff (cenkalti/backoff with
// its default multiplier 1.5 and ±50% jitter).
type retryPolicy struct {
	initialInterval time.Duration
	maxInterval     time.Duration
	maxElapsed      time.Duration
}

var defaultRetryPolicy = retryPolicy{
	initialInterval: 5 * time.Second,
	maxInterval:     30 * time.Second,
	maxElapsed:      time.Minute,
}

func (p retryPolicy) do(ctx context.Context, attempt func(context.Context) error) error {
	start := time.Now()
	interval := p.initialInterval
	for {
		err := attempt(ctx)
		var retryable *retryableError
		if err == nil || !errors.As(err, &retryable) {
			return err
		}
		if ctxErr := ctx.Err(); ctxErr != nil {
			return fmt.Errorf("%w: %w", ctxErr, err)
		}
		elapsed := time.Since(start)
		if elapsed > p.maxElapsed {
			return fmt.Errorf("max retry time elapsed: %w", err)
		}
		delay := max(retryable.throttle, jitter(interval))
		interval = min(time.Duration(float64(interval)*1.5), p.maxInterval)
		if elapsed+retryable.throttle > p.maxElapsed {
			return fmt.Errorf("max retry time would elapse: %w", err)
		}
		// Stock sleeps until the deadline and then fails; failing now frees
		// the span processor sooner with the same outcome.
		if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < delay {
			return fmt.Errorf("retry in %v would pass the context deadline: %w", delay.Round(time.Millisecond), err)
		}
		timer := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			timer.Stop()
			return fmt.Errorf("%w: %w", context.Cause(ctx), err)
		case <-timer.C:
		}
	}
}

func jitter(d time.Duration) time.Duration {
	return d/2 + rand.N(d+1)
}

// exportBuffer holds one export's encoded and compressed request. The HTTP
// transport may still read a request body after Do returns (it closes the
// body when done), so a buffer goes back to the pool only once every body
// reader handed out has been closed.
type exportBuffer struct {
	raw         []byte
	compressed  bytes.Buffer
	openReaders atomic.Int32
}

// maxPooledBuffer keeps a rare huge batch from pinning memory in the pool.
const maxPooledBuffer = 8 << 20

var bufferPool = sync.Pool{New: func() any { return new(exportBuffer) }}

var gzipPool = sync.Pool{New: func() any { return gzip.NewWriter(io.Discard) }}

func (b *exportBuffer) compress() ([]byte, error) {
	b.compressed.Reset()
	zw := gzipPool.Get().(*gzip.Writer)
	defer gzipPool.Put(zw)
	zw.Reset(&b.compressed)
	if _, err := zw.Write(b.raw); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return b.compressed.Bytes(), nil
}

func (b *exportBuffer) reader(body []byte) io.ReadCloser {
	b.openReaders.Add(1)
	return &bodyReader{Reader: bytes.NewReader(body), owner: b}
}

func (b *exportBuffer) release() {
	if b.openReaders.Load() != 0 || cap(b.raw) > maxPooledBuffer || b.compressed.Cap() > maxPooledBuffer {
		return
	}
	bufferPool.Put(b)
}

type bodyReader struct {
	*bytes.Reader
	owner  *exportBuffer
	closed atomic.Bool
}

func (r *bodyReader) Close() error {
	if r.closed.CompareAndSwap(false, true) {
		r.owner.openReaders.Add(-1)
	}
	return nil
}
