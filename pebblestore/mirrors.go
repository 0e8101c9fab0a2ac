package pebblestore

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"

	"github.com/tidemq/tidemq/core"
)

// Mirrors: definitions (W, JSON like topics and subscriptions) and, per
// mirror and source queue, the skip record (O): which source offsets are
// stored here.
//
// A skip record's value: watermark u64, copied u64, last copied ms u64,
// then the stored offsets above the watermark as uvarint deltas (the first
// from the watermark), ascending.

func (b *batch) PutMirror(m *core.MirrorRecord) { b.setJSON(mirrorKey(m.Name), m) }

func (b *batch) DeleteMirror(name string) {
	lo, hi := prefixRange(mirrorPosPrefix(name))
	b.deleteRange(lo, hi)
	_ = b.b.Delete(mirrorKey(name), nil)
}

func encodeMirrorProgress(p core.MirrorProgress) []byte {
	v := make([]byte, 0, 24+2*len(p.Stored))
	v = be.AppendUint64(v, p.Watermark)
	v = be.AppendUint64(v, p.Copied)
	v = be.AppendUint64(v, uint64(p.LastCopiedMs))
	prev := p.Watermark
	for _, o := range p.Stored {
		v = binary.AppendUvarint(v, o-prev)
		prev = o
	}
	return v
}

func decodeMirrorProgress(queueID uint32, v []byte) (core.MirrorProgress, error) {
	if len(v) < 24 {
		return core.MirrorProgress{}, errCorrupt
	}
	p := core.MirrorProgress{QueueID: queueID, Watermark: be.Uint64(v), Copied: be.Uint64(v[8:]), LastCopiedMs: int64(be.Uint64(v[16:]))}
	prev := p.Watermark
	for rest := v[24:]; len(rest) > 0; {
		d, n := binary.Uvarint(rest)
		// Stored offsets are above the watermark and ascending (deltas of
		// at least 1, no wrap-around), each delta in its shortest form:
		// one record, one encoding.
		if n <= 0 || d == 0 || prev+d < prev || n != uvarintLen(d) {
			return core.MirrorProgress{}, errCorrupt
		}
		prev += d
		p.Stored = append(p.Stored, prev)
		rest = rest[n:]
	}
	return p, nil
}

func uvarintLen(x uint64) int {
	var buf [binary.MaxVarintLen64]byte
	return binary.PutUvarint(buf[:], x)
}

func varintLen(x int64) int {
	var buf [binary.MaxVarintLen64]byte
	return binary.PutVarint(buf[:], x)
}

func (b *batch) PutMirrorProgress(name string, p core.MirrorProgress) {
	_ = b.b.Set(mirrorPosKey(name, p.QueueID), encodeMirrorProgress(p), nil)
}

// loadMirrors reads the mirrors' definitions and skip records.
func (s *Store) loadMirrors(snap *core.Snapshot) error {
	lo, hi := prefixRange([]byte{prefixMirror})
	if err := s.walk(lo, hi, func(k, v []byte) (bool, error) {
		m := new(core.MirrorRecord)
		if err := json.Unmarshal(v, m); err != nil {
			return false, fmt.Errorf("mirror %q: %w", k[1:], err)
		}
		snap.Mirrors = append(snap.Mirrors, m)
		return true, nil
	}); err != nil {
		return err
	}
	lo, hi = prefixRange([]byte{prefixMirrorPos})
	return s.walk(lo, hi, func(k, v []byte) (bool, error) {
		i := bytes.IndexByte(k, 0)
		if i < 1 || len(k) != i+5 {
			return false, errCorrupt
		}
		p, err := decodeMirrorProgress(be.Uint32(k[i+1:]), v)
		if err != nil {
			return false, fmt.Errorf("mirror %q skip record: %w", k[1:i], err)
		}
		name := string(k[1:i])
		snap.MirrorProgress[name] = append(snap.MirrorProgress[name], p)
		return true, nil
	})
}
