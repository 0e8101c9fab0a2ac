package wire

import (
	"bytes"
	"encoding/base64"
	"math/rand/v2"
	"testing"
)

// TestAppendBase64 compares AppendBase64 with encoding/base64 for every
// length up to 200 (each remainder after the six-byte steps, with and
// without padding) and random lengths up to 64 KiB, of random bytes and of
// all-zero and all-0xff bytes, after a prefix.
func TestAppendBase64(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	check := func(src []byte) {
		t.Helper()
		prefix := []byte(`{"body":"`)
		want := base64.StdEncoding.AppendEncode(bytes.Clone(prefix), src)
		if got := AppendBase64(bytes.Clone(prefix), src); !bytes.Equal(got, want) {
			t.Fatalf("AppendBase64(%d bytes %x…) = %q, want %q", len(src), src[:min(len(src), 16)], got, want)
		}
	}
	random := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		return b
	}
	for n := range 201 {
		check(random(n))
		check(make([]byte, n))
		check(bytes.Repeat([]byte{0xff}, n))
	}
	for range 200 {
		check(random(r.IntN(64 << 10)))
	}
	// Into a buffer with room: written in place, the prefix kept.
	buf := make([]byte, 3, 4096)
	copy(buf, "abc")
	src := random(1000)
	if got := AppendBase64(buf, src); &got[0] != &buf[0] || string(got[:3]) != "abc" || string(got[3:]) != base64.StdEncoding.EncodeToString(src) {
		t.Errorf("AppendBase64 into a buffer with room: %q", got[:16])
	}
}

func FuzzAppendBase64(f *testing.F) {
	f.Add([]byte("tidemq"))
	f.Add(bytes.Repeat([]byte{0xfe, 0x01}, 40))
	f.Fuzz(func(t *testing.T, src []byte) {
		if got, want := AppendBase64(nil, src), base64.StdEncoding.AppendEncode(nil, src); !bytes.Equal(got, want) {
			t.Fatalf("AppendBase64(%x) = %q, want %q", src, got, want)
		}
	})
}

func BenchmarkAppendBase64(b *testing.B) {
	src := bytes.Repeat([]byte{0x12, 0x9a, 0xfe, 0x33, 0x00, 0x7c, 0xd1}, 147)[:1024]
	buf := make([]byte, 0, 2048)
	b.SetBytes(int64(len(src)))
	b.Run("AppendBase64", func(b *testing.B) {
		for b.Loop() {
			buf = AppendBase64(buf[:0], src)
		}
	})
	b.Run("encoding/base64", func(b *testing.B) {
		for b.Loop() {
			buf = base64.StdEncoding.AppendEncode(buf[:0], src)
		}
	})
}
