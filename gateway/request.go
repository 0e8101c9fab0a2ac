package gateway

import (
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"net/http"
	"strings"

	"github.com/go-chi/chi/v5"
	jsonv2 "github.com/go-json-experiment/json"
	"github.com/klauspost/compress/zstd"
	"go.opentelemetry.io/otel/propagation"

	"github.com/tidemq/tidemq/core"
)

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
