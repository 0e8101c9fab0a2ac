package pebblestore

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/tidemq/tidemq/core"
)

// Topics (t) and subscriptions (s) as JSON records, the highest ids ever
// given (keyLastIDs), the broker's counters (keyCounters) and its epoch
// (keyEpoch). A topic's queues keep their position in q keys (messages.go).

func (b *batch) PutTopic(t *core.TopicRecord) { b.setJSON(topicKey(t.ID), t) }

func (b *batch) DeleteTopic(t *core.TopicRecord) {
	// The topic's ranges go with range tombstones. Its bodies in the shared
	// log stay until retention cuts the log past them (core): deleting them
	// one by one took a batch as large as the topic (10M messages: 170 MB).
	for _, p := range []byte{prefixQueue, prefixTime, prefixSecondary, prefixHistory, prefixQueueMeta} {
		lo, hi := prefixRange(id32Prefix(p, t.ID))
		b.deleteRange(lo, hi)
	}
	_ = b.b.Delete(topicKey(t.ID), nil)
}

func (b *batch) PutSubscription(s *core.SubscriptionRecord) { b.setJSON(subKey(s.ID), s) }

func (b *batch) DeleteSubscription(s *core.SubscriptionRecord) {
	for _, p := range []byte{prefixWatermark, prefixAck, prefixAttempt, prefixDead, prefixMember} {
		lo, hi := prefixRange(id32Prefix(p, s.ID))
		b.deleteRange(lo, hi)
	}
	_ = b.b.Delete(subKey(s.ID), nil)
}

func (b *batch) PutLastIDs(lastTopic, lastSub uint32) {
	v := be.AppendUint32(be.AppendUint32(nil, lastTopic), lastSub)
	_ = b.b.Set(keyLastIDs, v, nil)
}

// loadMetaValue calls set with the fixed-size value stored under key; a
// missing key leaves the snapshot as it is (a new store), a value of
// another size is corruption. v is valid only during set.
func (s *Store) loadMetaValue(key []byte, size int, set func(v []byte)) error {
	v, closer, err := s.db.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	defer closer.Close()
	if len(v) != size {
		return errCorrupt
	}
	set(v)
	return nil
}

func (s *Store) loadLastIDs(snap *core.Snapshot) error {
	return s.loadMetaValue(keyLastIDs, 8, func(v []byte) { snap.LastTopicID, snap.LastSubID = be.Uint32(v), be.Uint32(v[4:]) })
}

func (b *batch) PutEpoch(epoch uint64) { _ = b.b.Set(keyEpoch, be.AppendUint64(nil, epoch), nil) }

func (s *Store) loadEpoch(snap *core.Snapshot) error {
	return s.loadMetaValue(keyEpoch, 8, func(v []byte) { snap.Epoch = be.Uint64(v) })
}

// countersLen is the size of a counters record: next seq u64, last store
// time u64, highest record id u64.
const countersLen = 24

func (b *batch) PutCounters(c core.Counters) {
	var v [countersLen]byte
	be.PutUint64(v[:], c.NextSeq)
	be.PutUint64(v[8:], uint64(c.LastStoredMs))
	be.PutUint64(v[16:], c.IDs)
	_ = b.b.Set(keyCounters, v[:], nil)
}

func (s *Store) loadCounters(snap *core.Snapshot) error {
	return s.loadMetaValue(keyCounters, countersLen, func(v []byte) {
		snap.Counters = &core.Counters{NextSeq: be.Uint64(v), LastStoredMs: int64(be.Uint64(v[8:])), IDs: be.Uint64(v[16:])}
	})
}

func (s *Store) loadTopics(snap *core.Snapshot) error {
	lo, hi := prefixRange([]byte{prefixTopic})
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return err
	}
	defer it.Close()
	for it.First(); it.Valid(); it.Next() {
		t := new(core.TopicRecord)
		if err := json.Unmarshal(it.Value(), t); err != nil {
			return fmt.Errorf("topic %x: %w", it.Key(), err)
		}
		snap.Topics = append(snap.Topics, t)
		ranges := make([]core.QueueRange, t.Queues)
		for q := range ranges {
			r, err := s.queueRange(t.ID, uint32(q))
			if err != nil {
				return err
			}
			ranges[q] = r
		}
		snap.Queues[t.ID] = ranges
	}
	return it.Error()
}

func (s *Store) loadSubscriptions(snap *core.Snapshot) error {
	lo, hi := prefixRange([]byte{prefixSub})
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return err
	}
	defer it.Close()
	for it.First(); it.Valid(); it.Next() {
		sub := new(core.SubscriptionRecord)
		if err := json.Unmarshal(it.Value(), sub); err != nil {
			return fmt.Errorf("subscription %x: %w", it.Key(), err)
		}
		snap.Subscriptions = append(snap.Subscriptions, sub)
	}
	return it.Error()
}

func (b *batch) setJSON(key []byte, v any) {
	data, err := json.Marshal(v)
	if err != nil && b.err == nil {
		b.err = err
	}
	_ = b.b.Set(key, data, nil)
}
