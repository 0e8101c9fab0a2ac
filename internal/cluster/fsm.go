package cluster

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"github.com/tidemq/tidemq/pebblestore"
)

// Kinds of command entries, their first byte; the session (8 bytes, big
// endian) follows.
//
// A leader's broker holds in memory what its batches decided (offsets,
// leases, counters), so it must never write after another leader wrote:
// its memory would not know those writes. Each leader first commits
// entrySession with its term and tags every batch with it; the state
// machine applies a batch only if its session is the last one started, on
// every replica alike, and the broker of a passed-over batch is replaced.
const (
	entryBatch   = 1 // session, then a write batch (core.Batch.Repr) applied as is
	entrySession = 2 // session: the writer from this entry on
)

// errStaleSession is a passed-over batch's result.
var errStaleSession = errors.New("cluster: batch of an earlier leader's session")

func encodeEntry(kind byte, session uint64, repr []byte) []byte {
	b := make([]byte, 9, 9+len(repr))
	b[0] = kind
	binary.BigEndian.PutUint64(b[1:], session)
	return append(b, repr...)
}

// fsm is a broker group's state machine: it applies the write batches the
// leader's broker built, in log order, to the node's store. Applying reads
// nothing and decides nothing, so every replica holds the leader's bytes.
type fsm struct {
	store *pebblestore.Store
	group uint32
	log   *slog.Logger
	// applied is the store's applied index: entries at or below it were
	// applied before a restart (the log is replayed from the last
	// snapshot, NoSnapshotRestoreOnStart) and are skipped.
	applied atomic.Uint64
	// session is the writer whose batches are applied (entrySession).
	// Only raft's apply goroutine changes it (Apply, Restore).
	session uint64
	metrics *metrics
}

func newFSM(store *pebblestore.Store, group uint32, log *slog.Logger, m *metrics) (*fsm, error) {
	f := &fsm{store: store, group: group, log: log, metrics: m}
	idx, err := store.AppliedIndex(group)
	if err != nil {
		return nil, err
	}
	f.applied.Store(idx)
	if f.session, err = store.Session(group); err != nil {
		return nil, err
	}
	return f, nil
}

// Apply implements raft.FSM. Its result is the error of applying, nil on
// success: the leader's proposer reads it from the future.
func (f *fsm) Apply(l *raft.Log) any {
	if l.Type != raft.LogCommand || l.Index <= f.applied.Load() {
		return nil
	}
	if len(l.Data) < 9 || (l.Data[0] != entryBatch && l.Data[0] != entrySession) {
		// An entry this build cannot read: applying around it would leave
		// this replica different from the others.
		err := fmt.Errorf("cluster: raft entry %d: unknown kind", l.Index)
		f.log.Error("state machine cannot apply an entry; the node's state stops here", "index", l.Index, "err", err)
		return err
	}
	start := time.Now()
	defer f.metrics.observeApply(start)
	session := binary.BigEndian.Uint64(l.Data[1:9])
	var err, result error
	switch {
	case l.Data[0] == entrySession:
		if err = f.store.StartSession(f.group, l.Index, session); err == nil {
			f.session = session
		}
	case session != f.session:
		err, result = f.store.ApplyCommitted(f.group, l.Index, nil), errStaleSession
	default:
		err = f.store.ApplyCommitted(f.group, l.Index, l.Data[9:])
	}
	if err != nil {
		f.log.Error("state machine apply failed", "index", l.Index, "err", err)
		return err
	}
	f.applied.Store(l.Index)
	return result
}

// Snapshot implements raft.FSM. The state is in the store, so the
// snapshot is only the promise that it is durable up to the applied index
// (applies are not synced): raft then truncates its log behind it.
// Sending it to a follower streams the store (stateSnapshots.Open).
func (f *fsm) Snapshot() (raft.FSMSnapshot, error) {
	if err := f.store.SyncWAL(); err != nil {
		return nil, err
	}
	f.metrics.snapshot("taken")
	return durableState{}, nil
}

// Restore implements raft.FSM: the state is replaced by the snapshot's
// (a follower too far behind the leader's truncated log).
func (f *fsm) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	if err := f.store.RestoreState(rc); err != nil {
		return err
	}
	idx, err := f.store.AppliedIndex(f.group)
	if err != nil {
		return err
	}
	f.applied.Store(idx)
	if f.session, err = f.store.Session(f.group); err != nil {
		return err
	}
	f.metrics.snapshot("restored")
	f.log.Info("state restored from a snapshot", "applied_index", idx)
	return nil
}

// durableState is a snapshot whose state is the store itself: it writes
// nothing into raft's sink.
type durableState struct{}

func (durableState) Persist(sink raft.SnapshotSink) error { return sink.Close() }
func (durableState) Release()                             {}
