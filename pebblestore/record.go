package pebblestore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"
	"unsafe"

	"github.com/klauspost/compress/zstd"

	"github.com/tidemq/tidemq/core"
)

// Message records in the L log:
//
//	version u8 | flags u8 | id | topicID u32 | queueID u32 | offset u64 |
//	bornAtMs i64 | storedAtMs i64 | tag | shardingKey | producerGroup |
//	traceparent | nkeys uvarint, keys… | nprops uvarint, (k, v)… | body
//
// where strings are uvarint length + bytes and body is the rest of the record,
// zstd-compressed when flagCompressed is set (bodies above compressAbove).
const (
	recordVersion  = 1
	flagBase64     = 1 << 0
	flagCompressed = 1 << 1
	compressAbove  = 4 << 10
)

var errCorrupt = errors.New("pebblestore: corrupt message record")

var (
	zenc, _ = zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(1))
	zdec, _ = zstd.NewReader(nil, zstd.WithDecoderConcurrency(0))
)

var recordPool = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

func appendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

// encodeRecord appends m's record to dst.
func encodeRecord(dst []byte, m *core.Message) []byte {
	var flags byte
	if m.BodyBase64 {
		flags |= flagBase64
	}
	if len(m.Body) > compressAbove {
		flags |= flagCompressed
	}
	dst = append(dst, recordVersion, flags)
	dst = appendString(dst, m.ID)
	dst = be.AppendUint32(dst, m.TopicID)
	dst = be.AppendUint32(dst, m.QueueID)
	dst = be.AppendUint64(dst, m.Offset)
	dst = be.AppendUint64(dst, uint64(m.BornAtMs))
	dst = be.AppendUint64(dst, uint64(m.StoredAtMs))
	dst = appendString(dst, m.Tag)
	dst = appendString(dst, m.ShardingKey)
	dst = appendString(dst, m.ProducerGroup)
	dst = appendString(dst, m.Traceparent)
	dst = binary.AppendUvarint(dst, uint64(len(m.Keys)))
	for _, k := range m.Keys {
		dst = appendString(dst, k)
	}
	dst = binary.AppendUvarint(dst, uint64(len(m.Properties)))
	dst = appendProperties(dst, m.Properties)
	if flags&flagCompressed != 0 {
		return zenc.EncodeAll(m.Body, dst)
	}
	return append(dst, m.Body...)
}

// appendProperties appends props in key order, so that a message always
// encodes to the same bytes (maps iterate in random order): a replica or a
// check comparing records sees equal messages as equal.
func appendProperties(dst []byte, props map[string]string) []byte {
	if len(props) == 1 {
		for k, v := range props {
			dst = appendString(appendString(dst, k), v)
		}
		return dst
	}
	var small [8]string
	keys := small[:0]
	for k := range props {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		dst = appendString(appendString(dst, k), props[k])
	}
	return dst
}

type recordReader struct {
	b   []byte
	err error
	// owned: b is the reader's own copy, never written again, so strings
	// may alias it instead of each being copied out.
	owned bool
}

// readVarint reads one varint with decode (binary.Uvarint or
// binary.Varint); a malformed one marks the record corrupt.
func readVarint[T uint64 | int64](r *recordReader, decode func([]byte) (T, int)) T {
	if r.err != nil {
		return 0
	}
	v, n := decode(r.b)
	if n <= 0 {
		r.err = errCorrupt
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *recordReader) uvarint() uint64 { return readVarint(r, binary.Uvarint) }

func (r *recordReader) varint() int64 { return readVarint(r, binary.Varint) }

func (r *recordReader) string() string {
	n := r.uvarint()
	if r.err != nil {
		return ""
	}
	if n > uint64(len(r.b)) {
		r.err = errCorrupt
		return ""
	}
	var s string
	if r.owned {
		s = unsafe.String(unsafe.SliceData(r.b), int(n))
	} else {
		s = string(r.b[:n])
	}
	r.b = r.b[n:]
	return s
}

func (r *recordReader) u32() uint32 {
	if r.err != nil || len(r.b) < 4 {
		r.err = errCorrupt
		return 0
	}
	v := be.Uint32(r.b)
	r.b = r.b[4:]
	return v
}

func (r *recordReader) u64() uint64 {
	if r.err != nil || len(r.b) < 8 {
		r.err = errCorrupt
		return 0
	}
	v := be.Uint64(r.b)
	r.b = r.b[8:]
	return v
}

// decodeRecord parses a record; it copies what it keeps, so b may be reused.
//
// A record with its body stored as is (all bodies up to 4 KiB) is copied
// once, whole: the body is the copy's tail (writing to it or appending to
// it never reaches the head) and the head's strings point into the copy's
// head, which nothing writes to again. A pulled message was a body, an
// id, a traceparent and every property key and value allocated apart. A
// string kept past the message (a delivery's message id) keeps the whole
// copy alive, so such a holder clones it.
func decodeRecord(b []byte, seq uint64) (*core.Message, error) {
	if len(b) < 2 || b[0] != recordVersion {
		return nil, errCorrupt
	}
	flags := b[1]
	r := recordReader{b: b[2:]}
	if flags&flagCompressed == 0 {
		r.b, r.owned = bytes.Clone(r.b), true
	}
	m := &core.Message{Seq: seq, BodyBase64: flags&flagBase64 != 0}
	m.ID = r.string()
	m.TopicID = r.u32()
	m.QueueID = r.u32()
	m.Offset = r.u64()
	m.BornAtMs = int64(r.u64())
	m.StoredAtMs = int64(r.u64())
	m.Tag = r.string()
	m.ShardingKey = r.string()
	m.ProducerGroup = r.string()
	m.Traceparent = r.string()
	if n := r.uvarint(); n > 0 && n <= uint64(len(r.b)) {
		m.Keys = make([]string, n)
		for i := range m.Keys {
			m.Keys[i] = r.string()
		}
	} else if n > uint64(len(r.b)) {
		r.err = errCorrupt
	}
	if n := r.uvarint(); n > 0 && n <= uint64(len(r.b)) {
		m.Properties = make(map[string]string, n)
		for range n {
			k := r.string()
			m.Properties[k] = r.string()
		}
	} else if n > uint64(len(r.b)) {
		r.err = errCorrupt
	}
	if r.err != nil {
		return nil, r.err
	}
	if flags&flagCompressed != 0 {
		body, err := zdec.DecodeAll(r.b, nil)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", errCorrupt, err)
		}
		m.Body = body
	} else {
		m.Body = r.b
	}
	return m, nil
}
