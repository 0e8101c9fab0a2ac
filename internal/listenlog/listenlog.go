// Package listenlog is the broker's "listening" log line, written by
// cmd/tidemq once it has bound its address and read by whoever started it
// on port 0 to learn the port (the load tester's backlog suite, the
// binary's own tests): one definition for the writer and the readers.
package listenlog

import "strings"

// Msg is the message of the line; its attribute AddrKey is the address
// the broker listens on.
const (
	Msg     = "tidemq listening"
	AddrKey = "addr"
)

// Addr is the address named by the first listening line in log (slog's
// text format), or "" when there is none yet.
func Addr(log string) string {
	for line := range strings.Lines(log) {
		if !strings.Contains(line, `msg="`+Msg+`"`) {
			continue
		}
		for field := range strings.FieldsSeq(line) {
			if addr, ok := strings.CutPrefix(field, AddrKey+"="); ok {
				return addr
			}
		}
	}
	return ""
}
