package pebblestore

import (
	"reflect"
	"testing"

	"github.com/tidemq/tidemq/core"
)

func mirrorProgressCases() []core.MirrorProgress {
	return []core.MirrorProgress{
		{QueueID: 0},
		{QueueID: 3, Watermark: 10, Stored: []uint64{12, 13, 300}, Copied: 7, LastCopiedMs: 1742000000000},
		{QueueID: ^uint32(0), Watermark: 1 << 62, Stored: []uint64{1<<62 + 1, ^uint64(0)}, Copied: ^uint64(0), LastCopiedMs: -1},
	}
}

func TestMirrorProgressRefusesBadBytes(t *testing.T) {
	head := encodeMirrorProgress(core.MirrorProgress{Watermark: 10})
	for name, v := range map[string][]byte{
		"short":        head[:23],
		"cut varint":   append(head[:24:24], 0x80),
		"long varint":  append(head[:24:24], 0x8c, 0x00),
		"zero delta":   append(head[:24:24], 0x01, 0x00),
		"past the top": append(encodeMirrorProgress(core.MirrorProgress{Watermark: ^uint64(0) - 1}), 0x02),
	} {
		if _, err := decodeMirrorProgress(0, v); err == nil {
			t.Errorf("%s: %x decoded", name, v)
		}
	}
}

func TestMirrorProgressRoundTrip(t *testing.T) {
	for _, p := range mirrorProgressCases() {
		got, err := decodeMirrorProgress(p.QueueID, encodeMirrorProgress(p))
		if err != nil || !reflect.DeepEqual(got, p) {
			t.Errorf("round trip of %+v: %+v, %v", p, got, err)
		}
	}
}

// The skip record's decoder reads what is on disk: it refuses bad bytes,
// never panics, and what it accepts encodes back to the same bytes.
func FuzzMirrorProgress(f *testing.F) {
	for _, p := range mirrorProgressCases() {
		f.Add(encodeMirrorProgress(p))
	}
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, v []byte) {
		p, err := decodeMirrorProgress(5, v)
		if err != nil {
			return
		}
		if again := encodeMirrorProgress(p); string(again) != string(v) {
			t.Fatalf("decode then encode changed %x into %x", v, again)
		}
	})
}
