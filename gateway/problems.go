package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/tidemq/tidemq/core"
)

// Problem is an RFC 9457 problem detail with tidemq's stable code.
type Problem struct {
	Type    string `json:"type"`
	Title   string `json:"title"`
	Status  int    `json:"status"`
	Detail  string `json:"detail,omitempty"`
	Code    string `json:"code"`
	Entry   *int   `json:"entry,omitempty"`
	Pointer string `json:"pointer,omitempty"`
}

type problemKind struct {
	status int
	code   string
	title  string
}

// problemTable maps each sentinel, core's and the cluster's, to its status
// and code (SPEC §4).
var problemTable = []struct {
	err  error
	kind problemKind
}{
	{core.ErrInvalidName, problemKind{400, "invalid_name", "Invalid name"}},
	{core.ErrInvalidFilter, problemKind{400, "invalid_filter", "Invalid filter expression"}},
	{core.ErrTopicNotFound, problemKind{404, "topic_not_found", "Topic not found"}},
	{core.ErrSubscriptionNotFound, problemKind{404, "subscription_not_found", "Subscription not found"}},
	{core.ErrMessageNotFound, problemKind{404, "message_not_found", "Message not found"}},
	{core.ErrMirrorNotFound, problemKind{404, "mirror_not_found", "Mirror not found"}},
	{core.ErrQueueCountDecrease, problemKind{409, "queue_count_decrease", "Queue count cannot decrease"}},
	{core.ErrTransactionNotFound, problemKind{404, "transaction_not_found", "Transaction not found"}},
	{core.ErrTransactionSettled, problemKind{409, "transaction_settled", "Transaction settled"}},
	{core.ErrModeConflict, problemKind{409, "subscription_mode_conflict", "Subscription mode conflict"}},
	{core.ErrMessageTooLarge, problemKind{413, "message_too_large", "Message too large"}},
	{core.ErrTooManyRequests, kindTooManyRequests},
	{core.ErrClosed, problemKind{503, "not_ready", "Not ready"}},
	{core.ErrInsufficientStorage, problemKind{507, "insufficient_storage", "Insufficient storage"}},
	// The cluster's (cluster.go).
	{ErrNoLeader, kindNoLeader},
	{ErrGroupNotFound, problemKind{404, "group_not_found", "Group not found"}},
	{ErrMemberNotFound, problemKind{404, "member_not_found", "Member not found"}},
	{ErrMemberConflict, problemKind{409, "member_conflict", "Member conflict"}},
	{errNotClustered, kindNotClustered},
}

var (
	kindInvalidRequest  = problemKind{400, "invalid_request", "Invalid request"}
	kindTooManyRequests = problemKind{429, "too_many_requests", "Too many requests"}
	kindInternal        = problemKind{500, "internal", "Internal error"}
)

// httpError is an error the gateway itself raises, with its problem kind.
type httpError struct {
	kind    problemKind
	detail  string
	pointer string
	entry   int // the bad batch entry, or -1
}

func (e *httpError) Error() string { return e.detail }

func newHTTPError(status int, code, title, format string, args ...any) *httpError {
	return &httpError{kind: problemKind{status, code, title}, detail: fmt.Sprintf(format, args...), entry: -1}
}

func badRequest(pointer, format string, args ...any) *httpError {
	return &httpError{kind: kindInvalidRequest, detail: fmt.Sprintf(format, args...), pointer: pointer, entry: batchEntry(pointer)}
}

// writeError classifies err once, at the edge, and writes the problem.
// Unknown errors become a 500 with a generic detail; the real error goes to
// the log with the request id.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	p := Problem{}
	var he *httpError
	var ve *core.ValidationError
	switch {
	case errors.As(err, &he):
		p = problemOf(he.kind, he.detail)
		p.Pointer = he.pointer
		if he.entry >= 0 {
			entry := he.entry
			p.Entry = &entry
		}
	case errors.As(err, &ve):
		p = problemOf(kindInvalidRequest, ve.Error())
		p.Pointer = ve.Field
		if ve.Entry >= 0 {
			entry := ve.Entry
			p.Entry = &entry
		}
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		// The client went away; nobody reads this answer.
		p = problemOf(problemKind{400, "invalid_request", "Client closed request"}, err.Error())
	default:
		p = problemOf(kindInternal, "internal error; see the server log for request "+requestID(r))
		for _, e := range problemTable {
			if errors.Is(err, e.err) {
				p = problemOf(e.kind, err.Error())
				break
			}
		}
		if p.Code == "internal" {
			s.log.Error("request failed", "err", err, "request_id", requestID(r), "method", r.Method, "path", r.URL.Path)
		}
	}
	if ee, ok := errors.AsType[*core.EntryError](err); ok && p.Entry == nil && r.URL != nil && strings.HasSuffix(r.URL.Path, ":batch") {
		entry := ee.Entry
		p.Entry = &entry
	}
	if p.Status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="tidemq"`)
	}
	if p.Status == http.StatusTooManyRequests {
		w.Header().Set("Retry-After", "1")
	}
	if p.Status == http.StatusServiceUnavailable || p.Status == http.StatusInsufficientStorage {
		w.Header().Set("Retry-After", "5")
		if p.Code == kindNoLeader.code {
			w.Header().Set("Retry-After", noLeaderRetryAfter)
		}
	}
	writeProblem(w, p)
}

// batchEntry reads the entry index from a pointer into a batch request
// ("/messages/3/tag" → 3), or -1.
func batchEntry(pointer string) int {
	rest, ok := strings.CutPrefix(pointer, "/messages/")
	if !ok {
		return -1
	}
	digits, _, _ := strings.Cut(rest, "/")
	n, err := strconv.Atoi(digits)
	if err != nil || n < 0 {
		return -1
	}
	return n
}

func problemOf(k problemKind, detail string) Problem {
	return Problem{
		Type:   "https://tidemq.dev/problems/" + k.code,
		Title:  k.title,
		Status: k.status,
		Detail: detail,
		Code:   k.code,
	}
}

func writeProblem(w http.ResponseWriter, p Problem) {
	body, _ := json.Marshal(p)
	body = append(body, '\n')
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(p.Status)
	_, _ = w.Write(body)
}
