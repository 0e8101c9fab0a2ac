package pebblestore

import (
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/tidemq/tidemq/core"
)

// Parked messages: retries (R) and delayed sends (P), each a copy of its
// message waiting for a timer (D), kept apart from the queues so that
// retention never removes them. A delayed send not yet due is also found
// by id through the secondary index (delayedIndexKey).

// Parked: kind u8 | subID u32 | topicID u32 | dueMs u64 | attempt u32 | reason | record
func encodeParked(p *core.Parked) []byte {
	b := make([]byte, 0, 64+len(p.Msg.Body))
	b = append(b, p.Kind)
	b = be.AppendUint32(b, p.SubID)
	b = be.AppendUint32(b, p.TopicID)
	b = be.AppendUint64(b, uint64(p.DueMs))
	b = be.AppendUint32(b, uint32(p.Attempt))
	b = appendString(b, p.Reason)
	return encodeRecord(b, p.Msg)
}

func decodeParked(id uint64, b []byte, withBody bool) (*core.Parked, error) {
	if len(b) < 21 {
		return nil, errCorrupt
	}
	p := &core.Parked{ID: id, Kind: b[0], SubID: be.Uint32(b[1:]), TopicID: be.Uint32(b[5:]),
		DueMs: int64(be.Uint64(b[9:])), Attempt: int(be.Uint32(b[17:]))}
	r := recordReader{b: b[21:]}
	p.Reason = r.string()
	if r.err != nil {
		return nil, r.err
	}
	m, err := decodeRecord(r.b, 0)
	if err != nil {
		return nil, err
	}
	if !withBody {
		m.Body = nil
	}
	p.Msg = m
	return p, nil
}

func (b *batch) PutParked(p *core.Parked) {
	_ = b.b.Set(parkedKey(p.Kind, p.ID), encodeParked(p), nil)
	if p.Kind == core.ParkedDelayed {
		b.key = delayedIndexKey(b.key, p)
		b.deferIndex(b.key, nil)
	}
}

func (b *batch) DeleteParked(p *core.Parked) {
	_ = b.b.Delete(parkedKey(p.Kind, p.ID), nil)
	if p.Kind == core.ParkedDelayed {
		b.key = delayedIndexKey(b.key, p)
		_ = b.b.Delete(b.key, nil)
	}
}

// delayedIndexKey is where a delayed message is found by id until due
// (core.IndexDelayed).
func delayedIndexKey(dst []byte, p *core.Parked) []byte {
	return secondaryKey(dst, p.TopicID, core.IndexBucket(p.DueMs), core.IndexDelayed, core.IndexHash(p.Msg.ID), p.ID)
}

func (b *batch) PutTimer(dueMs int64, id uint64, kind byte) {
	_ = b.b.Set(timerKey(dueMs, id), []byte{kind}, nil)
}

func (b *batch) DeleteTimersBefore(dueMs int64) {
	b.deleteRange([]byte{prefixTimer}, timerKey(dueMs, 0))
}

func (s *Store) ReadParked(kind byte, id uint64) (*core.Parked, error) {
	var p *core.Parked
	err := s.read(func() error {
		v, closer, err := s.db.Get(parkedKey(kind, id))
		if errors.Is(err, pebble.ErrNotFound) {
			return core.ErrMessageNotFound
		}
		if err != nil {
			return err
		}
		defer closer.Close()
		p, err = decodeParked(id, v, true)
		return err
	})
	if err != nil && !errors.Is(err, core.ErrMessageNotFound) {
		return nil, fmt.Errorf("pebblestore: read parked %d: %w", id, err)
	}
	return p, err
}

func (s *Store) ScanTimers(fromMs, toMs int64, fn func(int64, uint64, byte) bool) error {
	if toMs < fromMs {
		return nil
	}
	return s.read(func() error {
		it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: timerKey(fromMs, 0), UpperBound: timerKey(toMs+1, 0)})
		if err != nil {
			return err
		}
		defer it.Close()
		for it.First(); it.Valid(); it.Next() {
			k, v := it.Key(), it.Value()
			if len(k) != 17 || len(v) != 1 {
				return fmt.Errorf("pebblestore: timer %x: %w", k, errCorrupt)
			}
			if !fn(int64(be.Uint64(k[1:])), be.Uint64(k[9:]), v[0]) {
				break
			}
		}
		return it.Error()
	})
}

// loadParked reads the retry records (without bodies) and the first timer.
func (s *Store) loadParked(snap *core.Snapshot) error {
	lo, hi := prefixRange([]byte{prefixRetry})
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return err
	}
	for it.First(); it.Valid(); it.Next() {
		if len(it.Key()) != 9 {
			it.Close()
			return errCorrupt
		}
		p, err := decodeParked(be.Uint64(it.Key()[1:]), it.Value(), false)
		if err != nil {
			it.Close()
			return err
		}
		snap.Retries = append(snap.Retries, p)
	}
	if err := errors.Join(it.Error(), it.Close()); err != nil {
		return err
	}
	lo, hi = prefixRange([]byte{prefixTimer})
	if it, err = s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi}); err != nil {
		return err
	}
	if it.First() && len(it.Key()) == 17 {
		snap.FirstTimerMs = int64(be.Uint64(it.Key()[1:]))
	}
	return errors.Join(it.Error(), it.Close())
}
