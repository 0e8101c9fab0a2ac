package main

import (
	"os"
	"path/filepath"
	"testing"
)

// TestListeningAddr reads the broker's address from its log, from the
// offset where the current run's lines begin: an earlier run's line before
// it does not count, and a log without the line (yet) gives "".
func TestListeningAddr(t *testing.T) {
	path := filepath.Join(t.TempDir(), "broker.log")
	earlier := "=== tidemq-load run 1\n" +
		`time=2026-11-30T00:35:24.771Z level=INFO msg="tidemq listening" addr=127.0.0.1:40001 data=/d fsync=always` + "\n"
	if err := os.WriteFile(path, []byte(earlier+"=== tidemq-load run 2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := listeningAddr(path, int64(len(earlier))); got != "" {
		t.Fatalf("before the run's line: %q, want none (the earlier run's address must not count)", got)
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.WriteString(`time=2026-11-30T00:36:00.000Z level=INFO msg="opening store" dir="/a b"` + "\n" +
		`time=2026-11-30T00:36:00.100Z level=INFO msg="tidemq listening" addr=127.0.0.1:40002 data="/a b" fsync=always` + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	if got := listeningAddr(path, int64(len(earlier))); got != "127.0.0.1:40002" {
		t.Fatalf("listeningAddr = %q, want 127.0.0.1:40002", got)
	}
	if got := listeningAddr(filepath.Join(t.TempDir(), "missing.log"), 0); got != "" {
		t.Fatalf("no log: %q", got)
	}
}
