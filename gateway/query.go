package gateway

import (
	"encoding/base64"
	"encoding/binary"
	"net/http"
	"strconv"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/tidemq/tidemq/core"
)

type seekRequest struct {
	To         string `json:"to"`
	DryRun     bool   `json:"dryRun"`
	ConsumerID string `json:"consumerId"`
}

func (s *Server) seek(w http.ResponseWriter, r *http.Request, body []byte) error {
	var req seekRequest
	if err := decodeJSON(body, &req); err != nil {
		return err
	}
	res, err := s.b.Seek(r.Context(), chi.URLParam(r, "topic"), chi.URLParam(r, "group"), req.To, req.ConsumerID, req.DryRun)
	if err != nil {
		return err
	}
	type queueCount struct {
		QueueID int   `json:"queueId"`
		Count   int64 `json:"count"`
	}
	out := struct {
		DryRun bool         `json:"dryRun"`
		Queues []queueCount `json:"queues"`
		Total  int64        `json:"total"`
	}{DryRun: req.DryRun, Queues: make([]queueCount, len(res.Queues)), Total: res.Total}
	for i, q := range res.Queues {
		out.Queues[i] = queueCount(q)
	}
	return writeJSON(w, http.StatusOK, out)
}

type attemptJSON struct {
	Attempt     int    `json:"attempt"`
	ConsumerID  string `json:"consumerId"`
	DeliveredAt Time   `json:"deliveredAt"`
	Outcome     string `json:"outcome"`
	Reason      string `json:"reason,omitempty"`
	SettledAt   *Time  `json:"settledAt"`
}

type messageStateJSON struct {
	Group           string        `json:"group"`
	ConsumerID      string        `json:"consumerId,omitempty"`
	State           string        `json:"state"`
	DeliveryAttempt int           `json:"deliveryAttempt"`
	LastReason      string        `json:"lastReason,omitempty"`
	History         []attemptJSON `json:"history"`
}

func (s *Server) getMessage(w http.ResponseWriter, r *http.Request, _ []byte) error {
	topic := chi.URLParam(r, "topic")
	m, states, err := s.b.GetMessage(topic, chi.URLParam(r, "messageId"))
	if err != nil {
		return err
	}
	out := struct {
		Message       messageJSON        `json:"message"`
		Subscriptions []messageStateJSON `json:"subscriptions"`
	}{Message: messageOut(topic, m), Subscriptions: make([]messageStateJSON, len(states))}
	for i, st := range states {
		js := messageStateJSON{Group: st.Group, ConsumerID: st.ConsumerID, State: st.State,
			DeliveryAttempt: st.Attempt, LastReason: st.LastReason, History: make([]attemptJSON, len(st.History))}
		for j, h := range st.History {
			a := attemptJSON{Attempt: h.Attempt, ConsumerID: h.ConsumerID, DeliveredAt: Time(h.DeliveredAt),
				Outcome: h.Outcome, Reason: h.Reason}
			if !h.SettledAt.IsZero() {
				t := Time(h.SettledAt)
				a.SettledAt = &t
			}
			js.History[j] = a
		}
		out.Subscriptions[i] = js
	}
	return writeJSON(w, http.StatusOK, out)
}

func (s *Server) queryMessages(w http.ResponseWriter, r *http.Request, _ []byte) error {
	v := r.URL.Query()
	q := core.Query{Key: v.Get("key"), Tag: v.Get("tag")}
	var err error
	if q.From, err = parseTimeParam(v.Get("from"), "from"); err != nil {
		return err
	}
	if q.To, err = parseTimeParam(v.Get("to"), "to"); err != nil {
		return err
	}
	if s := v.Get("limit"); s != "" {
		if q.Limit, err = strconv.Atoi(s); err != nil {
			return badRequest("/limit", "limit must be a whole number")
		}
	}
	if s := v.Get("queueId"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			return badRequest("/queueId", "queueId must be a whole number")
		}
		q.QueueID = &n
	}
	if s := v.Get("offset"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return badRequest("/offset", "offset must be a whole number")
		}
		q.Offset = &n
	}
	if c := v.Get("cursor"); c != "" {
		cur, ok := parseQueryCursor(c)
		if !ok {
			return badRequest("/cursor", "cursor is not one this server gave out")
		}
		q.Cursor = &cur
	}
	topic := chi.URLParam(r, "topic")
	msgs, next, err := s.b.QueryMessages(r.Context(), topic, q)
	if err != nil {
		return err
	}
	out := struct {
		Messages []messageJSON `json:"messages"`
		Next     *string       `json:"next"`
	}{Messages: make([]messageJSON, len(msgs))}
	for i, m := range msgs {
		out.Messages[i] = messageOut(topic, m)
	}
	if next != nil {
		c := formatQueryCursor(*next)
		out.Next = &c
	}
	return writeJSON(w, http.StatusOK, out)
}

func parseTimeParam(v, name string) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}, badRequest("/"+name, "%s must be an RFC 3339 time", name)
	}
	return t, nil
}

// Query cursors are opaque: bucket, seq, queue and offset, base64url.
func formatQueryCursor(c core.QueryCursor) string {
	var b [24]byte
	binary.BigEndian.PutUint32(b[0:], c.Bucket)
	binary.BigEndian.PutUint64(b[4:], c.Seq)
	binary.BigEndian.PutUint32(b[12:], c.QueueID)
	binary.BigEndian.PutUint64(b[16:], c.Offset)
	return base64.RawURLEncoding.EncodeToString(b[:])
}

func parseQueryCursor(s string) (core.QueryCursor, bool) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || len(b) != 24 {
		return core.QueryCursor{}, false
	}
	return core.QueryCursor{
		Bucket: binary.BigEndian.Uint32(b[0:]), Seq: binary.BigEndian.Uint64(b[4:]),
		QueueID: binary.BigEndian.Uint32(b[12:]), Offset: binary.BigEndian.Uint64(b[16:]),
	}, true
}
