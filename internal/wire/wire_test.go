package wire

import (
	"bytes"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/go-json-experiment/json/jsontext"
)

// TestJSONPlain compares the word-at-a-time check with the byte rule for
// every byte value at every position of bodies 0 to 72 bytes long (the
// 32- and 8-byte steps and the tail, each alone and together), and
// checks that a plain body is written exactly as AppendQuote writes it.
func TestJSONPlain(t *testing.T) {
	plainByte := func(c byte) bool { return c >= 0x20 && c < 0x80 && c != '"' && c != '\\' }
	for n := 0; n <= 72; n++ {
		for pos := 0; pos < max(n, 1); pos++ {
			for c := 0; c < 256; c++ {
				b := bytes.Repeat([]byte{'a'}, n)
				if n > 0 {
					b[pos] = byte(c)
				}
				want := n == 0 || plainByte(byte(c))
				if got := Plain(b); got != want {
					t.Fatalf("Plain(%q) = %v, want %v", b, got, want)
				}
				if want {
					quoted, err := jsontext.AppendQuote(nil, b)
					if err != nil || string(quoted) != `"`+string(b)+`"` {
						t.Fatalf("%q is plain but AppendQuote writes %s (%v)", b, quoted, err)
					}
				}
			}
		}
	}
	// Neighbouring bytes that borrow from each other in the subtraction.
	for _, b := range []string{"\x00\x01 !\"#", "\x1f\x20\x21\x21\x21\x21\x21\x21", "  !!!!!!\x7f~", "\x21\x22\x21\x21\x21\x21\x21\x21"} {
		want := true
		for _, c := range []byte(b) {
			want = want && plainByte(c)
		}
		if got := Plain([]byte(b)); got != want {
			t.Errorf("Plain(%q) = %v, want %v", b, got, want)
		}
	}
}

// TestAppendTime compares the hand-written RFC 3339 writer with
// AppendFormat(TimeLayout) at the edges of its fast path (years 0 and
// 9999, every field's carry), beyond it, and at random instants, in UTC
// and in another zone.
func TestAppendTime(t *testing.T) {
	zone := time.FixedZone("UTC+5:30", 5*3600+1800)
	check := func(tm time.Time) {
		t.Helper()
		for _, in := range []time.Time{tm, tm.In(zone)} {
			want := in.UTC().AppendFormat(nil, TimeLayout)
			if got := AppendTime([]byte("x"), in); string(got) != "x"+string(want) {
				t.Fatalf("AppendTime(%v) = %q, want x%q", in, got, want)
			}
		}
	}
	for _, tm := range []time.Time{
		{}, time.Unix(0, 0), time.UnixMilli(-1),
		time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(9999, 12, 31, 23, 59, 59, 999_999_999, time.UTC),
		time.Date(-1, 6, 1, 0, 0, 0, 0, time.UTC), time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(2026, 2, 28, 23, 59, 59, 999_000_000, time.UTC), time.Date(2024, 2, 29, 9, 9, 9, 9_999_999, time.UTC),
		time.Date(1999, 12, 31, 23, 59, 59, 500_000_001, time.UTC), time.Date(2000, 10, 10, 10, 10, 10, 100_000_000, time.UTC),
	} {
		check(tm)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 100_000 {
		check(time.UnixMilli(rng.Int64N(400_000_000_000_000) - 62_000_000_000_000).Add(time.Duration(rng.IntN(1e6))))
	}
}

func BenchmarkAppendTime(b *testing.B) {
	tm := time.UnixMilli(1_790_000_000_123)
	buf := make([]byte, 0, 64)
	b.Run("AppendTime", func(b *testing.B) {
		for b.Loop() {
			buf = AppendTime(buf[:0], tm)
		}
	})
	b.Run("AppendFormat", func(b *testing.B) {
		for b.Loop() {
			buf = tm.UTC().AppendFormat(buf[:0], TimeLayout)
		}
	})
}

func BenchmarkJSONPlain(b *testing.B) {
	body := bytes.Repeat([]byte("tidemq-body-0123456789/ABCDEFGHIJKLMNOPQRSTUVWXYZ+abcdefghijklmnopqrstuvwxyz "), 14)[:1024]
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if !Plain(body) {
			b.Fatal("a plain body judged not plain")
		}
	}
}
