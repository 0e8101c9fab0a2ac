package pebblestore

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"

	"github.com/cockroachdb/pebble/v2"
)

// What a replica needs beside core.Store's reads: applying the leader's
// encoded batches, copying a store, and comparing two stores.

// ApplyBatch implements core.Store: it applies a batch encoded by
// core.Batch.Repr. The bytes are copied, so the caller may reuse them.
func (s *Store) ApplyBatch(repr []byte, sync bool) error {
	opt := pebble.NoSync
	if sync {
		opt = pebble.Sync
	}
	err := s.read(func() error {
		b := s.db.NewBatch()
		defer b.Close()
		if err := b.SetRepr(append([]byte(nil), repr...)); err != nil {
			return err
		}
		return s.db.Apply(b, opt)
	})
	if err != nil {
		return fmt.Errorf("pebblestore: apply batch: %w", err)
	}
	return nil
}

// Checkpoint writes a consistent copy of the store to dir (which must not
// exist) on the store's own filesystem, the WAL flushed and synced first,
// so that the copy holds every commit made before the call. Opening dir
// gives a store with the same keys and values (Fingerprint).
func (s *Store) Checkpoint(dir string) error {
	err := s.read(func() error { return s.db.Checkpoint(dir, pebble.WithFlushedWAL()) })
	if err != nil {
		return fmt.Errorf("pebblestore: checkpoint to %s: %w", dir, err)
	}
	return nil
}

// Fingerprint is a SHA-256 over every key and value of the store in key
// order, each length-prefixed (uvarint) so that no two contents hash alike
// by a shifted boundary. Raft groups' logs and stable keys (RaftStore) are
// left out (walkState): they are each replica's own, not the state it
// applied. Two stores with equal fingerprints hold the same data, whatever
// their files look like (flushes, compactions, tombstones are not data).
// It reads the whole store: for tests and for comparing replicas, not for
// a request path.
func (s *Store) Fingerprint() ([32]byte, error) {
	var sum [32]byte
	err := s.read(func() error {
		h := sha256.New()
		var n [binary.MaxVarintLen64]byte
		err := walkState(s.db, func(k, v []byte) error {
			for _, p := range [][]byte{k, v} {
				h.Write(n[:binary.PutUvarint(n[:], uint64(len(p)))])
				h.Write(p)
			}
			return nil
		})
		if err != nil {
			return err
		}
		h.Sum(sum[:0])
		return nil
	})
	if err != nil {
		return sum, fmt.Errorf("pebblestore: fingerprint: %w", err)
	}
	return sum, nil
}
