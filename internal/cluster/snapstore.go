package cluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/tidemq/tidemq/pebblestore"
)

// stateSnapshots is the group's raft.SnapshotStore. The applied state is
// already in the node's store, durable up to at least a snapshot's index
// (fsm.Snapshot syncs it), so a snapshot taken here is its metadata only:
// taking one copies nothing, however large the backlog, and raft truncates
// its log behind it. Opening one to send to a follower streams the store's
// state as it is then (once per snapshot: the stream is kept beside its
// metadata for the next follower or try), which carries its own, later
// applied index: the
// follower restores it and skips the entries up to that index when raft
// replays them. A snapshot received from a leader is kept with its stream
// (the state file) until newer ones replace it: the state machine restores
// from it, and a restore a crash interrupted is finished from it.
type stateSnapshots struct {
	dir   string
	store *pebblestore.Store
	log   *slog.Logger
	mu    sync.Mutex // orders Close's pruning and renames against List and Open
}

const (
	snapMetaFile  = "meta.json"
	snapStateFile = "state"    // a leader's stream, received
	snapSentFile  = "streamed" // this store's state streamed for followers, kept for the next one
	snapTmpSuffix = ".tmp"
	snapsRetained = 2
)

func newStateSnapshots(dir string, store *pebblestore.Store, log *slog.Logger) (*stateSnapshots, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("cluster: snapshot directory: %w", err)
	}
	s := &stateSnapshots{dir: dir, store: store, log: log}
	// What a crash left half-written is not a snapshot.
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), snapTmpSuffix) {
			_ = os.RemoveAll(filepath.Join(dir, e.Name()))
		}
	}
	return s, nil
}

// Create implements raft.SnapshotSink's maker: a local snapshot's sink is
// written nothing; a leader's stream is written into the state file.
func (s *stateSnapshots) Create(version raft.SnapshotVersion, index, term uint64, configuration raft.Configuration,
	configurationIndex uint64, _ raft.Transport) (raft.SnapshotSink, error) {
	id := fmt.Sprintf("%020d-%020d-%d", term, index, time.Now().UnixNano())
	tmp := filepath.Join(s.dir, id+snapTmpSuffix)
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return nil, fmt.Errorf("cluster: snapshot %s: %w", id, err)
	}
	return &snapSink{s: s, tmp: tmp, meta: raft.SnapshotMeta{
		Version: version, ID: id, Index: index, Term: term,
		Configuration: configuration, ConfigurationIndex: configurationIndex,
	}}, nil
}

// List implements raft.SnapshotStore: newest first.
func (s *stateSnapshots) List() ([]*raft.SnapshotMeta, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.list()
}

func (s *stateSnapshots) list() ([]*raft.SnapshotMeta, error) {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("cluster: list snapshots: %w", err)
	}
	var metas []*raft.SnapshotMeta
	for _, e := range entries {
		if !e.IsDir() || strings.HasSuffix(e.Name(), snapTmpSuffix) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(s.dir, e.Name(), snapMetaFile))
		if err != nil {
			s.log.Warn("snapshot without metadata skipped", "snapshot", e.Name(), "err", err)
			continue
		}
		var m raft.SnapshotMeta
		if err := json.Unmarshal(b, &m); err != nil {
			s.log.Warn("snapshot with unreadable metadata skipped", "snapshot", e.Name(), "err", err)
			continue
		}
		metas = append(metas, &m)
	}
	slices.SortFunc(metas, func(a, b *raft.SnapshotMeta) int {
		if a.Term != b.Term {
			return cmpDesc(a.Term, b.Term)
		}
		if a.Index != b.Index {
			return cmpDesc(a.Index, b.Index)
		}
		return strings.Compare(b.ID, a.ID)
	})
	return metas, nil
}

func cmpDesc(a, b uint64) int {
	switch {
	case a > b:
		return -1
	case a < b:
		return 1
	}
	return 0
}

// Open implements raft.SnapshotStore: a received snapshot's stream as
// stored, or for a local one the store's state streamed now into a file
// (raft sends a snapshot's size before its bytes), removed on Close.
func (s *stateSnapshots) Open(id string) (*raft.SnapshotMeta, io.ReadCloser, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	dir := filepath.Join(s.dir, id)
	b, err := os.ReadFile(filepath.Join(dir, snapMetaFile))
	if err != nil {
		return nil, nil, fmt.Errorf("cluster: open snapshot %s: %w", id, err)
	}
	var meta raft.SnapshotMeta
	if err := json.Unmarshal(b, &meta); err != nil {
		return nil, nil, fmt.Errorf("cluster: open snapshot %s: %w", id, err)
	}
	if f, err := os.Open(filepath.Join(dir, snapStateFile)); err == nil {
		st, err := f.Stat()
		if err != nil {
			return nil, nil, errors.Join(err, f.Close())
		}
		meta.Size = st.Size()
		return &meta, f, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, nil, fmt.Errorf("cluster: open snapshot %s: %w", id, err)
	}
	// Streamed once per snapshot: raft tries again and again to send one to
	// a follower that is down, and each try would copy the whole state.
	sent := filepath.Join(dir, snapSentFile)
	if f, err := os.Open(sent); err == nil {
		st, err := f.Stat()
		if err != nil {
			return nil, nil, errors.Join(err, f.Close())
		}
		meta.Size = st.Size()
		return &meta, f, nil
	}
	f, err := os.Create(sent + snapTmpSuffix)
	if err != nil {
		return nil, nil, fmt.Errorf("cluster: snapshot %s: %w", id, err)
	}
	remove := func() error { return errors.Join(f.Close(), os.Remove(f.Name())) }
	sn, err := s.store.StateSnapshot()
	if err != nil {
		return nil, nil, errors.Join(err, remove())
	}
	n, err := sn.WriteTo(f)
	if err = errors.Join(err, sn.Close()); err != nil {
		return nil, nil, errors.Join(err, remove())
	}
	if err := errors.Join(f.Sync(), f.Close()); err != nil {
		return nil, nil, errors.Join(err, os.Remove(f.Name()))
	}
	if err := os.Rename(f.Name(), sent); err != nil {
		return nil, nil, errors.Join(err, os.Remove(f.Name()))
	}
	s.log.Info("state streamed for a follower's snapshot", "snapshot", id, "bytes", n)
	rf, err := os.Open(sent)
	if err != nil {
		return nil, nil, err
	}
	meta.Size = n
	return &meta, rf, nil
}

// received is the newest snapshot that holds a leader's stream.
func (s *stateSnapshots) received() (*raft.SnapshotMeta, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	metas, err := s.list()
	if err != nil {
		return nil, err
	}
	for _, m := range metas {
		if _, err := os.Stat(filepath.Join(s.dir, m.ID, snapStateFile)); err == nil {
			return m, nil
		}
	}
	return nil, nil
}

type snapSink struct {
	s      *stateSnapshots
	tmp    string
	meta   raft.SnapshotMeta
	f      *os.File
	size   int64
	closed bool
}

func (k *snapSink) ID() string { return k.meta.ID }

func (k *snapSink) Write(p []byte) (int, error) {
	if k.f == nil {
		f, err := os.Create(filepath.Join(k.tmp, snapStateFile))
		if err != nil {
			return 0, err
		}
		k.f = f
	}
	n, err := k.f.Write(p)
	k.size += int64(n)
	return n, err
}

// Close makes the snapshot durable and visible (metadata and stream
// synced, then the directory renamed), and prunes all but the newest.
func (k *snapSink) Close() error {
	if k.closed {
		return nil
	}
	k.closed = true
	if k.f != nil {
		if err := errors.Join(k.f.Sync(), k.f.Close()); err != nil {
			return errors.Join(err, os.RemoveAll(k.tmp))
		}
	}
	k.meta.Size = k.size
	b, err := json.Marshal(k.meta)
	if err == nil {
		err = writeSynced(filepath.Join(k.tmp, snapMetaFile), b)
	}
	if err != nil {
		return errors.Join(err, os.RemoveAll(k.tmp))
	}
	k.s.mu.Lock()
	defer k.s.mu.Unlock()
	if err := os.Rename(k.tmp, filepath.Join(k.s.dir, k.meta.ID)); err != nil {
		return errors.Join(err, os.RemoveAll(k.tmp))
	}
	if err := syncDir(k.s.dir); err != nil {
		return err
	}
	metas, err := k.s.list()
	if err != nil {
		return err
	}
	for _, m := range pruned(metas) {
		if err := os.RemoveAll(filepath.Join(k.s.dir, m.ID)); err != nil {
			k.s.log.Warn("old snapshot not removed", "snapshot", m.ID, "err", err)
		}
	}
	return nil
}

// pruned is what lies behind the newest snapsRetained points (term and
// index) of metas, newest first. Snapshots at one point stay together: a
// follower that learns an entry's commit only with the leader's next
// message takes local snapshots at the index of the one it received until
// then, and counting those would drop the received stream a restore cut
// short is completed from.
func pruned(metas []*raft.SnapshotMeta) []*raft.SnapshotMeta {
	points := 0
	for i, m := range metas {
		if i == 0 || m.Term != metas[i-1].Term || m.Index != metas[i-1].Index {
			points++
		}
		if points > snapsRetained {
			return metas[i:]
		}
	}
	return nil
}

func (k *snapSink) Cancel() error {
	if k.closed {
		return nil
	}
	k.closed = true
	var err error
	if k.f != nil {
		err = k.f.Close()
	}
	return errors.Join(err, os.RemoveAll(k.tmp))
}

func writeSynced(path string, b []byte) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		return errors.Join(err, f.Close())
	}
	return errors.Join(f.Sync(), f.Close())
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	return errors.Join(d.Sync(), d.Close())
}
