package pebblestore

import (
	"errors"
	"io"
)

// Temporary stand-in (replaced at merge).
type StateSnapshot struct{}

func (s *Store) StateSnapshot() (*StateSnapshot, error)      { return nil, errors.New("not built") }
func (sn *StateSnapshot) WriteTo(w io.Writer) (int64, error) { return 0, errors.New("not built") }
func (sn *StateSnapshot) Close() error                       { return nil }
func (s *Store) RestoreState(r io.Reader) error              { return errors.New("not built") }
func (s *Store) RestoreInProgress() (bool, error)            { return false, nil }
