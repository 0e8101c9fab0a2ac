package core_test

import (
	"sync"
	"testing"

	"github.com/tidemq/tidemq/core"
	"github.com/tidemq/tidemq/pebblestore"
)

// A send committed alone, on its caller's goroutine, waits for its WAL sync
// by polling (core.PollingBatch) on a store that allows it; sends that
// share the appender's commits park, and a store told not to spin never
// polls. Every acknowledged send is readable after a restart either way.
func TestLoneSendsPollForTheirSync(t *testing.T) {
	for _, tc := range []struct {
		name       string
		noSyncSpin bool
	}{{"syncs may spin", false}, {"NoSyncSpin", true}} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			open := func() (*pebblestore.Store, *core.Broker) {
				store, err := pebblestore.Open(dir, pebblestore.Options{MemTableBytes: 4 << 20, CacheBytes: 8 << 20, NoSyncSpin: tc.noSyncSpin, Logger: quiet})
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
			if !tc.noSyncSpin && store.Stats().WALUringSyncs == 0 {
				t.Skip("no io_uring here: WAL syncs are plain syscalls and nothing polls")
			}

			const lone = 30
			for i := range lone {
				if _, err := b.Send(ctx, "t", []*core.Message{{Body: []byte{byte(i)}}}); err != nil {
					t.Fatal(err)
				}
			}
			polledAlone := store.Stats().WALPolledCommits
			syncsAlone := store.Stats().WALUringSyncs
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
			polled, synced := store.Stats().WALPolledCommits-polledAlone, store.Stats().WALUringSyncs-syncsAlone
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
