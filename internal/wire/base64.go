package wire

import (
	"encoding/base64"
	"encoding/binary"
	"slices"
)

// AppendBase64 appends src in standard base64 (padded), as
// base64.StdEncoding.AppendEncode does, six bytes at a time through a
// table of the two characters of every 12 bits: binary bodies are pulled
// base64-encoded, and encoding/base64's three bytes at a time was the
// largest single cost of serving a pull of them.
func AppendBase64(dst, src []byte) []byte {
	n := base64.StdEncoding.EncodedLen(len(src))
	dst = slices.Grow(dst, n)
	out := dst[len(dst) : len(dst)+n]
	si, di := 0, 0
	// Each word: eight bytes read (two past the six encoded), eight
	// written; four words a step, which the CPU overlaps.
	for ; si+26 <= len(src); si, di = si+24, di+32 {
		s, d := src[si:si+26], out[di:di+32]
		binary.LittleEndian.PutUint64(d, base64Word(binary.BigEndian.Uint64(s)))
		binary.LittleEndian.PutUint64(d[8:], base64Word(binary.BigEndian.Uint64(s[6:])))
		binary.LittleEndian.PutUint64(d[16:], base64Word(binary.BigEndian.Uint64(s[12:])))
		binary.LittleEndian.PutUint64(d[24:], base64Word(binary.BigEndian.Uint64(s[18:])))
	}
	for ; si+8 <= len(src); si, di = si+6, di+8 {
		binary.LittleEndian.PutUint64(out[di:], base64Word(binary.BigEndian.Uint64(src[si:])))
	}
	base64.StdEncoding.Encode(out[di:], src[si:])
	return dst[:len(dst)+n]
}

// base64Word is the eight characters of the top six bytes of x, the
// first in the low byte.
func base64Word(x uint64) uint64 {
	return uint64(base64Pairs[x>>52]) | uint64(base64Pairs[x>>40&0xfff])<<16 |
		uint64(base64Pairs[x>>28&0xfff])<<32 | uint64(base64Pairs[x>>16&0xfff])<<48
}

// base64Pairs holds, for every 12-bit value, its two base64 characters,
// the first in the low byte.
var base64Pairs = func() (t [4096]uint16) {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
	for v := range t {
		t[v] = uint16(alphabet[v>>6]) | uint16(alphabet[v&63])<<8
	}
	return t
}()
