package gateway

import (
	"context"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/go-chi/chi/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

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
