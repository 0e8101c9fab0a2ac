package pebblestore

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/cockroachdb/pebble/v2"

	"github.com/tidemq/tidemq/core"
)

// TestMessageFoundByIDRun: a message sent through a real broker is
// indexed by id as a run of one (kind indexNUIDRun), which is what a
// lookup by id reads: without it the message is not found.
func TestMessageFoundByIDRun(t *testing.T) {
	s, err := Open(t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	br, err := core.New(s, core.Options{AutoCreate: true})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := errors.Join(br.Close(), s.Close()); err != nil {
			t.Error(err)
		}
	}()
	ctx := context.Background()
	res, err := br.Send(ctx, "orders", []*core.Message{{Body: []byte("hello")}})
	if err != nil {
		t.Fatal(err)
	}
	id := res[0].MessageID
	if kind, _ := core.IDIndex(id); kind != core.IndexNUID {
		t.Fatalf("message id %q is not indexed as a NUID", id)
	}

	// The entry the broker wrote: I topic bucket 'r' digest seq (a run of one).
	lo, hi := prefixRange([]byte{prefixSecondary})
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		t.Fatal(err)
	}
	var entries [][]byte
	for it.First(); it.Valid(); it.Next() {
		entries = append(entries, append([]byte(nil), it.Key()...))
	}
	if err := it.Close(); err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0][9] != indexNUIDRun {
		t.Fatalf("id index entries %x: want one of kind %q", entries, indexNUIDRun)
	}
	if m, _, err := br.GetMessage("orders", id); err != nil || m.ID != id || string(m.Body) != "hello" {
		t.Fatalf("GetMessage(%s) through its run: %+v, %v", id, m, err)
	}
	if err := s.db.Delete(entries[0], pebble.Sync); err != nil {
		t.Fatal(err)
	}
	if _, _, err := br.GetMessage("orders", id); !errors.Is(err, core.ErrMessageNotFound) {
		t.Fatalf("GetMessage(%s) with no index entry: %v, want not found", id, err)
	}
}

// TestNUIDRunsFindEveryID appends NUID-indexed messages the ways a broker
// does (sends whose ids interleave with other sends', several sends in one
// commit, delayed messages coming due long after their neighbours, a
// prefix change, sends longer than a run, several buckets) and checks that
// ScanIndex finds each digest's seq and nothing else, and far fewer keys
// than messages.
func TestNUIDRunsFindEveryID(t *testing.T) {
	s, err := Open(t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const topicID = 7
	type entry struct {
		digest, seq uint64
		bucket      uint32
	}
	var all []entry
	seq := uint64(1000)
	commit := func(entries ...[]entry) {
		t.Helper()
		b := s.NewBatch().(*batch)
		for _, send := range entries {
			for _, e := range send {
				seq++
				e.seq = seq
				b.addToRun(topicID, e.bucket, e.digest, e.seq)
				all = append(all, e)
			}
		}
		if err := b.Commit(false, false); err != nil {
			t.Fatal(err)
		}
	}
	ids := func(bucket uint32, from uint64, step uint64, n int) []entry {
		out := make([]entry, n)
		for i := range out {
			out[i] = entry{digest: from + uint64(i)*step, bucket: bucket}
		}
		return out
	}
	const prefixA, prefixB = uint64(3) << 60, uint64(9) << 60
	// Two producers' sends drawing from one generator: interleaved digests.
	commit(ids(5, prefixA+100, 66, 100), ids(5, prefixA+133, 66, 100))
	// A send longer than a run, and one whose span exceeds maxRunSpan.
	commit(ids(5, prefixA+1_000_000, 33, 600))
	commit(ids(5, prefixA+3_000_000, 333, 4000))
	// Delayed messages coming due: digests from inside earlier runs.
	commit([]entry{{digest: prefixA + 100 + 66*50 + 1, bucket: 5}, {digest: prefixA + 1_000_000 + 17, bucket: 5}})
	// Another process's prefix, another bucket, the same digests again.
	commit(ids(6, prefixB+100, 66, 50), ids(6, prefixA+100, 66, 10))

	for _, e := range all {
		var got []uint64
		err := s.ScanIndex(topicID, core.IndexNUID, e.digest, 5, 6, 0, 0, func(bucket uint32, seq uint64) bool {
			if bucket == e.bucket {
				got = append(got, seq)
			}
			return true
		})
		if err != nil {
			t.Fatal(err)
		}
		var want []uint64
		for _, o := range all {
			if o.digest == e.digest && o.bucket == e.bucket {
				want = append(want, o.seq)
			}
		}
		if !slices.Equal(got, want) {
			t.Fatalf("digest %x in bucket %d: seqs %v, want %v", e.digest, e.bucket, got, want)
		}
	}
	var nothing int
	_ = s.ScanIndex(topicID, core.IndexNUID, prefixA+101, 5, 6, 0, 0, func(uint32, uint64) bool { nothing++; return true })
	if nothing != 0 {
		t.Fatalf("a digest never indexed found %d seqs", nothing)
	}

	lo, hi := prefixRange([]byte{prefixSecondary})
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		t.Fatal(err)
	}
	keys := 0
	for it.First(); it.Valid(); it.Next() {
		keys++
	}
	if err := it.Close(); err != nil {
		t.Fatal(err)
	}
	if keys*20 > len(all) {
		t.Fatalf("%d index keys for %d messages: runs are not forming", keys, len(all))
	}
}

// TestDelayedIndexFollowsTheParkedRecord: a parked delayed message is
// indexed by its id in the bucket of its due time, and the entry goes with
// the parked record.
func TestDelayedIndexFollowsTheParkedRecord(t *testing.T) {
	s, err := Open(t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	p := &core.Parked{ID: 42, Kind: core.ParkedDelayed, TopicID: 7, DueMs: 5 * core.IndexBucketMs,
		Msg: &core.Message{ID: "delayed-1", Body: []byte("x")}}
	find := func() []uint64 {
		t.Helper()
		var ids []uint64
		if err := s.ScanIndex(7, core.IndexDelayed, core.IndexHash("delayed-1"), 0, 10, 0, 0, func(bucket uint32, id uint64) bool {
			if bucket != 5 {
				t.Errorf("indexed in bucket %d, want the due time's, 5", bucket)
			}
			ids = append(ids, id)
			return true
		}); err != nil {
			t.Fatal(err)
		}
		return ids
	}
	b := s.NewBatch()
	b.PutParked(p)
	if err := b.Commit(true, false); err != nil {
		t.Fatal(err)
	}
	if got := find(); len(got) != 1 || got[0] != 42 {
		t.Fatalf("parked: index finds %v, want [42]", got)
	}
	b = s.NewBatch()
	b.DeleteParked(p)
	if err := b.Commit(true, false); err != nil {
		t.Fatal(err)
	}
	if got := find(); len(got) != 0 {
		t.Fatalf("after DeleteParked: index still finds %v", got)
	}
}
