package pebblestore

import (
	"io"
	"log/slog"
	"sync"
	"testing"

	"github.com/tidemq/tidemq/core"
)

// A send the broker commits alone, on its caller's goroutine, waits for
// its WAL sync by polling (its commit is marked alone) on a store that
// allows it; sends that share the appender's commits park, and a store
// told not to spin never polls. Every acknowledged send is readable after
// a restart either way.
func TestLoneSendsPollForTheirSync(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, tc := range []struct {
		name       string
		noSyncSpin bool
	}{{"syncs may spin", false}, {"NoSyncSpin", true}} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			open := func() (*Store, *core.Broker) {
				store, err := Open(dir, Options{MemTableBytes: 4 << 20, CacheBytes: 8 << 20, NoSyncSpin: tc.noSyncSpin, Logger: quiet})
				if err != nil {
					t.Fatal(err)
				}
				b, err := core.New(store, core.Options{Logger: quiet})
				if err != nil {
					t.Fatal(err)
				}
				return store, b
			}
			store, b := open()
			ctx := t.Context()
			if _, _, err := b.PutTopic(ctx, "t", core.TopicConfig{Queues: 2}); err != nil {
				t.Fatal(err)
			}
			if !tc.noSyncSpin && store.ring.syncs() == 0 {
				t.Skip("no io_uring here: WAL syncs are plain syscalls and nothing polls")
			}

			// The start's epoch commit polls too (it commits alone): count
			// from here.
			polledBefore := store.polledCommits()
			const lone = 30
			for i := range lone {
				if _, err := b.Send(ctx, "t", []*core.Message{{Body: []byte{byte(i)}}}); err != nil {
					t.Fatal(err)
				}
			}
			polledAfterLone := store.polledCommits()
			polledAlone := polledAfterLone - polledBefore
			syncsAlone := store.ring.syncs()
			// Sends one after another find the appender idle nearly always;
			// the broker's own timers may take a turn at committing.
			if tc.noSyncSpin && polledAlone != 0 || !tc.noSyncSpin && (polledAlone < lone/2 || polledAlone > lone) {
				t.Fatalf("%d of %d sends made one after another polled for their sync (NoSyncSpin %v)", polledAlone, lone, tc.noSyncSpin)
			}

			// Many at once: the appender commits most of them together.
			const producers, each = 16, 20
			var wg sync.WaitGroup
			errs := make(chan error, producers)
			for p := range producers {
				wg.Go(func() {
					for i := range each {
						if _, err := b.Send(ctx, "t", []*core.Message{{Body: []byte{byte(p), byte(i)}}}); err != nil {
							errs <- err
							return
						}
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			// Each commit syncs the WAL once (they take turns); the lone
			// ones are about every other one here.
			polled, synced := store.polledCommits()-polledAfterLone, store.ring.syncs()-syncsAlone
			if polled*4 > synced*3 {
				t.Errorf("%d of the %d commits of concurrent sends polled for their sync; those of the appender must park", polled, synced)
			}

			if err := b.Close(); err != nil {
				t.Fatal(err)
			}
			if err := store.Close(); err != nil {
				t.Fatal(err)
			}
			store, b = open()
			defer store.Close()
			defer b.Close()
			info, err := b.GetTopic("t")
			if err != nil {
				t.Fatal(err)
			}
			if want := int64(lone + producers*each); info.Messages != want {
				t.Errorf("after a restart the topic holds %d messages, want %d", info.Messages, want)
			}
		})
	}
}
