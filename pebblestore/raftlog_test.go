package pebblestore_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/hashicorp/raft"

	"github.com/tidemq/tidemq/core"
	"github.com/tidemq/tidemq/pebblestore"
)

// The behaviours checked here are those raft-boltdb's tests hold its store
// to, plus what several groups in one Pebble and a restart add.

func raftLog(index uint64, data string) *raft.Log {
	return &raft.Log{Index: index, Term: index/10 + 1, Type: raft.LogCommand, Data: []byte(data)}
}

func raftLogs(from, to uint64) []*raft.Log {
	var logs []*raft.Log
	for i := from; i <= to; i++ {
		logs = append(logs, raftLog(i, fmt.Sprintf("log%d", i)))
	}
	return logs
}

func storeLogs(t *testing.T, r *pebblestore.RaftStore, logs []*raft.Log) {
	t.Helper()
	if err := r.StoreLogs(logs); err != nil {
		t.Fatalf("StoreLogs: %v", err)
	}
}

// wantIndexes checks FirstIndex and LastIndex.
func wantIndexes(t *testing.T, r *pebblestore.RaftStore, first, last uint64) {
	t.Helper()
	f, err := r.FirstIndex()
	if err != nil {
		t.Fatalf("FirstIndex: %v", err)
	}
	l, err := r.LastIndex()
	if err != nil {
		t.Fatalf("LastIndex: %v", err)
	}
	if f != first || l != last {
		t.Errorf("FirstIndex, LastIndex = %d, %d; want %d, %d", f, l, first, last)
	}
}

// wantLog checks that GetLog(want.Index) returns a log equal to want, field
// by field.
func wantLog(t *testing.T, r *pebblestore.RaftStore, want *raft.Log) {
	t.Helper()
	var got raft.Log
	if err := r.GetLog(want.Index, &got); err != nil {
		t.Fatalf("GetLog(%d): %v", want.Index, err)
	}
	if got.Index != want.Index || got.Term != want.Term || got.Type != want.Type {
		t.Errorf("GetLog(%d): index, term, type = %d, %d, %v; want %d, %d, %v", want.Index, got.Index, got.Term, got.Type, want.Index, want.Term, want.Type)
	}
	if !bytes.Equal(got.Data, want.Data) || !bytes.Equal(got.Extensions, want.Extensions) {
		t.Errorf("GetLog(%d): data %q, extensions %q; want %q, %q", want.Index, got.Data, got.Extensions, want.Data, want.Extensions)
	}
	if !got.AppendedAt.Equal(want.AppendedAt) || got.AppendedAt.IsZero() != want.AppendedAt.IsZero() {
		t.Errorf("GetLog(%d): appendedAt %v; want %v", want.Index, got.AppendedAt, want.AppendedAt)
	}
}

func wantNoLog(t *testing.T, r *pebblestore.RaftStore, index uint64) {
	t.Helper()
	var got raft.Log
	if err := r.GetLog(index, &got); err != raft.ErrLogNotFound {
		t.Errorf("GetLog(%d) = %v (log %+v); want raft.ErrLogNotFound", index, err, got)
	}
}

func TestRaftStoreEmpty(t *testing.T) {
	r := openStore(t, vfs.NewMem(), "db").RaftStore(1)
	wantIndexes(t, r, 0, 0)
	wantNoLog(t, r, 0)
	wantNoLog(t, r, 1)
	// hashicorp/raft tells a missing stable key by this exact message.
	if v, err := r.Get([]byte("missing")); err == nil || err.Error() != "not found" || v != nil {
		t.Errorf("Get(missing) = %q, %v; want nil, \"not found\"", v, err)
	}
	if v, err := r.GetUint64([]byte("missing")); err == nil || err.Error() != "not found" || v != 0 {
		t.Errorf("GetUint64(missing) = %d, %v; want 0, \"not found\"", v, err)
	}
	has, err := raft.HasExistingState(r, r, raft.NewInmemSnapshotStore())
	if err != nil || has {
		t.Errorf("raft.HasExistingState on an empty store = %v, %v; want false, nil", has, err)
	}
}

func TestRaftStoreLogFields(t *testing.T) {
	r := openStore(t, vfs.NewMem(), "db").RaftStore(1)
	logs := []*raft.Log{
		{Index: 1, Term: 1, Type: raft.LogConfiguration, Data: []byte{0, 1, 2, 0xff}},
		{Index: 2, Term: 1, Type: raft.LogNoop},
		{Index: 3, Term: 2, Type: raft.LogCommand, Data: bytes.Repeat([]byte("x"), 100_000), Extensions: []byte("ext"),
			AppendedAt: time.Date(2026, 12, 2, 3, 4, 5, 123456789, time.UTC)},
		{Index: 4, Term: math.MaxUint64, Type: raft.LogBarrier, Extensions: []byte{0},
			AppendedAt: time.Date(1500, 1, 1, 0, 0, 0, 1, time.UTC)},
		{Index: math.MaxUint64, Term: 3, Type: raft.LogCommand, Data: []byte("last"), AppendedAt: time.Unix(0, 999_999_999)},
	}
	if err := r.StoreLog(logs[0]); err != nil {
		t.Fatalf("StoreLog: %v", err)
	}
	storeLogs(t, r, logs[1:])
	for _, l := range logs {
		wantLog(t, r, l)
	}
	wantIndexes(t, r, 1, math.MaxUint64)

	// Storing an index again replaces its log.
	again := &raft.Log{Index: 2, Term: 5, Type: raft.LogCommand, Data: []byte("replaced")}
	storeLogs(t, r, []*raft.Log{again})
	wantLog(t, r, again)

	// The log read owns its bytes: a later read does not change them.
	var a, b raft.Log
	if err := r.GetLog(1, &a); err != nil {
		t.Fatal(err)
	}
	if err := r.GetLog(3, &b); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Data, logs[0].Data) {
		t.Errorf("log 1's data changed to %q by reading log 3", a.Data)
	}
}

func TestRaftStoreGaps(t *testing.T) {
	r := openStore(t, vfs.NewMem(), "db").RaftStore(1)
	storeLogs(t, r, append(raftLogs(5, 7), raftLogs(20, 22)...))
	wantIndexes(t, r, 5, 22)
	for _, i := range []uint64{1, 4, 8, 19, 23} {
		wantNoLog(t, r, i)
	}
	for _, l := range append(raftLogs(5, 7), raftLogs(20, 22)...) {
		wantLog(t, r, l)
	}
}

func TestRaftStoreDeleteRange(t *testing.T) {
	cases := []struct {
		name        string
		min, max    uint64
		first, last uint64 // after the delete
		kept        [2]uint64
	}{
		{"prefix", 1, 4, 5, 10, [2]uint64{5, 10}},
		{"suffix", 7, 10, 1, 6, [2]uint64{1, 6}},
		{"one at the start", 1, 1, 2, 10, [2]uint64{2, 10}},
		{"one at the end", 10, 10, 1, 9, [2]uint64{1, 9}},
		{"everything", 1, 10, 0, 0, [2]uint64{1, 0}},
		{"everything, wider bounds", 0, math.MaxUint64, 0, 0, [2]uint64{1, 0}},
		{"below the log", 0, 0, 1, 10, [2]uint64{1, 10}},
		{"above the log", 11, 100, 1, 10, [2]uint64{1, 10}},
		{"min above max", 5, 4, 1, 10, [2]uint64{1, 10}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := openStore(t, vfs.NewMem(), "db").RaftStore(1)
			storeLogs(t, r, raftLogs(1, 10))
			if err := r.DeleteRange(c.min, c.max); err != nil {
				t.Fatalf("DeleteRange(%d, %d): %v", c.min, c.max, err)
			}
			wantIndexes(t, r, c.first, c.last)
			for i := uint64(1); i <= 10; i++ {
				if i >= c.kept[0] && i <= c.kept[1] {
					wantLog(t, r, raftLog(i, fmt.Sprintf("log%d", i)))
				} else {
					wantNoLog(t, r, i)
				}
			}
		})
	}

	t.Run("middle, then store past it", func(t *testing.T) {
		r := openStore(t, vfs.NewMem(), "db").RaftStore(1)
		storeLogs(t, r, raftLogs(1, 10))
		if err := r.DeleteRange(4, 6); err != nil {
			t.Fatal(err)
		}
		wantIndexes(t, r, 1, 10)
		wantNoLog(t, r, 4)
		wantNoLog(t, r, 6)
		wantLog(t, r, raftLog(3, "log3"))
		wantLog(t, r, raftLog(7, "log7"))
		// A suffix removed and written again, as raft does on a conflict.
		if err := r.DeleteRange(8, 10); err != nil {
			t.Fatal(err)
		}
		storeLogs(t, r, raftLogs(8, 12))
		wantIndexes(t, r, 1, 12)
		wantLog(t, r, raftLog(12, "log12"))
	})
}

func TestRaftStoreLargeBatch(t *testing.T) {
	r := openStore(t, vfs.NewMem(), "db").RaftStore(1)
	const n = 10_000
	logs := raftLogs(1, n)
	for i, l := range logs {
		l.AppendedAt = time.Unix(1_800_000_000+int64(i), int64(i))
	}
	storeLogs(t, r, logs)
	wantIndexes(t, r, 1, n)
	for _, l := range logs {
		wantLog(t, r, l)
		if t.Failed() {
			break
		}
	}
	if err := r.DeleteRange(1, n-1); err != nil {
		t.Fatal(err)
	}
	wantIndexes(t, r, n, n)
}

func TestRaftStoreStable(t *testing.T) {
	r := openStore(t, vfs.NewMem(), "db").RaftStore(1)
	if err := r.Set([]byte("hello"), []byte("world")); err != nil {
		t.Fatalf("Set: %v", err)
	}
	if v, err := r.Get([]byte("hello")); err != nil || string(v) != "world" {
		t.Errorf("Get(hello) = %q, %v; want world", v, err)
	}
	if err := r.Set([]byte("hello"), []byte("again")); err != nil {
		t.Fatal(err)
	}
	if v, err := r.Get([]byte("hello")); err != nil || string(v) != "again" {
		t.Errorf("Get(hello) after a second Set = %q, %v; want again", v, err)
	}
	if _, err := r.Get([]byte("hell")); err == nil || err.Error() != "not found" {
		t.Errorf("Get(hell) = %v; want \"not found\" (a prefix of a key is not the key)", err)
	}

	if err := r.SetUint64([]byte("CurrentTerm"), 0); err != nil {
		t.Fatalf("SetUint64: %v", err)
	}
	if v, err := r.GetUint64([]byte("CurrentTerm")); err != nil || v != 0 {
		t.Errorf("GetUint64(CurrentTerm) = %d, %v; want 0, nil (stored, not missing)", v, err)
	}
	for _, want := range []uint64{1, 1 << 40, math.MaxUint64} {
		if err := r.SetUint64([]byte("CurrentTerm"), want); err != nil {
			t.Fatal(err)
		}
		if v, err := r.GetUint64([]byte("CurrentTerm")); err != nil || v != want {
			t.Errorf("GetUint64(CurrentTerm) = %d, %v; want %d", v, err, want)
		}
	}
	// A value that is not 8 bytes is an error, not a number.
	if v, err := r.GetUint64([]byte("hello")); err == nil || err.Error() == "not found" {
		t.Errorf("GetUint64(hello) of a 5-byte value = %d, %v; want an error other than not found", v, err)
	}

	// The stable store and the log do not see each other.
	wantIndexes(t, r, 0, 0)
	storeLogs(t, r, raftLogs(1, 3))
	if v, err := r.GetUint64([]byte("CurrentTerm")); err != nil || v != math.MaxUint64 {
		t.Errorf("GetUint64(CurrentTerm) after StoreLogs = %d, %v", v, err)
	}
	if err := r.DeleteRange(0, math.MaxUint64); err != nil {
		t.Fatal(err)
	}
	if v, err := r.Get([]byte("hello")); err != nil || string(v) != "again" {
		t.Errorf("Get(hello) after deleting the whole log = %q, %v", v, err)
	}
}

// Groups share one Pebble: 0 and MaxUint32 are the edges of the group id's
// range, where a span computed wrong would reach a neighbour.
func TestRaftStoreGroupsIsolated(t *testing.T) {
	s := openStore(t, vfs.NewMem(), "db")
	groups := []uint32{0, 1, 2, math.MaxUint32}
	from := func(i int) uint64 { return uint64(i*100 + 1) }
	for i, g := range groups {
		r := s.RaftStore(g)
		storeLogs(t, r, raftLogs(from(i), from(i)+9))
		if err := r.SetUint64([]byte("CurrentTerm"), uint64(g)); err != nil {
			t.Fatal(err)
		}
		if err := r.Set([]byte("LastVoteCand"), []byte(fmt.Sprint("n", g))); err != nil {
			t.Fatal(err)
		}
	}
	check := func(deleted map[uint32]bool) {
		t.Helper()
		for i, g := range groups {
			r := s.RaftStore(g)
			if deleted[g] {
				wantIndexes(t, r, 0, 0)
				wantNoLog(t, r, from(i))
			} else {
				wantIndexes(t, r, from(i), from(i)+9)
				wantLog(t, r, raftLog(from(i), fmt.Sprintf("log%d", from(i))))
			}
			// Another group's indexes are not in this one.
			for j := range groups {
				if j != i {
					wantNoLog(t, r, from(j))
				}
			}
			if v, err := r.GetUint64([]byte("CurrentTerm")); err != nil || v != uint64(g) {
				t.Errorf("group %d: GetUint64(CurrentTerm) = %d, %v; want %d", g, v, err, g)
			}
			if v, err := r.Get([]byte("LastVoteCand")); err != nil || string(v) != fmt.Sprint("n", g) {
				t.Errorf("group %d: Get(LastVoteCand) = %q, %v", g, v, err)
			}
		}
	}
	check(nil)
	// Deleting the whole log of the edge groups leaves every other group's.
	for _, g := range []uint32{0, math.MaxUint32} {
		if err := s.RaftStore(g).DeleteRange(0, math.MaxUint64); err != nil {
			t.Fatal(err)
		}
	}
	check(map[uint32]bool{0: true, math.MaxUint32: true})
	if v, err := s.RaftStore(7).Get([]byte("CurrentTerm")); err == nil || err.Error() != "not found" {
		t.Errorf("group 7 (never written): Get(CurrentTerm) = %q, %v; want \"not found\"", v, err)
	}
}

// A log and a stable key written survive closing and opening the store, on
// the real disk; and they survive a crash, which keeps only synced data.
func TestRaftStorePersists(t *testing.T) {
	logs := raftLogs(1, 50)
	logs[10].Extensions = []byte("ext")
	logs[10].AppendedAt = time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
	write := func(t *testing.T, s *pebblestore.Store) {
		r := s.RaftStore(3)
		storeLogs(t, r, logs)
		if err := r.DeleteRange(1, 5); err != nil {
			t.Fatal(err)
		}
		if err := r.SetUint64([]byte("CurrentTerm"), 9); err != nil {
			t.Fatal(err)
		}
		if err := r.Set([]byte("LastVoteCand"), []byte("n2")); err != nil {
			t.Fatal(err)
		}
	}
	check := func(t *testing.T, s *pebblestore.Store) {
		t.Helper()
		r := s.RaftStore(3)
		wantIndexes(t, r, 6, 50)
		wantNoLog(t, r, 5)
		for _, l := range logs[5:] {
			wantLog(t, r, l)
		}
		if v, err := r.GetUint64([]byte("CurrentTerm")); err != nil || v != 9 {
			t.Errorf("GetUint64(CurrentTerm) = %d, %v; want 9", v, err)
		}
		if v, err := r.Get([]byte("LastVoteCand")); err != nil || string(v) != "n2" {
			t.Errorf("Get(LastVoteCand) = %q, %v; want n2", v, err)
		}
		// The broker's own reads are not disturbed by raft keys.
		if _, err := s.Load(); err != nil {
			t.Errorf("Load of a store holding raft keys: %v", err)
		}
	}

	t.Run("reopen", func(t *testing.T) {
		dir := t.TempDir()
		s := openStore(t, nil, dir)
		write(t, s)
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		check(t, openStore(t, nil, dir))
	})
	t.Run("crash", func(t *testing.T) {
		check(t, crashAfter(t, write))
	})
}

// Each write is synced on its own: a crash right after it, which keeps only
// what was synced, keeps it.
func TestRaftStoreWritesSynced(t *testing.T) {
	r := func(s *pebblestore.Store) *pebblestore.RaftStore { return s.RaftStore(1) }
	t.Run("StoreLogs", func(t *testing.T) {
		s := crashAfter(t, func(t *testing.T, s *pebblestore.Store) { storeLogs(t, r(s), raftLogs(1, 3)) })
		wantIndexes(t, r(s), 1, 3)
	})
	t.Run("StoreLog", func(t *testing.T) {
		s := crashAfter(t, func(t *testing.T, s *pebblestore.Store) {
			if err := r(s).StoreLog(raftLog(4, "log4")); err != nil {
				t.Fatal(err)
			}
		})
		wantLog(t, r(s), raftLog(4, "log4"))
	})
	t.Run("DeleteRange", func(t *testing.T) {
		fs := vfs.NewCrashableMem()
		s := openStore(t, fs, "db")
		storeLogs(t, r(s), raftLogs(1, 3))
		if err := r(s).DeleteRange(1, 2); err != nil {
			t.Fatal(err)
		}
		wantIndexes(t, r(openStore(t, fs.CrashClone(vfs.CrashCloneCfg{}), "db")), 3, 3)
	})
	t.Run("Set", func(t *testing.T) {
		s := crashAfter(t, func(t *testing.T, s *pebblestore.Store) {
			if err := r(s).Set([]byte("k"), []byte("v")); err != nil {
				t.Fatal(err)
			}
		})
		if v, err := r(s).Get([]byte("k")); err != nil || string(v) != "v" {
			t.Errorf("Get(k) after a crash = %q, %v; want v", v, err)
		}
	})
	t.Run("SetUint64", func(t *testing.T) {
		s := crashAfter(t, func(t *testing.T, s *pebblestore.Store) {
			if err := r(s).SetUint64([]byte("k"), 7); err != nil {
				t.Fatal(err)
			}
		})
		if v, err := r(s).GetUint64([]byte("k")); err != nil || v != 7 {
			t.Errorf("GetUint64(k) after a crash = %d, %v; want 7", v, err)
		}
	})
}

// crashAfter runs write on a new store on a crashable filesystem, then
// opens what a crash right after it leaves.
func crashAfter(t *testing.T, write func(*testing.T, *pebblestore.Store)) *pebblestore.Store {
	t.Helper()
	fs := vfs.NewCrashableMem()
	write(t, openStore(t, fs, "db"))
	return openStore(t, fs.CrashClone(vfs.CrashCloneCfg{}), "db")
}

func TestRaftStoreClosed(t *testing.T) {
	s := openStore(t, vfs.NewMem(), "db")
	r := s.RaftStore(1)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := r.LastIndex(); !errors.Is(err, core.ErrClosed) {
		t.Errorf("LastIndex on a closed store = %v; want core.ErrClosed", err)
	}
	if err := r.GetLog(1, new(raft.Log)); !errors.Is(err, core.ErrClosed) {
		t.Errorf("GetLog on a closed store = %v; want core.ErrClosed", err)
	}
	if err := r.StoreLogs(raftLogs(1, 1)); !errors.Is(err, core.ErrClosed) {
		t.Errorf("StoreLogs on a closed store = %v; want core.ErrClosed", err)
	}
	if _, err := r.Get([]byte("k")); !errors.Is(err, core.ErrClosed) || err.Error() == "not found" {
		t.Errorf("Get on a closed store = %v; want core.ErrClosed", err)
	}
}

// countingFSM counts the commands applied to it.
type countingFSM struct{ applied atomic.Int64 }

func (f *countingFSM) Apply(*raft.Log) any { return f.applied.Add(1) }

func (f *countingFSM) Snapshot() (raft.FSMSnapshot, error) {
	return countSnapshot(f.applied.Load()), nil
}

func (f *countingFSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	var n int64
	if _, err := fmt.Fscan(rc, &n); err != nil {
		return err
	}
	f.applied.Store(n)
	return nil
}

type countSnapshot int64

func (c countSnapshot) Persist(sink raft.SnapshotSink) error {
	if _, err := fmt.Fprint(sink, int64(c)); err != nil {
		return errors.Join(err, sink.Cancel())
	}
	return sink.Close()
}

func (countSnapshot) Release() {}

// waitFor polls cond every 5 ms for up to timeout.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, timeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A single-node raft group runs on the store, and after a restart on the
// same Pebble it finds its log and term and applies its commands again.
func TestRaftStoreRunsRaft(t *testing.T) {
	dir := t.TempDir()
	const id, addr = raft.ServerID("n1"), raft.ServerAddress("n1")
	conf := raft.DefaultConfig()
	conf.LocalID = id
	conf.LogOutput = io.Discard
	conf.HeartbeatTimeout = 50 * time.Millisecond
	conf.ElectionTimeout = 50 * time.Millisecond
	conf.LeaderLeaseTimeout = 50 * time.Millisecond
	conf.CommitTimeout = 5 * time.Millisecond

	start := func(t *testing.T, s *pebblestore.Store, fsm *countingFSM) *raft.Raft {
		t.Helper()
		r := s.RaftStore(1)
		_, trans := raft.NewInmemTransport(addr)
		node, err := raft.NewRaft(conf, fsm, r, r, raft.NewInmemSnapshotStore(), trans)
		if err != nil {
			t.Fatalf("NewRaft: %v", err)
		}
		t.Cleanup(func() { _ = node.Shutdown().Error() })
		return node
	}

	s := openStore(t, nil, dir)
	rs := s.RaftStore(1)
	fsm := new(countingFSM)
	node := start(t, s, fsm)
	err := node.BootstrapCluster(raft.Configuration{Servers: []raft.Server{{Suffrage: raft.Voter, ID: id, Address: addr}}}).Error()
	if err != nil {
		t.Fatalf("BootstrapCluster: %v", err)
	}
	waitFor(t, 5*time.Second, "leader", func() bool { return node.State() == raft.Leader })
	const n = 100
	for i := range n {
		if err := node.Apply([]byte(fmt.Sprint("cmd", i)), 2*time.Second).Error(); err != nil {
			t.Fatalf("Apply %d: %v", i, err)
		}
	}
	if got := fsm.applied.Load(); got != n {
		t.Fatalf("FSM applied %d commands; want %d", got, n)
	}
	if err := node.Shutdown().Error(); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	last, err := rs.LastIndex()
	if err != nil || last < n {
		t.Fatalf("LastIndex after %d applies = %d, %v; want at least %d", n, last, err, n)
	}
	term, err := rs.GetUint64([]byte("CurrentTerm"))
	if err != nil || term == 0 {
		t.Fatalf("CurrentTerm = %d, %v; want a stored term", term, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = openStore(t, nil, dir)
	rs = s.RaftStore(1)
	has, err := raft.HasExistingState(rs, rs, raft.NewInmemSnapshotStore())
	if err != nil || !has {
		t.Fatalf("raft.HasExistingState after a restart = %v, %v; want true", has, err)
	}
	fsm = new(countingFSM)
	node = start(t, s, fsm)
	waitFor(t, 5*time.Second, "leader after restart", func() bool { return node.State() == raft.Leader })
	// Leading again commits the log it found, so the FSM sees every command.
	waitFor(t, 5*time.Second, "commands applied again", func() bool { return fsm.applied.Load() >= n })
	if err := node.Apply([]byte("after"), 2*time.Second).Error(); err != nil {
		t.Fatalf("Apply after restart: %v", err)
	}
	if got := fsm.applied.Load(); got != n+1 {
		t.Errorf("FSM applied %d commands after the restart; want %d", got, n+1)
	}
	if newTerm, err := rs.GetUint64([]byte("CurrentTerm")); err != nil || newTerm <= term {
		t.Errorf("CurrentTerm after the restart's election = %d, %v; want above %d", newTerm, err, term)
	}
	if err := node.Shutdown().Error(); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
}
