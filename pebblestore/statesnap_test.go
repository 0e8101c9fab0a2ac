package pebblestore_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"reflect"
	"runtime"
	"runtime/debug"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/hashicorp/raft"

	"github.com/tidemq/tidemq/core"
	"github.com/tidemq/tidemq/pebblestore"
)

// brokerView is what a broker shows of its state through core's API.
type brokerView struct {
	Topics []core.TopicInfo
	Msgs   map[string][]*core.Message
	Subs   map[string][]core.SubscriptionInfo
	Dead   map[string][]core.DeadMessage
}

func viewOf(t *testing.T, b *core.Broker) brokerView {
	t.Helper()
	v := brokerView{Topics: b.ListTopics(), Msgs: map[string][]*core.Message{}, Subs: map[string][]core.SubscriptionInfo{}, Dead: map[string][]core.DeadMessage{}}
	for _, ti := range v.Topics {
		var cur *core.QueryCursor
		for page := 0; ; page++ {
			if page > 1000 {
				t.Fatalf("topic %s: more than 1000 pages of messages", ti.Name)
			}
			ms, next, err := b.QueryMessages(t.Context(), ti.Name, core.Query{Limit: 100, Cursor: cur})
			if err != nil {
				t.Fatalf("QueryMessages %s: %v", ti.Name, err)
			}
			v.Msgs[ti.Name] = append(v.Msgs[ti.Name], ms...)
			if next == nil {
				break
			}
			cur = next
		}
		subs, err := b.ListSubscriptions(ti.Name)
		if err != nil {
			t.Fatalf("ListSubscriptions %s: %v", ti.Name, err)
		}
		for i := range subs {
			// Leases and consumers' liveness are the running broker's
			// memory, not stored (core/doc.go): a broker over the same
			// state shows none. What the leases cover is compared: lag
			// counts leased messages as not acked on either side.
			subs[i].Consumers = nil
			subs[i].Inflight = 0
			for q := range subs[i].Queues {
				subs[i].Queues[q].Inflight = 0
			}
		}
		v.Subs[ti.Name] = subs
		for _, sub := range subs {
			var after core.DLQCursor
			for page := 0; ; page++ {
				if page > 1000 {
					t.Fatalf("%s/%s: more than 1000 pages of dead messages", ti.Name, sub.Group)
				}
				ds, next, err := b.ListDead(ti.Name, sub.Group, 100, after)
				if err != nil {
					t.Fatalf("ListDead %s/%s: %v", ti.Name, sub.Group, err)
				}
				v.Dead[ti.Name+"/"+sub.Group] = append(v.Dead[ti.Name+"/"+sub.Group], ds...)
				if next == nil {
					break
				}
				after = *next
			}
		}
	}
	return v
}

// stateStream writes sn to memory.
func stateStream(t *testing.T, sn *pebblestore.StateSnapshot) []byte {
	t.Helper()
	var buf bytes.Buffer
	n, err := sn.WriteTo(&buf)
	if err != nil {
		t.Fatalf("WriteTo: %v", err)
	}
	if n != int64(buf.Len()) {
		t.Fatalf("WriteTo reports %d bytes, wrote %d", n, buf.Len())
	}
	return buf.Bytes()
}

func snapshotStream(t *testing.T, s *pebblestore.Store) []byte {
	t.Helper()
	sn, err := s.StateSnapshot()
	if err != nil {
		t.Fatalf("StateSnapshot: %v", err)
	}
	defer func() {
		if err := sn.Close(); err != nil {
			t.Errorf("StateSnapshot.Close: %v", err)
		}
	}()
	return stateStream(t, sn)
}

func restoring(t *testing.T, s *pebblestore.Store) bool {
	t.Helper()
	in, err := s.RestoreInProgress()
	if err != nil {
		t.Fatalf("RestoreInProgress: %v", err)
	}
	return in
}

// raftFixture is a raft group's log and stable values written beside the
// state, which a restore must leave alone.
type raftFixture struct {
	logs []*raft.Log
	term uint64
	vote []byte
}

func writeRaft(t *testing.T, s *pebblestore.Store) raftFixture {
	t.Helper()
	f := raftFixture{term: 7, vote: []byte("node-2")}
	for i := range uint64(20) {
		f.logs = append(f.logs, &raft.Log{Index: 11 + i, Term: 7, Type: raft.LogCommand, Data: fmt.Appendf(nil, "cmd-%d", i), AppendedAt: time.Unix(1_700_000_000+int64(i), 5)})
	}
	rs := s.RaftStore(1)
	if err := rs.StoreLogs(f.logs); err != nil {
		t.Fatal(err)
	}
	if err := rs.SetUint64([]byte("CurrentTerm"), f.term); err != nil {
		t.Fatal(err)
	}
	if err := rs.Set([]byte("LastVoteCand"), f.vote); err != nil {
		t.Fatal(err)
	}
	return f
}

func checkRaft(t *testing.T, s *pebblestore.Store, f raftFixture) {
	t.Helper()
	rs := s.RaftStore(1)
	first, err1 := rs.FirstIndex()
	last, err2 := rs.LastIndex()
	if err := errors.Join(err1, err2); err != nil || first != f.logs[0].Index || last != f.logs[len(f.logs)-1].Index {
		t.Fatalf("raft log spans %d–%d (%v), want %d–%d", first, last, err, f.logs[0].Index, f.logs[len(f.logs)-1].Index)
	}
	for _, want := range f.logs {
		var got raft.Log
		if err := rs.GetLog(want.Index, &got); err != nil {
			t.Fatalf("GetLog(%d): %v", want.Index, err)
		}
		if got.Term != want.Term || got.Type != want.Type || !bytes.Equal(got.Data, want.Data) || !got.AppendedAt.Equal(want.AppendedAt) {
			t.Fatalf("raft log %d = %+v, want %+v", want.Index, got, *want)
		}
	}
	term, err := rs.GetUint64([]byte("CurrentTerm"))
	vote, err2 := rs.Get([]byte("LastVoteCand"))
	if err := errors.Join(err, err2); err != nil || term != f.term || !bytes.Equal(vote, f.vote) {
		t.Fatalf("raft stable values: term %d vote %q (%v), want %d %q", term, vote, err, f.term, f.vote)
	}
}

// openBroker opens a broker over s at clk's time; it is closed when the
// test ends, before s.
func openBroker(t *testing.T, s *pebblestore.Store, clk *testClock) *core.Broker {
	t.Helper()
	b, err := core.New(s, core.Options{Now: clk.Now, Logger: replicaQuiet, ReceiptKey: []byte("replica-test-key")})
	if err != nil {
		t.Fatalf("core.New: %v", err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Errorf("broker Close: %v", err)
		}
	})
	return b
}

// A restored store holds the source's state as of the snapshot, and only
// that: the same fingerprint (none of the target's old keys, none of the
// source's later writes), its own raft log and votes, and a broker over it
// that shows the same topics, messages, subscriptions (lag included) and
// dead letters, after a reopen too, as does a broker over a checkpoint of
// the source (a plain reopen, no snapshot). Each seed leaves other leases
// out and other filtered messages behind the running broker's cursors.
func TestStateSnapshotRestoresTheStateAsOfTheSnapshot(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3, 4} {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) { testStateSnapshotRestores(t, seed) })
	}
}

func testStateSnapshotRestores(t *testing.T, seed uint64) {
	ctx := t.Context()
	clk := &testClock{now: time.Date(2025, 3, 14, 9, 26, 53, 0, time.UTC)}
	srcFS := vfs.NewMem()
	src, srcStore := openObservedBroker(t, srcFS, clk, core.LocalProposer(false))
	c := runWorkload(t, src, clk, seed, 60)
	wantCoverage(t, c)
	// A dead letter and a delayed send that are there at the snapshot.
	if _, _, err := src.PutTopic(ctx, "dlq", core.TopicConfig{Queues: 1}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := src.PutSubscription(ctx, "dlq", "g", core.SubscriptionConfig{}); err != nil {
		t.Fatal(err)
	}
	if _, err := src.Send(ctx, "dlq", []*core.Message{{Body: []byte("poison")}, {Body: []byte("later"), DeliverAtMs: clk.Now().Add(time.Hour).UnixMilli()}}); err != nil {
		t.Fatal(err)
	}
	got, err := src.Pull(ctx, "dlq", "g", core.PullRequest{MaxMessages: 2, Invisible: time.Minute})
	if err != nil || len(got) != 1 {
		t.Fatalf("Pull dlq: %d messages, %v", len(got), err)
	}
	if n, _, err := src.DeadLetter(ctx, "dlq", "g", []string{got[0].ReceiptHandle}, "poison"); err != nil || n != 1 {
		t.Fatalf("DeadLetter: %d, %v", n, err)
	}
	want := fingerprint(t, srcStore)
	wantView := viewOf(t, src)
	if len(wantView.Dead["dlq/g"]) != 1 {
		t.Fatalf("the source lists %d dead letters in dlq/g, want 1", len(wantView.Dead["dlq/g"]))
	}
	sn, err := srcStore.StateSnapshot()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sn.Close(); err != nil {
			t.Error(err)
		}
	})
	if err := srcStore.Checkpoint("checkpoint"); err != nil {
		t.Fatal(err)
	}
	if fingerprint(t, srcStore) != want {
		t.Fatal("the source changed while the snapshot and the checkpoint were taken: the comparisons below would not be of one state")
	}
	if got := viewOf(t, openBroker(t, openStore(t, srcFS, "checkpoint"), clk)); !reflect.DeepEqual(got, wantView) {
		logViewDiff(t, got, wantView)
		t.Fatal("a broker over a checkpoint of the source shows another state than the source")
	}
	// The source goes on after the snapshot.
	if _, err := src.Send(ctx, "orders", []*core.Message{{Body: []byte("after the snapshot"), Tag: "red"}}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := src.PutTopic(ctx, "later", core.TopicConfig{Queues: 1}); err != nil {
		t.Fatal(err)
	}
	if err := srcStore.Flush(); err != nil {
		t.Fatal(err)
	}
	if fingerprint(t, srcStore) == want {
		t.Fatal("the writes after the snapshot changed nothing")
	}
	stream := stateStream(t, sn)
	if again := stateStream(t, sn); !bytes.Equal(again, stream) {
		t.Fatal("a second WriteTo of one snapshot wrote another stream")
	}

	// The target holds another broker's state and a raft group's log.
	fs := vfs.NewMem()
	other, dst := openObservedBroker(t, fs, clk, core.LocalProposer(false))
	runWorkload(t, other, clk, 9, 4)
	if err := other.Close(); err != nil {
		t.Fatal(err)
	}
	rf := writeRaft(t, dst)
	if fingerprint(t, dst) == want {
		t.Fatal("the target already holds the source's state")
	}
	if err := dst.RestoreState(bytes.NewReader(stream)); err != nil {
		t.Fatalf("RestoreState: %v", err)
	}
	if fingerprint(t, dst) != want {
		t.Fatal("the restored store differs from the source at the snapshot")
	}
	if restoring(t, dst) {
		t.Fatal("RestoreInProgress after a restore that succeeded")
	}
	checkRaft(t, dst, rf)
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}

	reopened := openStore(t, fs, "db")
	if fingerprint(t, reopened) != want || restoring(t, reopened) {
		t.Fatal("the reopened restored store differs from the source at the snapshot, or is marked as restoring")
	}
	checkRaft(t, reopened, rf)
	snap, err := reopened.Load()
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	srcSnap, err := srcStore.Load()
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Topics) != len(srcSnap.Topics)-1 || len(snap.Subscriptions) != len(srcSnap.Subscriptions) {
		t.Fatalf("the restored store loads %d topics and %d subscriptions; the source, one topic later, %d and %d",
			len(snap.Topics), len(snap.Subscriptions), len(srcSnap.Topics), len(srcSnap.Subscriptions))
	}
	gotView := viewOf(t, openBroker(t, reopened, clk))
	if !reflect.DeepEqual(gotView, wantView) {
		logViewDiff(t, gotView, wantView)
		t.Fatal("a broker over the restored store shows another state")
	}
	n := 0
	for _, ms := range wantView.Msgs {
		n += len(ms)
	}
	if c.sent < 200 || n < 50 {
		t.Fatalf("the workload sent %d messages and kept %d", c.sent, n)
	}
	t.Logf("restored %d topics, %d messages (of %d sent), %d stream bytes", len(wantView.Topics), n, c.sent, len(stream))
}

// logViewDiff logs where got differs from want.
func logViewDiff(t *testing.T, got, want brokerView) {
	t.Helper()
	if !reflect.DeepEqual(got.Topics, want.Topics) {
		t.Logf("topics:\n got  %+v\n want %+v", got.Topics, want.Topics)
	}
	for name, ms := range want.Msgs {
		if !reflect.DeepEqual(ms, got.Msgs[name]) {
			t.Logf("topic %s: %d messages wanted, %d got, not equal", name, len(ms), len(got.Msgs[name]))
		}
	}
	for name, ss := range want.Subs {
		if !reflect.DeepEqual(ss, got.Subs[name]) {
			t.Logf("topic %s subscriptions:\n got  %+v\n want %+v", name, got.Subs[name], ss)
		}
	}
	for name, ds := range want.Dead {
		if !reflect.DeepEqual(ds, got.Dead[name]) {
			t.Logf("dead %s: %d wanted, %d got, not equal", name, len(ds), len(got.Dead[name]))
		}
	}
}

// stateRecord is one record of a state stream, for tests that re-encode a
// stream with a change (the format is documented in statesnap.go).
type stateRecord struct{ k, v []byte }

func decodeStream(t *testing.T, stream []byte) (hdr []byte, recs []stateRecord) {
	t.Helper()
	hdr, p := stream[:16], stream[16:]
	for p[0] == 'k' {
		kl, vl := int(binary.BigEndian.Uint32(p[1:])), int(binary.BigEndian.Uint32(p[5:]))
		recs = append(recs, stateRecord{p[9 : 9+kl], p[9+kl : 9+kl+vl]})
		p = p[9+kl+vl:]
	}
	if p[0] != 'e' || len(p) != 1+8+32 {
		t.Fatalf("stream ends with %d bytes from %#x", len(p), p[0])
	}
	return hdr, recs
}

func encodeStream(hdr []byte, recs []stateRecord) []byte {
	out := bytes.Clone(hdr)
	for _, r := range recs {
		out = append(out, 'k')
		out = binary.BigEndian.AppendUint32(out, uint32(len(r.k)))
		out = binary.BigEndian.AppendUint32(out, uint32(len(r.v)))
		out = append(append(out, r.k...), r.v...)
	}
	out = binary.BigEndian.AppendUint64(append(out, 'e'), uint64(len(recs)))
	sum := sha256.Sum256(out)
	return append(out, sum[:]...)
}

// withRecord is recs with r put in key order.
func withRecord(recs []stateRecord, r stateRecord) []stateRecord {
	i, _ := slices.BinarySearchFunc(recs, r, func(a, b stateRecord) int { return bytes.Compare(a.k, b.k) })
	return slices.Insert(slices.Clone(recs), i, r)
}

// withValue is recs with key k's value replaced.
func withValue(t *testing.T, recs []stateRecord, k, v string) []stateRecord {
	t.Helper()
	out := slices.Clone(recs)
	for i := range out {
		if string(out[i].k) == k {
			out[i].v = []byte(v)
			return out
		}
	}
	t.Fatalf("no record of key %q", k)
	return nil
}

// A restore of a stream that is cut short, has a byte changed, is of
// another version, holds a raft key, the marker or keys out of order,
// fails and leaves the store marked as restoring, with its raft keys
// intact; a good stream then restores it and clears the mark. A marked
// store refuses to be snapshotted.
func TestRestoreStateRefusesBadStreams(t *testing.T) {
	src := openStore(t, vfs.NewMem(), "db")
	writeFixture(t, src)
	want := fingerprint(t, src)
	stream := snapshotStream(t, src)
	dst := openStore(t, vfs.NewMem(), "db")
	rf := writeRaft(t, dst)
	commit(t, dst, func(b core.Batch) { b.PutTopic(&core.TopicRecord{ID: 9, Name: "old", Queues: 1}) })

	mustFail := func(what string, bad []byte) {
		t.Helper()
		err := dst.RestoreState(bytes.NewReader(bad))
		if !errors.Is(err, pebblestore.ErrStateStream) {
			t.Fatalf("%s: RestoreState = %v, want ErrStateStream", what, err)
		}
		if !restoring(t, dst) {
			t.Fatalf("%s: the failed restore left no mark", what)
		}
	}
	// Every cut in the header and trailer, and a spread of cuts between.
	var cuts []int
	for i := range len(stream) {
		if i < 40 || i > len(stream)-60 || i%97 == 0 {
			cuts = append(cuts, i)
		}
	}
	for _, cut := range cuts {
		mustFail(fmt.Sprintf("cut at %d of %d bytes", cut, len(stream)), stream[:cut])
	}
	if _, err := dst.StateSnapshot(); !errors.Is(err, pebblestore.ErrRestoreInProgress) {
		t.Fatalf("StateSnapshot of a half-restored store: %v, want ErrRestoreInProgress", err)
	}
	for _, at := range []int{0, 9, 13, 16, 17, 22, 30, len(stream) / 2, len(stream) - 40, len(stream) - 33, len(stream) - 1} {
		bad := bytes.Clone(stream)
		bad[at] ^= 0x20
		mustFail(fmt.Sprintf("byte %d of %d flipped", at, len(stream)), bad)
	}
	mustFail("a byte after the trailer", append(bytes.Clone(stream), 0))

	hdr, recs := decodeStream(t, stream)
	if !bytes.Equal(encodeStream(hdr, recs), stream) {
		t.Fatal("the test's encoder does not write what WriteTo writes")
	}
	insert := func(k, v string) []stateRecord { return withRecord(recs, stateRecord{[]byte(k), []byte(v)}) }
	swapped := slices.Clone(recs)
	swapped[1], swapped[2] = swapped[2], swapped[1]
	otherVersion := bytes.Clone(hdr)
	otherVersion[11]++
	otherLayout := bytes.Clone(hdr)
	otherLayout[15]++
	for what, bad := range map[string][]byte{
		"a raft log key":         encodeStream(hdr, insert("r\x00\x00\x00\x01l\x00\x00\x00\x00\x00\x00\x00\x01", "x")),
		"a raft stable key":      encodeStream(hdr, insert("r\x00\x00\x00\x02sCurrentTerm", "x")),
		"the restore's marker":   encodeStream(hdr, insert("mR", "")),
		"keys out of order":      encodeStream(hdr, swapped),
		"a key twice":            encodeStream(hdr, append(slices.Clone(recs[:3]), recs[2:]...)),
		"an empty key":           encodeStream(hdr, append([]stateRecord{{k: nil, v: []byte("x")}}, recs...)),
		"another stream version": encodeStream(otherVersion, recs),
		"another layout version": encodeStream(otherLayout, recs),
		"another layout value":   encodeStream(hdr, withValue(t, recs, "mV", "\x00\x00\x00\x02")),
	} {
		mustFail(what, bad)
	}
	checkRaft(t, dst, rf)

	if err := dst.RestoreState(bytes.NewReader(stream)); err != nil {
		t.Fatalf("RestoreState of the good stream: %v", err)
	}
	if restoring(t, dst) || fingerprint(t, dst) != want {
		t.Fatal("the good stream's restore left the mark, or another state")
	}
	checkRaft(t, dst, rf)

	// Closed stores and snapshots.
	sn, err := src.StateSnapshot()
	if err != nil {
		t.Fatal(err)
	}
	if err := sn.Close(); err != nil {
		t.Fatal(err)
	}
	if err := sn.Close(); err != nil {
		t.Fatalf("a second Close: %v", err)
	}
	if _, err := sn.WriteTo(io.Discard); err == nil {
		t.Fatal("WriteTo of a closed snapshot succeeded")
	}
	sn, err = src.StateSnapshot()
	if err != nil {
		t.Fatal(err)
	}
	if err := src.Close(); err == nil {
		t.Error("Close of a store with a snapshot open reports nothing")
	}
	if _, err := sn.WriteTo(io.Discard); !errors.Is(err, core.ErrClosed) {
		t.Errorf("WriteTo after the store's Close: %v, want ErrClosed", err)
	}
	if err := sn.Close(); err != nil {
		t.Errorf("Close of a snapshot of a closed store: %v", err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := dst.StateSnapshot(); !errors.Is(err, core.ErrClosed) {
		t.Errorf("StateSnapshot of a closed store: %v", err)
	}
	if err := dst.RestoreState(bytes.NewReader(stream)); !errors.Is(err, core.ErrClosed) {
		t.Errorf("RestoreState of a closed store: %v", err)
	}
	if _, err := dst.RestoreInProgress(); !errors.Is(err, core.ErrClosed) {
		t.Errorf("RestoreInProgress of a closed store: %v", err)
	}
}

// fillMessages writes n messages of size-byte random bodies, 32 to a
// commit.
func fillMessages(tb testing.TB, s *pebblestore.Store, n, size int) {
	tb.Helper()
	rng := rand.New(rand.NewPCG(uint64(n), uint64(size)))
	body := make([]byte, size)
	for seq := 0; seq < n; {
		b := s.NewBatch()
		for range min(32, n-seq) {
			for i := range body {
				body[i] = byte(rng.Uint32())
			}
			b.Append(&core.Message{ID: fmt.Sprint("m", seq), TopicID: 1, QueueID: uint32(seq % 3), Offset: uint64(seq / 3), Seq: uint64(seq), Body: bytes.Clone(body)})
			seq++
		}
		if err := b.Commit(false, false); err != nil {
			tb.Fatal(err)
		}
	}
}

// readerFunc runs fn at the point of a stream it is put at (in an
// io.MultiReader), then ends.
type readerFunc func()

func (f readerFunc) Read([]byte) (int, error) {
	f()
	return 0, io.EOF
}

// A crash in the middle of a restore leaves a store that opens and says
// it is being restored (whether the restore's unsynced batches survive
// or not), and a restore of it then succeeds; a crash right after a
// restore returns keeps all of it.
func TestCrashMidRestoreLeavesTheMark(t *testing.T) {
	src := openStore(t, vfs.NewMem(), "db")
	fillMessages(t, src, 600, 8<<10) // ~5 MiB: several restore batches
	commit(t, src, func(b core.Batch) { b.PutTopic(&core.TopicRecord{ID: 1, Name: "t", Queues: 3}) })
	want := fingerprint(t, src)
	stream := snapshotStream(t, src)

	fs := vfs.NewCrashableMem()
	dst := openStore(t, fs, "db")
	writeFixture(t, dst)
	rf := writeRaft(t, dst)
	var crashes []*vfs.MemFS
	crashAt := func(cfg vfs.CrashCloneCfg) io.Reader {
		return readerFunc(func() { crashes = append(crashes, fs.CrashClone(cfg)) })
	}
	kept := vfs.CrashCloneCfg{UnsyncedDataPercent: 100, RNG: rand.New(rand.NewPCG(1, 2))}
	half := vfs.CrashCloneCfg{UnsyncedDataPercent: 50, RNG: rand.New(rand.NewPCG(3, 4))}
	r := io.MultiReader(
		bytes.NewReader(stream[:64<<10]), crashAt(vfs.CrashCloneCfg{}),
		bytes.NewReader(stream[64<<10:3<<20]), crashAt(kept), crashAt(half), crashAt(vfs.CrashCloneCfg{}),
		bytes.NewReader(stream[3<<20:]))
	if err := dst.RestoreState(r); err != nil {
		t.Fatalf("RestoreState: %v", err)
	}
	after := fs.CrashClone(vfs.CrashCloneCfg{})
	for i, crashed := range crashes {
		s := openStore(t, crashed, "db")
		if !restoring(t, s) {
			t.Fatalf("crash %d: the store reopened after a crash mid-restore is not marked as restoring", i)
		}
		checkRaft(t, s, rf)
		if err := s.RestoreState(bytes.NewReader(stream)); err != nil {
			t.Fatalf("crash %d: restoring again: %v", i, err)
		}
		if restoring(t, s) || fingerprint(t, s) != want {
			t.Fatalf("crash %d: the second restore left the mark or another state", i)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	s := openStore(t, after, "db")
	if restoring(t, s) || fingerprint(t, s) != want {
		t.Fatal("a crash right after a restore lost part of it")
	}
	checkRaft(t, s, rf)
}

// A restore of a state far larger than its batches holds a bounded amount
// of memory: the snapshot is piped straight into the restore, and the heap
// in use, sampled throughout with the collector at a tight target, must
// grow by well under the state's size. Whole-state buffering on either side
// would exceed it.
func TestRestoreStateInBoundedMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 2×48 MiB")
	}
	// The bound is two thirds of the state: the race detector's shadow
	// memory and slower collector take a restore in bounded memory to
	// ~22 MiB of growth (~5 without it); buffering the whole state takes
	// more than the state itself.
	const stateBytes, bound = 48 << 20, 32 << 20
	src := openStore(t, nil, t.TempDir())
	fillMessages(t, src, stateBytes/(32<<10), 32<<10)
	want := fingerprint(t, src)
	dst := openStore(t, nil, t.TempDir())
	writeFixture(t, dst)
	sn, err := src.StateSnapshot()
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := sn.Close(); err != nil {
			t.Error(err)
		}
	}()

	defer debug.SetGCPercent(debug.SetGCPercent(20))
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base := ms.HeapInuse
	var peak uint64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		var m runtime.MemStats
		for {
			runtime.ReadMemStats(&m)
			peak = max(peak, m.HeapInuse)
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	})
	pr, pw := io.Pipe()
	var written int64
	var writeErr error
	wg.Go(func() {
		written, writeErr = sn.WriteTo(pw)
		pw.CloseWithError(writeErr)
	})
	restoreErr := dst.RestoreState(pr)
	_ = pr.CloseWithError(errors.New("the restore stopped reading"))
	close(stop)
	wg.Wait()
	if err := errors.Join(writeErr, restoreErr); err != nil {
		t.Fatal(err)
	}
	if fingerprint(t, dst) != want {
		t.Fatal("the restored store differs from the source")
	}
	growth := int64(peak) - int64(base)
	t.Logf("streamed %d MiB; heap in use %d MiB at the start, peak growth %.1f MiB (bound %d MiB)", written>>20, base>>20, float64(growth)/(1<<20), bound>>20)
	if written < stateBytes {
		t.Fatalf("the stream holds %d bytes, less than the state's %d", written, stateBytes)
	}
	if growth > bound {
		t.Fatalf("the heap in use grew by %d MiB while %d MiB were restored, over the bound of %d MiB", growth>>20, written>>20, bound>>20)
	}
}

// BenchmarkStateSnapshot measures writing a snapshot's stream (to memory)
// and restoring one into a store, in stream MB/s.
func BenchmarkStateSnapshot(b *testing.B) {
	open := func(b *testing.B) *pebblestore.Store {
		s, err := pebblestore.Open(b.TempDir(), pebblestore.Options{CacheBytes: 8 << 20, MemTableBytes: 16 << 20})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() {
			if err := s.Close(); err != nil {
				b.Error(err)
			}
		})
		return s
	}
	src := open(b)
	fillMessages(b, src, 1024, 16<<10) // 16 MiB
	sn, err := src.StateSnapshot()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = sn.Close() })
	var stream bytes.Buffer
	if _, err := sn.WriteTo(&stream); err != nil {
		b.Fatal(err)
	}
	b.Run("write", func(b *testing.B) {
		b.SetBytes(int64(stream.Len()))
		b.ReportAllocs()
		for b.Loop() {
			if _, err := sn.WriteTo(io.Discard); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("restore", func(b *testing.B) {
		dst := open(b)
		b.SetBytes(int64(stream.Len()))
		b.ReportAllocs()
		for b.Loop() {
			if err := dst.RestoreState(bytes.NewReader(stream.Bytes())); err != nil {
				b.Fatal(err)
			}
		}
	})
}
