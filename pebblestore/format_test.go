package pebblestore

import (
	"errors"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// A new store records its format version, and a reopen finds it; a data
// dir of another version, or one holding keys but no version, is refused
// with an error naming what it found and what this build reads, and left
// as it was.
func TestFormatVersionCheckedAtOpen(t *testing.T) {
	for _, tc := range []struct {
		name    string
		tamper  func(t *testing.T, db *pebble.DB)
		wantErr []string // "" for none
	}{
		{"this version", func(*testing.T, *pebble.DB) {}, nil},
		{"an unknown version", func(t *testing.T, db *pebble.DB) {
			if err := db.Set(keyFormat, be.AppendUint32(nil, formatVersion+1), pebble.Sync); err != nil {
				t.Fatal(err)
			}
		}, []string{"format version 2", "reads version 1"}},
		{"no version in a dir with data", func(t *testing.T, db *pebble.DB) {
			if err := db.Delete(keyFormat, pebble.Sync); err != nil {
				t.Fatal(err)
			}
			if err := db.Set(topicKey(1), []byte(`{}`), pebble.Sync); err != nil {
				t.Fatal(err)
			}
		}, []string{"no format version (found none)", "reads version 1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := vfs.NewMem()
			s, err := Open("db", Options{FS: fs})
			if err != nil {
				t.Fatal(err)
			}
			v, closer, err := s.db.Get(keyFormat)
			if err != nil || len(v) != 4 || be.Uint32(v) != formatVersion {
				t.Fatalf("a new store's format version: %x, %v; want %d", v, err, formatVersion)
			}
			closer.Close()
			tc.tamper(t, s.db)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}

			s, err = Open("db", Options{FS: fs})
			if tc.wantErr == nil {
				if err != nil {
					t.Fatalf("reopen: %v", err)
				}
				s.Close()
				return
			}
			if err == nil {
				s.Close()
				t.Fatal("the store opened")
			}
			if !errors.Is(err, errFormat) {
				t.Errorf("error %v is not errFormat", err)
			}
			for _, want := range tc.wantErr {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}
			// Refused, the dir is as it was: a second try says the same.
			if _, again := Open("db", Options{FS: fs}); again == nil || again.Error() != err.Error() {
				t.Errorf("a second open: %v, want %v", again, err)
			}
		})
	}
}
