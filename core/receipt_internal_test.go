package core

import (
	"encoding/base64"
	"strings"
	"testing"
)

var receiptCases = []receipt{
	{},
	{subID: 1, queueID: 0, offset: 0, leaseID: 1},
	{subID: 7, queueID: 3, offset: 123456789, leaseID: 1_742_000_000_000_000_001},
	{subID: ^uint32(0), queueID: ^uint32(0), offset: ^uint64(0), leaseID: ^uint64(0)},
	{subID: 2, queueID: 1 << 31, offset: 99, leaseID: 5},
}

func TestReceiptRoundTrip(t *testing.T) {
	seen := map[string]bool{}
	for _, r := range receiptCases {
		s := r.String()
		if len(s) != 34 || strings.ContainsAny(s, "+/=\n ") {
			t.Errorf("%+v encodes to %q: want 34 URL-safe characters", r, s)
		}
		got, ok := parseReceipt(s)
		if !ok || got != r {
			t.Errorf("parseReceipt(%q) = %+v %v, want %+v", s, got, ok, r)
		}
		if seen[s] {
			t.Errorf("two receipts encode to %q", s)
		}
		seen[s] = true
	}
}

func validReceiptRaw(version byte) []byte {
	raw := make([]byte, 25)
	raw[0] = version
	raw[4], raw[8], raw[16], raw[24] = 1, 2, 3, 4
	return raw
}

var badReceipts = []string{
	"",
	"x",
	"nope",
	strings.Repeat("A", 33),
	strings.Repeat("A", 35),
	strings.Repeat("A", 34), // version 0
	base64.RawURLEncoding.EncodeToString(validReceiptRaw(2)),
	base64.RawURLEncoding.EncodeToString(validReceiptRaw(1)[:24]),
	base64.RawURLEncoding.EncodeToString(append(validReceiptRaw(1), 0)),
	base64.URLEncoding.EncodeToString(validReceiptRaw(1)),    // padded
	base64.StdEncoding.EncodeToString(validReceiptRaw(0xfb)), // '+' and '/'
	strings.Repeat("!", 34),
	" " + base64.RawURLEncoding.EncodeToString(validReceiptRaw(1))[1:],
	strings.Repeat("é", 17),
}

func TestParseReceiptRejectsGarbage(t *testing.T) {
	if _, ok := parseReceipt(base64.RawURLEncoding.EncodeToString(validReceiptRaw(1))); !ok {
		t.Fatal("the well-formed control case is rejected")
	}
	for _, s := range badReceipts {
		if r, ok := parseReceipt(s); ok {
			t.Errorf("parseReceipt(%q) = %+v, want rejected", s, r)
		}
	}
}

func FuzzParseReceipt(f *testing.F) {
	for _, r := range receiptCases {
		f.Add(r.String())
	}
	for _, s := range badReceipts {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, ok := parseReceipt(s)
		if !ok {
			if r != (receipt{}) {
				t.Fatalf("rejected %q but returned %+v", s, r)
			}
			return
		}
		if len(s) != 34 {
			t.Fatalf("accepted %q of length %d", s, len(s))
		}
		// Whatever was accepted names a receipt that survives a round trip.
		if again, ok := parseReceipt(r.String()); !ok || again != r {
			t.Fatalf("%q parsed to %+v, which re-parses to %+v %v", s, r, again, ok)
		}
	})
}
