package pebblestore

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/tidemq/tidemq/core"
)

// Transactions (core/transaction.go): an open transaction's record under
// x id, a settled one's under y id, so that Load reads the open ones only
// (settled records stay for the topic's retention, many more of them).
// Their half messages are parked records under h id (parkedKey).

func txKey(prefix byte, id uint64) []byte { return be.AppendUint64([]byte{prefix}, id) }

func (b *batch) PutTransaction(r *core.TransactionRecord) {
	if r.State == core.TxOpen {
		b.setJSON(txKey(prefixTxOpen, r.ID), r)
		return
	}
	_ = b.b.Delete(txKey(prefixTxOpen, r.ID), nil)
	b.setJSON(txKey(prefixTxSettled, r.ID), r)
}

func (b *batch) DeleteTransaction(r *core.TransactionRecord) {
	_ = b.b.Delete(txKey(prefixTxOpen, r.ID), nil)
	_ = b.b.Delete(txKey(prefixTxSettled, r.ID), nil)
}

func (s *Store) ReadTransaction(id uint64) (*core.TransactionRecord, error) {
	var rec *core.TransactionRecord
	err := s.read(func() error {
		for _, p := range []byte{prefixTxOpen, prefixTxSettled} {
			v, closer, err := s.db.Get(txKey(p, id))
			if errors.Is(err, pebble.ErrNotFound) {
				continue
			}
			if err != nil {
				return err
			}
			rec = new(core.TransactionRecord)
			err = json.Unmarshal(v, rec)
			closer.Close()
			return err
		}
		return core.ErrTransactionNotFound
	})
	if err != nil && !errors.Is(err, core.ErrTransactionNotFound) {
		return nil, fmt.Errorf("pebblestore: read transaction %d: %w", id, err)
	}
	return rec, err
}

// loadTransactions reads the open transactions.
func (s *Store) loadTransactions(snap *core.Snapshot) error {
	lo, hi := prefixRange([]byte{prefixTxOpen})
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return err
	}
	for it.First(); it.Valid(); it.Next() {
		rec := new(core.TransactionRecord)
		if err := json.Unmarshal(it.Value(), rec); err != nil {
			it.Close()
			return fmt.Errorf("transaction %x: %w", it.Key(), err)
		}
		snap.Transactions = append(snap.Transactions, rec)
	}
	return errors.Join(it.Error(), it.Close())
}
