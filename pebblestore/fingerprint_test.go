package pebblestore

import (
	"bytes"
	"errors"
	"testing"

	"github.com/cockroachdb/pebble/v2"

	"github.com/tidemq/tidemq/core"
)

// kv is one raw write; the value "\x00delete" deletes the key.
type kv struct{ k, v string }

func fingerprintOf(t *testing.T, flush bool, writes ...kv) [32]byte {
	t.Helper()
	s := openFuzzStore(t)
	for i, w := range writes {
		var err error
		if w.v == "\x00delete" {
			err = s.db.Delete([]byte(w.k), pebble.NoSync)
		} else {
			err = s.db.Set([]byte(w.k), []byte(w.v), pebble.NoSync)
		}
		if err != nil {
			t.Fatal(err)
		}
		if flush && i == len(writes)/2 {
			if err := s.Flush(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if flush {
		if err := s.Compact(); err != nil {
			t.Fatal(err)
		}
	}
	fp, err := s.Fingerprint()
	if err != nil {
		t.Fatal(err)
	}
	return fp
}

// A fingerprint is of the contents: the same keys and values give the
// same one however they were written (order, overwrites, deletes, flushes
// and compactions, values in blob files) and whatever raft keys lie beside
// them; any other key or value, or the
// same bytes split differently between key and value, gives another.
func TestFingerprintIsOfTheContents(t *testing.T) {
	big := string(bytes.Repeat([]byte("body"), 300)) // value separation keeps it in a blob file
	base := []kv{{"a", "1"}, {"b", big}, {"c", ""}}
	want := fingerprintOf(t, false, base...)
	same := map[string][]kv{
		"reordered":   {{"c", ""}, {"b", big}, {"a", "1"}},
		"overwritten": {{"a", "0"}, {"b", "x"}, {"a", "1"}, {"c", ""}, {"b", big}},
		"deleted":     {{"d", "gone"}, {"a", "1"}, {"b", big}, {"d", "\x00delete"}, {"c", ""}},
		// A replica's own raft log and votes are not the applied state.
		"with raft keys": {{"a", "1"}, {string(prefixRaft) + "\x00\x00\x00\x01sCurrentTerm", "7"}, {"b", big}, {"c", ""}},
	}
	for name, writes := range same {
		if got := fingerprintOf(t, false, writes...); got != want {
			t.Errorf("%s: fingerprint differs", name)
		}
		if got := fingerprintOf(t, true, writes...); got != want {
			t.Errorf("%s, flushed and compacted: fingerprint differs", name)
		}
	}
	other := map[string][]kv{
		"a value changed":      {{"a", "2"}, {"b", big}, {"c", ""}},
		"a big value changed":  {{"a", "1"}, {"b", big[:len(big)-1] + "x"}, {"c", ""}},
		"a key changed":        {{"a", "1"}, {"b", big}, {"d", ""}},
		"a key more":           {{"a", "1"}, {"b", big}, {"c", ""}, {"e", ""}},
		"a key fewer":          {{"a", "1"}, {"b", big}},
		"a boundary shifted":   {{"a1", ""}, {"b", big}, {"c", ""}},
		"a key became a value": {{"a", "1"}, {"b", big + "c"}},
	}
	for name, writes := range other {
		if got := fingerprintOf(t, true, writes...); got == want {
			t.Errorf("%s: same fingerprint", name)
		}
	}
	s := openFuzzStore(t)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Fingerprint(); !errors.Is(err, core.ErrClosed) {
		t.Errorf("Fingerprint of a closed store: %v, want ErrClosed", err)
	}
}
