package core

import (
	"strings"
	"testing"
)

var testSealer = newReceiptSealer([]byte("receipt-internal-test-key-000000"))

var receiptCases = []receipt{
	{},
	{epoch: 1, subID: 1, queueID: 0, offset: 0, leaseID: 1},
	{group: 3, epoch: 42, subID: 7, queueID: 3, offset: 123456789, leaseID: 1_742_000_000_000_000_001},
	{group: ^uint32(0), epoch: ^uint64(0), subID: ^uint32(0), queueID: ^uint32(0), offset: ^uint64(0), leaseID: ^uint64(0)},
	{epoch: 2, subID: 2, queueID: 1 << 31, offset: 99, leaseID: 5},
}

func TestReceiptRoundTrip(t *testing.T) {
	seen := map[string]bool{}
	for _, r := range receiptCases {
		s := testSealer.seal(r)
		if len(s) != receiptTextLen || strings.ContainsAny(s, "+/=\n ") {
			t.Errorf("%+v encodes to %q: want %d URL-safe characters", r, s, receiptTextLen)
		}
		got, ok := testSealer.open(s)
		if !ok || got != r {
			t.Errorf("open(%q) = %+v %v, want %+v", s, got, ok, r)
		}
		if seen[s] {
			t.Errorf("two receipts encode to %q", s)
		}
		seen[s] = true
	}
}

// rawOf decodes a handle to its bytes, which tests then alter.
func rawOf(t testing.TB, s string) []byte {
	t.Helper()
	raw, err := receiptEncoding.DecodeString(s)
	if err != nil || len(raw) != receiptRawLen {
		t.Fatalf("decode %q: %d bytes, %v", s, len(raw), err)
	}
	return raw
}

// TestReceiptAlteredRefused flips every bit of a handle's bytes, one at a
// time: fields and MAC alike, none is accepted.
func TestReceiptAlteredRefused(t *testing.T) {
	good := testSealer.seal(receiptCases[2])
	raw := rawOf(t, good)
	for i := range raw {
		for bit := range 8 {
			alt := append([]byte(nil), raw...)
			alt[i] ^= 1 << bit
			s := receiptEncoding.EncodeToString(alt)
			if r, ok := testSealer.open(s); ok {
				t.Fatalf("byte %d bit %d flipped: %q accepted as %+v", i, bit, s, r)
			}
		}
	}
	// The same fields under a MAC of another key.
	other := newReceiptSealer([]byte("another-key"))
	if r, ok := testSealer.open(other.seal(receiptCases[2])); ok {
		t.Fatalf("a handle of another key is accepted as %+v", r)
	}
	if _, ok := testSealer.open(good); !ok {
		t.Fatal("the control handle is refused")
	}
}

// TestReceiptSpellingUnique: the last character's spare bits are part of
// the spelling, so a handle has exactly one text.
func TestReceiptSpellingUnique(t *testing.T) {
	good := testSealer.seal(receiptCases[1])
	last := good[len(good)-1]
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	for _, c := range []byte(alphabet) {
		if c == last {
			continue
		}
		if _, ok := testSealer.open(good[:len(good)-1] + string(c)); ok {
			t.Errorf("%q with its last character %q for %q is accepted", good, c, last)
		}
	}
}

// validReceiptRaw is a signed handle's bytes with its version set.
func validReceiptRaw(version byte) []byte {
	raw, _ := receiptEncoding.DecodeString(testSealer.seal(receipt{epoch: 1, subID: 1, queueID: 2, offset: 3, leaseID: 4}))
	raw[0] = version
	return raw
}

var badReceipts = func() []string {
	v1 := make([]byte, 25) // the unsigned layout of version 1
	v1[0], v1[4], v1[8], v1[16], v1[24] = 1, 1, 2, 3, 4
	good := receiptEncoding.EncodeToString(validReceiptRaw(receiptVersion))
	return []string{
		"",
		"x",
		"nope",
		receiptEncoding.EncodeToString(v1),
		strings.Repeat("A", receiptTextLen-1),
		strings.Repeat("A", receiptTextLen+1),
		strings.Repeat("A", receiptTextLen), // version 0
		receiptEncoding.EncodeToString(validReceiptRaw(1)),
		receiptEncoding.EncodeToString(validReceiptRaw(3)),
		good[:len(good)-1],
		good + "A",
		good[:len(good)-2] + "\n" + good[len(good)-1:],
		" " + good[1:],
		strings.Repeat("!", receiptTextLen),
		strings.Repeat("é", receiptTextLen/2) + "A",
	}
}()

func TestParseReceiptRejectsGarbage(t *testing.T) {
	if _, ok := testSealer.open(receiptEncoding.EncodeToString(validReceiptRaw(receiptVersion))); !ok {
		t.Fatal("the well-formed control case is rejected")
	}
	for _, s := range badReceipts {
		if r, ok := testSealer.open(s); ok {
			t.Errorf("open(%q) = %+v, want rejected", s, r)
		}
	}
}

// TestSealAllocs: sealing is on the pull path, once per message; it costs
// the string and nothing else.
func TestSealAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items under the race detector")
	}
	r := receiptCases[2]
	testSealer.seal(r) // fill the pool
	if n := testing.AllocsPerRun(100, func() { testSealer.seal(r) }); n > 1 {
		t.Errorf("seal: %v allocations, want 1", n)
	}
	s := testSealer.seal(r)
	if n := testing.AllocsPerRun(100, func() { testSealer.open(s) }); n > 0 {
		t.Errorf("open: %v allocations, want 0", n)
	}
}

func FuzzParseReceipt(f *testing.F) {
	for _, r := range receiptCases {
		f.Add(testSealer.seal(r))
	}
	for _, s := range badReceipts {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, ok := testSealer.open(s)
		if !ok {
			if r != (receipt{}) {
				t.Fatalf("rejected %q but returned %+v", s, r)
			}
			return
		}
		// Only what the key signed is accepted, in its one spelling.
		if again := testSealer.seal(r); again != s {
			t.Fatalf("%q opened to %+v, which seals to %q", s, r, again)
		}
	})
}

func BenchmarkReceiptSeal(b *testing.B) {
	r := receiptCases[2]
	b.ReportAllocs()
	for b.Loop() {
		testSealer.seal(r)
	}
}

func BenchmarkReceiptOpen(b *testing.B) {
	s := testSealer.seal(receiptCases[2])
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := testSealer.open(s); !ok {
			b.Fatal("refused")
		}
	}
}

// BenchmarkDistinctHandles is the duplicate check of an ack of 32.
func BenchmarkDistinctHandles(b *testing.B) {
	hs := make([]string, 32)
	for i := range hs {
		hs[i] = testSealer.seal(receipt{epoch: 1, subID: 1, offset: uint64(i), leaseID: uint64(i + 1)})
	}
	b.ReportAllocs()
	for b.Loop() {
		distinctHandles(hs)
	}
}
