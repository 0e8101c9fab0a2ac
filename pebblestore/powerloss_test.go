package pebblestore_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tidemq/tidemq/core"
	"github.com/tidemq/tidemq/pebblestore"
)

// A crash keeps every commit made with sync and loses commits made
// without: each try commits one message per batch, takes a crash clone of
// the filesystem (keeping nothing unsynced, or a random half of it) and
// counts the messages the reopened store lacks. It fails if synced commits
// are lost, and if unsynced ones never are, which would mean the store
// syncs whatever it is told, or this test cannot see the difference.
func TestCrashKeepsSyncedCommitsAndLosesUnsyncedOnes(t *testing.T) {
	const msgs, tries = 200, 4
	for _, sync := range []bool{true, false} {
		t.Run(fmt.Sprintf("sync=%v", sync), func(t *testing.T) {
			lostTotal := 0
			for try := range tries {
				fs := vfs.NewCrashableMem()
				s := openStore(t, fs, "db")
				for seq := range uint64(msgs) {
					b := s.NewBatch()
					b.Append(&core.Message{ID: fmt.Sprint("m", seq), TopicID: 1, Offset: seq, Seq: seq, Body: []byte("body")})
					if err := b.Commit(sync, false); err != nil {
						t.Fatal(err)
					}
				}
				cfg := vfs.CrashCloneCfg{}
				if try > 0 {
					cfg = vfs.CrashCloneCfg{UnsyncedDataPercent: 50, RNG: rand.New(rand.NewPCG(uint64(try), 1))}
				}
				crashed := fs.CrashClone(cfg)
				if err := s.Close(); err != nil {
					t.Fatal(err)
				}
				lost := lostMessages(t, openStore(t, crashed, "db"), msgs)
				lostTotal += lost
				if sync && lost > 0 {
					t.Errorf("try %d (%d%% of unsynced data kept): %d of %d synced commits lost in the crash", try, cfg.UnsyncedDataPercent, lost, msgs)
				}
				t.Logf("try %d, %d%% of unsynced data kept: %d of %d messages lost", try, cfg.UnsyncedDataPercent, lost, msgs)
			}
			if !sync && lostTotal == 0 {
				t.Errorf("%d tries of %d unsynced commits lost nothing in a crash: the store synced them anyway, or the crash clone kept everything", tries, msgs)
			}
		})
	}
}

// lostMessages counts the seqs below n that s cannot read.
func lostMessages(t *testing.T, s *pebblestore.Store, n int) int {
	t.Helper()
	lost := 0
	for seq := range uint64(n) {
		m, err := s.ReadMessage(seq)
		switch {
		case errors.Is(err, core.ErrMessageNotFound):
			lost++
		case err != nil:
			t.Fatalf("ReadMessage(%d): %v", seq, err)
		case m.ID != fmt.Sprint("m", seq):
			t.Fatalf("ReadMessage(%d) = %s", seq, m.ID)
		}
	}
	return lost
}
