package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
)

// The targets are measured with tracing on: every message's spans
// made, batched and exported over OTLP, as a broker with
// OTEL_EXPORTER_OTLP_ENDPOINT set does. The brokers this command starts
// export to otlpSink, a stand-in collector on loopback that reads each
// export and drops it, so the broker pays the whole cost of tracing
// (spans, protobuf encoding, HTTP) and no collector's CPU is counted: its
// goroutines are labelled side=collector.
//
// The sink counts the spans it receives (a walk over the protobuf framing,
// no decoding), so that spans the broker's batch processor dropped under
// load show as the difference from the spans the run made.
//
// tracesEndpoint is the sink's base URL ("" with -tracing=false); run sets
// it before any broker starts.
var tracesEndpoint string

type otlpSink struct {
	URL      string
	srv      *http.Server
	exports  atomic.Int64
	received atomic.Int64
	spans    atomic.Int64
	bad      atomic.Int64 // exports read whole that were not a well-formed ExportTraceServiceRequest
	cut      atomic.Int64 // exports whose body ended early (a broker killed while exporting)
}

func startOTLPSink() (*otlpSink, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("otlp sink: %w", err)
	}
	s := &otlpSink{URL: "http://" + ln.Addr().String()}
	// A real collector runs elsewhere; this one shares the broker's CPUs,
	// so it reads into reused buffers: io.ReadAll grew and zeroed a new
	// one per export, 3% of a pull phase's CPU.
	var bufs sync.Pool
	s.srv = &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		buf, _ := bufs.Get().(*bytes.Buffer)
		if buf == nil {
			buf = new(bytes.Buffer)
		}
		defer bufs.Put(buf)
		buf.Reset()
		if _, err := buf.ReadFrom(r.Body); err != nil {
			s.cut.Add(1)
			return
		}
		body := buf.Bytes()
		s.exports.Add(1)
		s.received.Add(int64(len(body)))
		if n, ok := countSpans(body); ok {
			s.spans.Add(int64(n))
		} else {
			s.bad.Add(1)
		}
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
	out := fmt.Sprintf("tracing on: %d OTLP exports, %d spans (%.1f MB) received by the stand-in collector",
		s.exports.Load(), s.spans.Load(), float64(s.received.Load())/1e6)
	if bad := s.bad.Load(); bad > 0 {
		out += fmt.Sprintf(", %d malformed exports", bad)
	}
	if cut := s.cut.Load(); cut > 0 {
		out += fmt.Sprintf(", %d exports cut short", cut)
	}
	return out
}

// countSpans counts the spans of an ExportTraceServiceRequest:
// resource_spans (1) → scope_spans (2) → spans (2).
func countSpans(req []byte) (int, bool) {
	n := 0
	ok := eachField(req, 1, func(rs []byte) bool {
		return eachField(rs, 2, func(ss []byte) bool {
			return eachField(ss, 2, func([]byte) bool { n++; return true })
		})
	})
	return n, ok
}

// eachField calls fn with every length-delimited field numbered num of
// msg, skipping the others; false when msg is malformed or fn says so.
func eachField(msg []byte, num protowire.Number, fn func([]byte) bool) bool {
	for len(msg) > 0 {
		field, typ, n := protowire.ConsumeTag(msg)
		if n < 0 {
			return false
		}
		msg = msg[n:]
		if field == num && typ == protowire.BytesType {
			v, n := protowire.ConsumeBytes(msg)
			if n < 0 || !fn(v) {
				return false
			}
			msg = msg[n:]
			continue
		}
		if n = protowire.ConsumeFieldValue(field, typ, msg); n < 0 {
			return false
		}
		msg = msg[n:]
	}
	return true
}
