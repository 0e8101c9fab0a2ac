package pebblestore

import (
	"crypto/rand"
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/tidemq/tidemq/core"
)

// What a raft group's state machine needs: applying committed entries with
// the index they came from, and the cluster-wide receipt key.

// appliedKey is m 'a' group: the index of the last raft entry of group
// whose batch the store applied. It is part of the replicated state (a
// snapshot carries it), so it is the same on every replica at that index.
func appliedKey(group uint32) []byte {
	return be.AppendUint32([]byte{prefixMeta, 'a'}, group)
}

// sessionKey is m 'w' group: the session (a leader's term) whose batches
// group's state machine applies; batches of an earlier leader's broker that
// reach the log after a later leader started are passed over.
func sessionKey(group uint32) []byte {
	return be.AppendUint32([]byte{prefixMeta, 'w'}, group)
}

// keyReceiptKey holds the key a cluster's brokers sign receipt handles
// with, replicated so that any leader judges any earlier leader's handles.
var keyReceiptKey = []byte{prefixMeta, 'K'}

// ApplyCommitted applies the batch (Batch.Repr bytes) of group's raft
// entry index and records index as applied, in one Pebble batch; a nil
// repr records only the index (an entry the state machine passes over).
// It is not synced: the raft log entry it comes from was synced before it
// in the same WAL, and a restart replays the log from the applied index on.
func (s *Store) ApplyCommitted(group uint32, index uint64, repr []byte) error {
	return s.applyEntry(group, index, func(b *pebble.Batch) error {
		if repr == nil {
			return nil
		}
		// repr's records are copied into b's pooled buffer: b may not take
		// repr itself (the raft log's, which a pooled buffer must never
		// become), and a copy of its own (megabytes, zeroed) at every entry
		// was most of what applying allocated. src is read, never committed
		// or pooled.
		var src pebble.Batch
		if err := src.SetRepr(repr); err != nil {
			return err
		}
		return b.Apply(&src, nil)
	})
}

// StartSession records session as group's writer from raft entry index on
// (the state machine applies only that session's batches), and index as
// applied.
func (s *Store) StartSession(group uint32, index, session uint64) error {
	return s.applyEntry(group, index, func(b *pebble.Batch) error {
		return b.Set(sessionKey(group), be.AppendUint64(nil, session), nil)
	})
}

func (s *Store) applyEntry(group uint32, index uint64, fill func(*pebble.Batch) error) error {
	err := s.read(func() error {
		b := s.pooledBatch()
		defer s.releaseBatch(b)
		if err := fill(b); err != nil {
			return err
		}
		if err := b.Set(appliedKey(group), be.AppendUint64(nil, index), nil); err != nil {
			return err
		}
		return s.db.Apply(b, pebble.NoSync)
	})
	if err != nil {
		return fmt.Errorf("pebblestore: apply entry %d of group %d: %w", index, group, err)
	}
	return nil
}

// Session is group's current writer session (StartSession), 0 if none.
func (s *Store) Session(group uint32) (uint64, error) { return s.getUint64(sessionKey(group)) }

// AppliedIndex is the index of group's last applied raft entry, 0 if none.
func (s *Store) AppliedIndex(group uint32) (uint64, error) { return s.getUint64(appliedKey(group)) }

func (s *Store) getUint64(key []byte) (uint64, error) {
	var n uint64
	err := s.read(func() error {
		v, closer, err := s.db.Get(key)
		if errors.Is(err, pebble.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		defer closer.Close()
		if len(v) != 8 {
			return fmt.Errorf("key %q: %d bytes, want 8", key, len(v))
		}
		n = be.Uint64(v)
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("pebblestore: %w", err)
	}
	return n, nil
}

// SyncWAL makes every write applied so far durable: the state machine's
// applies are not synced on their own, and a snapshot must not be taken of
// state a crash could still take back.
func (s *Store) SyncWAL() error {
	err := s.read(func() error { return s.db.LogData(nil, pebble.Sync) })
	if err != nil {
		return fmt.Errorf("pebblestore: sync WAL: %w", err)
	}
	return nil
}

// ReceiptKey returns the replicated receipt key, nil when none was set.
func (s *Store) ReceiptKey() ([]byte, error) {
	var key []byte
	err := s.read(func() error {
		v, closer, err := s.db.Get(keyReceiptKey)
		if errors.Is(err, pebble.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		defer closer.Close()
		key = append([]byte(nil), v...)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("pebblestore: receipt key: %w", err)
	}
	return key, nil
}

// NewReceiptKeyRepr makes a random receipt key and returns the batch that
// stores it, for a leader to propose when the replicated state has none.
func (s *Store) NewReceiptKeyRepr() []byte {
	key := make([]byte, core.ReceiptKeyLen)
	_, _ = rand.Read(key) // crypto/rand.Read never fails
	b := s.db.NewBatch()
	defer b.Close()
	_ = b.Set(keyReceiptKey, key, nil)
	return append([]byte(nil), b.Repr()...)
}
