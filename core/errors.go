package core

import (
	"errors"
	"fmt"
)

// Sentinel errors. The gateway maps each to one HTTP status and problem code.
var (
	ErrClosed               = errors.New("broker closed")
	ErrTopicNotFound        = errors.New("topic not found")
	ErrSubscriptionNotFound = errors.New("subscription not found")
	ErrMessageNotFound      = errors.New("message not found")
	ErrQueueCountDecrease   = errors.New("queue count cannot decrease")
	ErrModeConflict         = errors.New("subscription mode conflict")
	ErrInvalidName          = errors.New("invalid name")
	ErrInvalidFilter        = errors.New("invalid filter")
	ErrMessageTooLarge      = errors.New("message too large")
	ErrTooManyRequests      = errors.New("too many requests")
	ErrInsufficientStorage  = errors.New("insufficient storage")
	ErrReceiptExpired       = errors.New("receipt expired")
	ErrReceiptInvalid       = errors.New("receipt invalid")
	// ErrNoLeader: the raft group that holds the data has no leader this
	// node can reach, or lost it while a request was being answered.
	ErrNoLeader = errors.New("no leader")
	// ErrMirrorNotFound: no mirror of that name (SPEC §8).
	ErrMirrorNotFound = errors.New("mirror not found")
	// ErrMirrorPaused: copies sent for a mirror paused since they were
	// pulled; the runner's, never an API answer.
	ErrMirrorPaused = errors.New("mirror paused")
	// ErrTransactionNotFound: no transaction of that id on the topic (never
	// prepared, or settled longer ago than the topic's retention).
	ErrTransactionNotFound = errors.New("transaction not found")
	// ErrTransactionSettled: the transaction was settled the other way.
	ErrTransactionSettled = errors.New("transaction settled")
)

// ValidationError reports one bad field of a request. Field is a JSON pointer
// ("/messages/3/tag"); Entry is the 0-based index of the bad batch entry, or -1.
type ValidationError struct {
	Field  string
	Reason string
	Entry  int
}

func (e *ValidationError) Error() string {
	if e.Field == "" {
		return e.Reason
	}
	return fmt.Sprintf("%s: %s", e.Field, e.Reason)
}

// EntryError names the message of a batch that an error is about.
type EntryError struct {
	Entry int
	Err   error
}

func (e *EntryError) Error() string { return fmt.Sprintf("message %d: %v", e.Entry, e.Err) }
func (e *EntryError) Unwrap() error { return e.Err }

func invalid(field, format string, args ...any) *ValidationError {
	return &ValidationError{Field: field, Reason: fmt.Sprintf(format, args...), Entry: -1}
}
