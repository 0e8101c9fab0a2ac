package gateway

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/tidemq/tidemq/core"
)

func (s *Server) send(w http.ResponseWriter, r *http.Request, body []byte) error {
	now := time.Now()
	var m *core.Message
	var err error
	var checkAfter int64
	if len(body) == 0 {
		return s.explainBody(r, body, &fieldError{reason: "a request body is required"})
	}
	if isRaw(r) {
		m, err = s.rawMessage(r, body, now)
		if err == nil {
			checkAfter, err = rawCheckAfter(r)
		}
	} else {
		var req *sendRequest
		if req, err = decodeSend(body); err != nil {
			return s.explainBody(r, body, err)
		}
		if req.DedupKey == "" {
			req.DedupKey = r.Header.Get("Idempotency-Key")
		}
		m, err = s.jsonMessage(req, "", now)
		checkAfter = req.CheckAfterSeconds
	}
	if err != nil {
		return err
	}
	stampProducer(m, r)
	var results []core.SendResult
	var txID string
	if checkAfter > 0 {
		results, txID, err = s.b.SendTransaction(r.Context(), chi.URLParam(r, "topic"), []*core.Message{m}, time.Duration(checkAfter)*time.Second)
	} else {
		results, err = s.b.Send(r.Context(), chi.URLParam(r, "topic"), []*core.Message{m})
	}
	if ve, ok := errors.AsType[*core.ValidationError](err); ok {
		ve.Entry = -1 // a single send has no entries
	}
	if err != nil {
		return err
	}
	return writeBody(w, http.StatusCreated, sendResultJSON(results[0], txID))
}

func (s *Server) sendBatch(w http.ResponseWriter, r *http.Request, body []byte) error {
	reqs, checkAfter, err := decodeBatch(body)
	if err != nil {
		return s.explainBody(r, body, err)
	}
	now := time.Now()
	msgs := make([]*core.Message, len(reqs))
	for i := range reqs {
		m, err := s.jsonMessage(&reqs[i], fmt.Sprintf("/messages/%d", i), now)
		if err != nil {
			if ve, ok := errors.AsType[*core.ValidationError](err); ok {
				ve.Entry = i
			}
			return err
		}
		stampProducer(m, r)
		msgs[i] = m
	}
	var results []core.SendResult
	var txID string
	if checkAfter > 0 {
		results, txID, err = s.b.SendTransaction(r.Context(), chi.URLParam(r, "topic"), msgs, time.Duration(checkAfter)*time.Second)
	} else {
		results, err = s.b.Send(r.Context(), chi.URLParam(r, "topic"), msgs)
	}
	if ve, ok := errors.AsType[*core.ValidationError](err); ok && ve.Entry >= 0 {
		ve.Field = fmt.Sprintf("/messages/%d%s", ve.Entry, ve.Field)
	}
	if err != nil {
		return err
	}
	return writeBody(w, http.StatusCreated, batchResultJSON(results, txID))
}

// rawCheckAfter reads X-Tidemq-Transaction-Check-After, the raw form's
// "transaction": 0 when absent.
func rawCheckAfter(r *http.Request) (int64, error) {
	v := r.Header.Get("X-Tidemq-Transaction-Check-After")
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < core.MinCheckAfterSeconds || n > core.MaxCheckAfterSeconds {
		return 0, badRequest("/headers/X-Tidemq-Transaction-Check-After",
			"X-Tidemq-Transaction-Check-After must be a whole number of seconds, %d-%d", core.MinCheckAfterSeconds, core.MaxCheckAfterSeconds)
	}
	return n, nil
}

func isRaw(r *http.Request) bool {
	mt, _ := mediaType(r.Header.Get("Content-Type"))
	return mt == "application/octet-stream"
}

func stampProducer(m *core.Message, r *http.Request) {
	// The trace context itself travels in r's context: the broker stores
	// the send span's (or the producer's) traceparent with the message.
	m.ProducerGroup = r.Header.Get("X-Producer-Group")
}

// jsonMessage turns one JSON send entry into a message; pointer prefixes
// field names in errors ("/messages/3").
func (s *Server) jsonMessage(req *sendRequest, pointer string, now time.Time) (*core.Message, error) {
	if !req.HasBody {
		return nil, &core.ValidationError{Field: pointer + "/body", Reason: "is required", Entry: -1}
	}
	m := &core.Message{
		Tag: req.Tag, Keys: req.Keys, Properties: req.Properties, ShardingKey: req.ShardingKey,
		BornAtMs: now.UnixMilli(), DedupKey: req.DedupKey,
	}
	switch req.BodyEncoding {
	case "", "utf8":
		m.Body = req.Body
	case "base64":
		b := make([]byte, base64.StdEncoding.DecodedLen(len(req.Body)))
		n, err := base64.StdEncoding.Decode(b, req.Body)
		b = b[:n]
		if err != nil {
			return nil, &core.ValidationError{Field: pointer + "/body", Reason: "is not valid base64", Entry: -1}
		}
		m.Body, m.BodyBase64 = b, true
	default:
		return nil, &core.ValidationError{Field: pointer + "/bodyEncoding", Reason: "must be utf8 or base64", Entry: -1}
	}
	at, err := deliveryTime(req.DelaySeconds, req.DeliverAt, now)
	if err != nil {
		err.Field = pointer + err.Field
		return nil, err
	}
	m.DeliverAtMs = at
	return m, nil
}

// deliveryTime resolves delaySeconds or deliverAt (not both) to a Unix ms
// time, 0 for "now".
func deliveryTime(delaySeconds *int64, deliverAt *time.Time, now time.Time) (int64, *core.ValidationError) {
	if delaySeconds != nil && deliverAt != nil {
		return 0, &core.ValidationError{Field: "/deliverAt", Reason: "give delaySeconds or deliverAt, not both", Entry: -1}
	}
	if delaySeconds != nil {
		if *delaySeconds < 0 || *delaySeconds > core.MaxDelaySeconds {
			return 0, &core.ValidationError{Field: "/delaySeconds", Reason: fmt.Sprintf("must be between 0 and %d", core.MaxDelaySeconds), Entry: -1}
		}
		if *delaySeconds == 0 {
			return 0, nil
		}
		// Rounded up to the millisecond: never due before the delay is over.
		return (now.Add(time.Duration(*delaySeconds)*time.Second).UnixNano() + 999_999) / 1e6, nil
	}
	if deliverAt != nil {
		if deliverAt.After(now.Add(core.MaxDelaySeconds * time.Second)) {
			return 0, &core.ValidationError{Field: "/deliverAt", Reason: "must be at most 7 days ahead", Entry: -1}
		}
		if !deliverAt.After(now) {
			return 0, nil
		}
		return deliverAt.UnixMilli(), nil
	}
	return 0, nil
}

// rawMessage takes the body byte for byte and the rest from X-Tidemq-* headers.
func (s *Server) rawMessage(r *http.Request, body []byte, now time.Time) (*core.Message, error) {
	h := r.Header
	m := &core.Message{
		Body: body, Tag: h.Get("X-Tidemq-Tag"), ShardingKey: h.Get("X-Tidemq-Sharding-Key"),
		BornAtMs: now.UnixMilli(), DedupKey: h.Get("Idempotency-Key"),
	}
	if keys := h.Get("X-Tidemq-Keys"); keys != "" {
		for k := range strings.SplitSeq(keys, ",") {
			if k = strings.TrimSpace(k); k != "" {
				m.Keys = append(m.Keys, k)
			}
		}
	}
	const propPrefix = "X-Tidemq-Property-"
	for name, vals := range h {
		if len(name) > len(propPrefix) && strings.EqualFold(name[:len(propPrefix)], propPrefix) && len(vals) > 0 {
			if m.Properties == nil {
				m.Properties = map[string]string{}
			}
			m.Properties[strings.ToLower(name[len(propPrefix):])] = vals[0]
		}
	}
	var delay *int64
	if v := h.Get("X-Tidemq-Delay-Seconds"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return nil, badRequest("/headers/X-Tidemq-Delay-Seconds", "X-Tidemq-Delay-Seconds must be a whole number of seconds")
		}
		delay = &n
	}
	var at *time.Time
	if v := h.Get("X-Tidemq-Deliver-At"); v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			return nil, badRequest("/headers/X-Tidemq-Deliver-At", "X-Tidemq-Deliver-At must be an RFC 3339 time")
		}
		at = &t
	}
	due, verr := deliveryTime(delay, at, now)
	if verr != nil {
		return nil, verr
	}
	m.DeliverAtMs = due
	return m, nil
}
