package pebblestore

import (
	"bytes"
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/tidemq/tidemq/core"
)

func recordCases() []*core.Message {
	rng := rand.New(rand.NewPCG(3, 4))
	noise := make([]byte, 64<<10)
	for i := range noise {
		noise[i] = byte(rng.Uint32())
	}
	return []*core.Message{
		{ID: "min"},
		{
			ID: "4ZXKMPQ2Q9J1D3Y6H7F8G0A", TopicID: 7, QueueID: 3, Offset: 1 << 40,
			Body: []byte("hello"), Tag: "TagA", Keys: []string{"order-1001", "customer-7"},
			Properties: map[string]string{"region": "hz", "empty": "", "ü": "✓"}, ShardingKey: "order-1001",
			ProducerGroup: "checkout", Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
			BornAtMs: 1742000000000, StoredAtMs: 1742000000123,
		},
		{ID: "b64", Body: []byte{0, 1, 2, 0xff}, BodyBase64: true},
		{ID: "negative times", BornAtMs: -1, StoredAtMs: -86400000},
		{ID: "max", TopicID: ^uint32(0), QueueID: ^uint32(0), Offset: ^uint64(0), Keys: slices.Repeat([]string{strings.Repeat("k", 128)}, 32)},
		{ID: "at the limit", Body: bytes.Repeat([]byte("a"), compressAbove)},
		{ID: "compressed", Body: bytes.Repeat([]byte("compressible "), 1000), Tag: "Big"},
		{ID: "compressed b64", Body: bytes.Repeat([]byte{0xfe}, compressAbove+1), BodyBase64: true, Keys: []string{"k"}},
		{ID: "incompressible", Body: noise, Properties: map[string]string{"k": "v"}},
	}
}

func wantSameMessage(t *testing.T, got, want *core.Message) {
	t.Helper()
	if !bytes.Equal(got.Body, want.Body) {
		t.Errorf("%s: body of %d bytes, want %d", want.ID, len(got.Body), len(want.Body))
	}
	g, w := *got, *want
	g.Body, w.Body = nil, nil
	g.Keys, w.Keys = nil, nil
	g.Properties, w.Properties = nil, nil
	if !reflect.DeepEqual(g, w) {
		t.Errorf("%s: decoded %+v\nwant %+v", want.ID, g, w)
	}
	if !slices.Equal(got.Keys, want.Keys) || !maps.Equal(got.Properties, want.Properties) {
		t.Errorf("%s: keys %q props %v, want %q %v", want.ID, got.Keys, got.Properties, want.Keys, want.Properties)
	}
}

func TestRecordRoundTrip(t *testing.T) {
	for _, m := range recordCases() {
		m.Seq = 42
		enc := encodeRecord(nil, m)
		compressed := enc[1]&flagCompressed != 0
		if compressed != (len(m.Body) > compressAbove) {
			t.Errorf("%s: %d-byte body compressed=%v; bodies above %d are compressed", m.ID, len(m.Body), compressed, compressAbove)
		}
		if m.ID == "compressed" && len(enc) > len(m.Body)/4 {
			t.Errorf("%s: record of %d bytes for a %d-byte repetitive body", m.ID, len(enc), len(m.Body))
		}
		got, err := decodeRecord(enc, 42)
		if err != nil {
			t.Fatalf("%s: %v", m.ID, err)
		}
		wantSameMessage(t, got, m)

		// The record may follow other bytes in dst; decoding copies what it
		// keeps, so the buffer can be reused.
		prefix := []byte("prefix")
		enc2 := encodeRecord(slices.Clone(prefix), m)
		if !bytes.Equal(enc2[:len(prefix)], prefix) || len(enc2) != len(prefix)+len(enc) {
			t.Errorf("%s: encodeRecord does not append to dst", m.ID)
		}
		got2, err := decodeRecord(enc2[len(prefix):], 42)
		if err != nil {
			t.Fatal(err)
		}
		clear(enc2)
		wantSameMessage(t, got2, m)

		// Its body may be written over and appended to: the strings, which
		// may share the body's allocation, stay as they were.
		for i := range got2.Body {
			got2.Body[i] = '!'
		}
		got2.Body = append(got2.Body, "more"...)
		rest := *m
		rest.Body = got2.Body
		wantSameMessage(t, got2, &rest)
	}
}

func TestDecodeRecordRejectsCorruption(t *testing.T) {
	for _, m := range recordCases() {
		enc := encodeRecord(nil, m)
		// Every cut inside the header is detected, and cuts inside a
		// compressed body. A plain body is "the rest", so cutting it is not
		// detectable by the codec, and neither is a compressed body cut
		// whole (an empty zstd input decodes to nothing): Pebble's block
		// checksums are what guard against torn records.
		headerLen := len(encodeRecord(nil, &core.Message{
			ID: m.ID, Tag: m.Tag, Keys: m.Keys, Properties: m.Properties, ShardingKey: m.ShardingKey,
			ProducerGroup: m.ProducerGroup, Traceparent: m.Traceparent,
		}))
		cuts := make([]int, 0, headerLen+64)
		for n := range headerLen {
			cuts = append(cuts, n)
		}
		if enc[1]&flagCompressed != 0 {
			for n := headerLen + 1; n < len(enc); n += 1 + (n-headerLen)/8 {
				cuts = append(cuts, n)
			}
			cuts = append(cuts, len(enc)-1)
		}
		for _, n := range cuts {
			if _, err := decodeRecord(enc[:n], 0); err == nil {
				t.Errorf("%s: a record cut to %d of %d bytes decodes", m.ID, n, len(enc))
			}
		}
		bad := slices.Clone(enc)
		bad[0] = recordVersion + 1
		if _, err := decodeRecord(bad, 0); err == nil {
			t.Errorf("%s: unknown version decodes", m.ID)
		}
	}
	if _, err := decodeRecord(nil, 0); err == nil {
		t.Error("empty record decodes")
	}
}

func FuzzDecodeRecord(f *testing.F) {
	for _, m := range recordCases() {
		enc := encodeRecord(nil, m)
		if len(enc) > 1024 {
			continue // large seeds make minimizing slow; small ones cover every branch
		}
		f.Add(enc)
		f.Add(enc[:len(enc)/2])
	}
	f.Add([]byte{recordVersion, flagCompressed, 0, 0})
	f.Add([]byte{recordVersion, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeRecord(b, 9)
		if err != nil {
			return
		}
		// Whatever decodes is a fixpoint of encode/decode.
		again, err := decodeRecord(encodeRecord(nil, m), 9)
		if err != nil {
			t.Fatalf("re-encoded record does not decode: %v", err)
		}
		wantSameMessage(t, again, m)
	})
}

// TestRecordEncodingIsDeterministic: a message encodes to the same bytes
// however its properties map iterates, built in any order; the record
// still decodes to the message.
func TestRecordEncodingIsDeterministic(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	keys := make([]string, 40)
	for i := range keys {
		keys[i] = fmt.Sprintf("prop-%02d-%x", i, rng.Uint32())
	}
	build := func() *core.Message {
		props := map[string]string{}
		for _, i := range rng.Perm(len(keys)) {
			props[keys[i]] = "value of " + keys[i]
		}
		return &core.Message{ID: "many props", TopicID: 1, Body: []byte("body"), Properties: props, Seq: 9}
	}
	want := encodeRecord(nil, build())
	for i := range 200 {
		m := build()
		if got := encodeRecord(nil, m); !bytes.Equal(got, want) {
			t.Fatalf("encoding %d differs from the first:\n%x\nwant\n%x", i, got, want)
		}
		dec, err := decodeRecord(want, 9)
		if err != nil {
			t.Fatal(err)
		}
		wantSameMessage(t, dec, m)
	}
	// Sorted by key: each property's key comes after the one before it.
	last := -1
	for _, k := range slices.Sorted(slices.Values(keys)) {
		at := bytes.Index(want, []byte(k))
		if at <= last {
			t.Fatalf("property %q at byte %d, not after the previous one (byte %d)", k, at, last)
		}
		last = at
	}
}
