package listenlog_test

import (
	"bytes"
	"log/slog"
	"testing"

	"github.com/tidemq/tidemq/internal/listenlog"
)

// TestAddrReadsWhatSlogWrites writes the line as cmd/tidemq does (slog's
// text handler, other lines and attributes around it, a data path with a
// space) and reads the address back; a log without it gives "".
func TestAddrReadsWhatSlogWrites(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	log.Info("opening store", "dir", "/data dir")
	if got := listenlog.Addr(buf.String()); got != "" {
		t.Fatalf("before the line: %q", got)
	}
	log.Info(listenlog.Msg, listenlog.AddrKey, "127.0.0.1:40123", "data", "/data dir", "fsync", "always")
	log.Info(listenlog.Msg, listenlog.AddrKey, "127.0.0.1:1") // a later line does not count
	if got := listenlog.Addr(buf.String()); got != "127.0.0.1:40123" {
		t.Fatalf("Addr = %q, want 127.0.0.1:40123\nlog:\n%s", got, buf.String())
	}
}
