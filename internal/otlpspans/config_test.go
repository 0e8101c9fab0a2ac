package otlpspans

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func mapEnv(env map[string]string) func(string) string {
	return func(name string) string { return env[name] }
}

// writeCertAndKey writes a self-signed certificate and its key as PEM files.
func writeCertAndKey(t *testing.T) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "otlpspans test"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		IsCA:         true,
		KeyUsage:     x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

func TestConfigFromEnv(t *testing.T) {
	cert, key := writeCertAndKey(t)
	notPEM := filepath.Join(t.TempDir(), "not.pem")
	if err := os.WriteFile(notPEM, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(t.TempDir(), "missing.pem")

	type want struct {
		endpoint    string
		headers     string // fmt of the map, to keep want comparable
		timeout     time.Duration
		compression string
		rootCAs     bool
		clientCerts int
	}
	defaults := want{endpoint: DefaultEndpoint, timeout: DefaultTimeout}
	with := func(change func(*want)) want {
		w := defaults
		change(&w)
		return w
	}
	tests := []struct {
		name    string
		env     map[string]string
		want    want
		wantErr string // substring; empty means success
	}{
		{name: "defaults", want: defaults},
		{name: "generic endpoint gets the signal path",
			env:  map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"},
			want: with(func(w *want) { w.endpoint = "http://collector:4318/v1/traces" })},
		{name: "generic endpoint with trailing slash",
			env:  map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/"},
			want: with(func(w *want) { w.endpoint = "http://collector:4318/v1/traces" })},
		{name: "generic endpoint with a base path",
			env:  map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": " https://gw.example.com/otlp/ "},
			want: with(func(w *want) { w.endpoint = "https://gw.example.com/otlp/v1/traces" })},
		{name: "traces endpoint used as is",
			env:  map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/custom/spans"},
			want: with(func(w *want) { w.endpoint = "http://collector:4318/custom/spans" })},
		{name: "traces endpoint without path gets the root",
			env:  map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318"},
			want: with(func(w *want) { w.endpoint = "http://collector:4318/" })},
		{name: "traces endpoint overrides generic",
			env: map[string]string{
				"OTEL_EXPORTER_OTLP_ENDPOINT":        "http://generic:4318",
				"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://traces:4318/v1/traces",
			},
			want: with(func(w *want) { w.endpoint = "https://traces:4318/v1/traces" })},
		{name: "insecure turns the scheme to http",
			env: map[string]string{
				"OTEL_EXPORTER_OTLP_ENDPOINT": "https://collector:4318",
				"OTEL_EXPORTER_OTLP_INSECURE": "TRUE",
			},
			want: with(func(w *want) { w.endpoint = "http://collector:4318/v1/traces" })},
		{name: "traces insecure overrides generic",
			env: map[string]string{
				"OTEL_EXPORTER_OTLP_ENDPOINT":        "http://collector:4318",
				"OTEL_EXPORTER_OTLP_INSECURE":        "true",
				"OTEL_EXPORTER_OTLP_TRACES_INSECURE": "false",
			},
			want: with(func(w *want) { w.endpoint = "https://collector:4318/v1/traces" })},
		{name: "headers decoded and trimmed",
			env: map[string]string{"OTEL_EXPORTER_OTLP_HEADERS": "api-key=secret%20value%2C1 , tenant = a ,,"},
			want: with(func(w *want) {
				w.headers = fmt.Sprint(map[string]string{"api-key": "secret value,1", "tenant": "a"})
			})},
		{name: "traces headers replace generic ones",
			env: map[string]string{
				"OTEL_EXPORTER_OTLP_HEADERS":        "a=1,b=2",
				"OTEL_EXPORTER_OTLP_TRACES_HEADERS": "c=3",
			},
			want: with(func(w *want) { w.headers = fmt.Sprint(map[string]string{"c": "3"}) })},
		{name: "timeout in milliseconds",
			env:  map[string]string{"OTEL_EXPORTER_OTLP_TIMEOUT": "2500"},
			want: with(func(w *want) { w.timeout = 2500 * time.Millisecond })},
		{name: "traces timeout overrides generic",
			env:  map[string]string{"OTEL_EXPORTER_OTLP_TIMEOUT": "2500", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "700"},
			want: with(func(w *want) { w.timeout = 700 * time.Millisecond })},
		{name: "gzip",
			env:  map[string]string{"OTEL_EXPORTER_OTLP_COMPRESSION": "gzip"},
			want: with(func(w *want) { w.compression = "gzip" })},
		{name: "traces compression none overrides generic gzip",
			env:  map[string]string{"OTEL_EXPORTER_OTLP_COMPRESSION": "gzip", "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": "none"},
			want: defaults},
		{name: "CA certificate",
			env:  map[string]string{"OTEL_EXPORTER_OTLP_CERTIFICATE": cert},
			want: with(func(w *want) { w.rootCAs = true })},
		{name: "traces CA certificate overrides generic",
			env:  map[string]string{"OTEL_EXPORTER_OTLP_CERTIFICATE": missing, "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE": cert},
			want: with(func(w *want) { w.rootCAs = true })},
		{name: "client certificate",
			env: map[string]string{
				"OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": cert,
				"OTEL_EXPORTER_OTLP_CLIENT_KEY":         key,
			},
			want: with(func(w *want) { w.clientCerts = 1 })},
		{name: "traces client certificate overrides generic",
			env: map[string]string{
				"OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE":        missing,
				"OTEL_EXPORTER_OTLP_CLIENT_KEY":                missing,
				"OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE": cert,
				"OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY":         key,
				"OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE":        cert,
			},
			want: with(func(w *want) { w.clientCerts, w.rootCAs = 1, true })},

		{name: "endpoint without scheme",
			env:     map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"},
			wantErr: "OTEL_EXPORTER_OTLP_ENDPOINT"},
		{name: "unparsable traces endpoint",
			env:     map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://[::1"},
			wantErr: "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"},
		{name: "grpc-style endpoint",
			env:     map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "unix:///tmp/otlp.sock"},
			wantErr: "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"},
		{name: "insecure not a bool",
			env:     map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_INSECURE": "yes"},
			wantErr: "OTEL_EXPORTER_OTLP_INSECURE"},
		{name: "header without =",
			env:     map[string]string{"OTEL_EXPORTER_OTLP_HEADERS": "a=1,novalue"},
			wantErr: "OTEL_EXPORTER_OTLP_HEADERS"},
		{name: "header name with a space",
			env:     map[string]string{"OTEL_EXPORTER_OTLP_TRACES_HEADERS": "bad key=1"},
			wantErr: "OTEL_EXPORTER_OTLP_TRACES_HEADERS"},
		{name: "header value bad escape",
			env:     map[string]string{"OTEL_EXPORTER_OTLP_HEADERS": "a=%zz"},
			wantErr: "OTEL_EXPORTER_OTLP_HEADERS"},
		{name: "timeout with unit",
			env:     map[string]string{"OTEL_EXPORTER_OTLP_TIMEOUT": "10s"},
			wantErr: "OTEL_EXPORTER_OTLP_TIMEOUT"},
		{name: "negative timeout",
			env:     map[string]string{"OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "-5"},
			wantErr: "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT"},
		{name: "unknown compression",
			env:     map[string]string{"OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": "zstd"},
			wantErr: "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION"},
		{name: "missing CA file",
			env:     map[string]string{"OTEL_EXPORTER_OTLP_CERTIFICATE": missing},
			wantErr: "OTEL_EXPORTER_OTLP_CERTIFICATE"},
		{name: "CA file without PEM",
			env:     map[string]string{"OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE": notPEM},
			wantErr: "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE"},
		{name: "client certificate without key",
			env:     map[string]string{"OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": cert},
			wantErr: "OTEL_EXPORTER_OTLP_CLIENT_KEY"},
		{name: "client key that does not load",
			env: map[string]string{
				"OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE": cert,
				"OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY":         notPEM,
			},
			wantErr: "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := ConfigFromEnv(mapEnv(tt.env))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one naming %s", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := want{endpoint: cfg.Endpoint, timeout: cfg.Timeout, compression: cfg.Compression}
			if cfg.Headers != nil {
				got.headers = fmt.Sprint(cfg.Headers)
			}
			if cfg.TLS != nil {
				got.rootCAs, got.clientCerts = cfg.TLS.RootCAs != nil, len(cfg.TLS.Certificates)
			}
			if got != tt.want {
				t.Errorf("got %+v\nwant %+v", got, tt.want)
			}
			if _, err := New(cfg); err != nil && !strings.HasPrefix(cfg.Endpoint, "http:") {
				t.Errorf("New rejected the config: %v", err)
			}
		})
	}
}
