package core

import (
	"fmt"
	"strings"
)

// tagFilter is a parsed tag expression: "*" (nil set: everything), "A", or
// "A || B || …". Tags match exactly.
type tagFilter struct {
	tags   map[string]bool
	hashes map[uint32]bool
}

// ParseFilter parses a subscription's tag expression.
func ParseFilter(expr string) (*tagFilter, error) {
	expr = strings.TrimSpace(expr)
	if expr == "" || expr == "*" {
		return &tagFilter{}, nil
	}
	f := &tagFilter{tags: map[string]bool{}, hashes: map[uint32]bool{}}
	for part := range strings.SplitSeq(expr, "||") {
		tag := strings.TrimSpace(part)
		if tag == "*" || !ValidTag(tag) {
			return nil, fmt.Errorf("%w: %q: expected \"*\" or tags joined by \"||\"", ErrInvalidFilter, expr)
		}
		f.tags[tag] = true
		f.hashes[TagHash(tag)] = true
	}
	return f, nil
}

// all reports whether the filter lets every message through.
func (f *tagFilter) all() bool { return f.tags == nil }

// mayMatch is the index-time check: a false answer is final, a true one is
// confirmed against the tag itself once the body is read (hashes collide).
func (f *tagFilter) mayMatch(tagHash uint32) bool { return f.tags == nil || f.hashes[tagHash] }

func (f *tagFilter) matches(tag string) bool { return f.tags == nil || f.tags[tag] }
