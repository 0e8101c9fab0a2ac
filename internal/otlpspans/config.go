package otlpspans

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/http/httpguts"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

const (
	// DefaultEndpoint is the OTLP/HTTP traces URL of a local collector.
	DefaultEndpoint = "http://localhost:4318/v1/traces"
	// DefaultTimeout bounds each HTTP attempt, as in otlptracehttp.
	DefaultTimeout = 10 * time.Second

	tracesPath = "/v1/traces"
)

// Config configures an Exporter. The zero value sends uncompressed to
// DefaultEndpoint with DefaultTimeout.
type Config struct {
	// Endpoint is the full URL spans are POSTed to, including /v1/traces.
	Endpoint string
	// Headers are added to every request.
	Headers map[string]string
	// Timeout bounds each HTTP attempt (like otlptracehttp, not the export
	// as a whole: retries are bounded by the caller's context and the retry
	// budget). Zero means DefaultTimeout.
	Timeout time.Duration
	// Compression is "gzip" or "" (none).
	Compression string
	// TLS is used for https endpoints; nil means the system roots.
	TLS *tls.Config
}

// ConfigFromEnv reads the OTLP exporter environment variables the way
// otlptracehttp v1.45 does, with the OTEL_EXPORTER_OTLP_TRACES_* variables
// overriding the generic OTEL_EXPORTER_OTLP_* ones. Unlike otlptracehttp,
// which logs a malformed value and ignores it, a malformed value is an error
// naming the variable, so a typo does not silently send spans elsewhere.
func ConfigFromEnv(getenv func(string) string) (Config, error) {
	env := envReader{getenv: getenv}
	cfg := Config{Endpoint: DefaultEndpoint, Timeout: DefaultTimeout}

	endpoint, err := env.endpoint()
	if err != nil {
		return Config{}, err
	}
	if endpoint != nil {
		cfg.Endpoint = endpoint.String()
	}
	if name, v := env.lookup("HEADERS"); name != "" {
		if cfg.Headers, err = parseHeaders(v); err != nil {
			return Config{}, fmt.Errorf("%s: %w", name, err)
		}
	}
	if name, v := env.lookup("TIMEOUT"); name != "" {
		ms, err := strconv.Atoi(v)
		if err != nil || ms <= 0 {
			return Config{}, fmt.Errorf("%s: want a positive number of milliseconds, got %q", name, v)
		}
		cfg.Timeout = time.Duration(ms) * time.Millisecond
	}
	if name, v := env.lookup("COMPRESSION"); name != "" {
		switch v {
		case "gzip":
			cfg.Compression = "gzip"
		case "none":
		default:
			return Config{}, fmt.Errorf("%s: want gzip or none, got %q", name, v)
		}
	}
	if cfg.TLS, err = env.tlsConfig(); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

type envReader struct {
	getenv func(string) string
}

// lookup returns the traces-specific variable if set, else the generic one,
// else an empty name.
func (e envReader) lookup(suffix string) (name, value string) {
	for _, name := range []string{"OTEL_EXPORTER_OTLP_TRACES_" + suffix, "OTEL_EXPORTER_OTLP_" + suffix} {
		if v := strings.TrimSpace(e.getenv(name)); v != "" {
			return name, v
		}
	}
	return "", ""
}

// endpoint returns nil when no endpoint variable is set. As in
// otlptracehttp, only scheme, host and path are kept, and *_INSECURE
// overrides the scheme.
func (e envReader) endpoint() (*url.URL, error) {
	name, v := e.lookup("ENDPOINT")
	if name == "" {
		return nil, nil
	}
	u, err := url.Parse(v)
	if err == nil && u.Host == "" {
		err = errors.New("missing host")
	}
	if err == nil && u.Scheme != "http" && u.Scheme != "https" {
		err = errors.New("scheme must be http or https")
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %q: %w", name, v, err)
	}
	out := &url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path}
	switch {
	case name == "OTEL_EXPORTER_OTLP_ENDPOINT":
		// The generic endpoint is a base URL for all signals.
		out.Path = path.Join(u.Path, tracesPath)
	case out.Path == "":
		out.Path = "/"
	}

	if name, v := e.lookup("INSECURE"); name != "" {
		switch strings.ToLower(v) {
		case "true":
			out.Scheme = "http"
		case "false":
			out.Scheme = "https"
		default:
			return nil, fmt.Errorf("%s: want true or false, got %q", name, v)
		}
	}
	return out, nil
}

func (e envReader) tlsConfig() (*tls.Config, error) {
	var cfg tls.Config
	if name, file := e.lookup("CERTIFICATE"); name != "" {
		pem, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s: no PEM certificate in %s", name, file)
		}
	}

	// The certificate and key are taken as a pair, never one from each
	// prefix.
	for _, prefix := range []string{"OTEL_EXPORTER_OTLP_TRACES_", "OTEL_EXPORTER_OTLP_"} {
		certName, keyName := prefix+"CLIENT_CERTIFICATE", prefix+"CLIENT_KEY"
		certFile, keyFile := strings.TrimSpace(e.getenv(certName)), strings.TrimSpace(e.getenv(keyName))
		if certFile == "" && keyFile == "" {
			continue
		}
		if certFile == "" || keyFile == "" {
			return nil, fmt.Errorf("%s and %s must be set together", certName, keyName)
		}
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("%s/%s: %w", certName, keyName, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
		break
	}

	if cfg.RootCAs == nil && cfg.Certificates == nil {
		return nil, nil
	}
	return &cfg, nil
}

// parseHeaders parses the W3C-baggage-like "k=v,k2=v2" form; values are
// percent-decoded. Empty list members are skipped.
func parseHeaders(s string) (map[string]string, error) {
	headers := make(map[string]string)
	for member := range strings.SplitSeq(s, ",") {
		if strings.TrimSpace(member) == "" {
			continue
		}
		k, v, ok := strings.Cut(member, "=")
		if !ok {
			return nil, fmt.Errorf("header %q: missing '='", member)
		}
		k = strings.TrimSpace(k)
		if !httpguts.ValidHeaderFieldName(k) {
			return nil, fmt.Errorf("header %q: invalid name", k)
		}
		v, err := url.PathUnescape(v)
		if err != nil {
			return nil, fmt.Errorf("header %q: %w", k, err)
		}
		headers[k] = strings.TrimSpace(v)
	}
	return headers, nil
}

// ProviderConfigFromEnv reads the sampler (OTEL_TRACES_SAMPLER,
// OTEL_TRACES_SAMPLER_ARG), the batching (OTEL_BSP_SCHEDULE_DELAY,
// OTEL_BSP_EXPORT_TIMEOUT, OTEL_BSP_MAX_QUEUE_SIZE,
// OTEL_BSP_MAX_EXPORT_BATCH_SIZE) and the attribute count limit
// (OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT, else OTEL_ATTRIBUTE_COUNT_LIMIT) as the
// SDK does. Resource is left for the caller. As with ConfigFromEnv, a
// malformed value is an error rather than a log line.
func ProviderConfigFromEnv(getenv func(string) string) (ProviderConfig, error) {
	var cfg ProviderConfig
	var err error
	if cfg.Sampler, err = samplerFromEnv(getenv); err != nil {
		return ProviderConfig{}, err
	}
	positive := func(name string, dst *int) error {
		s := strings.TrimSpace(getenv(name))
		if s == "" {
			return nil
		}
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			return fmt.Errorf("%s=%q: want a positive integer", name, s)
		}
		*dst = n
		return nil
	}
	var delayMs, timeoutMs int
	for _, v := range []struct {
		name string
		dst  *int
	}{
		{"OTEL_BSP_MAX_QUEUE_SIZE", &cfg.QueueSize},
		{"OTEL_BSP_MAX_EXPORT_BATCH_SIZE", &cfg.BatchSize},
		{"OTEL_BSP_SCHEDULE_DELAY", &delayMs},
		{"OTEL_BSP_EXPORT_TIMEOUT", &timeoutMs},
	} {
		if err := positive(v.name, v.dst); err != nil {
			return ProviderConfig{}, err
		}
	}
	cfg.ScheduleDelay = time.Duration(delayMs) * time.Millisecond
	cfg.ExportTimeout = time.Duration(timeoutMs) * time.Millisecond
	// A negative limit means none, as in the SDK; zero (drop every
	// attribute) is refused: tidemq's spans are their attributes.
	for _, name := range []string{"OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "OTEL_ATTRIBUTE_COUNT_LIMIT"} {
		s := strings.TrimSpace(getenv(name))
		if s == "" {
			continue
		}
		n, err := strconv.Atoi(s)
		if err != nil || n == 0 {
			return ProviderConfig{}, fmt.Errorf("%s=%q: want a non-zero integer (negative: no limit)", name, s)
		}
		cfg.AttributeCountLimit = n
		break
	}
	return cfg, nil
}

// samplerFromEnv builds the samplers the SDK builds from
// OTEL_TRACES_SAMPLER; the default is parent-based, always on.
func samplerFromEnv(getenv func(string) string) (sdktrace.Sampler, error) {
	name := strings.ToLower(strings.TrimSpace(getenv("OTEL_TRACES_SAMPLER")))
	arg := strings.TrimSpace(getenv("OTEL_TRACES_SAMPLER_ARG"))
	ratio := func() (sdktrace.Sampler, error) {
		if arg == "" {
			return sdktrace.TraceIDRatioBased(1), nil
		}
		r, err := strconv.ParseFloat(arg, 64)
		if err != nil || r < 0 || r > 1 {
			return nil, fmt.Errorf("OTEL_TRACES_SAMPLER_ARG=%q: want a ratio from 0 to 1", arg)
		}
		return sdktrace.TraceIDRatioBased(r), nil
	}
	switch name {
	case "", "parentbased_always_on":
		return sdktrace.ParentBased(sdktrace.AlwaysSample()), nil
	case "always_on":
		return sdktrace.AlwaysSample(), nil
	case "always_off":
		return sdktrace.NeverSample(), nil
	case "parentbased_always_off":
		return sdktrace.ParentBased(sdktrace.NeverSample()), nil
	case "traceidratio":
		return ratio()
	case "parentbased_traceidratio":
		root, err := ratio()
		if err != nil {
			return nil, err
		}
		return sdktrace.ParentBased(root), nil
	default:
		return nil, fmt.Errorf("OTEL_TRACES_SAMPLER=%q: want always_on, always_off, traceidratio or their parentbased_ forms", name)
	}
}
