package pebblestore_test

import (
	"reflect"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tidemq/tidemq/core"
	"github.com/tidemq/tidemq/pebblestore"
)

// Mirror definitions and skip records round-trip through a batch, its
// Repr applied to another store, and a reopen; deleting a mirror removes
// its skip records and no other mirror's (a name that prefixes another).
func TestMirrorRecordsRoundTrip(t *testing.T) {
	fs := vfs.NewMem()
	s := openStore(t, fs, "db")
	follower := openStore(t, vfs.NewMem(), "db")
	alerts := int64(10)
	recs := []*core.MirrorRecord{
		{Name: "m", Source: core.MirrorSource{URL: "http://hz:8080", Topic: "orders", Token: "secret"}, Topic: "orders", Filter: "*", StartFrom: "earliest", CreatedAtMs: 1},
		{Name: "m.2", Source: core.MirrorSource{URL: "https://sg", Topic: "o"}, Topic: "copies", Filter: "a || b", StartFrom: "latest", Paused: true,
			Alerts: &core.AlertConfig{MaxLag: &alerts, WebhookURL: "http://hook"}, CreatedAtMs: 2},
	}
	progress := []core.MirrorProgress{
		{QueueID: 0, Watermark: 5, Stored: []uint64{7, 9, 300, 1 << 40}, Copied: 9, LastCopiedMs: 1234},
		{QueueID: 7, Watermark: 0, Copied: 0},
	}
	b := s.NewBatch()
	for _, r := range recs {
		b.PutMirror(r)
	}
	for _, p := range progress {
		b.PutMirrorProgress("m", p)
		b.PutMirrorProgress("m.2", p)
	}
	if err := follower.ApplyBatch(b.Repr(), true); err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(true, false); err != nil {
		t.Fatal(err)
	}
	check := func(st *pebblestore.Store, names ...string) {
		t.Helper()
		snap, err := st.Load()
		if err != nil {
			t.Fatal(err)
		}
		var want []*core.MirrorRecord
		for _, r := range recs {
			for _, n := range names {
				if r.Name == n {
					want = append(want, r)
				}
			}
		}
		if !reflect.DeepEqual(snap.Mirrors, want) {
			t.Errorf("mirrors %+v, want %+v", snap.Mirrors, want)
		}
		if len(snap.MirrorProgress) != len(names) {
			t.Errorf("skip records of %d mirrors, want %d: %+v", len(snap.MirrorProgress), len(names), snap.MirrorProgress)
		}
		for _, n := range names {
			if got := snap.MirrorProgress[n]; !reflect.DeepEqual(got, progress) {
				t.Errorf("%s: skip records %+v, want %+v", n, got, progress)
			}
		}
	}
	check(s, "m", "m.2")
	check(follower, "m", "m.2")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, fs, "db")
	check(s, "m", "m.2")

	b = s.NewBatch()
	b.DeleteMirror("m")
	if err := b.Commit(true, false); err != nil {
		t.Fatal(err)
	}
	check(s, "m.2")
}
