package gateway

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"strings"

	"github.com/go-chi/chi/v5"
	jsonv2 "github.com/go-json-experiment/json"
	"github.com/klauspost/compress/zstd"
	"go.opentelemetry.io/otel/propagation"

	"github.com/tidemq/tidemq/core"
)

// prepare checks and reads a request and hands it to h. With recycle, the
// body's buffer goes back to the pool once h has returned: only for
// handlers that keep nothing of it (the sends: core.Broker.Send returns
// once the batch holding a copy of each message is committed, and the
// problems they answer hold strings, never the body's bytes).
func (s *Server) prepare(w http.ResponseWriter, r *http.Request, action string, h handlerFunc, checkBody, recycle bool) error {
	topic, group := chi.URLParam(r, "topic"), chi.URLParam(r, "group")
	// Permission first, before the body is read or any name looked up.
	if err := s.authorize(r, action, topic, group); err != nil {
		return err
	}
	for _, p := range []struct{ param, kind string }{{"topic", "topic"}, {"group", "group"}, {"name", "mirror"}} {
		if v := chi.URLParam(r, p.param); v != "" {
			if err := core.ValidateName(p.kind, v); err != nil {
				return err
			}
		}
	}
	// The body's bytes are reserved before it is read and given back when
	// the handler has answered.
	res := reservation{b: &s.budget}
	defer res.release()
	body, err := s.readBody(w, r, &res)
	if err != nil {
		return err
	}
	if recycle {
		defer recycleBody(body)
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
// refused too). The buffer is reserved against the body budget before it
// is made: a Content-Length at once, before anything is read (a body
// declared over the limit is refused unread too), and an unknown or
// decompressed length as the buffer grows.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request, res *reservation) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	limit := s.opts.MaxRequestBytes
	if r.ContentLength > limit {
		return nil, tooLarge(limit)
	}
	size := max(r.ContentLength, 0)
	if size > 0 && !res.grow(size) {
		return nil, errBudget(res.b)
	}
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
	return readReserved(src, size, limit, res)
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
