package pebblestore

import (
	"bytes"
	"math"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

func TestRaftLogEncoding(t *testing.T) {
	l := &raft.Log{Index: 300, Term: 7, Type: raft.LogCommand, Data: []byte("data"), Extensions: []byte("ext"),
		AppendedAt: time.Date(2026, 12, 2, 1, 2, 3, 456789, time.UTC)}
	enc := encodeRaftLog(nil, l)
	// Deterministic: equal logs encode to equal bytes, whatever the
	// AppendedAt's location.
	same := *l
	same.AppendedAt = l.AppendedAt.In(time.FixedZone("x", 3600))
	if again := encodeRaftLog(nil, &same); !bytes.Equal(enc, again) {
		t.Errorf("encodings of one log differ: %x, %x", enc, again)
	}
	// raftLogLen, which StoreLogs reserves in its batch, is the encoding's
	// length, whatever the varints' sizes.
	for _, o := range []*raft.Log{l, {}, {Index: math.MaxUint64, Term: 1 << 40, Data: make([]byte, 200_000)},
		{Index: 1, AppendedAt: time.Date(1500, 1, 1, 0, 0, 0, 1, time.UTC)}, {Extensions: make([]byte, 128)}} {
		if n, want := raftLogLen(o), len(encodeRaftLog(nil, o)); n != want {
			t.Errorf("raftLogLen(index %d) = %d, encoded in %d", o.Index, n, want)
		}
	}
	var got raft.Log
	if err := decodeRaftLog(enc, 300, &got); err != nil {
		t.Fatalf("decode: %v", err)
	}
	if got.Index != l.Index || got.Term != l.Term || got.Type != l.Type || !bytes.Equal(got.Data, l.Data) ||
		!bytes.Equal(got.Extensions, l.Extensions) || !got.AppendedAt.Equal(l.AppendedAt) {
		t.Errorf("decoded %+v; want %+v", got, *l)
	}

	// Every malformed record is an error, never a panic or a wrong log.
	bad := map[string][]byte{
		"empty":          nil,
		"other version":  append([]byte{2}, enc[1:]...),
		"trailing bytes": append(append([]byte(nil), enc...), 0),
		"bad time flag":  append(append([]byte(nil), enc[:len(enc)-len(encodeTime(l.AppendedAt))]...), 2),
	}
	for n := 1; n < len(enc); n++ {
		bad["truncated"] = enc[:n]
		for name, v := range bad {
			if err := decodeRaftLog(v, 300, new(raft.Log)); err == nil {
				t.Errorf("%s (%x): decoded without error", name, v)
			}
		}
	}
	if err := decodeRaftLog(enc, 301, new(raft.Log)); err == nil {
		t.Errorf("a record of index 300 read as index 301 without error")
	}
}

// encodeTime is the tail encodeRaftLog writes for t.
func encodeTime(t time.Time) []byte {
	full := encodeRaftLog(nil, &raft.Log{AppendedAt: t})
	return full[len(encodeRaftLog(nil, &raft.Log{}))-1:]
}
