package pebblestore

import (
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/tidemq/tidemq/core"
)

// Dead letters (X): a subscription's messages that ran out of attempts,
// by the time they died, each a copy of its message.

// Dead: attempt u32 | cursorID u32 | reason | record (subID, deadAt and id are in the key)
func encodeDead(d *core.Dead) []byte {
	b := make([]byte, 0, 64+len(d.Msg.Body))
	b = be.AppendUint32(b, uint32(d.Attempt))
	b = be.AppendUint32(b, d.CursorID)
	b = appendString(b, d.Reason)
	return encodeRecord(b, d.Msg)
}

func decodeDead(k, v []byte) (*core.Dead, error) {
	if len(k) != 21 || len(v) < 8 {
		return nil, errCorrupt
	}
	d := &core.Dead{SubID: be.Uint32(k[1:]), DeadAtMs: int64(be.Uint64(k[5:])), ID: be.Uint64(k[13:]),
		Attempt: int(be.Uint32(v)), CursorID: be.Uint32(v[4:])}
	r := recordReader{b: v[8:]}
	d.Reason = r.string()
	if r.err != nil {
		return nil, r.err
	}
	m, err := decodeRecord(r.b, 0)
	if err != nil {
		return nil, err
	}
	d.Msg = m
	return d, nil
}

func (b *batch) PutDead(d *core.Dead) {
	_ = b.b.Set(deadKey(d.SubID, d.DeadAtMs, d.ID), encodeDead(d), nil)
}

func (b *batch) DeleteDead(d *core.Dead) { _ = b.b.Delete(deadKey(d.SubID, d.DeadAtMs, d.ID), nil) }

func (s *Store) ScanDead(subID uint32, fromMs, toMs, afterMs int64, afterID uint64, fn func(*core.Dead) bool) error {
	return s.read(func() error {
		lo := deadKey(subID, fromMs, 0)
		if after := deadKey(subID, afterMs, afterID+1); afterMs > 0 && string(after) > string(lo) {
			lo = after
		}
		hi := deadKey(subID, toMs+1, 0)
		it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
		if err != nil {
			return err
		}
		defer it.Close()
		for it.First(); it.Valid(); it.Next() {
			d, err := decodeDead(it.Key(), it.Value())
			if err != nil {
				return fmt.Errorf("pebblestore: dead %x: %w", it.Key(), err)
			}
			if !fn(d) {
				break
			}
		}
		return it.Error()
	})
}

// loadDeadCounts counts each subscription's dead letters.
func (s *Store) loadDeadCounts(snap *core.Snapshot) error {
	snap.DeadCounts = map[uint32]int64{}
	lo, hi := prefixRange([]byte{prefixDead})
	return s.walk(lo, hi, func(k, _ []byte) (bool, error) {
		if len(k) == 21 {
			snap.DeadCounts[be.Uint32(k[1:])]++
		}
		return true, nil
	})
}
