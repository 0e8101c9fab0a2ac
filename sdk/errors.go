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

// Is reports whether target is the sentinel of e's code, or the class of
// e's status: ErrUnavailable for a temporary one (see Temporary),
// ErrRejected for any other 4xx.
func (e *APIError) Is(target error) bool {
	switch target {
	case ErrUnavailable:
		return e.Temporary()
	case ErrRejected:
		return e.Status >= 400 && e.Status <= 499 && !e.Temporary()
	}
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
	// A cluster's (SPEC §7): a group electing its leader (a Producer
	// retries it after its Retry-After, 1 s), and the membership API's.
	ErrNoLeader       = newCode("no_leader")        // 503
	ErrGroupNotFound  = newCode("group_not_found")  // 404
	ErrMemberNotFound = newCode("member_not_found") // 404
	ErrMemberConflict = newCode("member_conflict")  // 409
	ErrNotClustered   = newCode("not_clustered")    // 409
	// Mirrors (SPEC §8).
	ErrMirrorNotFound = newCode("mirror_not_found") // 404
	// Transactional messages' (SPEC §9): no such transaction (never
	// opened, or settled so long ago that the broker forgot it), and the
	// other verb after a commit or rollback.
	ErrTransactionNotFound = newCode("transaction_not_found") // 404
	ErrTransactionSettled  = newCode("transaction_settled")   // 409
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
	// ErrClosed is returned by a Producer after its Close, and by a Client
	// (and what uses it) after its Close.
	ErrClosed = errors.New("tidemq: closed")
	// ErrUnavailable classifies a failure the broker may get over: no
	// usable reply (connection refused or reset, a timeout, a reply cut
	// short) or a temporary status (429, 502, 503, 504, 507). A Producer
	// call that ran out of retries, or met an open circuit breaker, matches
	// it, and wraps the last cause (errors.As finds the *APIError or the
	// *url.Error). A failure of a Client call whose ctx was cancelled does
	// not match it.
	ErrUnavailable = errors.New("tidemq: broker unavailable")
	// ErrRejected classifies a request the broker refused for good: an
	// *APIError with a 4xx status other than 429. Sending it again does not
	// help; the sentinel of its code (ErrMessageTooLarge…) says why.
	ErrRejected = errors.New("tidemq: request rejected")
	// ErrCircuitOpen is returned by a Producer call refused by its open
	// circuit breaker (the broker failed repeatedly; see
	// ProducerOptions.BreakerFailures): the call fails at once, without a
	// request. It matches ErrUnavailable too.
	ErrCircuitOpen error = &classError{"tidemq: circuit breaker open: broker unavailable", ErrUnavailable}
	// ErrLeaseLost is the cause of a handler's context when the message's
	// lease could not be extended (it ran out and the message went to
	// another consumer).
	ErrLeaseLost = errors.New("tidemq: lease lost")
	// ErrTransactionUnsettled is matched by the error of a
	// SendInTransaction whose commit or rollback did not reach the broker
	// (it was down, or the retries ran out): the half messages stay
	// stored, delivered to nobody, until the broker's check-back asks the
	// topic's TransactionCheckURL and settles them (never, if the topic
	// has none: then they are rolled back after the checks run out).
	ErrTransactionUnsettled = errors.New("tidemq: transaction not settled: the broker's check-back will settle it")
	// ErrConsumerRunning is returned by Consumer.Run while another Run of
	// the same Consumer is going on.
	ErrConsumerRunning = errors.New("tidemq: consumer is already running")
)

// classError is a sentinel that also matches a wider one.
type classError struct {
	msg   string
	class error
}

func (e *classError) Error() string        { return e.msg }
func (e *classError) Is(target error) bool { return target == e.class }

// gaveUpError is a Producer call that failed for want of the broker: kinds
// (ErrUnavailable, and ErrCircuitOpen when the breaker refused it) and the
// last cause, if any, all seen by errors.Is and errors.As.
type gaveUpError struct {
	msg   string
	kinds []error
	cause error
}

func (e *gaveUpError) Error() string {
	if e.cause == nil {
		return e.msg
	}
	return e.msg + ": " + e.cause.Error()
}

func (e *gaveUpError) Unwrap() []error {
	if e.cause == nil {
		return e.kinds
	}
	return append(e.kinds[:len(e.kinds):len(e.kinds)], e.cause)
}

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
