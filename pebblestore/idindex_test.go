package pebblestore

import (
	"context"
	"errors"
	"testing"

	"github.com/cockroachdb/pebble/v2"

	"github.com/tidemq/tidemq/core"
)

// TestMessageFoundByLegacyIDIndex: a data dir written before NUIDs were
// indexed by their ordered digest (kind 'i', FNV hash) still finds its
// messages by id. The message is sent through a real broker, then its
// index entry is rewritten the old way.
func TestMessageFoundByLegacyIDIndex(t *testing.T) {
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

	// The entry the broker wrote: I topic bucket 'n' digest seq.
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
	if len(entries) != 1 || entries[0][9] != core.IndexNUID {
		t.Fatalf("id index entries %x: want one of kind %q", entries, core.IndexNUID)
	}
	k := entries[0]
	topicID, bucket, seq := be.Uint32(k[1:]), be.Uint32(k[5:]), be.Uint64(k[len(k)-8:])
	legacy := secondaryKey(nil, topicID, bucket, core.IndexID, core.IndexHash(id), seq)
	rewrite := func(del, set []byte) {
		t.Helper()
		b := s.db.NewBatch()
		_ = b.Delete(del, nil)
		if set != nil {
			_ = b.Set(set, nil, nil)
		}
		if err := b.Commit(pebble.Sync); err != nil {
			t.Fatal(err)
		}
	}

	rewrite(k, legacy)
	m, _, err := br.GetMessage("orders", id)
	if err != nil || m.ID != id || string(m.Body) != "hello" {
		t.Fatalf("GetMessage(%s) through the legacy entry: %+v, %v", id, m, err)
	}
	rewrite(legacy, nil)
	if _, _, err := br.GetMessage("orders", id); !errors.Is(err, core.ErrMessageNotFound) {
		t.Fatalf("GetMessage(%s) with no index entry: %v, want not found", id, err)
	}
}
