package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"testing"

	"github.com/go-chi/chi/v5"

	"github.com/tidemq/tidemq/core"
	"github.com/tidemq/tidemq/gateway"
	"github.com/tidemq/tidemq/pebblestore"
)

// Benchmarks of sends over HTTP on loopback, through the real wiring
// (Pebble in b.TempDir() on the real disk, core with fsync on, gateway),
// next to a no-op chi handler hit by the same client at the same
// concurrency, so that the gateway's cost reads as a ratio:
//
//	go test -run '^$' -bench . -benchmem ./gateway/
//
// Client and server share the machine's cores. The client is the SDK's: a
// clone of http.DefaultTransport (so it asks for gzip replies, and the
// gateway's compression middleware gives them) with enough idle connections
// per host for every goroutine.

const (
	benchTopic       = "bench"
	benchKiB         = 1024
	benchSendConc    = 64
	benchBatchConc   = 16
	benchBatchLength = 100
)

var benchLogger = slog.New(slog.NewTextHandler(io.Discard, nil))

// benchText is n random letters: a 1 KiB body that needs no JSON escaping.
func benchText(n int) string {
	r := rand.New(rand.NewPCG(1, 2))
	b := make([]byte, n)
	for i := range b {
		b[i] = 'a' + byte(r.IntN(26))
	}
	return string(b)
}

func benchSendJSON() []byte {
	body, _ := json.Marshal(map[string]string{"body": benchText(benchKiB)})
	return body
}

func benchBatchJSON() []byte {
	type entry struct {
		Body string `json:"body"`
	}
	msgs := make([]entry, benchBatchLength)
	for i := range msgs {
		msgs[i].Body = benchText(benchKiB)
	}
	body, _ := json.Marshal(map[string]any{"messages": msgs})
	return body
}

// benchServer serves the real wiring on loopback with topic benchTopic
// (8 queues); everything is closed when the benchmark ends.
func benchServer(b *testing.B) string {
	b.Helper()
	store, err := pebblestore.Open(b.TempDir(), pebblestore.Options{Logger: benchLogger})
	if err != nil {
		b.Fatalf("pebblestore.Open: %v", err)
	}
	b.Cleanup(func() {
		if err := store.Close(); err != nil {
			b.Errorf("store Close: %v", err)
		}
	})
	br, err := core.New(store, core.Options{Logger: benchLogger})
	if err != nil {
		b.Fatalf("core.New: %v", err)
	}
	b.Cleanup(func() {
		if err := br.Close(); err != nil {
			b.Errorf("broker Close: %v", err)
		}
	})
	if _, _, err := br.PutTopic(context.Background(), benchTopic, core.TopicConfig{}); err != nil {
		b.Fatalf("PutTopic: %v", err)
	}
	gw, err := gateway.New(br, gateway.Options{Logger: benchLogger})
	if err != nil {
		b.Fatalf("gateway.New: %v", err)
	}
	srv := httptest.NewServer(gw)
	b.Cleanup(srv.Close)
	return srv.URL
}

// benchNoopServer is a chi router with one handler that reads the request
// body and answers 201 with a send result of the real size.
func benchNoopServer(b *testing.B) string {
	b.Helper()
	reply := []byte(`{"messageId":"1O8GTGXJ0V5JVDKQ6ZQ5XH","queueId":3,"offset":123456,"storedAt":"2026-01-02T03:04:05.678Z","duplicate":false}` + "\n")
	m := chi.NewRouter()
	m.Post("/v1/topics/{topic}/messages", func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.Copy(io.Discard, r.Body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(reply)))
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(reply)
	})
	srv := httptest.NewServer(m)
	b.Cleanup(srv.Close)
	return srv.URL
}

// benchClient is the shared client: the SDK's transport with an idle
// connection kept for each of conc goroutines.
func benchClient(b *testing.B, conc int) *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns = 2 * conc
	tr.MaxIdleConnsPerHost = conc
	b.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// benchPost runs b.RunParallel with about conc goroutines, each POSTing
// payload to url and wanting 201; msgs is the messages per request.
func benchPost(b *testing.B, url string, payload []byte, conc, msgs int) {
	client := benchClient(b, conc)
	b.SetBytes(int64(msgs * benchKiB))
	b.ReportAllocs()
	b.SetParallelism((conc + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(payload))
			if err != nil {
				b.Errorf("NewRequest: %v", err)
				return
			}
			req.Header.Set("Content-Type", "application/json")
			resp, err := client.Do(req)
			if err != nil {
				b.Errorf("POST %s: %v", url, err)
				return
			}
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if err != nil || resp.StatusCode != http.StatusCreated {
				b.Errorf("POST %s: %s, %v", url, resp.Status, err)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(msgs*b.N)/b.Elapsed().Seconds(), "msgs/s")
}

// BenchmarkGatewaySend is 64 clients each sending one 1 KiB message per
// request (POST /v1/topics/bench/messages), fsync on.
func BenchmarkGatewaySend(b *testing.B) {
	url := benchServer(b) + "/v1/topics/" + benchTopic + "/messages"
	benchPost(b, url, benchSendJSON(), benchSendConc, 1)
}

// BenchmarkGatewayBatchSend is 16 clients each sending 100 messages of
// 1 KiB per request (POST /v1/topics/bench/messages:batch), fsync on.
func BenchmarkGatewayBatchSend(b *testing.B) {
	url := benchServer(b) + "/v1/topics/" + benchTopic + "/messages:batch"
	benchPost(b, url, benchBatchJSON(), benchBatchConc, benchBatchLength)
}

// BenchmarkNoopChi is BenchmarkGatewaySend's client against a chi handler
// that does nothing: the floor of HTTP on loopback on this machine.
func BenchmarkNoopChi(b *testing.B) {
	url := benchNoopServer(b) + "/v1/topics/" + benchTopic + "/messages"
	benchPost(b, url, benchSendJSON(), benchSendConc, 1)
}
