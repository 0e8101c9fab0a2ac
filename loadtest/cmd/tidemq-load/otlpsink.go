package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime/pprof"
	"sync/atomic"
	"time"
)

// The targets are measured with tracing on: every message's spans
// made, batched and exported over OTLP, as a broker with
// OTEL_EXPORTER_OTLP_ENDPOINT set does. The brokers this command starts
// export to otlpSink, a stand-in collector on loopback that reads each
// export and drops it, so the broker pays the whole cost of tracing
// (spans, protobuf encoding, HTTP) and no collector's CPU is counted: its
// goroutines are labelled side=collector.
//
// tracesEndpoint is the sink's base URL ("" with -tracing=false); run sets
// it before any broker starts.
var tracesEndpoint string

type otlpSink struct {
	URL      string
	srv      *http.Server
	exports  atomic.Int64
	received atomic.Int64
}

func startOTLPSink() (*otlpSink, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("otlp sink: %w", err)
	}
	s := &otlpSink{URL: "http://" + ln.Addr().String()}
	s.srv = &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		s.exports.Add(1)
		s.received.Add(n)
		// An empty ExportTraceServiceResponse: every span accepted.
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.WriteHeader(http.StatusOK)
	})}
	pprof.Do(context.Background(), pprof.Labels("side", "collector"), func(context.Context) {
		go func() { _ = s.srv.Serve(ln) }() // ends with Close
	})
	return s, nil
}

func (s *otlpSink) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return s.srv.Shutdown(ctx)
}

func (s *otlpSink) String() string {
	return fmt.Sprintf("tracing on: %d OTLP exports, %.1f MB of spans received by the stand-in collector",
		s.exports.Load(), float64(s.received.Load())/1e6)
}
