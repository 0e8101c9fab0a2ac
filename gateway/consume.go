package gateway

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/tidemq/tidemq/core"
)

func (s *Server) putSubscription(w http.ResponseWriter, r *http.Request, body []byte) error {
	var req subscriptionRequest
	if err := decodeJSON(body, &req); err != nil {
		return err
	}
	cfg := core.SubscriptionConfig{
		Mode: req.Mode, Orderly: req.Orderly, Filter: req.Filter,
		MaxRetries: req.MaxRetries, StartFrom: req.StartFrom,
	}
	if p := req.Push; p != nil {
		cfg.Push = &core.PushConfig{Endpoint: p.Endpoint, MaxInFlight: p.MaxInFlight,
			TimeoutSeconds: p.TimeoutSeconds, Headers: p.Headers, Secret: p.Secret}
	}
	if a := req.Alerts; a != nil {
		cfg.Alerts = &core.AlertConfig{MaxLag: a.MaxLag, MaxDLQ: a.MaxDlq}
		if a.WebhookURL != nil {
			cfg.Alerts.WebhookURL = *a.WebhookURL
		}
	}
	for i, d := range req.RetryDelays {
		dur, err := parseDelay(d)
		if err != nil {
			return badRequest("/retryDelays/"+strconv.Itoa(i), "retryDelays[%d] %q must be a number with ms, s, m or h", i, d)
		}
		cfg.RetryDelays = append(cfg.RetryDelays, dur)
	}
	info, created, err := s.b.PutSubscription(r.Context(), chi.URLParam(r, "topic"), chi.URLParam(r, "group"), cfg)
	if err != nil {
		return err
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	return writeJSON(w, status, subscriptionOut(info))
}

func parseDelay(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, errors.New("bad duration")
	}
	return d, nil
}

func (s *Server) getSubscription(w http.ResponseWriter, r *http.Request, _ []byte) error {
	info, err := s.b.GetSubscription(chi.URLParam(r, "topic"), chi.URLParam(r, "group"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, subscriptionOut(info))
}

func (s *Server) listSubscriptions(w http.ResponseWriter, r *http.Request, _ []byte) error {
	subs, err := s.b.ListSubscriptions(chi.URLParam(r, "topic"))
	if err != nil {
		return err
	}
	out := struct {
		Subscriptions []subscriptionJSON `json:"subscriptions"`
	}{Subscriptions: make([]subscriptionJSON, len(subs))}
	for i, sub := range subs {
		out.Subscriptions[i] = subscriptionOut(sub)
	}
	return writeJSON(w, http.StatusOK, out)
}

func (s *Server) deleteSubscription(w http.ResponseWriter, r *http.Request, _ []byte) error {
	if err := s.b.DeleteSubscription(r.Context(), chi.URLParam(r, "topic"), chi.URLParam(r, "group")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) pull(w http.ResponseWriter, r *http.Request, body []byte) error {
	req, err := decodePull(body)
	if err != nil {
		return s.explainBody(r, body, err)
	}
	topic, group := chi.URLParam(r, "topic"), chi.URLParam(r, "group")
	got, err := s.b.Pull(r.Context(), topic, group, core.PullRequest{
		MaxMessages: req.MaxMessages,
		Wait:        time.Duration(req.WaitSeconds) * time.Second,
		Invisible:   time.Duration(req.InvisibleSeconds) * time.Second,
		ConsumerID:  req.ConsumerID,
		ClientAddr:  clientAddr(r),
	})
	if err != nil {
		return err
	}
	// A client that went away gets its leases back at once instead of after
	// invisibleSeconds: it never saw the messages.
	if err := r.Context().Err(); err != nil {
		s.release(topic, group, got)
		return nil
	}
	// Once written, the answer counts as delivered: a client may close
	// the connection as soon as it has read it.
	buf := replyBuffers.Get().(*[]byte)
	reply := pullReplyJSON((*buf)[:0], got)
	if err := writeBody(w, http.StatusOK, reply); err != nil {
		s.release(topic, group, got)
	}
	// Write has copied or sent it (gzip included): the buffer is free.
	if cap(reply) <= maxPooledReply {
		*buf = reply[:0]
		replyBuffers.Put(buf)
	}
	return nil
}

// replyBuffers keep pull replies' buffers from one pull to the next: a
// reply of 256 1 KiB messages is ~450 KB, and making (and zeroing) one per
// pull was ~2% of a pull's CPU and most of the bytes it allocated, which
// set how often the collector ran. Buffers past maxPooledReply (bodies of
// megabytes) are left to it.
var replyBuffers = sync.Pool{New: func() any { return new([]byte) }}

const maxPooledReply = 4 << 20

func (s *Server) release(topic, group string, got []core.Delivered) {
	if len(got) == 0 {
		return
	}
	handles := make([]string, len(got))
	for i, d := range got {
		handles[i] = d.ReceiptHandle
	}
	s.b.Release(topic, group, handles)
}

// clientAddr names a consumer that did not name itself: its address.
func clientAddr(r *http.Request) string {
	return r.RemoteAddr
}

func failedOut(results []core.HandleResult) []failedHandle {
	out := make([]failedHandle, 0, len(results))
	for _, f := range results {
		code := "receipt_invalid"
		if errors.Is(f.Err, core.ErrReceiptExpired) {
			code = "receipt_expired"
		}
		out = append(out, failedHandle{ReceiptHandle: f.ReceiptHandle, Code: code})
	}
	return out
}

// settleFunc applies one per-handle operation (ack, nack, extend,
// deadletter) to a subscription.
type settleFunc func(r *http.Request, topic, group string, req *handlesRequest) (int, []core.HandleResult, error)

// handlesEndpoint is the one shape of the four per-handle operations: a
// list of receipt handles in, {"<counted>": n, "failed": […]} out.
func (s *Server) handlesEndpoint(counted string, decode func([]byte) (*handlesRequest, error), do settleFunc) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request, body []byte) error {
		req, err := decode(body)
		if err != nil {
			return s.explainBody(r, body, err)
		}
		n, failed, err := do(r, chi.URLParam(r, "topic"), chi.URLParam(r, "group"), req)
		if err != nil {
			return err
		}
		out, err := json.Marshal(failedOut(failed))
		if err != nil {
			return err
		}
		reply := make([]byte, 0, len(counted)+len(out)+32)
		reply = append(reply, `{"`...)
		reply = append(reply, counted...)
		reply = append(reply, `":`...)
		reply = strconv.AppendInt(reply, int64(n), 10)
		reply = append(reply, `,"failed":`...)
		reply = append(reply, out...)
		return writeBody(w, http.StatusOK, append(reply, '}'))
	}
}

// decodeHandles reads the bodies of nack, extend and deadletter, which
// kin-openapi has already validated.
func decodeHandles(body []byte) (*handlesRequest, error) {
	req := new(handlesRequest)
	return req, decodeJSON(body, req)
}

func (s *Server) ack(r *http.Request, topic, group string, req *handlesRequest) (int, []core.HandleResult, error) {
	return s.b.Ack(r.Context(), topic, group, req.ReceiptHandles)
}

func (s *Server) nack(r *http.Request, topic, group string, req *handlesRequest) (int, []core.HandleResult, error) {
	delay := time.Duration(-1)
	if req.DelaySeconds != nil {
		if *req.DelaySeconds < 0 || *req.DelaySeconds > core.MaxInvisibleSeconds {
			return 0, nil, badRequest("/delaySeconds", "delaySeconds must be between 0 and %d", core.MaxInvisibleSeconds)
		}
		delay = time.Duration(*req.DelaySeconds) * time.Second
	}
	return s.b.Nack(r.Context(), topic, group, req.ReceiptHandles, delay, req.Reason)
}

func (s *Server) extend(r *http.Request, topic, group string, req *handlesRequest) (int, []core.HandleResult, error) {
	return s.b.Extend(r.Context(), topic, group, req.ReceiptHandles, time.Duration(req.InvisibleSeconds)*time.Second)
}

func (s *Server) deadLetter(r *http.Request, topic, group string, req *handlesRequest) (int, []core.HandleResult, error) {
	return s.b.DeadLetter(r.Context(), topic, group, req.ReceiptHandles, req.Reason)
}

type deadMessageJSON struct {
	messageJSON
	Reason string `json:"reason"`
	DeadAt Time   `json:"deadAt"`
}

func (s *Server) listDeadLetters(w http.ResponseWriter, r *http.Request, _ []byte) error {
	limit := 100
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			return badRequest("/limit", "limit must be a whole number")
		}
		limit = n
	}
	var after core.DLQCursor
	if c := r.URL.Query().Get("cursor"); c != "" {
		var ok bool
		if after, ok = parseDLQCursor(c); !ok {
			return badRequest("/cursor", "cursor is not one this server gave out")
		}
	}
	dead, next, err := s.b.ListDead(chi.URLParam(r, "topic"), chi.URLParam(r, "group"), limit, after)
	if err != nil {
		return err
	}
	out := struct {
		Messages []deadMessageJSON `json:"messages"`
		Next     *string           `json:"next"`
	}{Messages: make([]deadMessageJSON, len(dead))}
	for i, d := range dead {
		m := messageOut(d.Topic, d.Message)
		m.DeliveryAttempt = d.Attempt
		out.Messages[i] = deadMessageJSON{messageJSON: m, Reason: d.Reason, DeadAt: Time(d.DeadAt)}
	}
	if next != nil {
		c := strconv.FormatInt(next.DeadAtMs, 36) + "." + strconv.FormatUint(next.ID, 36)
		out.Next = &c
	}
	return writeJSON(w, http.StatusOK, out)
}

func parseDLQCursor(c string) (core.DLQCursor, bool) {
	ms, id, ok := strings.Cut(c, ".")
	if !ok {
		return core.DLQCursor{}, false
	}
	a, err1 := strconv.ParseInt(ms, 36, 64)
	b, err2 := strconv.ParseUint(id, 36, 64)
	return core.DLQCursor{DeadAtMs: a, ID: b}, err1 == nil && err2 == nil && a >= 0
}

type redriveRequest struct {
	MessageIDs []string   `json:"messageIds"`
	Tag        string     `json:"tag"`
	From       *time.Time `json:"from"`
	To         *time.Time `json:"to"`
	DryRun     bool       `json:"dryRun"`
}

func (s *Server) redrive(w http.ResponseWriter, r *http.Request, body []byte) error {
	var req redriveRequest
	if err := decodeJSON(body, &req); err != nil {
		return err
	}
	f := core.RedriveFilter{MessageIDs: req.MessageIDs, Tag: req.Tag, DryRun: req.DryRun}
	if req.From != nil {
		f.From = *req.From
	}
	if req.To != nil {
		f.To = *req.To
	}
	n, err := s.b.Redrive(r.Context(), chi.URLParam(r, "topic"), chi.URLParam(r, "group"), f)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, struct {
		Redriven int  `json:"redriven"`
		DryRun   bool `json:"dryRun"`
	}{n, req.DryRun})
}
