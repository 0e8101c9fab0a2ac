package sdk

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// APIError is a problem (RFC 9457) the server answered with. Match it with
// errors.Is against the sentinels below (errors.Is(err, ErrTopicNotFound)),
// or get the details with errors.As.
type APIError struct {
	Type     string `json:"type,omitempty"`
	Title    string `json:"title,omitempty"`
	Status   int    `json:"status"`
	Detail   string `json:"detail,omitempty"`
	Instance string `json:"instance,omitempty"`
	// Code is the stable snake_case identifier (SPEC §4).
	Code string `json:"code"`
	// Entry is, for a batch, the 0-based index of the bad message.
	Entry *int `json:"entry,omitempty"`
	// Pointer is the JSON pointer of the bad field ("/messages/3/tag").
	Pointer string `json:"pointer,omitempty"`
	// RetryAfter is the reply's Retry-After header, 0 when absent.
	RetryAfter time.Duration `json:"-"`
}

func (e *APIError) Error() string {
	var b strings.Builder
	b.WriteString("tidemq: ")
	b.WriteString(strconv.Itoa(e.Status))
	if e.Code != "" {
		b.WriteString(" ")
		b.WriteString(e.Code)
	}
	switch {
	case e.Detail != "":
		b.WriteString(": ")
		b.WriteString(e.Detail)
	case e.Title != "":
		b.WriteString(": ")
		b.WriteString(e.Title)
	}
	if e.Entry != nil {
		fmt.Fprintf(&b, " (batch entry %d)", *e.Entry)
	}
	return b.String()
}

// Is reports whether target is the sentinel of e's code.
func (e *APIError) Is(target error) bool {
	s, ok := sentinels[e.Code]
	return ok && s == target
}

// Temporary reports whether the request may succeed if sent again: 429,
// 502, 503, 504 and 507.
func (e *APIError) Temporary() bool {
	switch e.Status {
	case 429, 502, 503, 504, 507:
		return true
	}
	return false
}

// codeError is a sentinel: an error code of the API.
type codeError struct{ code string }

func (e *codeError) Error() string { return "tidemq: " + e.code }

func newCode(code string) error {
	e := &codeError{code}
	sentinels[code] = e
	return e
}

var sentinels = map[string]error{}

// One sentinel per error code of SPEC §4 and openapi.yaml. An *APIError
// (and HandleFailure.Err) matches the sentinel of its code with errors.Is.
var (
	ErrInvalidRequest           = newCode("invalid_request")            // 400
	ErrInvalidName              = newCode("invalid_name")               // 400
	ErrInvalidFilter            = newCode("invalid_filter")             // 400
	ErrUnauthenticated          = newCode("unauthenticated")            // 401
	ErrForbidden                = newCode("forbidden")                  // 403
	ErrTopicNotFound            = newCode("topic_not_found")            // 404
	ErrSubscriptionNotFound     = newCode("subscription_not_found")     // 404
	ErrMessageNotFound          = newCode("message_not_found")          // 404
	ErrQueueCountDecrease       = newCode("queue_count_decrease")       // 409
	ErrSubscriptionModeConflict = newCode("subscription_mode_conflict") // 409
	ErrMessageTooLarge          = newCode("message_too_large")          // 413
	ErrRequestTooLarge          = newCode("request_too_large")          // 413
	ErrUnsupportedMediaType     = newCode("unsupported_media_type")     // 415
	ErrTooManyRequests          = newCode("too_many_requests")          // 429
	ErrNotReady                 = newCode("not_ready")                  // 503
	ErrInsufficientStorage      = newCode("insufficient_storage")       // 507
	// Codes of openapi.yaml beyond SPEC §4.
	ErrNotFound         = newCode("not_found")          // 404: no such path
	ErrMethodNotAllowed = newCode("method_not_allowed") // 405
	ErrInternal         = newCode("internal")           // 500
	// Per-handle codes of ack, nack, extend and deadletter (HandleFailure).
	ErrReceiptExpired = newCode(CodeReceiptExpired)
	ErrReceiptInvalid = newCode(CodeReceiptInvalid)
)

// Errors of the SDK itself.
var (
	// ErrClosed is returned by a Producer after Close.
	ErrClosed = errors.New("tidemq: producer closed")
	// ErrCircuitOpen is returned when the producer's circuit breaker is
	// open (the broker failed repeatedly) and the retry budget of the call
	// cannot outlast it: the call fails at once instead of waiting.
	ErrCircuitOpen = errors.New("tidemq: circuit breaker open: broker unavailable")
	// ErrLeaseLost is the cause of a handler's context when the message's
	// lease could not be extended (it ran out and the message went to
	// another consumer).
	ErrLeaseLost = errors.New("tidemq: lease lost")
)

// retryAfterError is what RetryAfter returns.
type retryAfterError struct {
	delay time.Duration
	err   error
}

func (e *retryAfterError) Error() string {
	if e.err == nil {
		return "retry after " + e.delay.String()
	}
	return e.err.Error()
}

func (e *retryAfterError) Unwrap() error { return e.err }

// RetryAfter returns an error that, returned by a Handler, nacks the message
// so that it is delivered again after d (rounded up to whole seconds, the
// API's unit; 0 means at once) instead of after the subscription's next
// retry delay. errs, if any, are wrapped (errors.Is and errors.As see them)
// and their text is the nack reason. Wrapping the result again
// (fmt.Errorf("…: %w", sdk.RetryAfter(d))) keeps its effect.
func RetryAfter(d time.Duration, errs ...error) error {
	return &retryAfterError{delay: max(d, 0), err: errors.Join(errs...)}
}

// deadLetterError is what DeadLetter returns.
type deadLetterError struct{ err error }

func (e *deadLetterError) Error() string {
	if e.err == nil {
		return "dead-lettered"
	}
	return e.err.Error()
}

func (e *deadLetterError) Unwrap() error { return e.err }

// DeadLetter returns an error that, returned by a Handler, moves the message
// to the subscription's DLQ at once, without further retries; err's text is
// the reason shown in the DLQ. errors.Is and errors.As see err.
func DeadLetter(err error) error { return &deadLetterError{err: err} }
